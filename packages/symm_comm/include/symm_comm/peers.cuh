// symm_comm/peers.cuh — the peer-pointer table: peers[r] = base address of rank r's symmetric
// buffer as mapped into THIS process (peers[rank] = the local buffer). Both backends (PyTorch
// symmetric memory, NVSHMEM) produce this table; device code never calls a backend API.
#pragma once
#include <stdint.h>
#include "symm_comm/layout.cuh"

#define SYMM_MAX_RANKS 64

#if defined(__CUDACC__)
namespace symm {

// Copies the table (in global memory) to shared memory; call with a group of `nthreads` threads,
// `tid` in [0, nthreads); the caller synchronises the group afterwards.
__device__ __forceinline__ void load_peers(uint64_t* smem_peers, const uint64_t* peers, int num_ranks, int tid,
                                           int nthreads) {
  for (int r = tid; r < num_ranks; r += nthreads) smem_peers[r] = peers[r];
}

}  // namespace symm
#endif
