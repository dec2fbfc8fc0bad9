// Analysis::print: what the analysis found, per op, for `rannc-plan import --tensor-parallel`.
#include <map>

#include "planner/sharding/propagate.h"
#include "planner/sharding/sharding.h"

namespace rannc::sharding {

namespace {

std::string shardingText(const ValueSharding &s, const ir::Value &v) {
  if (s.partial) return "partial";
  if (s.axis < 0) return "whole";
  std::string text = "axis " + std::to_string(s.axis);
  if (v.shape_known && s.axis < static_cast<int>(v.shape.size()) && !v.shape[s.axis].isFixed())
    text += " (" + std::to_string(v.shape[s.axis].batch_coeff) + " per batch row, Note [batch-folded cuts])";
  return text;
}

} // namespace

std::string_view nodeRole(const ir::Graph &g, const Analysis &a, ir::NodeId n) {
  switch (detail::vocabRole(g, a.values, n)) {
  case detail::VocabRole::Lookup: return "vocab-parallel embedding";
  case detail::VocabRole::Loss: return "vocab-parallel loss";
  case detail::VocabRole::LossLogSoftmax: return "vocab-parallel loss (its log-softmax)";
  case detail::VocabRole::None: break;
  }
  const ir::Node &node = g.nodes[n];
  bool partial = false, cut_out = false, cut_weight = false;
  for (ir::ValueId out : node.outputs)
    if (out != ir::kNoValue) {
      partial = partial || a.values[out].partial;
      cut_out = cut_out || a.values[out].axis >= 0;
    }
  for (ir::ValueId in : node.inputs)
    if (in != ir::kNoValue && a.values[in].axis >= 0 && g.values[in].kind != ir::ValueKind::Input) {
      const ir::Value &v = g.values[in];
      bool weight = v.kind == ir::ValueKind::Parameter ||
                    (v.kind == ir::ValueKind::Intermediate && v.producer >= 0 && a.node_split[v.producer] &&
                     g.nodes[v.producer].inputs.size() == 1 &&
                     g.values[g.nodes[v.producer].inputs[0]].kind == ir::ValueKind::Parameter);
      cut_weight = cut_weight || weight;
    }
  const bool product = node.domain.empty() ? node.op_type == "MatMul" || node.op_type == "Gemm"
                                            : node.op_type == "aten::linear" || node.op_type == "aten::matmul" ||
                                                  node.op_type == "aten::mm" || node.op_type == "aten::bmm";
  if (product && partial && cut_weight) return "row-parallel";
  if (product && cut_out && cut_weight) return "column-parallel";
  if (partial) return "partial";
  return n < static_cast<ir::NodeId>(a.node_split.size()) && a.node_split[n] ? "split" : "whole";
}

void Analysis::print(const ir::Graph &g, std::ostream &os) const {
  os << "tensor parallelism: ";
  if (!any()) {
    os << "nothing to cut; every op runs whole on each device\n";
    return;
  }
  os << "cut sizes";
  for (int64_t s : cut_sizes) os << ' ' << s;
  os << '\n';
  // The collectives whose results each node reads.
  std::map<ir::NodeId, std::vector<const Collective *>> reads;
  for (const Collective &c : collectives)
    for (ir::NodeId r : c.readers) reads[r].push_back(&c);
  auto name = [&](ir::ValueId v) { return '%' + g.values[v].name; };
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g.nodes.size()); ++n) {
    const bool split = n < static_cast<ir::NodeId>(node_split.size()) && node_split[n];
    auto it = reads.find(n);
    if (!split && it == reads.end()) continue;
    const ir::Node &node = g.nodes[n];
    os << "  " << node.name << " (" << (node.domain.empty() ? "" : node.domain + ".") << node.op_type
       << "): " << nodeRole(g, *this, n);
    if (it != reads.end())
      for (const Collective *c : it->second) {
        os << "; " << collectiveName(c->kind) << '(' << name(c->value);
        if (c->kind == CollectiveKind::GatherAxis) os << ", axis " << c->axis;
        os << ") first";
      }
    for (ir::ValueId in : node.inputs)
      if (in != ir::kNoValue && g.values[in].kind == ir::ValueKind::Parameter && values[in].axis >= 0)
        os << "; param " << name(in) << ' ' << shardingText(values[in], g.values[in]);
    for (ir::ValueId out : node.outputs)
      if (out != ir::kNoValue && !values[out].replicated())
        os << "; " << name(out) << ' ' << shardingText(values[out], g.values[out]);
    os << '\n';
  }
}

} // namespace rannc::sharding
