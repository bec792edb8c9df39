// Peer-copy probe (2 GPUs, one process, peer access): LDG/STG vs TMA bulk (cp.async.bulk) vs copy engine,
// both GPUs copying at once, one launch each, CUDA events, best of 10. Not part of the build:
//   nvcc -O3 -arch=sm_90a -std=c++17 -o peer_copy_probe experiments/probes/peer_copy_probe.cu && ./peer_copy_probe
// Result (2 x H200, 2026-11-30): TMA reads = LDG reads at every size (docs/perf-notes-symm_comm.md section 3).
// Note: sm_copy runs its unrolled loop only when a thread has >= 8 vectors (58.7 MB); smaller sizes take the
// one-vector tail loop (one round trip per vector), so its small-size numbers are a lower bound.
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cstdlib>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("ERR %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__global__ void __launch_bounds__(512, 1) sm_copy(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  constexpr int U = 8;
  for (; i + (U - 1) * stride < n; i += U * stride) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) asm volatile("ld.relaxed.sys.global.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(src + i + u * stride));
#pragma unroll
    for (int u = 0; u < U; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Each CTA: chunks of CH bytes, S stages; thread 0 issues bulk load (src->smem) then bulk store (smem->dst).
template <int CH, int S>
__global__ void __launch_bounds__(32, 1) tma_copy(const char* src, char* dst, size_t nbytes) {
  extern __shared__ __align__(128) char sm[];
  __shared__ __align__(8) uint64_t bar[S];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(sa(&bar[s])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  size_t nch = nbytes / CH;
  uint32_t ph[S] = {0};
  int it = 0;
  // prologue: issue S loads
  size_t c0 = blockIdx.x;
  for (int s = 0; s < S; ++s) {
    size_t c = c0 + (size_t)s * gridDim.x;
    if (c >= nch) break;
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(sa(&bar[s])), "r"(CH));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(sa(sm + s * CH)), "l"(src + c * CH), "r"(CH), "r"(sa(&bar[s])) : "memory");
  }
  for (size_t c = c0; c < nch; c += gridDim.x, ++it) {
    int s = it % S;
    // wait
    uint32_t done = 0;
    while (!done) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0,1,0,p; }" : "=r"(done) : "r"(sa(&bar[s])), "r"(ph[s]));
    ph[s] ^= 1;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" :: "l"(dst + c * CH), "r"(sa(sm + s * CH)), "r"(CH) : "memory");
    asm volatile("cp.async.bulk.commit_group;");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    size_t cn = c + (size_t)S * gridDim.x;
    if (cn < nch) {
      asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(sa(&bar[s])), "r"(CH));
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   :: "r"(sa(sm + s * CH)), "l"(src + cn * CH), "r"(CH), "r"(sa(&bar[s])) : "memory");
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

struct Dev { char* a; char* b; cudaStream_t st; cudaEvent_t e0, e1; };

int main(int argc, char** argv) {
  int n; CK(cudaGetDeviceCount(&n));
  if (n < 2) { printf("need 2 GPUs\n"); return 1; }
  const size_t MAXB = 64ull << 20;
  Dev d[2];
  for (int g = 0; g < 2; ++g) {
    CK(cudaSetDevice(g));
    CK(cudaDeviceEnablePeerAccess(1 - g, 0));
    CK(cudaMalloc(&d[g].a, MAXB)); CK(cudaMalloc(&d[g].b, MAXB));
    CK(cudaMemset(d[g].a, g + 1, MAXB)); CK(cudaMemset(d[g].b, 0, MAXB));
    CK(cudaStreamCreateWithFlags(&d[g].st, cudaStreamNonBlocking));
    CK(cudaEventCreate(&d[g].e0)); CK(cudaEventCreate(&d[g].e1));
    CK(cudaFuncSetAttribute(tma_copy<16384, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 16384 * 8));
    CK(cudaFuncSetAttribute(tma_copy<8192, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, 8192 * 8));
    CK(cudaFuncSetAttribute(tma_copy<4096, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4096 * 16));
    CK(cudaFuncSetAttribute(tma_copy<32768, 6>, cudaFuncAttributeMaxDynamicSharedMemorySize, 32768 * 6));
    CK(cudaFuncSetAttribute(tma_copy<2048, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, 2048 * 16));
  }
  CK(cudaSetDevice(0)); CK(cudaDeviceSynchronize());
  // modes: 0 sm read (dst local, src peer), 1 sm write (src local, dst peer), 2 ce read, 3 ce write,
  // 4.. tma read variants, then tma write variants
  const char* names[] = {"sm_read", "sm_write", "ce_read", "ce_write",
                         "tma_read_16Kx8", "tma_read_8Kx8", "tma_read_4Kx16", "tma_read_32Kx6", "tma_read_2Kx16",
                         "tma_write_16Kx8", "tma_write_8Kx8", "tma_write_4Kx16", "tma_write_2Kx16",
                         "tma_read_16Kx8_x2cta", "tma_read_4Kx16_x2cta"};
  const int nm = sizeof(names) / sizeof(names[0]);
  size_t sizes[] = {7340032, 14680064, 58720256};
  for (size_t nb : sizes) {
    for (int m = 0; m < nm; ++m) {
      std::vector<float> best(2, 1e30f);
      for (int rep = 0; rep < 12; ++rep) {
        for (int g = 0; g < 2; ++g) {
          CK(cudaSetDevice(g));
          bool rd = (m == 0 || m == 2 || (m >= 4 && m <= 8) || m >= 13);
          const char* src = rd ? d[1 - g].a : d[g].a;
          char* dst = rd ? d[g].b : d[1 - g].b;
          CK(cudaEventRecord(d[g].e0, d[g].st));
          switch (m) {
            case 0: case 1: sm_copy<<<132, 512, 0, d[g].st>>>((const int4*)src, (int4*)dst, nb / 16); break;
            case 2: case 3: CK(cudaMemcpyPeerAsync(dst, rd ? g : 1 - g, src, rd ? 1 - g : g, nb, d[g].st)); break;
            case 4: case 9: tma_copy<16384, 8><<<132, 32, 16384 * 8, d[g].st>>>(src, dst, nb); break;
            case 5: case 10: tma_copy<8192, 8><<<132, 32, 8192 * 8, d[g].st>>>(src, dst, nb); break;
            case 6: case 11: tma_copy<4096, 16><<<132, 32, 4096 * 16, d[g].st>>>(src, dst, nb); break;
            case 7: tma_copy<32768, 6><<<132, 32, 32768 * 6, d[g].st>>>(src, dst, nb); break;
            case 8: case 12: tma_copy<2048, 16><<<132, 32, 2048 * 16, d[g].st>>>(src, dst, nb); break;
            case 13: tma_copy<16384, 8><<<264, 32, 16384 * 8, d[g].st>>>(src, dst, nb); break;
            case 14: tma_copy<4096, 16><<<264, 32, 4096 * 16, d[g].st>>>(src, dst, nb); break;
          }
          CK(cudaGetLastError());
          CK(cudaEventRecord(d[g].e1, d[g].st));
        }
        for (int g = 0; g < 2; ++g) {
          CK(cudaSetDevice(g)); CK(cudaStreamSynchronize(d[g].st));
          float ms; CK(cudaEventElapsedTime(&ms, d[g].e0, d[g].e1));
          if (rep >= 2 && ms < best[g]) best[g] = ms;
        }
      }
      // verify a sample: dst bytes must equal the source's fill
      float t = best[0] > best[1] ? best[0] : best[1];
      printf("%-22s %9.2f MB  %8.2f us  %7.1f GB/s per direction\n", names[m], nb / 1e6, t * 1e3, nb / (t * 1e-3) / 1e9);
    }
    // check correctness of last tma mode
    for (int g = 0; g < 2; ++g) {
      CK(cudaSetDevice(g));
      std::vector<unsigned char> h(4096);
      CK(cudaMemcpy(h.data(), d[g].b + nb - 4096, 4096, cudaMemcpyDeviceToHost));
      int bad = 0; for (auto c : h) bad += c != (unsigned char)(2 - g);
      if (bad) printf("CHECK FAIL gpu %d: %d bad\n", g, bad);
    }
  }
  printf("done\n");
  return 0;
}
