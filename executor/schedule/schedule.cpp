#include "executor/schedule/schedule.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "planner/ir/op_set.h"
#include "planner/pipeline/gradient_waits.h"

namespace rannc::schedule {

std::string toString(const Action &a) {
  const char *name = "?";
  switch (a.kind) {
  case ActionKind::RecvActivations: name = "recv-act"; break;
  case ActionKind::Forward: name = "forward"; break;
  case ActionKind::SendActivations: name = "send-act"; break;
  case ActionKind::RecvGradients: name = "recv-grad"; break;
  case ActionKind::Backward: name = "backward"; break;
  case ActionKind::SendGradients: name = "send-grad"; break;
  case ActionKind::BackwardWeight: name = "backward-weight"; break;
  case ActionKind::AwaitGradients: name = "await-grad"; break;
  case ActionKind::AllReduce: name = "all-reduce"; break;
  case ActionKind::OptimizerStep: name = "optimizer-step"; break;
  }
  const std::string at = a.stage < 0 ? "" : "@" + std::to_string(a.stage);
  return a.microbatch < 0 ? name + at : std::string(name) + "(" + std::to_string(a.microbatch) + ")" + at;
}

void print(const std::vector<Action> &actions, std::ostream &os) {
  for (size_t i = 0; i < actions.size(); ++i) os << (i ? " " : "") << toString(actions[i]);
  os << "\n";
}

namespace {

void forward(std::vector<Action> &a, int m, bool first, bool last, int stage) {
  if (!first) a.push_back({ActionKind::RecvActivations, m, stage});
  a.push_back({ActionKind::Forward, m, stage});
  if (!last) a.push_back({ActionKind::SendActivations, m, stage});
}

void backward(std::vector<Action> &a, int m, bool first, bool last, int stage) {
  if (!last) a.push_back({ActionKind::RecvGradients, m, stage});
  a.push_back({ActionKind::Backward, m, stage});
  if (!first) a.push_back({ActionKind::SendGradients, m, stage});
}

void finish(std::vector<Action> &a) {
  a.push_back({ActionKind::AllReduce, -1});
  a.push_back({ActionKind::OptimizerStep, -1});
}

} // namespace

std::vector<Action> build(pipeline::Schedule schedule, int stage, int num_stages, int microbatches) {
  std::vector<Action> a;
  const bool first = stage == 0, last = stage == num_stages - 1;
  for (const pipeline::Pass &p : pipeline::stageOrder(schedule, stage, num_stages, microbatches)) {
    if (p.weight)
      a.push_back({ActionKind::BackwardWeight, p.microbatch});
    else
      (p.forward ? forward : backward)(a, p.microbatch, first, last, -1);
  }
  finish(a);
  return a;
}

std::vector<Action> buildRank(pipeline::Schedule schedule, int rank, int ranks, int virtual_stages, int microbatches) {
  if (virtual_stages <= 1) return build(schedule, rank, ranks, microbatches);
  std::vector<Action> a;
  const int num_stages = ranks * virtual_stages;
  for (const pipeline::Pass &p : pipeline::rankOrder(schedule, rank, ranks, virtual_stages, microbatches)) {
    const int stage = p.chunk * ranks + rank; // Note [interleaved 1F1B]
    (p.forward ? forward : backward)(a, p.microbatch, stage == 0, stage == num_stages - 1, stage);
  }
  finish(a);
  return a;
}

Expected<std::vector<Action>> awaitingGradients(const std::vector<std::vector<Action>> &lists, int rank,
                                                const std::vector<std::vector<int>> &producers) {
  const int ranks = static_cast<int>(lists.size());
  auto isPass = [](const Action &a) {
    return a.kind == ActionKind::Forward || a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight;
  };
  std::vector<std::vector<pipeline::Pass>> orders(lists.size());
  for (int r = 0; r < ranks; ++r)
    for (const Action &a : lists[r])
      if (isPass(a))
        orders[r].push_back({a.kind == ActionKind::Forward, a.microbatch, a.kind == ActionKind::BackwardWeight,
                             a.stage < 0 ? 0 : a.stage / ranks});
  auto waits = pipeline::awaitedGradients(orders, producers);
  if (!waits) return waits.error();
  std::vector<Action> out;
  size_t pass = 0;
  for (const Action &a : lists[static_cast<size_t>(rank)]) {
    if (isPass(a)) {
      for (const pipeline::SentGradient &g : (*waits)[static_cast<size_t>(rank)][pass])
        out.push_back({ActionKind::AwaitGradients, g.microbatch, a.stage < 0 ? -1 : g.stage});
      ++pass;
    }
    out.push_back(a);
  }
  return out;
}

std::vector<Action> accumulate(const std::vector<Action> &one_batch, int batches, int microbatches) {
  std::vector<Action> a;
  for (int j = 0; j < batches; ++j)
    for (Action x : one_batch) {
      if (x.kind == ActionKind::AllReduce || x.kind == ActionKind::OptimizerStep) continue;
      x.microbatch += j * microbatches;
      a.push_back(x);
    }
  finish(a);
  return a;
}

int peakMicrobatchesInFlight(const std::vector<Action> &actions) {
  const bool split = std::any_of(actions.begin(), actions.end(),
                                 [](const Action &a) { return a.kind == ActionKind::BackwardWeight; });
  const ActionKind frees = split ? ActionKind::BackwardWeight : ActionKind::Backward;
  int alive = 0, peak = 0;
  for (const auto &a : actions) {
    if (a.kind == ActionKind::Forward) peak = std::max(peak, ++alive);
    if (a.kind == frees) --alive;
  }
  return peak;
}

namespace {

/// For each stage, the values it receives (by producer stage) and the nodes
/// it recomputes (Note [recomputed values]).
struct Routing {
  std::vector<std::set<std::pair<int, ir::ValueId>>> recvs;
  std::vector<std::set<ir::NodeId>> nodes;
};

Routing route(const ir::Graph &g, const std::vector<std::pair<int, int>> &ranges) {
  const int num_stages = static_cast<int>(ranges.size());
  std::vector<int> stage_of(g.nodes.size(), -1);
  for (int s = 0; s < num_stages; ++s)
    for (int n = ranges[s].first; n < ranges[s].second; ++n) stage_of[n] = s;

  // recomputable[v]: rebuilt on the consuming stage from its own inputs
  // (which are then needed in turn): Constant ops and non-floating values.
  std::vector<char> recomputable(g.values.size(), 0);
  for (const ir::Node &node : g.nodes)
    for (ir::ValueId out : node.outputs)
      if (out != ir::kNoValue) recomputable[out] = node.inputs.empty() || !ir::isFloating(g.values[out].dtype);

  Routing r;
  r.recvs.resize(num_stages);
  r.nodes.resize(num_stages);
  for (int s = 0; s < num_stages; ++s) {
    auto &nodes = r.nodes[s];
    std::function<void(ir::ValueId)> need = [&](ir::ValueId in) {
      if (in == ir::kNoValue || g.values[in].kind != ir::ValueKind::Intermediate) return;
      ir::NodeId p = g.values[in].producer;
      if (stage_of[p] == s || nodes.count(p)) return;
      if (recomputable[in]) {
        nodes.insert(p);
        for (ir::ValueId pin : g.nodes[p].inputs) need(pin);
      } else {
        r.recvs[s].insert({stage_of[p], in});
      }
    };
    for (ir::NodeId n = ranges[s].first; n < ranges[s].second; ++n) {
      nodes.insert(n);
      for (ir::ValueId in : g.nodes[n].inputs) need(in);
    }
  }
  return r;
}

/// Note [gradient-free values]: per value, whether it may carry a gradient.
std::vector<char> mayCarryGradient(const ir::Graph &g) {
  std::vector<char> carries(g.values.size(), 0);
  auto differentiable = [&](ir::ValueId v) {
    if (v == ir::kNoValue) return false;
    const ir::DType t = g.values[v].dtype;
    return ir::isFloating(t) || t == ir::DType::C64 || t == ir::DType::C128;
  };
  for (ir::ValueId v = 0; v < ir::ValueId(g.values.size()); ++v)
    carries[v] = g.values[v].kind == ir::ValueKind::Parameter && differentiable(v);
  // Nodes are in topological order; an in-place op marks earlier values,
  // whose readers are then visited again: repeat until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (const ir::Node &node : g.nodes) {
      bool any = false;
      for (ir::ValueId in : node.inputs) any |= in != ir::kNoValue && carries[in];
      if (!any) continue;
      for (ir::ValueId out : node.outputs)
        if (differentiable(out) && !carries[out]) carries[out] = 1, changed = true;
      if (!ir::isInPlace(node) || node.inputs.empty()) continue;
      // What it writes may be a view (a slice of a zeros): up the first
      // inputs, every value it may alias (more than it does: harmless).
      for (ir::ValueId v = node.inputs[0]; differentiable(v) && !carries[v];) {
        carries[v] = 1, changed = true;
        const ir::Value &val = g.values[v];
        if (val.kind != ir::ValueKind::Intermediate || g.nodes[val.producer].inputs.empty()) break;
        v = g.nodes[val.producer].inputs[0];
      }
    }
  }
  return carries;
}

/// Note [shape-only receives]
/// A stage may read a value another stage made for its shape alone: the
/// integer chain Shape -> Gather -> Concat that a reshape reads is
/// recomputed locally (Note [recomputed values]), so its Shape's input, a
/// float activation, is received. No gradient flows through a shape, so the
/// receiver does not make it a leaf that requires one, lets it go after its
/// last reader as it does a value of its own (Note [last use] in
/// executor/runtime/stage.h), and sends back no gradient for it. A GPT
/// stage beginning at an attention kernel received the query projection's
/// output, 4,096 B a micro-batch, only to read its shape, and had kept it
/// to the micro-batch's backward (or W): on the 4-stage, 8-micro-batch
/// memory_split case ZB-H2's stage 1 held 7 of them, 28,672 B over the
/// plan, whose cut counts only values read for their elements.
bool readsOnlyShape(const ir::Node &n) {
  if (ir::isAten(n))
    return n.op_type == "aten::size" || n.op_type == "aten::sym_size" || n.op_type == "aten::numel" ||
           n.op_type == "aten::dim" || n.op_type == "aten::len";
  return n.domain.empty() && (n.op_type == "Shape" || n.op_type == "Size");
}

/// Whether any of `nodes` reads `v` for more than its shape.
bool readsElements(const ir::Graph &g, const std::set<ir::NodeId> &nodes, ir::ValueId v) {
  for (ir::NodeId n : nodes)
    if (!readsOnlyShape(g.nodes[n]) && std::count(g.nodes[n].inputs.begin(), g.nodes[n].inputs.end(), v) > 0)
      return true;
  return false;
}

} // namespace

StageProgram buildStageProgram(const ir::Graph &g, const std::vector<std::pair<int, int>> &ranges, int stage) {
  Routing r = route(g, ranges);
  StageProgram p;
  p.stage = stage;
  p.nodes.assign(r.nodes[stage].begin(), r.nodes[stage].end());
  std::set<ir::ValueId> data, params, consts, buffers;
  for (ir::NodeId n : p.nodes)
    for (ir::ValueId in : g.nodes[n].inputs) {
      if (in == ir::kNoValue) continue;
      switch (g.values[in].kind) {
      case ir::ValueKind::Input: data.insert(in); break;
      case ir::ValueKind::Parameter: params.insert(in); break;
      case ir::ValueKind::Constant: consts.insert(in); break;
      case ir::ValueKind::Buffer: buffers.insert(in); break;
      case ir::ValueKind::Intermediate: break;
      }
    }
  p.data_inputs.assign(data.begin(), data.end());
  p.parameters.assign(params.begin(), params.end());
  p.constants.assign(consts.begin(), consts.end());
  p.buffers.assign(buffers.begin(), buffers.end());
  // Note [shared parameters]: which other stages read this stage's parameters.
  std::map<ir::ValueId, std::set<int>> readers;
  for (int t = 0; t < static_cast<int>(ranges.size()); ++t)
    for (ir::NodeId n : r.nodes[t])
      for (ir::ValueId in : g.nodes[n].inputs)
        if (in != ir::kNoValue && params.count(in)) readers[in].insert(t);
  for (const auto &[v, stages] : readers)
    if (stages.size() > 1) p.shared_parameters.push_back({v, {stages.begin(), stages.end()}});
  const std::vector<char> carries = mayCarryGradient(g); // Note [gradient-free values]
  // Note [shape-only receives]: a gradient only through a value a stage reads the elements of.
  auto gradient = [&](int t, ir::ValueId v) { return carries[v] && readsElements(g, r.nodes[t], v); };
  for (auto [s, v] : r.recvs[stage]) p.recvs.push_back({v, s, gradient(stage, v)});
  std::set<std::pair<int, ir::ValueId>> sends;
  for (int t = 0; t < static_cast<int>(ranges.size()); ++t)
    for (auto [s, v] : r.recvs[t])
      if (s == stage) sends.insert({t, v});
  for (auto [t, v] : sends) p.sends.push_back({v, t, gradient(t, v)});
  p.computes_loss = g.loss != ir::kNoValue && g.values[g.loss].producer >= ranges[stage].first &&
                    g.values[g.loss].producer < ranges[stage].second;
  return p;
}

std::vector<SampleRange> splitSamples(int64_t count, int replicas) {
  std::vector<SampleRange> out;
  int64_t begin = 0;
  for (int j = 0; j < replicas; ++j) {
    int64_t size = count / replicas + (j < count % replicas ? 1 : 0);
    out.push_back({begin, begin + size});
    begin += size;
  }
  return out;
}

SampleRange intersect(const SampleRange &a, const SampleRange &b) {
  return {std::max(a.begin, b.begin), std::min(a.end, b.end)};
}

} // namespace rannc::schedule
