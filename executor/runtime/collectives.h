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

/// A contiguous float32 tensor's memory as a buffer of `group`'s collectives
/// (host or device memory as `group` takes the tensor's: comm::tensorMemory).
comm::Buffer floatBuffer(const comm::Communicator &group, const torch::Tensor &t);

/// The sum of `t` over the ranks of `group`, a new tensor of `t`'s dtype
/// (summed in float32, the precision of the gradient sums).
torch::Tensor allReduceSum(comm::Communicator &group, const torch::Tensor &t);

/// The element-wise maximum of `t` over the ranks of `group` (as allReduceSum).
torch::Tensor allReduceMax(comm::Communicator &group, const torch::Tensor &t);

/// Every rank's `t` (the same shape on each) joined along `axis` in rank
/// order, a new tensor of `t`'s dtype.
torch::Tensor allGather(comm::Communicator &group, const torch::Tensor &t, int64_t axis);

/// Slice `index` of `count` equal slices of `t` along `axis` (a copy).
torch::Tensor shardOf(const torch::Tensor &t, int64_t axis, int64_t index, int64_t count);

} // namespace rannc::runtime
