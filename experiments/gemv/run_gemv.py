"""EXPERIMENT (experiments/gemv/gemv.cu): the mma.sync few-token GEMM against fp4_gemm's grouped GEMM (block_n 8 with the
layer's split-K workspace, as the layer runs 1-token calls) at 1-8 rows per group.
1. Correctness: every element of the GEMV's output against the float64 reference on the same quantised inputs
   (fresh seeded inputs, output poisoned first), small shapes and the presets' L1 / L2 shapes.
2. Speed: CUDA-graph time of each at the presets' shapes, 1, 16 and 64 tokens per rank (top-6 routing, 6 /
   ~90 / ~250 groups of 1-2 rows), with the HBM floor (touched experts' packed bytes / the copy bandwidth measured here).
Usage (GPU machine, repo root, gpu_env sourced): python experiments/gemv/run_gemv.py build-gemv/libgemv.so"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fp4_gemm"))
sys.path.insert(0, str(ROOT / "bench"))
from gemm_cases import (check_l1, gemm_error_bound, gemm_reference, l1_reference, random_tokens, random_weights,  # noqa: E402
                        reference_bf16_step_check)

from common import measure_hbm_copy, time_cuda_graph  # noqa: E402
from fp4_gemm import layout, ops, quantize_fp8  # noqa: E402

LIB = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build-gemv" / "libgemv.so"))
LIB.gemv_bf16.restype = ctypes.c_int
UNIT_ROWS = LIB.gemv_rows_per_unit()
HAS_L1 = UNIT_ROWS == 256  # the pair build's gemv_l1
LIB.gemv_l1.restype = ctypes.c_int
LIB.gemv_l1.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 3 +
                        [ctypes.c_float, ctypes.c_int, ctypes.c_int, ctypes.c_void_p])
LIB.gemv_bf16.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3 + [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
POISON = 0x7FC1
SEED = int(os.environ.get("GEMV_SEED", torch.randint(0, 2**31 - 1, (1,)).item()))
print(f"run_gemv: seed {SEED} (GEMV_SEED={SEED} replays)")


def gemv(xq, xs, pw, offs, out, num_sms=0):
    rc = LIB.gemv_bf16(xq.data_ptr(), xs.data_ptr(), pw.packed.data_ptr(), pw.row_scale.data_ptr(), offs.data_ptr(),
                       pw.num_groups, pw.n, pw.k, out.data_ptr(), num_sms, torch.cuda.current_stream().cuda_stream)
    assert rc == 0, f"gemv_bf16 returned {rc}"


def gemv_l1(xq, xs, pw, offs, topk_w, q, sc, clamp=float("inf"), num_sms=0):
    rc = LIB.gemv_l1(xq.data_ptr(), xs.data_ptr(), pw.packed.data_ptr(), pw.row_scale.data_ptr(), offs.data_ptr(),
                     pw.num_groups, pw.n, pw.k, topk_w.data_ptr(), q.data_ptr(), sc.data_ptr(), clamp, 0, num_sms,
                     torch.cuda.current_stream().cuda_stream)
    assert rc == 0, f"gemv_l1 returned {rc}"


def case(G, N, K, sizes, gen, gate_up=False):
    tw, pw = random_weights(G, N, K, gen, gate_up=gate_up)
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    x = random_tokens(int(offs[-1]), K, gen)
    xq, xs = quantize_fp8(x)
    return tw, pw, offs, xq, xs


def check(G, N, K, sizes, gen):
    """num_sms 0: every SM (about one unit per CTA here); 1: one SM's CTAs take every unit in turn (the ring's phases
    across units, the producer's waits at a unit boundary, the per-unit resets)."""
    tw, pw, offs, xq, xs = case(G, N, K, sizes, gen)
    starts = offs.tolist()
    groups = [(g, starts[g], sizes[g]) for g in range(G)]
    ref = gemm_reference(xq, xs, tw, groups)
    bound = gemm_error_bound(xq, xs, tw, groups)
    for num_sms in (0, 1):
        out = torch.full((xq.shape[0], N), POISON, dtype=torch.int16, device="cuda").view(torch.bfloat16)
        gemv(xq, xs, pw, offs, out, num_sms)
        torch.cuda.synchronize()
        what = f"gemv G={G} N={N} K={K} num_sms={num_sms}"
        within, rel = reference_bf16_step_check(out, ref, what, bound, small=float("inf"))  # every element bounded
        print(f"check {what} rows={sum(sizes)}: within one BF16 step {within:.4f}, rel {rel:.2e}", flush=True)


def check_l1_case(G, N, K, sizes, gen, clamp):
    tw, pw, offs, xq, xs = case(G, N, K, sizes, gen, gate_up=True)
    rows = xq.shape[0]
    topk_w = (torch.rand(rows, generator=gen) + 0.05).cuda()
    starts = offs.tolist()
    groups = [(g, starts[g], sizes[g]) for g in range(G)]
    q_ref, s_ref, bound = l1_reference(xq, xs, tw, groups, topk_w, clamp=clamp, with_bound=True)
    for num_sms in (0, 1):  # as check(): 1 reuses each CTA's maxima / scales across its units
        q = torch.full((rows, N // 2), 0x7F, dtype=torch.uint8, device="cuda")
        sc = torch.full((rows, N // 256), float("nan"), device="cuda")
        gemv_l1(xq, xs, pw, offs, topk_w, q, sc, clamp, num_sms)
        torch.cuda.synchronize()
        check_l1(q, sc, q_ref, s_ref, f"check L1 G={G} N={N} K={K} rows={rows} clamp={clamp} num_sms={num_sms}", bound)


def bench(name, E, N, K, tokens, topk, gen, bw, ws):
    """The touched experts only (random packed bytes: timing, not values; every shift byte indexes the table).
    The graph rotates over weight copies that together exceed the 50 MB L2, so every call streams its weights
    from HBM (time_cuda_graph: the project's timing, several calls per graph, no host gap)."""
    routed = torch.stack([torch.randperm(E, generator=gen)[:topk] for _ in range(tokens)]).flatten()
    sizes = [s for s in torch.bincount(routed, minlength=E).tolist() if s]
    G = len(sizes)
    C = layout.constants()
    shape = (G, N // 128, K // 128, C["kBlockChunkBytes"])
    copies = max(2, -(-(128 << 20) // (G * N * K // 2)))
    pws = [ops.PackedWeights(torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda"),
                             torch.full((G, N), 2.0 ** -8, device="cuda"), G, N, K, "L1" in name) for _ in range(copies)]
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    xq, xs = quantize_fp8(random_tokens(sum(sizes), K, gen))
    out = torch.empty((xq.shape[0], N), dtype=torch.bfloat16, device="cuda")
    t_gemv = time_cuda_graph([lambda pw=pw: gemv(xq, xs, pw, offs, out) for pw in pws]) * 1e6
    t_mma = time_cuda_graph([lambda pw=pw: ops.grouped_gemm(xq, xs, pw, group_offsets=offs, block_n=8, out=out,
                                                            splitk=ws) for pw in pws]) * 1e6
    floor = pws[0].packed.numel() / bw * 1e6
    if HAS_L1 and "L1" in name:  # the L1 epilogue (SwiGLU x top-k weight -> E4M3 + scales) on both paths
        rows = xq.shape[0]
        tkw = torch.rand(rows, device="cuda") + 0.05
        q = torch.empty((rows, N // 2), dtype=torch.uint8, device="cuda")
        sc = torch.empty((rows, N // 256), device="cuda")
        t_l1 = time_cuda_graph([lambda pw=pw: gemv_l1(xq, xs, pw, offs, tkw, q, sc) for pw in pws]) * 1e6
        t_l1w = time_cuda_graph([lambda pw=pw: ops.grouped_gemm_l1(xq, xs, pw, tkw, group_offsets=offs, block_n=8,
                                                                   out=(q, sc), splitk=ws) for pw in pws]) * 1e6
        print(f"{name:9s} T={tokens:3d} L1 epilogue: gemv_l1 {t_l1:7.1f} us, wgmma L1 (block_n 8, split-K) {t_l1w:7.1f} us, "
              f"floor {floor:6.1f}", flush=True)
    print(f"{name:9s} T={tokens:3d} groups {G:3d} rows {sum(sizes):4d}: gemv {t_gemv:7.1f} us, wgmma (block_n 8, "
          f"split-K) {t_mma:7.1f} us, HBM floor {floor:6.1f} us: gemv / floor {t_gemv / floor:4.2f}", flush=True)


def main():
    gen = torch.Generator().manual_seed(SEED)
    print(f"GPU {torch.cuda.get_device_name()}, {sys.argv[1:]}, {UNIT_ROWS}-row units")
    for G, N, K, sizes in [(1, 128, 128, [1]), (3, 256, 256, [0, 2, 1]), (8, 384, 512, [1, 0, 3, 1, 2, 0, 5, 1]),
                           (6, 4096, 2048, [1, 2, 1, 1, 0, 1]), (4, 256, 384, [17, 0, 9, 8]), (4, 7168, 3072, [1, 1, 2, 0])]:
        if N % UNIT_ROWS == 0:  # the pair build takes 256-row units
            check(G, N, K, sizes, gen)
    if HAS_L1:
        for G, N, K, sizes, clamp in [(3, 256, 256, [0, 2, 1], float("inf")), (4, 512, 384, [17, 0, 9, 8], 1.0),
                                      (6, 4096, 2048, [1, 2, 1, 1, 0, 1], float("inf"))]:
            check_l1_case(G, N, K, sizes, gen, clamp)
    bw = measure_hbm_copy()
    print(f"HBM copy {bw / 1e12:.2f} TB/s")
    ws = ops.SplitKWorkspace()
    for name, G, N, K in [("flash L1", 256, 4096, 4096), ("flash L2", 256, 4096, 2048),
                          ("pro L1", 384, 6144, 7168), ("pro L2", 384, 7168, 3072)]:
        for tokens in (1, 16, 64):
            bench(name, G, N, K, tokens, 6, gen, bw, ws)


if __name__ == "__main__":
    main()
