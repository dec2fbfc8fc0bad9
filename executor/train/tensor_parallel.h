// Tensor-parallel stages in the trainer: which ranks form a stage's groups,
// how the pipeline's values reach every device of a group, and each
// parameter's shard (Note [tensor parallel sharding] in
// planner/sharding/sharding.h; the collectives inside a stage are kernels,
// Note [tensor parallel collectives] in executor/runtime/kernels/tensor_parallel.cpp).
//
// Note [tensor parallel ranks]
// A stage with r replicas and tensor-parallel degree t holds ranks
// [first, first + r*t) (the plan's Stage.ranks lists every one). Group g, the
// stage's replica g, is ranks first + g*t .. first + g*t + t - 1: consecutive,
// so a group lies inside one node. A rank's position in its group is the
// slice it holds of every sharded parameter. The rest of the trainer sees one
// replica per group, its first rank (the leader):
//   - values crossing a cut are whole on every device of a group, so only
//     leaders exchange them with other stages; a leader shares what it
//     receives, values and the gradients of the values it sent, with the rest
//     of its group (shareFromLeader), and only a leader sends the gradients
//     of received values (they are the same on every device: a value's
//     sharded readers sum their parts in a TensorParallelCopy's backward);
//     where the plan says so, every device sends and receives its slice
//     instead (Note [scatter/gather in the executor], scatter_gather.h);
//   - every device of group g trains on replica g's samples, and weights its
//     loss as one replica does; the loss counts once, the leader's;
//   - the data-parallel sums of a shard go over the ranks holding the same
//     position in every group (r ranks), a replicated parameter's too (every
//     position holds all of it, and sums it with its peers);
//   - the global gradient norm counts a sharded parameter's slices from every
//     position of group 0, a replicated one from the leader of group 0 only.
// Start-up (setup.cpp) refuses a plan where a cut or partial value crosses a
// tensor-parallel stage's boundary, or a collective's readers lie in another
// stage than the collective: the leader would send one slice, or a copy's
// backward would miss the other devices' parts of its gradient.
#pragma once

#include <torch/torch.h>

#include <map>
#include <utility>
#include <vector>

#include "executor/comm/comm.h"
#include "planner/ir/ir.h"

namespace rannc::train {

/// A rank's place in its stage's tensor-parallel layout (Note [tensor parallel ranks]).
struct TensorParallelPlace {
  int degree = 1;   ///< t: devices per group
  int replica = 0;  ///< g: the group, the stage's replica index
  int position = 0; ///< the slice of every sharded parameter this rank holds
  bool leader() const { return position == 0; }
};

/// The first rank of each group of a stage whose ranks are `stage_ranks` (in
/// order) at degree `degree`: what the trainer treats as the stage's replicas.
std::vector<int> groupLeaders(const std::vector<int> &stage_ranks, int degree);

/// Where `rank` (one of `stage_ranks`) lies in the stage's layout.
TensorParallelPlace placeOf(const std::vector<int> &stage_ranks, int degree, int rank);

/// Collective over `group`: every rank ends with its leader's (rank 0's)
/// `tensors`, moved onto `device`; what the others pass in is replaced. An
/// undefined tensor stays undefined everywhere. Shapes and dtypes travel
/// first; the data is summed with zeros from the others (exact), so it moves
/// as device memory where the group reaches it.
void shareFromLeader(comm::Communicator &group, std::vector<torch::Tensor> &tensors, torch::Device device);

/// Each parameter's cut axis (Note [tensor parallel sharding]); absent: replicated.
using ParameterAxes = std::map<ir::ValueId, int>;

/// Replaces each sharded parameter of `params` (loaded whole) by slice
/// `place.position` of `place.degree` along its axis: leaves that require grad.
void shardParameters(std::map<ir::ValueId, torch::Tensor> &params, const ParameterAxes &axes,
                     const TensorParallelPlace &place);

/// The op ranges of the stages in `local`, a local graph of `whole` (the
/// same nodes by name, in the same order, with collectives inserted before
/// their readers): each inserted node belongs to the stage of the next
/// original node, the reader it was inserted for. `ranges` are the stages'
/// ranges in `whole`. Throws when `local` is not such a graph.
std::vector<std::pair<int, int>> localRanges(const ir::Graph &whole, const ir::Graph &local,
                                             const std::vector<std::pair<int, int>> &ranges);

} // namespace rannc::train
