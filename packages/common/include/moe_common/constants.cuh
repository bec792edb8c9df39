// moe_common/constants.cuh — granularities every package shares, stated once. Plain C as well as
// C++ (symm_comm/layout.cuh is compiled for the host and mirrored by Python). The Python side reads
// the `static constexpr int` lines (packages/common/native_loader.py header_constants).
#pragma once

// Activation scale granularity: one FP32 scale per token per MOE_SCALE_GROUP consecutive channels, for
// every FP8 activation the kernels read or write: the layer input (DeepEP's convention on Hopper), the
// dispatch pool's rows, and the L1 output = L2 input. The GEMMs promote once per this much K.
#define MOE_SCALE_GROUP 128

#ifdef __cplusplus
namespace moe {
struct Granularity {
  static constexpr int kScaleGroup = 128;
};
static_assert(Granularity::kScaleGroup == MOE_SCALE_GROUP, "one value for C and C++");
}  // namespace moe
#endif
