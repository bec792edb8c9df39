"""Summarise an `ncu --csv` metrics dump: per profiled kernel, its duration, instructions executed and
the largest warp-stall reasons (smsp__average_warps_issue_stalled_*_per_issue_active.ratio: warps
stalled for that reason per issued instruction). Usage: python3 experiments/ncu_stalls.py ncu.csv [top]"""
import csv
import sys
from collections import OrderedDict


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    lines = open(path).read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print("".join(lines[-20:]))
        return
    kern = OrderedDict()
    for row in csv.DictReader(lines[start:]):
        k = kern.setdefault(row["ID"], {"name": row["Kernel Name"][:60], "m": {}})
        try:
            k["m"][row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            pass
    pre, suf = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
    for kid, k in kern.items():
        m = k["m"]
        st = sorted(((v, n[len(pre):-len(suf)]) for n, v in m.items() if n.startswith(pre)), reverse=True)
        tot = sum(v for v, _ in st) or 1.0
        print(f"[{kid}] {k['name']} time {m.get('gpu__time_duration.sum', 0) / 1e3:.1f} us, "
              f"inst {m.get('smsp__inst_executed.sum', 0):.0f}")
        print("    " + ", ".join(f"{n} {v:.2f} ({100 * v / tot:.0f}%)" for v, n in st[:top]))


if __name__ == "__main__":
    main()
