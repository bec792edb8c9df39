"""Diagnostic: the gap between two back-to-back kernels on one stream (the 5.5-6 us "gap d->c" of
experiments/comm_stamps.py: how much of it is the launch itself?). Kernel A's last CTA out stamps %globaltimer
at its end, kernel B's CTA 0 stamps at its start; gap = B.start - A.end. Variants: CTA shape (128
threads / 512 threads + 100 KB dynamic shared memory, 1 CTA per SM: the symm_comm kernels' shape), with
and without a CUDA event recorded between the two (bench/comm.py records one after every call), and
the host enqueuing ahead (stream parked on a sleep kernel first) as in common.time_cuda_sequence.
Last rows: programmatic dependent launch (cuLaunchKernelEx with the programmatic-stream-serialization
attribute; A calls griddepcontrol.launch_dependents at its start, B griddepcontrol.wait after its start
stamp): B's first instruction and B after its wait, against A's end; once plain, once with the
cooperative attribute too (our kernels' launch). Run on one GPU: python3 experiments/launch_gap_probe.py"""
from __future__ import annotations

import ctypes
import statistics

import cupy as cp

SRC = r"""
// pdl != 0 (the programmatic-dependent-launch rows): launch dependents at once, stamp the first
// instruction (st[2 which]), then griddepcontrol.wait and stamp again (st[8 + which]).
extern "C" __global__ void stampk(unsigned long long* st, unsigned int* ctr, int which, int work, int pdl) {
  extern __shared__ int smem[];
  unsigned long long t;
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (blockIdx.x == 0 && threadIdx.x == 0) st[2 * which] = t;
  if (pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (blockIdx.x == 0 && threadIdx.x == 0) st[8 + which] = t;
  }
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


class _Attr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("nattrs", ctypes.c_uint)]


def _launch_ex(fn_ptr, grid, block, smem, stream_ptr, args, attrs):
    """cuLaunchKernelEx through ctypes; args: ctypes scalars; attrs: [(id, int value)]."""
    cuda = ctypes.CDLL("libcuda.so.1")
    arr = (_Attr * max(len(attrs), 1))()
    for i, (aid, val) in enumerate(attrs):
        arr[i].id, arr[i].value = aid, val
    cfg = _Config(grid, 1, 1, block, 1, 1, smem, ctypes.c_void_p(stream_ptr), arr, len(attrs))
    params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
    rc = cuda.cuLaunchKernelEx(ctypes.byref(cfg), ctypes.c_void_p(fn_ptr), params, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx: CUresult {rc}")


def _fn_ptr(f):
    return f.kernel.ptr if hasattr(f, "kernel") else f.ptr


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
                    k((sms,), (threads,), (st, ctr, cp.int32(0), cp.int32(2000), cp.int32(0)), shared_mem=smem)
                    if ev_between:
                        cp.cuda.Event().record(stream)
                    k((sms,), (threads,), (st, ctr, cp.int32(1), cp.int32(2000), cp.int32(0)), shared_mem=smem)
                stream.synchronize()
                s = [int(v) for v in st.get()]
                if rep >= 10:
                    gaps.append((s[2] - s[1]) / 1e3)
                    durs.append((s[1] - s[0]) / 1e3)
            print(f"| {threads} thr, {smem // 1024} KB smem | {'yes' if ev_between else 'no'} | "
                  f"{statistics.median(gaps):.2f} | {statistics.median(durs):.2f} |", flush=True)

    # Programmatic dependent launch, 512 threads + 100 KB (the symm_comm shape; its smem attribute is
    # set above), no event between.
    smem = 100 * 1024
    fp = _fn_ptr(k)
    print("| PDL variant | B first instruction - A end us | B after griddepcontrol.wait - A end us |")
    print("|---|---|---|")
    for name, extra in (("PDL", []), ("PDL + cooperative", [(2, 1)])):
        try:
            starts, waits = [], []
            for rep in range(60):
                with stream:
                    park((1,), (1,), (cp.uint64(2_000_000),))
                for which, attrs in ((0, extra), (1, extra + [(6, 1)])):
                    args = [ctypes.c_uint64(st.data.ptr), ctypes.c_uint64(ctr.data.ptr), ctypes.c_int(which),
                            ctypes.c_int(2000), ctypes.c_int(1)]
                    _launch_ex(fp, sms, 512, smem, stream.ptr, args, attrs)
                stream.synchronize()
                s = [int(v) for v in st.get()]
                if rep >= 10:
                    starts.append((s[2] - s[1]) / 1e3)
                    waits.append((s[9] - s[1]) / 1e3)
            print(f"| {name} | {statistics.median(starts):.2f} | {statistics.median(waits):.2f} |", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"| {name} | failed: {e} | |", flush=True)


if __name__ == "__main__":
    main()
