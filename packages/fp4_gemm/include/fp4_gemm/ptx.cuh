// fp4_gemm's view of the one PTX wrapper layer (packages/common/include/moe_common/ptx.cuh).
#pragma once
#include "moe_common/ptx.cuh"

namespace fp4_gemm {
namespace ptx = ::moe::ptx;
}  // namespace fp4_gemm
