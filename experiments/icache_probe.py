"""Diagnostic: how fast does an SM run straight-line code it has not cached? (the hypothesis in
docs/perf-notes-symm_comm.md section 2, "Code size halved": symm_comm's small calls are instruction-fetch bound).
Kernels of N KB of independent FFMAs (8 accumulators, no loop, no memory traffic inside), one CTA per
SM, timed with %globaltimer by CTA 0 (start) and the last CTA out (end). Each kernel runs twice in a row
(cold, then with its code possibly still cached) and alternates with a different kernel of the same
size (what a dispatch -> combine sequence does). Prints us and KB/us per (threads, KB, run).
Run on one GPU: python3 experiments/icache_probe.py"""
from __future__ import annotations

import cupy as cp

SIZES_KB = [8, 32, 64, 128, 256]
THREADS = [128, 512]


def source(name: str, n_instr: int, salt: float) -> str:
    body = []
    for i in range(n_instr):
        a = i % 8
        body.append(f"a{a} = fmaf(a{a}, m, {salt + i * 1e-7:.9f}f);")
    body = "\n    ".join(body)
    return f"""
extern "C" __global__ void {name}(const float* in, float* out, unsigned long long* st, unsigned int* ctr) {{
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (blockIdx.x == 0 && threadIdx.x == 0) st[0] = t0;
  float m = in[threadIdx.x & 31];
  float a0 = in[0], a1 = in[1], a2 = in[2], a3 = in[3], a4 = in[4], a5 = in[5], a6 = in[6], a7 = in[7];
  {body}
  out[blockIdx.x * blockDim.x + threadIdx.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
  __syncthreads();
  if (threadIdx.x == 0) {{
    __threadfence();
    if (atomicAdd(ctr, 1u) == gridDim.x - 1) {{
      unsigned long long t1;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
      st[1] = t1;
      *ctr = 0u;
    }}
  }}
}}"""


def main():
    dev = cp.cuda.Device(0)
    sms = dev.attributes["MultiProcessorCount"]
    inp = cp.random.rand(64, dtype=cp.float32) + 0.5
    out = cp.zeros(sms * 1024, cp.float32)
    st = cp.zeros(2, cp.uint64)
    ctr = cp.zeros(1, cp.uint32)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {sms} SMs")
    print("| threads | code KB | kernel | run | us | KB/us |")
    print("|---|---|---|---|---|---|")
    for kb in SIZES_KB:
        n = kb * 1024 // 16
        mods = [cp.RawModule(code=source(f"k{j}", n, 0.25 + j)) for j in range(2)]
        ks = [m.get_function(f"k{j}") for j, m in enumerate(mods)]
        for threads in THREADS:
            for rep in range(3):
                for j, k in enumerate(ks):
                    for run in range(2):
                        k((sms,), (threads,), (inp, out, st, ctr))
                        cp.cuda.runtime.deviceSynchronize()
                        t0, t1 = (int(v) for v in st.get())
                        us = (t1 - t0) / 1e3
                        if rep == 2:
                            print(f"| {threads} | {kb} | k{j} | {'cold' if run == 0 else 'again'} | {us:.2f} | "
                                  f"{kb / us if us > 0 else 0:.1f} |", flush=True)


if __name__ == "__main__":
    main()
