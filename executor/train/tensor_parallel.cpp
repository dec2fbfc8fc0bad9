#include "executor/train/tensor_parallel.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "executor/runtime/collectives.h"
#include "executor/runtime/stage.h"
#include "planner/ir/op_set.h"

namespace rannc::train {

std::vector<int> groupLeaders(const std::vector<int> &stage_ranks, int degree) {
  if (degree < 1 || stage_ranks.size() % size_t(degree) != 0)
    throw std::invalid_argument("a stage of " + std::to_string(stage_ranks.size()) +
                                " rank(s) cannot form groups of " + std::to_string(degree));
  std::vector<int> leaders;
  for (size_t i = 0; i < stage_ranks.size(); i += size_t(degree)) leaders.push_back(stage_ranks[i]);
  return leaders;
}

TensorParallelPlace placeOf(const std::vector<int> &stage_ranks, int degree, int rank) {
  groupLeaders(stage_ranks, degree); // checks the degree
  for (size_t i = 0; i < stage_ranks.size(); ++i)
    if (stage_ranks[i] == rank) return {degree, int(i) / degree, int(i) % degree};
  throw std::invalid_argument("rank " + std::to_string(rank) + " is not in the stage");
}

void shareFromLeader(comm::Communicator &group, std::vector<torch::Tensor> &tensors, torch::Device device) {
  if (group.size() == 1) return;
  const bool leader = group.rank() == 0;
  for (torch::Tensor &t : tensors) {
    // The header (dtype and shape; empty: undefined), its size first.
    std::string header = leader && t.defined() ? runtime::packTensorHeader(t) : std::string();
    int64_t size = int64_t(header.size());
    group.broadcast(&size, sizeof size, 0);
    header.resize(size_t(size));
    if (size > 0) group.broadcast(header.data(), header.size(), 0);
    if (size == 0) {
      t = torch::Tensor();
      continue;
    }
    torch::Tensor mine = leader ? t.to(device) : runtime::emptyFromHeader(header, device).zero_();
    t = runtime::allReduceSum(group, mine);
  }
}

void shardParameters(std::map<ir::ValueId, torch::Tensor> &params, const ParameterAxes &axes,
                     const TensorParallelPlace &place) {
  if (place.degree == 1) return;
  for (auto &[id, p] : params) {
    auto axis = axes.find(id);
    if (axis == axes.end()) continue;
    p = runtime::shardOf(p.detach(), axis->second, place.position, place.degree).set_requires_grad(true);
  }
}

std::vector<std::pair<int, int>> localRanges(const ir::Graph &whole, const ir::Graph &local,
                                             const std::vector<std::pair<int, int>> &ranges) {
  // owner[i]: the index in `whole` of local node i, or of the next original
  // node after it (an inserted collective's reader, or the Reshape whose
  // run-time target localGraph patches, its nodes named "<node>/tp_target...").
  // A node made a "rannc" kernel (a vocabulary-parallel lookup or loss) keeps
  // its name and place.
  std::vector<int> owner(local.nodes.size(), int(whole.nodes.size()));
  size_t next = whole.nodes.size(); // matched from the end
  for (size_t i = local.nodes.size(); i-- > 0;) {
    const bool original = next > 0 && local.nodes[i].name == whole.nodes[next - 1].name;
    const bool target = next < whole.nodes.size() &&
                        local.nodes[i].name.rfind(whole.nodes[next].name + "/tp_target", 0) == 0;
    if (original) --next;
    else if (!ir::isRannc(local.nodes[i]) && !target)
      throw std::invalid_argument("node '" + local.nodes[i].name + "' of the local graph is not in the model's graph");
    owner[i] = !original && i + 1 < local.nodes.size() ? owner[i + 1] : int(next);
  }
  if (next != 0) throw std::invalid_argument("the local graph lacks node '" + whole.nodes[next - 1].name + "'");
  std::vector<std::pair<int, int>> out;
  for (const auto &[begin, end] : ranges) {
    int b = 0;
    while (b < int(owner.size()) && owner[size_t(b)] < begin) ++b;
    int e = b;
    while (e < int(owner.size()) && owner[size_t(e)] < end) ++e;
    out.emplace_back(b, e);
  }
  return out;
}

} // namespace rannc::train
