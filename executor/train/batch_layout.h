// Where a value's samples lie along its batch axis, and how a tensor is cut
// into and joined from sample ranges (between the replicas of two stages).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "executor/schedule/schedule.h"
#include "planner/ir/ir.h"

namespace rannc::train {

/// Where a value's samples lie: its batch axis, the first dimension affine in
/// the batch size (-1: none, Note [batch-free values]; 0 when the shape is
/// unknown), and their order along it (Value::batch_blocks, Note [batch layout]
/// in executor/frontend/common.cpp).
struct BatchLayout {
  int64_t axis = 0;
  int64_t blocks = 1;
};

/// The layout of `v` from its symbolic shape and batch_blocks.
BatchLayout batchLayout(const ir::Value &v);

/// `t`'s sizes with its batch axis, of `rows` rows for `n` samples, viewed as
/// [blocks, n, rows / (n * blocks)] (Note [batch layout]).
std::vector<int64_t> blockView(const torch::Tensor &t, const BatchLayout &l, int64_t n);

/// Samples [part.begin, part.end) of `t`, which holds samples [whole.begin,
/// whole.end) laid out as `l` says; `what` names the value in errors.
torch::Tensor sliceSamples(const torch::Tensor &t, const BatchLayout &l, const schedule::SampleRange &whole,
                           const schedule::SampleRange &part, const std::string &what);

/// Joins pieces holding consecutive sample ranges of `counts[i]` samples each.
torch::Tensor joinSamples(const std::vector<torch::Tensor> &pieces, const std::vector<int64_t> &counts,
                          const BatchLayout &l);

} // namespace rannc::train
