"""torch.library custom ops over the CUDA kernels, with fake (meta) implementations, so the GEMMs
and the quantiser work under torch.compile and inside CUDA graphs.

    torch.ops.fp4_gemm.quantize_fp8(x, pow2)                                  -> (q, scales)
    torch.ops.fp4_gemm.grouped_gemm_contiguous(x, x_scales, packed, row_scale, group_offsets,
                                               n, k, block_n)                 -> out [M, n] BF16
    torch.ops.fp4_gemm.grouped_gemm_masked(x, x_scales, packed, row_scale, masked_m, n, k, block_n)
                                                                              -> out [G, max_m, n] BF16
    torch.ops.fp4_gemm.grouped_gemm_l1_contiguous(x, x_scales, packed, row_scale, topk_w, group_offsets,
                                                  n, k, activation_clamp (< 0: none), pow2, block_n)
                                                                              -> (q [M, n/2], scales [M, n/256])
block_n = 0 picks the token tile from the shapes.
"""
from __future__ import annotations

import torch

from . import ops

SCALE_GROUP = ops.SCALE_GROUP


@torch.library.custom_op("fp4_gemm::quantize_fp8", mutates_args=())
def quantize_fp8(x: torch.Tensor, pow2: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return ops.quantize_fp8_cuda(x, pow2=pow2)


@quantize_fp8.register_fake
def _(x, pow2=False):
    T, H = x.shape
    return x.new_empty((T, H), dtype=torch.float8_e4m3fn), x.new_empty((T, H // SCALE_GROUP), dtype=torch.float32)


def _weights(packed, row_scale, n, k):
    return ops.PackedWeights(packed, row_scale, packed.shape[0], n, k)


@torch.library.custom_op("fp4_gemm::grouped_gemm_contiguous", mutates_args=())
def grouped_gemm_contiguous(x: torch.Tensor, x_scales: torch.Tensor, packed: torch.Tensor, row_scale: torch.Tensor,
                            group_offsets: torch.Tensor, n: int, k: int, block_n: int = 0) -> torch.Tensor:
    return ops.grouped_gemm(x, x_scales, _weights(packed, row_scale, n, k), group_offsets=group_offsets,
                            block_n=block_n or None)


@grouped_gemm_contiguous.register_fake
def _(x, x_scales, packed, row_scale, group_offsets, n, k, block_n=0):
    return x.new_empty((x.shape[0], n), dtype=torch.bfloat16)


@torch.library.custom_op("fp4_gemm::grouped_gemm_masked", mutates_args=())
def grouped_gemm_masked(x: torch.Tensor, x_scales: torch.Tensor, packed: torch.Tensor, row_scale: torch.Tensor,
                        masked_m: torch.Tensor, n: int, k: int, block_n: int = 0) -> torch.Tensor:
    return ops.grouped_gemm(x, x_scales, _weights(packed, row_scale, n, k), masked_m=masked_m,
                            block_n=block_n or None)


@grouped_gemm_masked.register_fake
def _(x, x_scales, packed, row_scale, masked_m, n, k, block_n=0):
    return x.new_empty((x.shape[0], x.shape[1], n), dtype=torch.bfloat16)


def _l1_weights(packed, row_scale, n, k):
    return ops.PackedWeights(packed, row_scale, packed.shape[0], n, k, gate_up_interleave=True)


@torch.library.custom_op("fp4_gemm::grouped_gemm_l1_contiguous", mutates_args=())
def grouped_gemm_l1_contiguous(x: torch.Tensor, x_scales: torch.Tensor, packed: torch.Tensor, row_scale: torch.Tensor,
                               topk_w: torch.Tensor, group_offsets: torch.Tensor, n: int, k: int,
                               activation_clamp: float = -1.0, pow2: bool = False,
                               block_n: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    # A schema default cannot be inf: a negative clamp means none.
    clamp = activation_clamp if activation_clamp >= 0 else float("inf")
    return ops.grouped_gemm_l1(x, x_scales, _l1_weights(packed, row_scale, n, k), topk_w, group_offsets=group_offsets,
                               activation_clamp=clamp, pow2=pow2, block_n=block_n or None)


@grouped_gemm_l1_contiguous.register_fake
def _(x, x_scales, packed, row_scale, topk_w, group_offsets, n, k, activation_clamp=-1.0, pow2=False, block_n=0):
    inter = n // 2
    return (x.new_empty((x.shape[0], inter), dtype=torch.float8_e4m3fn),
            x.new_empty((x.shape[0], inter // SCALE_GROUP), dtype=torch.float32))
