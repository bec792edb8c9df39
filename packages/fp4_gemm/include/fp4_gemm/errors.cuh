// fp4_gemm's codes and phases for the common error sink (moe_common/errors.cuh: first error wins;
// the role that hits it stops and leaves through the kernel's normal exit, nothing traps).
// fp4_gemm.ops reads these lines (`static constexpr int k...`) to decode the record.
#pragma once
#include "moe_common/errors.cuh"

namespace fp4_gemm {
using moe::ErrSink;
using moe::report_error;

struct Err {  // word 0 (code); fp4_gemm's range is 32..63 (symm_comm's 1..31)
  static constexpr int kTimeoutFull = 32;   // a math warp waited past the timeout for a stage's data
  static constexpr int kTimeoutEmpty = 33;  // the producer waited past the timeout for a free stage
  static constexpr int kSmemAlign = 34;     // dynamic shared memory not 1024-byte aligned (nothing computed)
};
// Timeouts record the code only (moe::claim_error: words 1-5 stay 0; the code names the role). The
// full record (phase, stage, iteration) inside the pipeline loops made the 128-token kernels spill:
// any asm with a "memory" clobber in those loops does.
struct Phase {  // word 2; what (word 3) per code:
  static constexpr int kSetup = 32;     // kSmemAlign: what = shared address % 1024
  static constexpr int kProducer = 33;  // (kTimeoutEmpty's role)
  static constexpr int kMath = 34;      // (kTimeoutFull's role)
};

}  // namespace fp4_gemm
