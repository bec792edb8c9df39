"""A few split-K GEMM calls for compute-sanitizer (memcheck / racecheck / synccheck): BF16 8-token and
L1 16-token kernels, small shapes that split (fewer tiles than CTAs), checked against the unsplit call.
Usage: compute-sanitizer --tool racecheck python3 bench/profile_splitk.py [nosplit]
(nosplit: the same calls without the workspace, for comparison)"""
import sys

import torch

from fp4_gemm import numerics as nm, ops, quantize_fp8

torch.manual_seed(0)
ws = ops.SplitKWorkspace("cuda")
use = None if "nosplit" in sys.argv else ws
for l1, bn, (G, N, K) in ((False, 8, (3, 256, 2048)), (True, 16, (2, 512, 2048))):
    tw = nm.transform_weights(*nm.quantize_mxfp4(torch.randn(G, N, K)), gate_up_interleave=l1)
    pw = ops.prepare_weights(tw)
    sizes = [1, 3, 2][:G]
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    xq, xs = quantize_fp8(torch.randn(sum(sizes), K, device="cuda", dtype=torch.bfloat16))
    if l1:
        w = torch.rand(sum(sizes), device="cuda")
        qa, a = ops.grouped_gemm_l1(xq, xs, pw, w, group_offsets=offs, block_n=bn, splitk=use)
        qb, b = ops.grouped_gemm_l1(xq, xs, pw, w, group_offsets=offs, block_n=bn)
        codes = float((qa.view(torch.uint8) != qb.view(torch.uint8)).double().mean())
        print(f"split-K L1 bn{bn}: E4M3 codes differing from unsplit {codes:.4f}")
        assert codes < 0.01  # a different sum order may move a code by one step, rarely
    else:
        a = ops.grouped_gemm(xq, xs, pw, group_offsets=offs, block_n=bn, splitk=use).float()
        b = ops.grouped_gemm(xq, xs, pw, group_offsets=offs, block_n=bn).float()
    torch.cuda.synchronize()
    ops.check_errors()
    err = float((a - b).abs().max() / b.abs().max())
    print(f"split-K {'L1' if l1 else 'BF16'} bn{bn}: max rel diff to unsplit {err:.2e}, counters {int(ws.counters.abs().sum())}")
    assert err < 2e-2 and int(ws.counters.abs().sum()) == 0
print("ok")
