"""Split-K of the few-token GEMMs (fp4_gemm SplitKWorkspace): the layer's two expert GEMMs at 1-8 tokens
per rank (flash / pro shapes, one token per touched expert, 6 experts per token), without a workspace
and with one whose slot count caps the split at S = 1 .. 8 (fp4g_splitk_splits: S <= slots / units),
each timed by CUDA-graph replay; weight bytes over the time against the HBM copy bandwidth measured in
the same run. Results: bench/results/splitk-<date>-<commit>.{json,md}.
Usage: python bench/splitk.py"""
from __future__ import annotations

import torch

from common import header, measure_hbm_copy, time_cuda_graph, write_results
from gemm import gaussian_packed

from fp4_gemm import ops, quantize_fp8
from fp4_gemm._lib import LIB

SHAPES = {"flash": (4096, 2048), "pro": (7168, 3072)}  # H, I (megamoe/_costs.py PRESETS)


def main():
    hbm = measure_hbm_copy()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for preset, (H, I) in SHAPES.items():
        for T in (1, 4):
            G = 6 * T  # touched experts, one token each
            for gemm, (N, K) in (("L1", (2 * I, H)), ("L2", (H, I))):
                w = gaussian_packed(G, N, K)
                w.gate_up_interleave = gemm == "L1"
                wbytes = w.packed.numel() + w.row_scale.numel() * 4
                xq, xs = quantize_fp8(torch.randn(G, K, device="cuda").to(torch.bfloat16))
                offs = torch.arange(0, G + 1, dtype=torch.int32, device="cuda")
                topk_w = torch.rand(G, device="cuda")
                units = G * (N // 128) // (2 if gemm == "L1" else 1)
                ws_full = ops.SplitKWorkspace("cuda")

                def call(ws):
                    if gemm == "L1":
                        return lambda: ops.grouped_gemm_l1(xq, xs, w, topk_w, group_offsets=offs, block_n=8, splitk=ws)
                    return lambda: ops.grouped_gemm(xq, xs, w, group_offsets=offs, block_n=8, splitk=ws)

                base = time_cuda_graph(call(None))
                row = {"preset": preset, "tokens": T, "gemm": gemm, "N": N, "K": K, "units": units,
                       "none_us": base * 1e6, "none_hbm": wbytes / base / hbm}
                for S in range(1, 9):
                    slots = units * S
                    got = LIB.lib.fp4g_splitk_splits(units, 2 * sms, K // 128, slots)
                    if got != S:
                        continue
                    ws = ops.SplitKWorkspace("cuda", slots=slots)
                    t = time_cuda_graph(call(ws))
                    ops.check_errors()
                    row[f"S{S}_us"] = t * 1e6
                auto = time_cuda_graph(call(ws_full))
                row["auto_S"] = LIB.lib.fp4g_splitk_splits(units, 2 * sms, K // 128, ws_full.slots)
                row["auto_us"] = auto * 1e6
                row["auto_hbm"] = wbytes / auto / hbm
                row["floor_us"] = wbytes / hbm * 1e6
                print(f"[splitk] {preset} T={T} {gemm}: none {base * 1e6:.1f} us, auto S={row['auto_S']} "
                      f"{auto * 1e6:.1f} us (floor {row['floor_us']:.1f})", flush=True)
                rows.append(row)
                del w, ws_full
                torch.cuda.empty_cache()
    cols = ["preset", "tokens", "gemm", "units", "floor_us", "none_us", "auto_S", "auto_us", "auto_hbm"] + \
        [f"S{s}_us" for s in range(1, 9)]
    write_results("splitk", header({"hbm_tbs": hbm / 1e12}), rows, cols)


if __name__ == "__main__":
    main()
