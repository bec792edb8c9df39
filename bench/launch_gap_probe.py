"""Diagnostic: the gap between two back-to-back kernels on one stream (the 5.5-6 us "gap d->c" of
bench/comm_stamps.py: how much of it is the launch itself?). Kernel A's last CTA out stamps %globaltimer
at its end, kernel B's CTA 0 stamps at its start; gap = B.start - A.end. Variants: CTA shape (128
threads / 512 threads + 100 KB dynamic shared memory, 1 CTA per SM: the symm_comm kernels' shape), with
and without a CUDA event recorded between the two (bench/comm.py records one after every call), and
the host enqueuing ahead (stream parked on a sleep kernel first) as in common.time_cuda_sequence.
Run on one GPU: python3 bench/launch_gap_probe.py"""
from __future__ import annotations

import statistics

import cupy as cp

SRC = r"""
extern "C" __global__ void stampk(unsigned long long* st, unsigned int* ctr, int which, int work) {
  extern __shared__ int smem[];
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (blockIdx.x == 0 && threadIdx.x == 0) st[2 * which] = t;
  float x = threadIdx.x;
  for (int i = 0; i < work; ++i) x = x * 0.999f + 1.0f;   // a little work so the CTAs overlap
  if (x == -1.f) smem[threadIdx.x] = 1;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(ctr + which, 1u) == gridDim.x - 1) {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      st[2 * which + 1] = t;
      ctr[which] = 0u;
    }
  }
}
extern "C" __global__ void park(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def main():
    dev = cp.cuda.Device(0)
    sms = dev.attributes["MultiProcessorCount"]
    mod = cp.RawModule(code=SRC)
    k = mod.get_function("stampk")
    park = mod.get_function("park")
    st = cp.zeros(16, cp.uint64)
    ctr = cp.zeros(8, cp.uint32)
    stream = cp.cuda.Stream(non_blocking=True)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {sms} SMs")
    print("| CTA shape | event between | gap A.end -> B.start us (median of 50) | A duration us |")
    print("|---|---|---|---|")
    for threads, smem in ((128, 0), (512, 100 * 1024)):
        if smem:
            k.max_dynamic_shared_size_bytes = smem
        for ev_between in (False, True):
            gaps, durs = [], []
            for rep in range(60):
                with stream:
                    park((1,), (1,), (cp.uint64(2_000_000),))  # host enqueues the pair meanwhile
                    k((sms,), (threads,), (st, ctr, cp.int32(0), cp.int32(2000)), shared_mem=smem)
                    if ev_between:
                        cp.cuda.Event().record(stream)
                    k((sms,), (threads,), (st, ctr, cp.int32(1), cp.int32(2000)), shared_mem=smem)
                stream.synchronize()
                s = [int(v) for v in st.get()]
                if rep >= 10:
                    gaps.append((s[2] - s[1]) / 1e3)
                    durs.append((s[1] - s[0]) / 1e3)
            print(f"| {threads} thr, {smem // 1024} KB smem | {'yes' if ev_between else 'no'} | "
                  f"{statistics.median(gaps):.2f} | {statistics.median(durs):.2f} |", flush=True)


if __name__ == "__main__":
    main()
