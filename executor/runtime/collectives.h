// Tensors through a comm::Communicator: the collectives the tensor-parallel
// kernels (kernels/tensor_parallel.cpp) and the trainer's sums share. The
// communicator reaches raw buffers only; these wrap LibTorch tensors around
// them, outside autograd.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "executor/comm/comm.h"
#include "executor/comm/device_comm.h"

namespace rannc::runtime {

// Note [float64 collectives]
// Collectives carry float32, or float64 for a model trained in double: a
// float64 model's gradients, batch statistics and gathered values are summed
// and moved in double, so that its training matches PyTorch's in double to
// double's rounding. That is how a gap between rannc and PyTorch in float32
// is told from a fault: rounding moves float64 losses some 1e-12, a wrong
// formula moves them as much as float32 ones (docs/front-ends.md, the
// torchvision survey's --dtype float64). Host memory only: the device
// collectives (NCCL) take float32, and say so.

/// A contiguous float32 (or, Note [float64 collectives], float64) tensor's
/// memory as a buffer of `group`'s collectives (host or device memory as
/// `group` takes the tensor's: comm::tensorMemory).
comm::Buffer floatBuffer(const comm::Communicator &group, const torch::Tensor &t);

/// The dtype a collective carries a tensor of dtype `t` in: float64 stays
/// float64 (Note [float64 collectives]), everything else is float32.
torch::ScalarType collectiveType(torch::ScalarType t);

/// The sum of `t` over the ranks of `group`, a new tensor of `t`'s dtype
/// (summed in float32, the precision of the gradient sums; float64 in float64).
torch::Tensor allReduceSum(comm::Communicator &group, const torch::Tensor &t);

/// The element-wise maximum of `t` over the ranks of `group` (as allReduceSum).
torch::Tensor allReduceMax(comm::Communicator &group, const torch::Tensor &t);

/// Every rank's `t` (the same shape on each) joined along `axis` in rank
/// order, a new tensor of `t`'s dtype.
torch::Tensor allGather(comm::Communicator &group, const torch::Tensor &t, int64_t axis);

/// Slice `index` of `count` equal slices of `t` along `axis` (a copy).
torch::Tensor shardOf(const torch::Tensor &t, int64_t axis, int64_t index, int64_t count);

} // namespace rannc::runtime
