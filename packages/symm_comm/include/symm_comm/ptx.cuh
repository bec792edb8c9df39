// symm_comm's view of the one PTX wrapper layer (packages/common/include/moe_common/ptx.cuh): the
// memory-model wrappers across GPUs live there with the CTA / TMA / tensor-core ones.
#pragma once
#include "moe_common/ptx.cuh"

#if defined(__CUDACC__)
namespace symm {
namespace ptx = ::moe::ptx;

// bar.red.and.pred on named barrier `id` among `threads` threads (a multiple of 32): every participant's
// earlier memory operations are ordered before every participant's later ones (as bar.sync), and each
// gets the AND of all their predicates. Only named barriers need it (id 0 with the whole CTA is
// __syncthreads_and). Belongs with named_barrier in moe_common/ptx.cuh; it sits here while that header
// is being moved by another change (the one PTX-layer rule: move it there next).
__device__ __forceinline__ bool named_barrier_and(uint32_t id, uint32_t threads, bool pred) {
  uint32_t out;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\tsetp.ne.u32 p, %1, 0;\n\tbar.red.and.pred q, %2, %3, p;\n\t"
      "selp.u32 %0, 1, 0, q;\n\t}"
      : "=r"(out)
      : "r"((uint32_t)pred), "r"(id), "r"(threads)
      : "memory");
  return out != 0;
}
}  // namespace symm
#endif
