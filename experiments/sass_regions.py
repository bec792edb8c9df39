"""Spill instructions (STL / LDL) of each kernel in an object file, by setmaxnreg region: the SASS is
scanned in code order and each instruction is charged to the budget of the last USETMAXREG before it
(launch budget before the first). A layout heuristic (regions are contiguous in practice), good enough to
see which role spills. Needs cuobjdump on PATH (pip: nvidia-cuda-cuobjdump).
Usage: python experiments/sass_regions.py file.o [kernel-substring]"""
import re
import subprocess
import sys
from collections import Counter, defaultdict

obj = sys.argv[1]
want = sys.argv[2] if len(sys.argv) > 2 else ""
sass = subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True, check=True).stdout
fn = None
stats = defaultdict(Counter)
region = "launch"
for line in sass.splitlines():
    m = re.match(r"\s*Function : (\S+)", line)
    if m:
        fn, region = m.group(1), "launch"
        continue
    if fn is None or want not in fn:
        continue
    m = re.search(r"USETMAXREG\.(\w+)[.\w]*\s+(?:\w+,\s*)?(0x[0-9a-f]+|\d+)", line)
    if m:
        region = f"{m.group(1)}:{int(m.group(2), 0)}"
        continue
    if re.search(r"\bSTL\b|\bSTL\.", line):
        stats[(fn, region)]["STL"] += 1
    elif re.search(r"\bLDL\b|\bLDL\.", line):
        stats[(fn, region)]["LDL"] += 1
    elif re.search(r"/\*[0-9a-f]{4,}\*/", line):
        stats[(fn, region)]["instr"] += 1
for (f, r), c in sorted(stats.items()):
    m = re.search(r"MainloopConfigILi(\d+)ELi(\d+)", f)  # the fused / GEMM kernels: token tile, stages
    name = f"bn{m.group(1)}/st{m.group(2)}" if m else f[:60]
    print(f"{name:24s} {r:18s} instr {c['instr']:6d} STL {c['STL']:4d} LDL {c['LDL']:4d}")
