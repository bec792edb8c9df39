// Standalone grouped FP8 x MXFP4 GEMM (contiguous and masked layouts), BF16 output.
// A thin composition of the headers: scheduler + mainloop (producer / math roles) + epilogue.
#include <algorithm>
#include <cuda.h>
#include <cuda_runtime.h>

#include "fp4_gemm/roles.cuh"
#include "fp4_gemm_api.h"
#include "tensor_map.h"

// FP4_TOKEN_MULTICAST (compile-time, default on; -DFP4_TOKEN_MULTICAST=0 turns it off): the
// 128-token kRegs kernel runs as 2-CTA clusters sharing each token tile through TMA multicast
// (MainloopConfig::kMulticast). Measured +2-3 % prefill on H200 (docs/perf-notes.md): each CTA
// pulls half the token tile from L2, the feed that capped the loop.
#ifndef FP4_TOKEN_MULTICAST
#define FP4_TOKEN_MULTICAST 1
#endif

namespace fp4_gemm {
namespace {

constexpr bool kTokenMulticast128 = FP4_TOKEN_MULTICAST != 0;

constexpr int kThreads = 128 + kMathThreads;  // producer warpgroup + math warpgroups
constexpr int kMaxDevices = 64;

struct GemmArgs {
  GroupedProblem pb;
  WeightOperand w;
  TokenOperand x;
  EpilogueParams epi;  // BF16 rows [rows][n], or the L1 epilogue's arguments
  int32_t* err;        // moe::kErrWords device words (no host mirror, rank or epoch: a standalone GEMM)
  uint64_t timeout_ns;  // per pipeline wait (the host's limit: a stuck pipeline, not a slow one)
};

using Epilogue = EpilogueKind;
// Named barriers (the kernel's one list): 0 = __syncthreads (also inside the unit table's build,
// before the roles split); 1 = all 256 math threads (the L1 epilogue, the split-K arrival);
// 2 + wg = the staged BF16 store of math warpgroup wg.
constexpr MathBarriers kMathBarriers{1, 2};
static_assert(kMathBarriers.store0 > kMathBarriers.math && kMathBarriers.store0 + WL::kMathThreads / 128 <= 16,
              "named barrier ids");

template <class Cfg, Epilogue kEpi>
__global__ void __launch_bounds__(kThreads, Cfg::kCtasPerSm)
grouped_gemm_kernel(const __grid_constant__ CUtensorMap tmap_x, const GemmArgs args) {
  // The dynamic shared memory window starts at offset 0 (no static shared memory in this kernel),
  // so it is 1024-byte aligned as the 128-byte swizzle needs; checked, not assumed. Pointers stay
  // in the shared address space (LDS, not generic loads).
  extern __shared__ __align__(1024) uint8_t smem[];
  SmemView<Cfg> sm{smem};
  const int tid = threadIdx.x;
  const ErrSink err{args.err, nullptr, 0, 0};
  // (The same in every CTA of a cluster, so a cluster's CTAs all leave here or none does.)
  if (ptx::smem_addr(smem) % 1024 != 0) {
    if (tid == 0) report_error(err, Err::kSmemAlign, Phase::kSetup, int(ptx::smem_addr(smem) % 1024), 0);
    return;
  }
  init_pipeline(sm, tid, kThreads);
  using Sched = GroupedScheduler<Cfg::kBlockN, WL::kBlockRows, Cfg::kClusterN, Cfg::kPairN, Cfg::kSplitK>;
  // The scheduler's unit table, by every thread before the roles split (scratch: the epilogue's
  // storage, unused until the first tile), then __syncthreads before any role's first next().
  static_assert(Sched::kTableThreads == kThreads, "the whole CTA builds the unit table");
  Sched::build_table(args.pb, sm.unit_table(), reinterpret_cast<int*>(sm.epilogue()), tid, 0);
  if constexpr (Cfg::kMulticast) {
    // Both CTAs' barriers initialised (and fenced at cluster scope) before any multicast
    // complete_tx or remote arrive; also orders the shift LUT writes like __syncthreads. The
    // __syncthreads after it orders the unit table as racecheck sees it (it was flagged without).
    ptx::cluster_sync();
  }
  __syncthreads();  // the shift LUT and the unit table complete (CTA-local) before any role reads them
  using Regs = RegisterSplit<kThreads, Cfg::kCtasPerSm>;
  using ML = Mainloop<Cfg>;
  // One worker per CTA, or per 2-CTA cluster (both CTAs walk the cluster's unit sequence).
  const Worker worker = Cfg::kMulticast ? Worker{int(ptx::cluster_id_x()), int(ptx::num_clusters_x()),
                                                 int(ptx::cluster_ctarank())}
                                        : Worker{int(blockIdx.x), int(gridDim.x), 0};
  const Sched sched(args.pb, sm.unit_table(), worker);
  // No role returns from here on: a timeout ends the role's loop, and every thread reaches the
  // exit cluster barrier below (multicast) once its own time-limited waits are over.
  if (tid < 128) {
    ptx::setmaxnreg_dec<Regs::kProducer>();
    static_assert(ML::kProducerThreads == 128, "the whole producer warpgroup produces");
    if (tid == 0) ptx::prefetch_tma_map(&tmap_x);
    const uint32_t cta_rank = Cfg::kMulticast ? ptx::cluster_ctarank() : 0u;
    ML::produce(sm, &tmap_x, args.pb, args.w, args.x, sched, tid, err, args.timeout_ns, cta_rank);
  } else {
    ptx::setmaxnreg_inc<Regs::kMath>();
    const int wg = (tid - 128) / 128, tid_in_wg = tid % 128;
    const TileEpilogue<Cfg, kEpi> epilogue{sm, args.pb, args.w, args.epi, wg, tid_in_wg, kMathBarriers};
    ML::math(sm, args.pb, args.w, sched, wg, tid_in_wg, err, args.timeout_ns, epilogue);
  }
  if constexpr (Cfg::kMulticast) {
    // Exit: the partner may still arrive on this CTA's empty barriers (its last releases) until
    // all its threads are here; its multicast writes into this CTA were all awaited via full[].
    ptx::cluster_sync();
  }
}

template <class Cfg, Epilogue kEpi>
int launch(const GemmArgs& a, const void* x, int num_sms, cudaStream_t stream) {
  static_assert(Cfg::kSplitK == (Cfg::kBlockN <= 16) && (!Cfg::kSplitK || Cfg::kCtasPerSm == kSplitKCtasPerSm),
                "split-K at block_n 8 / 16 (the fused kernel asserts the same), fp4g_splitk_floats_per_slot, workers");
  // Token tensor map: box of kBlockK bytes x kTmaBoxRows rows (half the tile with multicast).
  CUtensorMap map;
  if (const int rc = make_tensor_map_2d_u8(&map, x, a.pb.k, a.pb.rows, a.pb.k, WL::kBlockK, Cfg::kTmaBoxRows))
    return rc;
  auto kernel = grouped_gemm_kernel<Cfg, kEpi>;
  // Once per device and instantiation, not on every launch (it costs host time).
  static bool attr_set[kMaxDevices] = {};
  static int max_clusters[kMaxDevices] = {};  // multicast: co-resident 2-CTA clusters
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev >= kMaxDevices || !attr_set[dev]) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: the error is returned here, not to the caller's next launch check
      return int(e);
    }
    if constexpr (Cfg::kMulticast) {
      // The persistent grid must be co-resident: a cluster that waits for another to finish would
      // double the run time. Clusters live inside one GPC, so this may be below num_sms / 2.
      cudaLaunchConfig_t q = {};
      cudaLaunchAttribute qa[1];
      qa[0].id = cudaLaunchAttributeClusterDimension;
      qa[0].val.clusterDim.x = Cfg::kClusterN, qa[0].val.clusterDim.y = 1, qa[0].val.clusterDim.z = 1;
      q.gridDim = dim3(Cfg::kClusterN), q.blockDim = dim3(kThreads), q.dynamicSmemBytes = Cfg::kSmemBytes;
      q.attrs = qa, q.numAttrs = 1;
      int n = 0;
      const cudaError_t e2 = cudaOccupancyMaxActiveClusters(&n, kernel, &q);
      if (e2 != cudaSuccess) {
        cudaGetLastError();
        return int(e2);
      }
      if (n <= 0) return int(cudaErrorInvalidConfiguration);
      if (dev < kMaxDevices) max_clusters[dev] = n;
    }
    if (dev < kMaxDevices) attr_set[dev] = true;
  }
  if constexpr (Cfg::kMulticast) {
    // Grid: a multiple of the cluster size, at most the co-resident clusters, at least one cluster.
    int clusters = num_sms / Cfg::kClusterN;
    if (dev < kMaxDevices) clusters = std::min(clusters, max_clusters[dev]);
    clusters = std::max(clusters, 1);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = Cfg::kClusterN, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(clusters * Cfg::kClusterN);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = Cfg::kSmemBytes;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, map, a);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return int(e);
    }
  } else {
    kernel<<<num_sms * Cfg::kCtasPerSm, kThreads, Cfg::kSmemBytes, stream>>>(map, a);
  }
  return int(cudaGetLastError());
}

template <Epilogue kEpi>
int run_grouped_gemm(GemmArgs& a, const void* x, int layout, int num_groups, int64_t rows, int max_m, int n, int k,
                     int block_n, int num_sms, cudaStream_t stream) {
  if (num_groups < 0 || rows < 0 || n <= 0 || k <= 0 || n % WL::kBlockRows || k % WL::kBlockK)
    return FP4G_EINVAL;
  if (layout != int(GroupLayout::kContiguous) && layout != int(GroupLayout::kMasked)) return FP4G_EINVAL;
  if (layout == int(GroupLayout::kMasked) && (max_m < 0 || rows != int64_t(num_groups) * max_m))
    return FP4G_EINVAL;
  if (num_groups == 0 || rows == 0) return FP4G_OK;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(a.w.packed)) % 16) return FP4G_EALIGN;
  if (kEpi == Epilogue::kBF16 && reinterpret_cast<uintptr_t>(a.epi.out) % 16) return FP4G_EALIGN;  // 16-byte row stores
  // L1: tile pairs cover 128-channel scale groups; 16-byte stores of 128-channel row pieces.
  if (kEpi == Epilogue::kL1 && (n % (2 * kL1ScaleGroup) || reinterpret_cast<uintptr_t>(a.epi.l1.out_q) % 16))
    return n % (2 * kL1ScaleGroup) ? FP4G_EINVAL : FP4G_EALIGN;
  int dev = 0, dev_sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&dev_sms, cudaDevAttrMultiProcessorCount, dev);
  if (num_sms <= 0) num_sms = dev_sms;
  a.pb.sk.workers = kSplitKCtasPerSm * dev_sms;  // the device's, not num_sms: the same splits (and bits) on every launch
  a.pb.layout = GroupLayout(layout);
  a.pb.num_groups = num_groups;
  a.pb.n = n;
  a.pb.k = k;
  a.pb.rows = rows;
  a.pb.max_m = max_m;
  a.x.scale_stride = k / WL::kBlockK;
  // Few tokens: the loop is short and latency-bound, so two CTAs per SM run two decode chains and
  // keep more weight bytes in flight. 32 / 64 tokens: one CTA per SM, weights through shared memory, two K
  // blocks in flight (the 64-token register path ran 9-16 % slower, H100 2026-12-07). 128 tokens: weights
  // straight to registers (kRegs; through shared memory the tensor cores' token reads delayed the decode).
  using P = WeightPath;
  constexpr bool kL1 = kEpi == Epilogue::kL1;
  switch (block_n) {
    case 8: return launch<MainloopConfig<8, 10, P::kSmem, 2, false, kL1>, kEpi>(a, x, num_sms, stream);
    // (L1: 9 stages, its stash and the unit table do not fit beside 10 in half an SM's shared memory)
    case 16: return launch<MainloopConfig<16, kL1 ? 9 : 10, P::kSmem, 2, false, kL1>, kEpi>(a, x, num_sms, stream);
    case 32: return launch<MainloopConfig<32, 16, P::kSmem, 1, false, kL1>, kEpi>(a, x, num_sms, stream);
    case 64: return launch<MainloopConfig<64, 12, P::kSmem, 1, false, kL1>, kEpi>(a, x, num_sms, stream);
    case 128: return launch<MainloopConfig<128, 10, P::kRegs, 1, kTokenMulticast128, kL1>, kEpi>(a, x, num_sms, stream);
    default: return FP4G_EUNSUPPORTED;
  }
}

GemmArgs make_args(const float* x_scales, const void* w_packed, const float* row_scale, const int* group_sizes,
                   const int* group_counts, int layout, float* sk_partials, int64_t sk_floats, uint32_t* sk_counters,
                   int sk_slots, int32_t* err, int64_t timeout_ns) {
  GemmArgs a{};
  if (sk_partials != nullptr && sk_counters != nullptr && sk_floats > 0 && sk_slots > 0)
    a.pb.sk = SplitKSpace{sk_partials, sk_counters, sk_floats, sk_slots, 0};  // workers: run_grouped_gemm
  a.pb.group_offsets = layout == int(GroupLayout::kContiguous) ? group_sizes : nullptr;
  a.pb.group_counts = layout == int(GroupLayout::kContiguous) ? group_counts : nullptr;
  a.pb.masked_m = layout == int(GroupLayout::kMasked) ? group_sizes : nullptr;
  a.w = WeightOperand{static_cast<const uint8_t*>(w_packed), row_scale};
  a.x.scales = x_scales;
  a.err = err;
  a.timeout_ns = uint64_t(timeout_ns);
  return a;
}

}  // namespace
}  // namespace fp4_gemm

extern "C" int fp4g_grouped_gemm_bf16(const void* x, const float* x_scales, const void* w_packed,
                                      const float* row_scale, const int* group_sizes, const int* group_counts, void* out,
                                      int layout, int num_groups, int64_t rows, int max_m, int n, int k,
                                      int block_n, int num_sms, float* sk_partials, int64_t sk_floats,
                                      uint32_t* sk_counters, int sk_slots, int32_t* err, int64_t timeout_ns,
                                      cudaStream_t stream) {
  using namespace fp4_gemm;
  if (timeout_ns <= 0 || sk_floats < 0 || sk_slots < 0) return FP4G_EINVAL;
  if ((sk_partials == nullptr) != (sk_counters == nullptr)) return FP4G_EINVAL;  // a workspace is both or none
  if (reinterpret_cast<uintptr_t>(sk_partials) % 16 || reinterpret_cast<uintptr_t>(sk_counters) % 4) return FP4G_EALIGN;
  GemmArgs a = make_args(x_scales, w_packed, row_scale, group_sizes, group_counts, layout, sk_partials, sk_floats,
                         sk_counters, sk_slots, err, timeout_ns);
  a.epi.out = static_cast<__nv_bfloat16*>(out);
  return run_grouped_gemm<Epilogue::kBF16>(a, x, layout, num_groups, rows, max_m, n, k, block_n, num_sms, stream);
}

extern "C" int fp4g_grouped_gemm_l1(const void* x, const float* x_scales, const void* w_packed,
                                    const float* row_scale, const int* group_sizes, const int* group_counts,
                                    const float* topk_w,
                                    void* out_q, float* out_s, int layout, int num_groups, int64_t rows, int max_m,
                                    int n, int k, int block_n, float activation_clamp, int pow2_scales, int num_sms,
                                    float* sk_partials, int64_t sk_floats, uint32_t* sk_counters, int sk_slots,
                                    int32_t* err, int64_t timeout_ns, cudaStream_t stream) {
  using namespace fp4_gemm;
  // (the clamp test also rejects a NaN clamp)
  if (!(activation_clamp >= 0.f) || timeout_ns <= 0 || sk_floats < 0 || sk_slots < 0) return FP4G_EINVAL;
  if ((sk_partials == nullptr) != (sk_counters == nullptr)) return FP4G_EINVAL;  // a workspace is both or none
  if (reinterpret_cast<uintptr_t>(sk_partials) % 16 || reinterpret_cast<uintptr_t>(sk_counters) % 4) return FP4G_EALIGN;
  GemmArgs a = make_args(x_scales, w_packed, row_scale, group_sizes, group_counts, layout, sk_partials, sk_floats,
                         sk_counters, sk_slots, err, timeout_ns);
  a.epi.l1 = L1Args{topk_w, static_cast<uint8_t*>(out_q), out_s, activation_clamp, pow2_scales != 0};
  return run_grouped_gemm<Epilogue::kL1>(a, x, layout, num_groups, rows, max_m, n, k, block_n, num_sms, stream);
}

extern "C" int fp4g_splitk_floats_per_slot(int block_n, int l1) {
  using namespace fp4_gemm;
  if (block_n != 8 && block_n != 16) return 0;  // the split-K configurations (MainloopConfig::kSplitK)
  return splitk_slot_floats(block_n, l1 ? 2 : 1);
}

extern "C" int fp4g_splitk_splits(int units, int workers, int k_blocks, int slots) {
  return fp4_gemm::choose_k_splits(units, workers, k_blocks, slots);
}
