"""Per-instruction summary of `ncu --page source --csv --print-source sass` (one kernel): writes every
SASS line with its share of warp-stall samples, executions and top stall reasons; with --regions
a,b,label ... also totals per line range. Usage:
  python3 experiments/ncu_source.py src.csv [--dump out.txt] [--top N] [--per EXECS] [--regions a:b:label ...]"""
import argparse
import csv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--dump")
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("--per", type=float, default=1.0, help="divide executions by this (e.g. K blocks x warps)")
    ap.add_argument("--regions", nargs="*", default=[])
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv, errors="replace")))
    hi = next(i for i, r in enumerate(rows) if "Source" in r)
    hdr, data = rows[hi], rows[hi + 1:]
    ix = {c: i for i, c in enumerate(hdr)}

    def f(x):
        try:
            return float(x.replace(",", ""))
        except ValueError:
            return 0.0

    reasons = [c for c in hdr if c.startswith("stall_") and "Not Issued" not in c]
    S = ix["Warp Stall Sampling (All Samples)"]
    E = ix["Instructions Executed"]
    tot = sum(f(r[S]) for r in data) or 1.0
    lines = []
    for j, r in enumerate(data):
        rs = sorted(((f(r[ix[c]]), c[6:]) for c in reasons), reverse=True)[:3]
        lines.append(f"{j:5d} {100 * f(r[S]) / tot:5.2f}% ex={f(r[E]):10.0f} {r[ix['Source']][:72]:72s} "
                     + " ".join(f"{n}={v:.0f}" for v, n in rs if v))
    if a.dump:
        open(a.dump, "w").write("\n".join(lines) + "\n")
    if a.top:
        for j in sorted(sorted(range(len(data)), key=lambda j: -f(data[j][S]))[:a.top]):
            print(lines[j])
    for reg in a.regions:
        lo, hi_, label = reg.split(":", 2)
        sub = data[int(lo):int(hi_)]
        t = sum(f(r[S]) for r in sub)
        ex = sum(f(r[E]) for r in sub)
        rs = {c: sum(f(r[ix[c]]) for r in sub) for c in reasons}
        top = sorted(rs.items(), key=lambda x: -x[1])[:6]
        print(f"{label:20s} {lo}-{hi_} {100 * t / tot:5.1f}% instr {ex / a.per:7.1f} "
              + " ".join(f"{k[6:]}={100 * v / max(t, 1):.0f}%" for k, v in top))


if __name__ == "__main__":
    main()
