"""Side-by-side markdown of experiments/ab_before_after.sh's logs: every bench/gemm.py case (ours_us) and
every bench/comm.py row (event-timed and kernel times of dispatch / combine), before / after and their
ratio, with the verdict of issue 23's bar (no case slower than 3 %).
Usage: python experiments/ab_table.py LOG_DIR > table.md"""
import glob
import os
import sys

d = sys.argv[1]


def rows(path):
    out = []
    for line in open(path, errors="replace"):
        if line.startswith("| ") and not line.startswith("| case") and not line.startswith("| tokens"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells and not cells[0].startswith("---"):
                out.append(cells)
    return out


worst = 0.0
print("| bench | case | round | before | after | after / before |\n|---|---|---|---|---|---|")
for before in sorted(glob.glob(os.path.join(d, "ab_*_before_*.log"))):
    after = before.replace("_before_", "_after_")
    if not os.path.exists(after):
        continue
    name = os.path.basename(before)[3:].split("_before_")[0]
    rnd = before.rsplit("_", 1)[1].split(".")[0]
    # Join by key (gemm: case + weights; comm: tokens), not by position: the two trees' case lists
    # differ (the after tree has cases the before tree lacks; those rows print as "new").
    gemm = name == "gemm"
    key = (lambda c: f"{c[0]} {c[1]}") if gemm else (lambda c: c[0])
    b = {key(x): x for x in rows(before)}
    for y in rows(after):
        x = b.get(key(y))
        if x is None:
            print(f"| {name} | {key(y)} (new) | {rnd} | - | {y[2] if gemm else y[1]} | - |")
            continue
        if gemm:  # case, weights, ours_us
            items = [(key(x), x[2], y[2])]
        else:  # tokens, dispatch, combine, ..., [10] dispatch kernel, [11] combine kernel
            items = [(f"{x[0]} tok {k}", x[i], y[i]) for k, i in
                     (("dispatch", 1), ("combine", 2), ("dispatch kernel", 10), ("combine kernel", 11))]
        for case, vb, va in items:
            try:
                r = float(va) / float(vb)
            except (ValueError, ZeroDivisionError):
                continue
            worst = max(worst, r)
            print(f"| {name} | {case} | {rnd} | {vb} | {va} | {r:.3f} |")
print(f"\nSlowest after / before: {worst:.3f} ({'within' if worst <= 1.03 else 'OVER'} the 3 % bar)")
