"""Spill instructions (STL / LDL) of each kernel in an object file, by setmaxnreg region: the SASS is
scanned in code order and each instruction is charged to the budget of the last USETMAXREG before it
(launch budget before the first). A layout heuristic (regions are contiguous in practice), good enough to
see which role spills. With --lines REGION (a -lineinfo build): the spills of the regions whose name
contains REGION by source line instead. Needs cuobjdump and nvdisasm on PATH (pip: nvidia-cuda-cuobjdump,
nvidia-cuda-nvdisasm).
Usage: python experiments/sass_regions.py file.o [kernel-substring] [--lines REGION]"""
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict

args = [a for a in sys.argv[1:] if a != "--lines"]
lines_of = None
if "--lines" in sys.argv:
    lines_of = sys.argv[sys.argv.index("--lines") + 1]
    args.remove(lines_of)
obj, want = args[0], (args[1] if len(args) > 1 else "")


def sass_text() -> str:
    if lines_of is None:
        return subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True, check=True).stdout
    d = tempfile.mkdtemp()
    subprocess.run(["cuobjdump", "-xelf", "all", os.path.abspath(obj)], cwd=d, check=True, capture_output=True)
    return "".join(subprocess.run(["nvdisasm", "-g", "-c", os.path.join(d, f)], capture_output=True, text=True).stdout
                   for f in sorted(os.listdir(d)) if f.endswith(".cubin"))


stats = defaultdict(Counter)
fn, region, src = None, "launch", "?"
for line in sass_text().splitlines():
    m = re.match(r"\s*Function : (\S+)", line) or re.match(r"\s*\.text\.(\S+):", line)
    if m:
        fn, region = m.group(1), "launch"
        continue
    if fn is None or want not in fn:
        continue
    m = re.search(r'//## File "([^"]+)", line (\d+)', line)
    if m:
        src = f"{os.path.basename(m.group(1))}:{m.group(2)}"
        continue
    m = re.search(r"USETMAXREG\.(\w+)[.\w]*\s+(?:\w+,\s*)?(0x[0-9a-f]+|\d+)", line)
    if m:
        region = f"{m.group(1)}:{int(m.group(2), 0)}"
        continue
    kind = "STL" if re.search(r"\bSTL(\.\w+)*\s", line) else "LDL" if re.search(r"\bLDL(\.\w+)*\s", line) else None
    if lines_of is not None:
        if kind and lines_of in region:
            stats[(region, src)][kind] += 1
    elif kind:
        stats[(fn, region)][kind] += 1
    elif re.search(r"/\*[0-9a-f]{4,}\*/", line):
        stats[(fn, region)]["instr"] += 1
if lines_of is not None:
    for (r, s), c in sorted(stats.items(), key=lambda kv: -sum(kv[1].values()))[:60]:
        print(f"{r:14s} {s:40s} STL {c['STL']:4d} LDL {c['LDL']:4d}")
    sys.exit(0)
for (f, r), c in sorted(stats.items()):
    m = re.search(r"MainloopConfigILi(\d+)ELi(\d+)", f)  # the fused / GEMM kernels: token tile, stages
    name = f"bn{m.group(1)}/st{m.group(2)}" if m else f[:60]
    print(f"{name:24s} {r:18s} instr {c['instr']:6d} STL {c['STL']:4d} LDL {c['LDL']:4d}")
