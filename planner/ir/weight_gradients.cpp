#include "planner/ir/weight_gradients.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

namespace rannc::ir {
namespace {

/// Per value: made from parameters alone (weight), and depends on the data.
struct Sides {
  std::vector<char> weight, data;
};

Sides sides(const Graph &g) {
  Sides s{std::vector<char>(g.values.size(), 0), std::vector<char>(g.values.size(), 0)};
  for (ValueId v = 0; v < ValueId(g.values.size()); ++v) {
    s.weight[v] = g.values[v].kind == ValueKind::Parameter;
    s.data[v] = g.values[v].kind == ValueKind::Input;
  }
  for (const Node &node : g.nodes) { // topological order
    bool any_weight = false, any_data = false;
    for (ValueId in : node.inputs)
      if (in != kNoValue) any_weight |= bool(s.weight[in]), any_data |= bool(s.data[in]);
    for (ValueId out : node.outputs)
      if (out != kNoValue) s.weight[out] = any_weight && !any_data, s.data[out] = any_data;
  }
  return s;
}

bool gradientCarrying(const Graph &g, const Sides &s, ValueId v) {
  return v != kNoValue && isFloating(g.values[v].dtype) && (s.weight[v] || s.data[v]);
}

} // namespace

bool weightGradientInB(const Node &node) {
  static const std::set<std::string> in_b{"Add",
                                          "Sub",
                                          "Mul",
                                          "Div",
                                          "PRelu",
                                          "LayerNormalization",
                                          "RMSNormalization",
                                          "BatchNormalization",
                                          "InstanceNormalization",
                                          "GroupNormalization"};
  return in_b.count(node.op_type) > 0;
}

namespace {

/// Per node: the weight share of every op that combines a weight with data.
std::vector<double> weightDataShares(const Graph &g) {
  const Sides s = sides(g);
  std::vector<double> roots(g.nodes.size(), 0.0);
  for (NodeId n = 0; n < NodeId(g.nodes.size()); ++n) {
    double weight = 0, all = 0;
    bool data = false;
    for (ValueId in : g.nodes[n].inputs) {
      if (in == kNoValue) continue;
      data |= bool(s.data[in]); // integer data too: an embedding's Gather of token ids is a root
      if (gradientCarrying(g, s, in)) all += 1, weight += s.weight[in] ? 1 : 0;
    }
    if (weight > 0 && data) roots[n] = weight / all;
  }
  return roots;
}

} // namespace

std::vector<double> weightGradientRoots(const Graph &g) {
  std::vector<double> roots = weightDataShares(g);
  for (NodeId n = 0; n < NodeId(g.nodes.size()); ++n)
    if (weightGradientInB(g.nodes[n])) roots[n] = 0; // Note [weight gradients in B]
  return roots;
}

std::vector<std::vector<ValueId>> weightGradientReads(const Graph &g) {
  const Sides s = sides(g);
  const std::vector<double> roots = weightGradientRoots(g);
  std::vector<std::vector<ValueId>> reads(g.nodes.size());
  for (NodeId n = 0; n < NodeId(g.nodes.size()); ++n) {
    const Node &node = g.nodes[n];
    if (roots[n] <= 0) continue;
    for (ValueId in : node.inputs)
      if (in != kNoValue && s.data[in] && std::find(reads[n].begin(), reads[n].end(), in) == reads[n].end())
        reads[n].push_back(in);
  }
  return reads;
}

namespace {

/// The parameters node n reaches through its weight-side inputs, up the
/// chain of weight-only ops above them, ascending. `enter(v)` says whether to
/// go on above the weight-only intermediate v (false: stop there).
template <class Enter> std::vector<ValueId> parametersAbove(const Graph &g, const Sides &s, NodeId n, Enter enter) {
  std::vector<ValueId> params;
  std::set<ValueId> seen;
  std::vector<ValueId> todo(g.nodes[n].inputs.begin(), g.nodes[n].inputs.end());
  while (!todo.empty()) {
    const ValueId v = todo.back();
    todo.pop_back();
    if (v == kNoValue || !s.weight[v] || !seen.insert(v).second) continue;
    const Value &val = g.values[v];
    if (val.kind == ValueKind::Parameter)
      params.push_back(v);
    else if (val.kind == ValueKind::Intermediate && enter(v))
      for (ValueId in : g.nodes[val.producer].inputs) todo.push_back(in);
  }
  std::sort(params.begin(), params.end());
  return params;
}

} // namespace

std::vector<std::vector<ValueId>> weightGradientsInB(const Graph &g) {
  const Sides s = sides(g);
  const std::vector<double> share = weightDataShares(g);
  std::vector<std::vector<ValueId>> out(g.nodes.size());
  for (NodeId n = 0; n < NodeId(g.nodes.size()); ++n)
    if (share[n] > 0 && weightGradientInB(g.nodes[n])) out[n] = parametersAbove(g, s, n, [](ValueId) { return true; });
  return out;
}

StageWeightRoots stageWeightRoots(const Graph &g, const std::vector<NodeId> &nodes) {
  const Sides s = sides(g);
  const std::vector<double> share = weightDataShares(g);
  StageWeightRoots out;
  std::map<ValueId, NodeId> reader; // parameter -> the first root that reaches it
  const std::set<NodeId> in_stage(nodes.begin(), nodes.end());
  for (NodeId n : nodes) {
    if (share[n] <= 0) continue;
    std::vector<ValueId> params = parametersAbove(g, s, n, [&](ValueId v) {
      if (in_stage.count(g.values[v].producer)) return true;
      if (out.conflict.empty()) // its gradient would go back to a stage with no root for it
        out.conflict = "weight-only value '" + g.values[v].name + "' that node '" + g.nodes[n].name +
                       "' reads comes from another stage";
      return false;
    });
    for (ValueId v : params) {
      auto [it, fresh] = reader.emplace(v, n);
      if (!fresh && it->second != n && out.conflict.empty())
        out.conflict = "'" + g.values[v].name + "' is read by nodes '" + g.nodes[it->second].name + "' and '" +
                       g.nodes[n].name + "'";
    }
    if (weightGradientInB(g.nodes[n]))
      out.in_b.insert(out.in_b.end(), params.begin(), params.end());
    else
      out.roots.push_back({n, std::move(params)});
  }
  std::sort(out.in_b.begin(), out.in_b.end());
  out.in_b.erase(std::unique(out.in_b.begin(), out.in_b.end()), out.in_b.end());
  return out;
}

} // namespace rannc::ir
