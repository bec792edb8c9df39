// symm_comm/symm_comm.cuh — everything a fused kernel needs from symm_comm.
#pragma once
#include "symm_comm/ptx.cuh"
#include "symm_comm/layout.cuh"
#include "symm_comm/errors.cuh"
#include "symm_comm/peers.cuh"
#include "symm_comm/workers.cuh"
#include "symm_comm/barrier.cuh"
#include "symm_comm/copy.cuh"
#include "symm_comm/pool.cuh"
#include "symm_comm/dispatch.cuh"
#include "symm_comm/combine.cuh"
