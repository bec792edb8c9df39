// csrc/fused.cu — host side of the fused MegaMoE kernel (csrc/fused_kernel.cuh): the cooperative launch per
// configuration, the token-tile switch and the plain C ABI (megamoe_api.h).
#include "fused_kernel.cuh"

namespace megamoe {
namespace {

// ---- host --------------------------------------------------------------------------------------------
constexpr int kMaxDevices = 64;

template <class CL1, class CL2>
int launch(FusedParams& p, const void* pool_x, const void* l1_q, int num_sms, cudaStream_t stream) {
  using S = FusedSmem<CL1, CL2>;
  const SymmLayout& L = p.L;
  // Dispatch scratch (one-pass metadata counts, then the pool tables) from offset 0, below the peer table;
  // the one-pass scan where its counts fit, as the standalone dispatch picks it (the pool is the same).
  p.onepass = symm_meta_smem_ints(&L) * 4 <= 160 * 1024 && symm_dispatch_smem_ints(&L, true) * 4 <= S::kPeersOff;
  if (symm_dispatch_smem_ints(&L, p.onepass != 0) * 4 > S::kPeersOff) return MOE_EUNSUPPORTED;
  CUtensorMap m1, m2;
  const int64_t P = L.pool_rows;
  if (int rc = fg::make_tensor_map_2d_u8(&m1, pool_x, p.pb1.k, P, p.pb1.k, fg::WL::kBlockK, CL1::kTmaBoxRows)) return rc;
  if (int rc = fg::make_tensor_map_2d_u8(&m2, l1_q, p.pb2.k, P, p.pb2.k, fg::WL::kBlockK, CL2::kTmaBoxRows)) return rc;
  auto kernel = fused_moe_kernel<CL1, CL2>;
  int dev = 0;
  cudaGetDevice(&dev);
  static int per_sm_cache[kMaxDevices] = {};  // per instantiation: co-resident CTAs per SM
  static int sms_cache[kMaxDevices] = {};
  if (dev >= kMaxDevices) return MOE_EUNSUPPORTED;
  if (per_sm_cache[dev] == 0) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kBytes);
    int per_sm = 0, sms = 0, coop = 0;
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, S::kBytes);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return int(e);
    }
    if (per_sm < 1 || !coop) return MOE_ECOOP;
    per_sm_cache[dev] = per_sm < CL1::kCtasPerSm ? per_sm : CL1::kCtasPerSm;
    sms_cache[dev] = sms;
  }
  int sms = sms_cache[dev];
  // The split choice from the device's SMs (as the standalone GEMM's), not the grid: the same bits.
  p.pb1.sk.workers = p.pb2.sk.workers = fg::kSplitKCtasPerSm * sms;
  if (num_sms > 0 && num_sms < sms) sms = num_sms;
  const int grid = sms * per_sm_cache[dev];
  void* argv[] = {&m1, &m2, &p};
  const cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid), dim3(kThreads),
                                                    argv, S::kBytes, stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return int(e);
  }
  return 0;
}

// The staged pipeline's configurations per token tile (fp4_gemm/csrc/grouped_gemm.cu run_grouped_gemm),
// without the 128-token kernel's 2-CTA multicast (a cooperative launch has no clusters; the token tile's
// bytes are the same, only how they arrive differs, so the bits are too). Stage counts may be lower where
// the two plans and the L2 table must fit one CTA's shared memory (stages do not change the bits either).
template <int kBlockN>
struct Configs;
using P_ = fg::WeightPath;
template <> struct Configs<8> {
  using L1 = fg::MainloopConfig<8, 10, P_::kSmem, 2, false, true>;
  using L2 = fg::MainloopConfig<8, 10, P_::kSmem, 2, false, false>;
};
template <> struct Configs<16> {
  using L1 = fg::MainloopConfig<16, 8, P_::kSmem, 2, false, true>;
  using L2 = fg::MainloopConfig<16, 8, P_::kSmem, 2, false, false>;
};
template <> struct Configs<32> {
  using L1 = fg::MainloopConfig<32, 16, P_::kSmem, 1, false, true>;
  using L2 = fg::MainloopConfig<32, 16, P_::kSmem, 1, false, false>;
};
template <> struct Configs<64> {
  using L1 = fg::MainloopConfig<64, 10, P_::kSmem, 1, false, true>;
  using L2 = fg::MainloopConfig<64, 10, P_::kSmem, 1, false, false>;
};
template <> struct Configs<128> {
  using L1 = fg::MainloopConfig<128, 9, P_::kRegs, 1, false, true>;
  using L2 = fg::MainloopConfig<128, 9, P_::kRegs, 1, false, false>;
};

template <int kBlockN>
int run(FusedParams& p, const void* pool_x, const void* l1_q, int num_sms, cudaStream_t stream) {
  return launch<typename Configs<kBlockN>::L1, typename Configs<kBlockN>::L2>(p, pool_x, l1_q, num_sms, stream);
}

bool aligned16(const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; }

}  // namespace
}  // namespace megamoe

extern "C" MOE_API const char* megamoe_error_string(int code) {
  switch (code) {
    case MOE_OK: return "success";
    case MOE_EINVAL: return "invalid argument";
    case MOE_EALIGN: return "misaligned pointer";
    case MOE_EUNSUPPORTED: return "configuration not supported by the fused kernel";
    case MOE_ELAYOUT: return "symm_comm layout version mismatch (rebuild)";
    case MOE_ECOOP: return "the fused kernel cannot be launched cooperatively (one CTA per SM) on this device";
    default: return code > 0 ? cudaGetErrorString(cudaError_t(code)) : "unknown error";
  }
}

extern "C" MOE_API int megamoe_abi_version(void) { return MOE_ABI_VERSION; }

extern "C" MOE_API int megamoe_fused_forward(const SymmLayout* layout, const uint64_t* peers, int32_t* host_err,
                                             int64_t timeout_ns, int num_sms, uint32_t* grid_words, const void* x_q,
                                             const float* x_s, const void* topk_idx, int idx_bytes,
                                             const float* topk_w, int num_tokens, const void* w1, const float* w1_rs,
                                             const void* w2, const float* w2_rs, int intermediate, void* l1_q,
                                             float* l1_s, void* y, int block_n, float activation_clamp, int pow2,
                                             void* local_base, uint64_t* stamps, float* sk_partials,
                                             int64_t sk_floats, uint32_t* sk_counters, int sk_slots,
                                             cudaStream_t stream) {
  using namespace megamoe;
  if (!layout || layout->version != SYMM_LAYOUT_VERSION) return MOE_ELAYOUT;
  const SymmLayout& L = *layout;
  if (!peers || !grid_words || !local_base || timeout_ns <= 0 || num_tokens < 0 || num_tokens > L.max_tokens ||
      (idx_bytes != 4 && idx_bytes != 8) || intermediate <= 0 || intermediate % 128 || L.hidden % 128 ||
      L.cmb_in_rows < L.pool_rows || !(activation_clamp >= 0.f) || !w1 || !w1_rs || !w2 || !w2_rs || !l1_q || !l1_s)
    return MOE_EINVAL;
  if (num_tokens > 0 && (!x_q || !x_s || !topk_idx || !topk_w || !y)) return MOE_EINVAL;
  if (sk_floats < 0 || sk_slots < 0 || (sk_partials == nullptr) != (sk_counters == nullptr)) return MOE_EINVAL;
  if (!aligned16(sk_partials) || reinterpret_cast<uintptr_t>(sk_counters) % 4) return MOE_EALIGN;
  if (!aligned16(x_q) || !aligned16(x_s) || !aligned16(topk_w) || !aligned16(peers) || !aligned16(y) ||
      !aligned16(w1) || !aligned16(w2) || !aligned16(l1_q) || !aligned16(local_base))
    return MOE_EALIGN;
  FusedParams p{};
  p.L = L;
  p.peers = peers;
  p.host_err = host_err;
  p.timeout_ns = uint64_t(timeout_ns);
  constexpr int small_dedup = 1;  // symm_comm's dispatch default
  p.d = symm::DispatchArgs{x_q, x_s, topk_idx, topk_w, num_tokens, 0, 0, small_dedup};
  const bool dedup_sent = L.topk > 0 && 32 % L.topk == 0;
  p.dedup = !((int64_t)num_tokens * L.topk <= (dedup_sent ? symm::kPlainPullMaxIds : symm::kMetaWarpMaxIds));
  p.idx_bytes = idx_bytes;
  p.grid_words = grid_words;
  p.stamps = stamps;
  p.err_dev = symm::state_err(reinterpret_cast<uint64_t>(local_base), L);
  const uint64_t base = reinterpret_cast<uint64_t>(local_base);
  const int* offs = reinterpret_cast<const int*>(base + L.off_exp_offsets);
  const int* cnts = reinterpret_cast<const int*>(base + L.off_exp_counts);
  const int Lx = L.num_local_experts, H = L.hidden, I = intermediate;
  p.pb1 = fg::GroupedProblem{fg::GroupLayout::kContiguous, Lx, 2 * I, H, L.pool_rows, 0, offs, cnts, nullptr};
  p.pb2 = fg::GroupedProblem{fg::GroupLayout::kContiguous, Lx, H, I, L.pool_rows, 0, offs, cnts, nullptr};
  // Split-K (the few-token configurations): one workspace for both GEMMs (L1 has finished with it at
  // grid barrier 1; each phase's last arrivers leave its counters zero).
  if (sk_partials != nullptr && sk_counters != nullptr && sk_floats > 0 && sk_slots > 0)
    p.pb1.sk = p.pb2.sk = fg::SplitKSpace{sk_partials, sk_counters, sk_floats, sk_slots, 0};  // workers: launch()
  p.w1 = fg::WeightOperand{static_cast<const uint8_t*>(w1), w1_rs};
  p.w2 = fg::WeightOperand{static_cast<const uint8_t*>(w2), w2_rs};
  p.x1 = fg::TokenOperand{reinterpret_cast<const float*>(base + L.off_pool_s), H / 128};
  p.x2 = fg::TokenOperand{l1_s, I / 128};
  p.e1.l1 = fg::L1Args{reinterpret_cast<const float*>(base + L.off_pool_w), static_cast<uint8_t*>(l1_q), l1_s,
                       activation_clamp, pow2 != 0};
  p.e2.out = reinterpret_cast<__nv_bfloat16*>(base + L.off_cmb_in);
  p.y = static_cast<uint16_t*>(y);
  const void* pool_x = reinterpret_cast<const void*>(base + L.off_pool_x);
  switch (block_n) {
    case 8: return run<8>(p, pool_x, l1_q, num_sms, stream);
    case 16: return run<16>(p, pool_x, l1_q, num_sms, stream);
    case 32: return run<32>(p, pool_x, l1_q, num_sms, stream);
    case 64: return run<64>(p, pool_x, l1_q, num_sms, stream);
    case 128: return run<128>(p, pool_x, l1_q, num_sms, stream);
    default: return MOE_EINVAL;
  }
}
