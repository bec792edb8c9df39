"""Loops holding wgmma (QGMMA / HGMMA) in each kernel of an object / shared library, innermost first: instructions
between a backward branch's target and the branch, how many GMMA / R2UR / STL / LDL they hold. What the
perf notes call "instructions per K-block pair" is the length of the unrolled-by-two mainloops.
Needs cuobjdump on PATH. Usage: python experiments/sass_loops.py file.so [kernel-substring]"""
import re
import subprocess
import sys

obj, want = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
sass = subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True, check=True).stdout
for fn in re.split(r"\n\s+Function : ", sass)[1:]:
    name = fn.split("\n", 1)[0].strip()
    if want not in name:
        continue
    ins = []  # (address, text)
    for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", fn):
        ins.append((int(m.group(1), 16), m.group(2)))
    idx = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, t) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", t)
        if m:
            tgt = int(m.group(1), 16)
            if tgt <= a and tgt in idx:
                body = [x for _, x in ins[idx[tgt]:i + 1]]
                n_mma = sum("GMMA" in x for x in body)
                if n_mma:
                    loops.append((len(body), n_mma, sum("R2UR" in x for x in body), sum(" STL" in x for x in body),
                                  sum(" LDL" in x for x in body), hex(tgt)))
    short = re.sub(r"_GLOBAL__N__[0-9a-f_]+", "", name)[:110]
    print(short)
    for n, h, r, s, l, at in sorted(loops)[:6]:
        print(f"   {n} instr, GMMA {h}, R2UR {r}, STL {s}, LDL {l}")
