// Megatron-LM's scatter/gather between tensor-parallel stages: each device of
// the sending group sends 1/t of a value, the receiving group all-gathers it.
//
// Note [scatter/gather in the executor]
// The cost model charges a tensor-parallel stage's cross-node receives as
// scattered on `cuda` devices (Note [scatter/gather transfers] in
// planner/partition/evaluate.cpp); rannc-exec does what the plan it runs
// was charged for, from the plan alone, so a hand-edited plan is run as
// `check` re-estimates it:
//   - the rule is cluster::scatterGatherTransfers of the plan's
//     Cluster.device.type (planner/cluster/transfers.h, the function lowering
//     uses), whatever device rannc-exec runs on (--device cpu too);
//   - values move from stage q to stage r scattered when both have the same
//     degree t > 1 and the transfer leaves the node by the cost model's test:
//     activations (q < r) compare the last ranks of q and r, gradients (q > r)
//     the first ranks of r and q;
//   - the rank at position p of a group then exchanges with the ranks at
//     position p of the peer stage's groups, by the same sample ranges the
//     leaders use otherwise (links.h), and no value is shared from the leader.
// Each piece a rank would send whole (a sample range, or a batch-free value)
// goes as two messages: its shape alone (an empty tensor of shape
// [0, sizes...]: a header, no bytes) and position p's slice of its flattened
// elements, ceil(n/t) of them, the last slice padded with zeros, so any size
// works. The receiver all-gathers the t slices over its tensor-parallel
// communicator (MPI on the CPU, NCCL on GPUs) and cuts the padding off, then
// joins or sums the pieces as links.cpp does: the bytes each device ends with
// are the whole pieces', so training is unchanged bit for bit. Only float32,
// float16 and bfloat16 pieces are sliced (the all-gather runs in float32,
// exact for these); others, and the empty "no gradient" message, go whole
// from every position, which the shape message's dtype and size tell the
// receiver. A gradient of a received value is the same on every device of the
// group (Note [tensor parallel ranks]), so the slices make up the whole.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/train/setup.h"
#include "executor/train/transport.h"

namespace rannc::train {

/// Where this rank's stage exchanges values scattered (Note [scatter/gather in the executor]).
class ScatterGather {
public:
  /// `group`: this rank's tensor-parallel communicator (null without one).
  ScatterGather(Transport &transport, const Setup &s, comm::Communicator *group);

  /// Whether values (or gradients) go scattered from stage `from` to stage `to`.
  bool scatters(int from, int to) const { return scatters_[size_t(from)][size_t(to)]; }
  /// The ranks at this rank's position in every group of `stage` (its peers when scattering).
  const std::vector<int> &peers(int stage) const { return peers_[size_t(stage)]; }
  /// Sends slices and receives whole pieces gathered over the group.
  Transport &transport() { return *sliced_; }

private:
  std::vector<std::vector<bool>> scatters_;
  std::vector<std::vector<int>> peers_;
  std::unique_ptr<Transport> sliced_;
};

/// Rank 0's start-up line naming the stage pairs that exchange scattered ("" when none).
std::string scatterGatherLine(const Setup &s);

/// Position `p`'s slice of `t`'s flattened elements in `t_count` slices of
/// ceil(n/t_count), zero-padded (Note [scatter/gather in the executor]).
torch::Tensor flatSlice(const torch::Tensor &t, int p, int t_count);

} // namespace rannc::train
