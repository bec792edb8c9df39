// Standalone grouped FP8 x MXFP4 GEMM (contiguous and masked layouts), BF16 output.
// A thin composition of the headers: scheduler + mainloop (producer / math roles) + epilogue.
#include <cuda.h>
#include <cuda_runtime.h>

#include "fp4_gemm/epilogue.cuh"
#include "fp4_gemm/mainloop.cuh"
#include "fp4_gemm_api.h"
#include "tensor_map.h"

namespace fp4_gemm {
namespace {

constexpr int kProducerRegs = 40;
constexpr int kMathRegs = 232;
constexpr int kThreads = 128 + kMathThreads;
constexpr int kMaxDevices = 64;  // producer warpgroup + math warpgroups
static_assert(kProducerRegs * 128 + kMathRegs * kMathThreads <= 65536, "register file");

struct GemmArgs {
  GroupedProblem pb;
  WeightOperand w;
  TokenOperand x;
  __nv_bfloat16* out;
  int64_t out_ld;
  int* err;
};

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1)
grouped_gemm_bf16_kernel(const __grid_constant__ CUtensorMap tmap_x, const GemmArgs args) {
  // The dynamic shared memory window starts at offset 0 (no static shared memory in this kernel),
  // so it is 1024-byte aligned as the 128-byte swizzle needs; checked, not assumed. Pointers stay
  // in the shared address space (LDS, not generic loads).
  extern __shared__ __align__(1024) uint8_t smem[];
  SmemView<Cfg> sm{smem};
  const int tid = threadIdx.x;
  if (ptx::smem_addr(smem) % 1024 != 0) {
    if (tid == 0) report_error(args.err, kErrSmemAlign);
    return;
  }
  init_pipeline(sm, tid, kThreads);
  __syncthreads();

  GroupedScheduler<Cfg::kBlockN, WL::kBlockRows> sched(args.pb);
  Tile t;
  uint32_t iter = 0;
  if (tid < 128) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (tid < 32) {
      if (tid == 0) ptx::prefetch_tma_map(&tmap_x);
      while (sched.next(t))
        if (!produce_tile(sm, &tmap_x, args.w, args.x, args.pb, t, iter, tid, args.err)) return;
    }
  } else {
    ptx::setmaxnreg_inc<kMathRegs>();
    const int wg = (tid - 128) / 128, tid_in_wg = tid % 128;
    float acc[Cfg::kAccRegs];
    while (sched.next(t)) {
      if (!mma_tile(sm, args.pb, wg, tid_in_wg, iter, acc, args.err)) return;
      const int n0 = t.n_block * WL::kBlockRows + wg * WL::kRowsPerWarpgroup;
      store_bf16<Cfg::kBlockN>(acc, args.w.row_scale + int64_t(t.group) * args.pb.n, args.out, args.out_ld,
                               t.row0, t.rows, n0, tid_in_wg);
    }
  }
}

template <int kBlockN, int kStages>
int launch(const GemmArgs& a, const CUtensorMap& map, int num_sms, cudaStream_t stream) {
  using Cfg = MainloopConfig<kBlockN, kStages>;
  auto kernel = grouped_gemm_bf16_kernel<Cfg>;
  // Once per device and instantiation, not on every launch (it costs host time).
  static bool attr_set[kMaxDevices] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev >= kMaxDevices || !attr_set[dev]) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemAlloc);
    if (e != cudaSuccess) return int(e);
    if (dev < kMaxDevices) attr_set[dev] = true;
  }
  kernel<<<num_sms, kThreads, Cfg::kSmemAlloc, stream>>>(map, a);
  return int(cudaGetLastError());
}

}  // namespace
}  // namespace fp4_gemm

extern "C" int fp4g_grouped_gemm_bf16(const void* x, const float* x_scales, const void* w_packed,
                                      const float* row_scale, const int* group_sizes, void* out,
                                      int layout, int num_groups, int64_t rows, int max_m, int n, int k,
                                      int block_n, int num_sms, int* err, cudaStream_t stream) {
  using namespace fp4_gemm;
  if (num_groups < 0 || rows < 0 || n <= 0 || k <= 0 || n % WL::kBlockRows || k % WL::kBlockK)
    return FP4G_EINVAL;
  if (layout != int(GroupLayout::kContiguous) && layout != int(GroupLayout::kMasked)) return FP4G_EINVAL;
  if (layout == int(GroupLayout::kMasked) && (max_m <= 0 || rows != int64_t(num_groups) * max_m))
    return FP4G_EINVAL;
  if (num_groups == 0 || rows == 0) return FP4G_OK;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w_packed)) % 16) return FP4G_EALIGN;
  if (num_sms <= 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
  }
  GemmArgs a;
  a.pb = GroupedProblem{GroupLayout(layout), num_groups, n, k, rows, max_m,
                        layout == int(GroupLayout::kContiguous) ? group_sizes : nullptr,
                        layout == int(GroupLayout::kMasked) ? group_sizes : nullptr};
  a.w = WeightOperand{static_cast<const uint8_t*>(w_packed), row_scale};
  a.x = TokenOperand{x_scales, k / WL::kBlockK};
  a.out = static_cast<__nv_bfloat16*>(out);
  a.out_ld = n;
  a.err = err;
  CUtensorMap map;
  int rc = make_tensor_map_2d_u8(&map, x, k, rows, k, WL::kBlockK, block_n);
  if (rc) return rc;
  switch (block_n) {
    case 8: return launch<8, 16>(a, map, num_sms, stream);
    case 16: return launch<16, 16>(a, map, num_sms, stream);
    case 32: return launch<32, 16>(a, map, num_sms, stream);
    case 64: return launch<64, 12>(a, map, num_sms, stream);
    case 128: return launch<128, 8>(a, map, num_sms, stream);
    default: return FP4G_EUNSUPPORTED;
  }
}
