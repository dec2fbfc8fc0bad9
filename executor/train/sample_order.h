// Which samples each step reads: SPEC's order with --shuffle off (step k
// reads samples [k*B, (k+1)*B) mod N), or a permutation per epoch from the
// seed, and the gathering of those samples from the .npy data.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "executor/data/npy.h"

namespace rannc::train {

/// Sample order: identity, or a fresh permutation per epoch from the seed.
class SampleOrder {
public:
  SampleOrder(int64_t samples, bool shuffle, uint64_t seed) : n_(samples), shuffle_(shuffle), seed_(seed) {}
  /// The sample read at `position` of the endless stream of epochs.
  int64_t at(int64_t position);

private:
  int64_t n_;
  bool shuffle_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> perm_;
};

/// Samples [first, first + count) in `order`, on `device`: gathered in host
/// memory (pinned for a GPU, so the copy to it does not block).
torch::Tensor gatherSamples(const data::NpyArray &a, SampleOrder &order, int64_t first, int64_t count,
                            const torch::Device &device);

} // namespace rannc::train
