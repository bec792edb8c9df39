"""Spill instructions (STL / LDL) by setmaxnreg region AND source line (needs a -lineinfo build; nvdisasm
and cuobjdump on PATH). Usage: python experiments/sass_lines.py file.o kernel-substring [region-substring]"""
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

obj, want = sys.argv[1], sys.argv[2]
reg_want = sys.argv[3] if len(sys.argv) > 3 else ""
d = tempfile.mkdtemp()
subprocess.run(["cuobjdump", "-xelf", "all", os.path.abspath(obj)], cwd=d, check=True, capture_output=True)
cubins = [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".cubin")]
cnt = Counter()
for cb in cubins:
    out = subprocess.run(["nvdisasm", "-g", "-c", cb], capture_output=True, text=True).stdout
    fn, region, src = None, "launch", "?"
    for line in out.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
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
        if reg_want not in region:
            continue
        if re.search(r"\bSTL(\.\w+)*\s", line):
            cnt[(region, src, "STL")] += 1
        elif re.search(r"\bLDL(\.\w+)*\s", line):
            cnt[(region, src, "LDL")] += 1
for (r, s, k), n in sorted(cnt.items(), key=lambda kv: -kv[1])[:60]:
    print(f"{r:14s} {s:40s} {k} {n}")
