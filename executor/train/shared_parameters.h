// Parameters read by several stages (tied embeddings): one communicator per
// set of reader stages, over which their gradients are summed after the
// replica sums (Note [shared parameters] in executor/schedule/schedule.h).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/runtime/stage.h"
#include "planner/ir/ir.h"

namespace rannc::train {

/// Makes a communicator over a group's ranks one for the device the stage's
/// tensors are on (collective over the group).
using GroupMaker = std::function<std::unique_ptr<comm::Communicator>(std::unique_ptr<comm::Communicator>)>;

/// Parameters read by several stages (Note [shared parameters] in
/// executor/schedule/schedule.h), grouped by the set of stages that read them.
/// Each group has a communicator over the ranks of those stages; after the
/// replica all-reduce, the first replica of each reader stage contributes its
/// part of the gradient and every rank of the group receives the sum, so every
/// copy of the parameter takes the same optimizer step.
struct SharedParameters {
  struct Group {
    std::vector<torch::Tensor> params; ///< this stage's copies, in value-id order
    std::unique_ptr<comm::Communicator> comm;
  };
  std::vector<Group> groups;            ///< the groups this rank's stage belongs to
  std::set<ir::ValueId> counted_elsewhere; ///< shared ones an earlier stage counts in the gradient norm

  /// Collective over `comm`: every rank splits once per group of the graph,
  /// in the same order; `on_device` makes a group's communicator one for the
  /// tensors' device (collective over the group). `position`: the rank's
  /// place in its tensor-parallel group (Note [tensor parallel ranks]): a
  /// parameter's copies are summed between ranks holding the same slice.
  SharedParameters(const ir::Graph &g, const std::vector<std::pair<int, int>> &ranges, int stage, int position,
                   const runtime::StageRunner &runner, comm::Communicator &comm, const GroupMaker &on_device);

  /// Sums each shared parameter's gradient over the stages that read it.
  void allReduce(int replica);
};

} // namespace rannc::train
