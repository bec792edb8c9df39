"""Peer READ rate of small transfers on 2 GPUs (both directions at once), by SM loads vs TMA bulk copies
into shared memory vs the copy engine: is the pull combine's data phase (7.34 MB at 128 tokens, read as
512-byte pieces with LDG.128) limited by the SM load path? One process, both GPUs, peer access.
  python3 experiments/probes/peer_read_probe.py
Prints per-call time (back to back, no per-call event) and GB/s per direction for each method and size.
(peer_copy_probe.cu asks the same of contiguous copies, one event-timed launch each; its LDG kernel is a
lower bound below 58.7 MB. This one times the combine's access pattern the way bench/comm.py's
back-to-back column does.)"""
import statistics
import cupy as cp
import numpy as np

SRC = r'''
typedef unsigned long long u64;
extern "C" __global__ void __launch_bounds__(512, 1)
ldg_read(const int4* __restrict__ src, const int* __restrict__ rows, int nrows, int row16, int* out) {
  // item = (row, 512-byte piece): warp w takes items w, w + W, ... ; UNROLL pieces in flight per lane
  const int lane = threadIdx.x & 31;
  const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
  const long long W = (gridDim.x * (long long)blockDim.x) >> 5;
  const int pieces = row16 / 32;
  const long long total = (long long)nrows * pieces;
  int acc = 0;
  for (long long q0 = warp; q0 < total; q0 += 8 * W) {
    int4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const long long q = q0 + u * W;
      if (q < total) {
        const int r = rows[q / pieces], p = (int)(q % pieces);
        const int4* a = src + (long long)r * row16 + p * 32 + lane;
        asm volatile("ld.relaxed.sys.global.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(a) : "memory");
      } else v[u] = make_int4(0,0,0,0);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x7fffffff) out[0] = acc;
}
// TMA bulk copies: CTA b takes rows b, b + G, ...; thread 0 issues one cp.async.bulk per row (up to NBUF in
// flight) into shared memory, waits on the row's mbarrier, the CTA reads the row from smem (xor), next.
template <int NBUF>
__device__ void tma_read_impl(const char* src, const int* rows, int nrows, int row_bytes, int* out) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) u64 bar[NBUF];
  const unsigned sm0 = (unsigned)__cvta_generic_to_shared(smem);
  if (threadIdx.x < NBUF) {
    unsigned b = (unsigned)__cvta_generic_to_shared(&bar[threadIdx.x]);
    asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(b));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  int acc = 0;
  int mine = 0;  // rows of this CTA
  for (int r = blockIdx.x; r < nrows; r += gridDim.x) ++mine;
  auto issue = [&](int i) {  // i-th row of this CTA into buffer i % NBUF
    const int r = rows[blockIdx.x + i * gridDim.x];
    const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[i % NBUF]);
    const unsigned dst = sm0 + (i % NBUF) * row_bytes;
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(b), "r"(row_bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src + (long long)r * row_bytes), "r"(row_bytes), "r"(b) : "memory");
  };
  if (threadIdx.x == 0) for (int i = 0; i < NBUF && i < mine; ++i) issue(i);
  for (int i = 0; i < mine; ++i) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[i % NBUF]);
    const unsigned ph = (i / NBUF) & 1;
    unsigned ok = 0;
    while (!ok) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(b), "r"(ph) : "memory");
    const int4* s = reinterpret_cast<const int4*>(smem + (i % NBUF) * row_bytes);
    for (int j = threadIdx.x; j < row_bytes / 16; j += blockDim.x) { int4 v = s[j]; acc ^= v.x ^ v.w; }
    __syncthreads();  // buffer free
    if (threadIdx.x == 0 && i + NBUF < mine) issue(i + NBUF);
  }
  if (acc == 0x7fffffff) out[0] = acc;
}
extern "C" __global__ void __launch_bounds__(512, 1) tma_read2(const char* src, const int* rows, int nrows, int rb, int* out) { tma_read_impl<2>(src, rows, nrows, rb, out); }
extern "C" __global__ void __launch_bounds__(512, 1) tma_read8(const char* src, const int* rows, int nrows, int rb, int* out) { tma_read_impl<8>(src, rows, nrows, rb, out); }
'''

ROW = 14336


def main():
    ndev = cp.cuda.runtime.getDeviceCount()
    assert ndev >= 2, "needs 2 GPUs"
    mods, bufs, outs, streams = [], [], [], []
    cap_rows = 20000
    for d in range(2):
        with cp.cuda.Device(d):
            cp.cuda.runtime.deviceEnablePeerAccess(1 - d)
            mods.append(cp.RawModule(code=SRC, options=("-arch=sm_90a", "-std=c++17"), name_expressions=None))
            bufs.append(cp.random.randint(0, 2**31 - 1, size=cap_rows * ROW // 4, dtype=cp.int32))
            outs.append(cp.zeros(4, dtype=cp.int32))
            streams.append(cp.cuda.Stream(non_blocking=True))
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    rng = np.random.default_rng(0)

    def run(method, nrows, calls):
        rows_d = []
        for d in range(2):
            with cp.cuda.Device(d):
                rows_d.append(cp.asarray(rng.choice(cap_rows, size=nrows, replace=False).astype(np.int32)))
        ev = []
        for d in range(2):
            with cp.cuda.Device(d):
                src = bufs[1 - d].data.ptr  # the peer's memory
                a, b = cp.cuda.Event(), cp.cuda.Event()
                s = streams[d]
                if method == "ce":
                    dst = cp.empty(nrows * ROW // 4, dtype=cp.int32)
                    # contiguous copy of the same bytes (the copy engine's best case)
                    f = lambda dst=dst, d=d, src=src, s=s: cp.cuda.runtime.memcpyPeerAsync(dst.data.ptr, d, src, 1 - d, nrows * ROW, s.ptr)
                elif method == "ldg":
                    k = mods[d].get_function("ldg_read")
                    args = (np.uint64(src), rows_d[d], np.int32(nrows), np.int32(ROW // 16), outs[d])
                    f = lambda k=k, args=args, s=s: k((sms,), (512,), args, stream=s)
                else:
                    nb = 2 if method == "tma2" else 8
                    k = mods[d].get_function(f"tma_read{nb}")
                    smem = nb * ROW
                    k.max_dynamic_shared_size_bytes = smem
                    args = (np.uint64(src), rows_d[d], np.int32(nrows), np.int32(ROW), outs[d])
                    f = lambda k=k, args=args, smem=smem, s=s: k((sms,), (512,), args, stream=s, shared_mem=smem)
                for _ in range(3):
                    f()
                ev.append((a, b, f, s))
        for d in range(2):
            with cp.cuda.Device(d):
                ev[d][3].synchronize()
        # both GPUs at once: launch the sequences interleaved
        for d in range(2):
            with cp.cuda.Device(d):
                ev[d][0].record(ev[d][3])
        for _ in range(calls):
            for d in range(2):
                with cp.cuda.Device(d):
                    ev[d][2]()
        for d in range(2):
            with cp.cuda.Device(d):
                ev[d][1].record(ev[d][3])
        ts = []
        for d in range(2):
            with cp.cuda.Device(d):
                ev[d][1].synchronize()
                ts.append(cp.cuda.get_elapsed_time(ev[d][0], ev[d][1]) * 1e3 / calls)
        return max(ts)

    print(f"SMs {sms}; row {ROW} B; both directions at once; per call, back to back ({'no per-call events'})")
    for nrows in (512, 4096, 16384):
        for method in ("ce", "ldg", "tma2", "tma8"):
            t = statistics.median(run(method, nrows, 20) for _ in range(5))
            mb = nrows * ROW / 1e6
            print(f"rows {nrows:6d} ({mb:7.2f} MB)  {method:5s}  {t:8.2f} us  {mb * 1e6 / t / 1e3:7.1f} GB/s")


if __name__ == "__main__":
    main()
