"""FP8 x MXFP4 grouped GEMM benchmark against what a user would pick instead.

Cases (DESIGN section 6 / the fp4_gemm issue): compute-bound contiguous 32 groups x 1024 tokens
(N 6144, K 7168) and (N 7168, K 3072); decode masked 32 groups x 8 tokens, same N/K.
Side by side: torch._scaled_grouped_mm (FP8 x FP8 rowwise; FP8 weights = 2x our weight bytes),
torch._grouped_mm in BF16, and the FP8 dense / HBM copy ceilings measured in this run.
Timing (bench/common.py time_best), one rule for ours, the torch baselines and the ceilings: the
better of CUDA-graph replay of 4 back-to-back calls (GPU time, what a serving loop that replays
graphs sees) and 4 back-to-back stream launches timed host-inclusive; `ours_host_us` is the latter.
Usage: python bench/gemm.py [--quick]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import header, measure_bf16_peak, measure_fp8_peak, measure_hbm_copy, time_best, write_results  # noqa: E402

from fp4_gemm import layout, ops, quantize_fp8  # noqa: E402

CASES = [
    # name, layout, G, m per group, N, K
    ("prefill-6144x7168", "contiguous", 32, 1024, 6144, 7168),
    ("prefill-7168x3072", "contiguous", 32, 1024, 7168, 3072),
    ("decode-6144x7168", "masked", 32, 8, 6144, 7168),
    ("decode-7168x3072", "masked", 32, 8, 7168, 3072),
    ("prefill-4096x4096", "contiguous", 32, 1024, 4096, 4096),  # the BF16-output GEMM at the L1 case's shape
    ("prefill-L1-4096x4096", "l1", 32, 1024, 4096, 4096),  # flash W1 (2I x H) with the SwiGLU -> FP8 epilogue
    ("decode-L1-4096x4096", "l1", 32, 8, 4096, 4096),      # the same at 8 tokens per expert (kSmem kernels)
]


def gaussian_packed(G, N, K):
    """Gaussian weights through the real MXFP4 quantiser and transform (on the GPU, a group at a
    time): realistic per-32 shifts, which decide the decoder's fast / slow path."""
    from fp4_gemm import numerics as nm
    packed, row_scale = [], []
    for g in range(G):
        codes, exps = nm.quantize_mxfp4(torch.randn(1, N, K, device="cuda"))
        tw = nm.transform_weights(codes, exps)
        packed.append(layout.pack_weights(tw.codes, tw.shift))
        row_scale.append(tw.row_scale)
    return ops.PackedWeights(torch.cat(packed), torch.cat(row_scale).float().contiguous(), G, N, K)


def random_packed(G, N, K):
    """Random bytes straight in the kernel layout, shifts uniform in [-8, 6]: the decoder's worst
    case (most warps take the subnormal-table path); a stress case, not realistic weights."""
    C = layout.constants()
    packed = torch.randint(0, 256, (G, N // 128, K // 128, C["kBlockChunkBytes"]), dtype=torch.uint8, device="cuda")
    sh = packed.view(G, N // 128, K // 128, 2, C["kWgChunkBytes"])[..., C["kCodeBytes"]:]
    sh.copy_((sh.view(torch.int8).to(torch.int16) % 15 - 8).to(torch.int8).view(torch.uint8))
    row_scale = torch.rand(G, N, device="cuda") * 1e-3 + 1e-4
    return ops.PackedWeights(packed, row_scale, G, N, K)


def gemm_call(lay, G, m, K, w, xq, xs, block_n=None, device="cuda"):
    """A no-argument call of our grouped GEMM for one case: `lay` is contiguous, masked (G x m rows)
    or l1 (contiguous with the SwiGLU -> FP8 epilogue; any packed weights are layout-valid L1
    weights, and speed does not depend on the gate/up pairing)."""
    if lay in ("contiguous", "l1"):
        offs = torch.arange(0, G + 1, dtype=torch.int32, device=device) * m
        if lay == "contiguous":
            return lambda: ops.grouped_gemm(xq, xs, w, group_offsets=offs, block_n=block_n)
        w.gate_up_interleave = True
        topk_w = torch.rand(G * m, device=device)
        return lambda: ops.grouped_gemm_l1(xq, xs, w, topk_w, group_offsets=offs, block_n=block_n)
    mm = torch.full((G,), m, dtype=torch.int32, device=device)
    xq3, xs3 = xq.view(G, m, K), xs.view(G, m, K // 128)
    return lambda: ops.grouped_gemm(xq3, xs3, w, masked_m=mm, block_n=block_n)


def bench_case(name, lay, G, m, N, K, peaks, weights="gaussian"):
    flops = 2.0 * G * m * N * K
    w = gaussian_packed(G, N, K) if weights == "gaussian" else random_packed(G, N, K)
    weight_bytes = w.packed.numel() + w.row_scale.numel() * 4
    x = torch.randn(G * m, K, device="cuda").to(torch.bfloat16)
    xq, xs = quantize_fp8(x)
    row = {"case": name, "weights": weights, "layout": lay, "groups": G, "m": m, "N": N, "K": K}
    # The better of CUDA-graph replay and host-inclusive back-to-back calls (bench/common.py
    # time_best, the same rule as for the baselines and ceilings), and the host-inclusive time alone
    # (our Python wrapper's launch cost shows there).
    call = gemm_call(lay, G, m, K, w, xq, xs)
    t, t_host = time_best(call)
    ops.check_errors()
    act_bytes = xq.numel() + xs.numel() * 4 + G * m * N * 2
    row.update(ours_us=t * 1e6, ours_host_us=t_host * 1e6, ours_tflops=flops / t / 1e12, ours_vs_fp8_peak=flops / t / peaks["fp8"],
               weight_GBs=weight_bytes / t / 1e9, weight_bw_vs_copy=weight_bytes / t / peaks["hbm"],
               floor_us=max(flops / peaks["fp8"], (weight_bytes + act_bytes) / peaks["hbm"]) * 1e6)
    del w
    # What a user would run instead: FP8 weights (rowwise scales) through torch._scaled_grouped_mm.
    try:
        wb = torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16)
        w8 = wb.to(torch.float8_e4m3fn)
        sw = torch.rand(G, N, device="cuda") + 0.5
        sx = torch.rand(G * m, device="cuda") + 0.5
        offs_end = (torch.arange(1, G + 1, dtype=torch.int32, device="cuda") * m)
        xa = xq.contiguous()
        f8 = lambda: torch._scaled_grouped_mm(xa, w8.transpose(-2, -1), sx, sw, offs=offs_end, out_dtype=torch.bfloat16)  # noqa: E731
        t8, _ = time_best(f8)
        row.update(torch_fp8_us=t8 * 1e6, torch_fp8_tflops=flops / t8 / 1e12)
        del w8
        xb = x.contiguous()
        fb = lambda: torch._grouped_mm(xb, wb.transpose(-2, -1), offs=offs_end)  # noqa: E731
        tb, _ = time_best(fb)
        row.update(torch_bf16_us=tb * 1e6, torch_bf16_tflops=flops / tb / 1e12)
        del wb
    except Exception as e:  # report, don't hide: the row says what failed
        row["torch_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    if "torch_fp8_us" in row:
        row["speedup_vs_torch_fp8"] = row["torch_fp8_us"] / row["ours_us"]
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the BF16 peak")
    args = ap.parse_args()
    peaks = {"fp8": measure_fp8_peak(), "hbm": measure_hbm_copy()}
    if not args.quick:
        peaks["bf16"] = measure_bf16_peak()
    head = header({"fp8_peak_tflops": peaks["fp8"] / 1e12, "hbm_copy_TBs": peaks["hbm"] / 1e12,
                   "bf16_peak_tflops": peaks.get("bf16", 0) / 1e12})
    rows = [bench_case(*c, peaks) for c in CASES]
    rows += [bench_case(*c, peaks, weights="uniform-shift") for c in CASES if c[0] in ("prefill-6144x7168", "decode-6144x7168", "prefill-L1-4096x4096")]
    cols = ["case", "weights", "ours_us", "ours_host_us", "ours_tflops", "ours_vs_fp8_peak", "weight_GBs", "weight_bw_vs_copy", "floor_us",
            "torch_fp8_us", "torch_fp8_tflops", "torch_bf16_us", "speedup_vs_torch_fp8", "torch_error"]
    write_results("gemm", head, rows, cols)


if __name__ == "__main__":
    main()
