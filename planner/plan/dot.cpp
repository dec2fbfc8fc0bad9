#include "planner/plan/dot.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "planner/plan/plan.h"
#include "planner/plan/show.h"

namespace rannc::plan {
namespace {

/// A DOT double-quoted string body.
std::string quoted(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

const char *kFill[] = {"#dbe9f6", "#fde2c8", "#d9f0d3", "#f3d6e8", "#fff2b3", "#e0dcf0", "#d4eeee", "#f0e0d0"};

} // namespace

void printPlanDot(const proto::Plan &plan, const ir::Graph &g, const DotOptions &opts, std::ostream &os) {
  const int num_ops = int(g.nodes.size());
  const int64_t mb = std::max<int64_t>(1, plan.microbatches() > 0 ? plan.global_batch_size() / plan.microbatches() : 1);

  // Drawn nodes: one per op, or one per group.
  std::vector<std::pair<int, int>> nodes = opts.groups;
  if (nodes.empty())
    for (int n = 0; n < num_ops; ++n) nodes.emplace_back(n, n + 1);
  std::vector<int> node_of(num_ops, -1), stage_of(num_ops, -1);
  for (int k = 0; k < int(nodes.size()); ++k)
    for (int n = nodes[k].first; n < nodes[k].second && n < num_ops; ++n) node_of[n] = k;
  for (int s = 0; s < plan.stages_size(); ++s)
    for (int n = std::max(0, plan.stages(s).op_begin()); n < std::min(num_ops, plan.stages(s).op_end()); ++n)
      stage_of[n] = s;
  const bool grouped = !opts.groups.empty();
  auto nodeId = [&](int k) { return (grouped ? "u" : "op") + std::to_string(k); };

  os << "// rannc-plan dot: " << plan.model().path() << ", " << plan.stages_size() << " stages, " << num_ops << " ops"
     << (grouped ? " drawn as " + std::to_string(nodes.size()) + " units" : "")
     << "; cut edges: bytes per micro-batch of " << mb << " samples\n";
  os << "digraph plan {\n";
  os << "  graph [rankdir=TB, fontname=\"Helvetica\", fontsize=12, newrank=true];\n";
  os << "  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\", fontsize=10];\n";
  os << "  edge [fontname=\"Helvetica\", fontsize=9, color=\"#808080\"];\n";

  const std::set<int> split(plan.graph().sharding().split_ops().begin(), plan.graph().sharding().split_ops().end());
  for (int s = 0; s < plan.stages_size(); ++s) {
    const auto &st = plan.stages(s);
    std::string ranks;
    for (int r : st.ranks()) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    os << "  subgraph cluster_" << s << " {\n";
    const int tp = tensorParallel(st); // a tensor-parallel stage says so, and marks the ops run on slices
    os << "    label="
       << quoted("stage " + std::to_string(s) + " (ranks " + ranks +
                 (tp > 1 ? "; tensor-parallel " + std::to_string(tp) : std::string()) + ")")
       << ";\n";
    os << "    style=filled; color=\"#a0a0a0\"; fillcolor=" << quoted(kFill[s % 8]) << ";\n";
    for (int k = 0; k < int(nodes.size()); ++k) {
      const auto [begin, end] = nodes[k];
      if (begin >= num_ops || stage_of[begin] != s) continue;
      const ir::Node &first = g.nodes[begin];
      std::string label = grouped ? std::to_string(end - begin) + (end - begin == 1 ? " op" : " ops") + " from\n" +
                                        first.name + " (" + first.op_type + ")"
                                  : first.name + "\n" + first.op_type;
      if (tp > 1 && !grouped && split.count(begin)) label += "\n(split " + std::to_string(tp) + " ways)";
      os << "    " << nodeId(k) << " [label=" << quoted(label) << "];\n";
    }
    os << "  }\n";
  }

  // Data inputs (read locally by every stage that needs them) and the loss.
  std::map<ir::ValueId, int> input_index;
  for (int i = 0; i < int(g.inputs.size()); ++i) {
    input_index[g.inputs[i]] = i;
    const ir::Value &v = g.values[g.inputs[i]];
    os << "  in" << i << " [shape=ellipse, style=solid, label="
       << quoted(v.name + "\n" + (v.shape_known ? ir::shapeString(v.shape) : "[*]")) << "];\n";
  }

  // Edges, merged per pair of drawn nodes: the values each carries.
  std::map<std::pair<int, int>, std::set<ir::ValueId>> edges;
  std::set<std::pair<int, int>> input_edges;
  for (int n = 0; n < num_ops; ++n)
    for (ir::ValueId in : g.nodes[n].inputs) {
      if (in == ir::kNoValue || node_of[n] < 0) continue;
      const ir::Value &v = g.values[in];
      if (v.kind == ir::ValueKind::Input) input_edges.insert({input_index[in], node_of[n]});
      if (v.kind != ir::ValueKind::Intermediate || v.producer < 0) continue;
      const int src = node_of[v.producer], dst = node_of[n];
      if (src != dst && src >= 0 && dst >= 0) edges[{src, dst}].insert(in);
    }
  for (auto [i, k] : input_edges) os << "  in" << i << " -> " << nodeId(k) << " [style=dashed];\n";
  for (const auto &[pair, values] : edges) {
    const int a = nodes[pair.first].first, b = nodes[pair.second].first;
    os << "  " << nodeId(pair.first) << " -> " << nodeId(pair.second);
    if (stage_of[a] == stage_of[b]) {
      os << ";\n";
      continue;
    }
    // Floating values computed from data are sent; integer values and
    // constants are recomputed by the receiver (Note [recomputed values]).
    int64_t sent = 0;
    bool any_sent = false, unknown = false;
    for (ir::ValueId v : values) {
      const ir::Value &val = g.values[v];
      if (!ir::isFloating(val.dtype) || g.nodes[val.producer].inputs.empty()) continue;
      any_sent = true;
      if (!val.shape_known)
        unknown = true;
      else
        sent += ir::numelAt(val.shape, mb) * ir::dtypeSize(val.dtype);
    }
    if (any_sent)
      os << " [label=" << quoted(unknown ? bytesText(double(sent)) + "+?" : bytesText(double(sent)))
         << ", color=\"#c03020\", fontcolor=\"#c03020\", penwidth=2];\n";
    else
      os << " [label=\"recomputed\", style=dashed];\n";
  }
  if (g.loss != ir::kNoValue && g.values[g.loss].producer >= 0) {
    os << "  loss [shape=ellipse, style=solid, label=" << quoted(g.values[g.loss].name) << "];\n";
    os << "  " << nodeId(node_of[g.values[g.loss].producer]) << " -> loss;\n";
  }
  os << "}\n";
}

} // namespace rannc::plan
