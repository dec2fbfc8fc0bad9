#include "executor/train/scatter_gather.h"

#include <algorithm>
#include <string>
#include <utility>

#include "executor/runtime/collectives.h"
#include "planner/cluster/transfers.h"

namespace rannc::train {
namespace {

// Note [scatter/gather in the executor]: the dtypes the float32 all-gather carries exactly.
bool sliced(torch::ScalarType dtype, int64_t numel) {
  return numel > 0 && (dtype == torch::kFloat || dtype == torch::kHalf || dtype == torch::kBFloat16);
}

/// Sends each piece as its shape and this position's slice; receives the
/// slices and all-gathers them into whole pieces over the group.
class SlicedTransport final : public Transport {
public:
  SlicedTransport(Transport &inner, comm::Communicator &group) : inner_(inner), group_(group) {}

  void send(const std::vector<std::pair<torch::Tensor, int>> &pieces, int tag) override {
    std::vector<std::pair<torch::Tensor, int>> messages;
    for (const auto &[t, dst] : pieces) {
      std::vector<int64_t> shape{0};
      shape.insert(shape.end(), t.sizes().begin(), t.sizes().end());
      messages.emplace_back(torch::empty(shape, t.options()), dst);
      messages.emplace_back(sliced(t.scalar_type(), t.numel()) ? flatSlice(t, group_.rank(), group_.size()) : t, dst);
    }
    inner_.send(messages, tag);
  }

  std::vector<torch::Tensor> recv(const std::vector<int> &srcs, int tag) override {
    std::vector<int> twice;
    for (int src : srcs) twice.insert(twice.end(), {src, src});
    const std::vector<torch::Tensor> messages = inner_.recv(twice, tag);
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i < srcs.size(); ++i) {
      const torch::Tensor &header = messages[2 * i], &piece = messages[2 * i + 1];
      const std::vector<int64_t> shape(header.sizes().begin() + 1, header.sizes().end());
      const int64_t numel = c10::multiply_integers(shape);
      if (!sliced(header.scalar_type(), numel)) {
        out.push_back(piece);
        continue;
      }
      out.push_back(runtime::allGather(group_, piece, 0).narrow(0, 0, numel).reshape(shape));
    }
    return out;
  }

  void waitSends() override { inner_.waitSends(); }
  void waitSendsTagged(int tag) override { inner_.waitSendsTagged(tag); }

private:
  Transport &inner_;
  comm::Communicator &group_;
};

} // namespace

torch::Tensor flatSlice(const torch::Tensor &t, int p, int t_count) {
  const int64_t n = t.numel(), chunk = (n + t_count - 1) / t_count;
  const int64_t begin = std::min(n, p * chunk), len = std::min(chunk, n - begin);
  torch::Tensor slice = t.detach().reshape({-1}).narrow(0, begin, len);
  if (len == chunk) return slice.contiguous();
  return torch::cat({slice, torch::zeros({chunk - len}, t.options())});
}

namespace {

/// [from][to]: whether values go scattered from stage `from` to stage `to`.
std::vector<std::vector<bool>> scatterPairs(const Setup &s) {
  const int stages = s.plan.stages_size();
  const bool rule = cluster::scatterGatherTransfers(s.plan.cluster().device().type());
  const int per_node = std::max(1, s.plan.cluster().devices_per_node());
  std::vector<std::vector<bool>> pairs(size_t(stages), std::vector<bool>(size_t(stages), false));
  for (int q = 0; q < stages && rule; ++q)
    for (int r = 0; r < stages; ++r) {
      const auto &from = s.plan.stages(q).ranks();
      const auto &to = s.plan.stages(r).ranks();
      const int t = s.tensor_parallel[size_t(q)];
      if (r == q || t <= 1 || s.tensor_parallel[size_t(r)] != t || from.empty() || to.empty()) continue;
      // The cost model's node test (evaluate.cpp): last ranks for
      // activations, first ranks for gradients.
      pairs[size_t(q)][size_t(r)] = q < r ? cluster::acrossNodes(from[from.size() - 1], to[to.size() - 1], per_node)
                                          : cluster::acrossNodes(to[0], from[0], per_node);
    }
  return pairs;
}

} // namespace

ScatterGather::ScatterGather(Transport &transport, const Setup &s, comm::Communicator *group)
    : scatters_(scatterPairs(s)), peers_(size_t(s.plan.stages_size())) {
  for (int q = 0; q < s.plan.stages_size(); ++q) {
    const auto &ranks = s.plan.stages(q).ranks();
    const int t = s.tensor_parallel[size_t(q)];
    if (t == s.tp.degree) // this rank's position exists in the stage's groups
      for (int i = s.tp.position; i < ranks.size(); i += t) peers_[size_t(q)].push_back(ranks[i]);
  }
  if (group) sliced_ = std::make_unique<SlicedTransport>(transport, *group);
}

std::string scatterGatherLine(const Setup &s) {
  const auto scatters = scatterPairs(s);
  std::string pairs;
  for (size_t q = 0; q + 1 < scatters.size(); ++q)
    for (const auto &[a, b] : {std::pair{q, q + 1}, std::pair{q + 1, q}})
      if (scatters[a][b]) pairs += (pairs.empty() ? "" : ", ") + std::to_string(a) + " -> " + std::to_string(b);
  return pairs.empty() ? "" : "rannc-exec: scatter/gather across nodes (Megatron-LM): stage(s) " + pairs + "\n";
}

} // namespace rannc::train
