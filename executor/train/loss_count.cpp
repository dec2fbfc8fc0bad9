#include "executor/train/loss_count.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "executor/runtime/tensor_convert.h"
#include "planner/ir/aten_args.h"
#include "planner/ir/op_set.h"

namespace rannc::train {
namespace {

namespace aa = ir::aten_args;

const std::set<std::string> kOnnxPassThrough = {"Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten"};
const std::set<std::string> kAtenPassThrough = {"aten::view",  "aten::reshape", "aten::squeeze",    "aten::unsqueeze",
                                                "aten::to",    "aten::_to_copy", "aten::clone",     "aten::contiguous",
                                                "aten::alias", "aten::flatten",  "aten::_unsafe_view"};
const std::set<std::string> kAtenNll = {"aten::cross_entropy_loss", "aten::nll_loss", "aten::nll_loss_nd",
                                        "aten::nll_loss2d", "aten::nll_loss_forward"};

const ir::AttrValue *attr(const ir::Node &n, const std::string &key) {
  auto it = n.attrs.find(key);
  return it == n.attrs.end() ? nullptr : &it->second;
}

std::optional<int64_t> intAttr(const ir::Node &n, const std::string &key) {
  const auto *a = attr(n, key);
  if (!a || !std::holds_alternative<int64_t>(*a)) return std::nullopt;
  return std::get<int64_t>(*a);
}

std::string stringAttr(const ir::Node &n, const std::string &key, const std::string &dflt) {
  const auto *a = attr(n, key);
  return a && std::holds_alternative<std::string>(*a) ? std::get<std::string>(*a) : dflt;
}

/// The nodes that compute `v` when they read only data inputs and constants
/// (at least one data input); nullopt when a parameter or buffer feeds it.
std::optional<std::vector<ir::NodeId>> dataOnlyNodes(const ir::Graph &g, ir::ValueId v) {
  std::set<ir::NodeId> nodes;
  std::vector<ir::ValueId> todo{v};
  std::set<ir::ValueId> seen;
  bool reads_data = false;
  while (!todo.empty()) {
    ir::ValueId u = todo.back();
    todo.pop_back();
    if (u == ir::kNoValue || !seen.insert(u).second) continue;
    const ir::Value &val = g.values[size_t(u)];
    switch (val.kind) {
    case ir::ValueKind::Input:
      reads_data = true;
      break;
    case ir::ValueKind::Constant:
      break;
    case ir::ValueKind::Intermediate:
      if (val.producer < 0) return std::nullopt;
      nodes.insert(val.producer);
      for (ir::ValueId in : g.nodes[size_t(val.producer)].inputs) todo.push_back(in);
      break;
    default: // a parameter or a buffer: the divisor is not the data's
      return std::nullopt;
    }
  }
  if (!reads_data) return std::nullopt;
  return std::vector<ir::NodeId>(nodes.begin(), nodes.end()); // node ids are in topological order
}

std::optional<LossDenominator> targets(const ir::Graph &g, ir::ValueId t, int64_t ignore, const ir::Node &n) {
  auto nodes = dataOnlyNodes(g, t);
  if (!nodes) return std::nullopt;
  return LossDenominator{LossDenominator::Kind::Targets, t, ignore, std::move(*nodes),
                         "the targets not equal to " + std::to_string(ignore) + " of '" + n.name + "'"};
}

} // namespace

std::optional<LossDenominator> findLossDenominator(const ir::Graph &g) {
  ir::ValueId v = g.loss;
  for (size_t hops = 0; hops < g.nodes.size() && v != ir::kNoValue; ++hops) {
    const ir::Value &val = g.values[size_t(v)];
    if (val.kind != ir::ValueKind::Intermediate || val.producer < 0) return std::nullopt;
    const ir::Node &n = g.nodes[size_t(val.producer)];
    if (n.inputs.empty()) return std::nullopt;
    if (ir::isAten(n)) {
      if (kAtenNll.count(n.op_type)) {
        // (input, target, weight, reduction, ignore_index, ...): mean is 1;
        // a class weight makes the count a weighted one (not handled: samples).
        if (attr(n, aa::kindKey(2)) && stringAttr(n, aa::kindKey(2), "") != aa::kConstNone) return std::nullopt;
        if (stringAttr(n, aa::kindKey(3), "") != aa::kConstInt || intAttr(n, aa::valueKey(3)) != 1 ||
            stringAttr(n, aa::kindKey(4), "") != aa::kConstInt || n.inputs.size() < 2)
          return std::nullopt;
        return targets(g, n.inputs[1], *intAttr(n, aa::valueKey(4)), n);
      }
      if (n.op_type == "aten::div" || n.op_type == "aten::true_divide") {
        if (stringAttr(n, aa::kindKey(1), "") != aa::kTensor || n.inputs.size() < 2) return std::nullopt;
      } else if (kAtenPassThrough.count(n.op_type)) {
        v = n.inputs[0];
        continue;
      } else {
        return std::nullopt;
      }
    } else if (n.domain.empty() || n.domain == "ai.onnx") {
      if (n.op_type == "SoftmaxCrossEntropyLoss" || n.op_type == "NegativeLogLikelihoodLoss") {
        auto ignore = intAttr(n, "ignore_index");
        if (!ignore || stringAttr(n, "reduction", "mean") != "mean" || n.inputs.size() < 2) return std::nullopt;
        if (n.inputs.size() > 2 && n.inputs[2] != ir::kNoValue) return std::nullopt; // class weights
        return targets(g, n.inputs[1], *ignore, n);
      }
      if (n.op_type == "Div") {
        if (n.inputs.size() < 2) return std::nullopt;
      } else if (kOnnxPassThrough.count(n.op_type)) {
        v = n.inputs[0];
        continue;
      } else {
        return std::nullopt;
      }
    } else {
      return std::nullopt;
    }
    // A division: its divisor counts when the data alone decides it.
    auto nodes = dataOnlyNodes(g, n.inputs[1]);
    if (!nodes) return std::nullopt;
    return LossDenominator{LossDenominator::Kind::Value, n.inputs[1], 0, std::move(*nodes),
                           "the divisor '" + g.values[size_t(n.inputs[1])].name + "' of '" + n.name + "'"};
  }
  return std::nullopt;
}

LossShares::LossShares(const ir::Graph &g, std::vector<schedule::SampleRange> shards, int replica, int64_t b, int M)
    : g_(g), shards_(std::move(shards)), replica_(replica), b_(b), M_(M), den_(findLossDenominator(g)) {}

double LossShares::count(const runtime::ValueMap &feeds) const {
  runtime::ValueMap env = feeds;
  runtime::NodeHooks hooks;
  hooks.missing = [this](const ir::Node &, ir::ValueId v) -> std::optional<torch::Tensor> {
    auto it = g_.constant_data.find(v);
    if (it == g_.constant_data.end()) return std::nullopt;
    return runtime::toTorch(it->second);
  };
  torch::NoGradGuard no_grad;
  runtime::runNodes(g_, den_->nodes, env, hooks);
  const torch::Tensor &t = env.at(den_->value);
  if (den_->kind == LossDenominator::Kind::Targets) return double((t != den_->ignore_index).sum().item<int64_t>());
  return t.to(torch::kDouble).sum().item<double>();
}

void LossShares::newStep(int64_t first, int microbatches, const FeedSamples &feed) {
  if (!den_) return;
  // counts[mb][r]: micro-batch mb's denominator on replica r's samples.
  std::vector<std::vector<double>> counts(static_cast<size_t>(microbatches));
  for (int mb = 0; mb < microbatches; ++mb)
    for (const auto &sh : shards_) {
      const double c = sh.size() == 0 ? 0.0 : count(feed(first + int64_t(mb) * b_ + sh.begin, sh.size()));
      counts[size_t(mb)].push_back(c);
    }
  shares_.assign(size_t(microbatches), {0.0, 0.0});
  for (int k = 0; k * M_ < microbatches; ++k) {
    double total = 0;
    for (int m = 0; m < M_; ++m)
      for (double c : counts[size_t(k * M_ + m)]) total += c;
    for (int m = 0; m < M_; ++m) shares_[size_t(k * M_ + m)] = {counts[size_t(k * M_ + m)][size_t(replica_)], total};
  }
}

std::pair<double, double> LossShares::share(int mb) const {
  if (!den_) return {double(shards_[size_t(replica_)].size()), double(b_ * M_)};
  return shares_.at(size_t(mb));
}

} // namespace rannc::train
