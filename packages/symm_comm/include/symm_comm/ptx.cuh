// symm_comm's view of the one PTX wrapper layer (packages/common/include/moe_common/ptx.cuh): the
// memory-model wrappers across GPUs live there with the CTA / TMA / tensor-core ones.
#pragma once
#include "moe_common/ptx.cuh"

#if defined(__CUDACC__)
namespace symm {
namespace ptx = ::moe::ptx;

}  // namespace symm
#endif
