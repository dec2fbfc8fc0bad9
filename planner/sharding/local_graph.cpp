// localGraph: the SPMD graph each device of a tensor-parallel group runs.
#include <algorithm>
#include <cstring>
#include <map>

#include "planner/ir/op_set.h"
#include "planner/sharding/propagate.h"
#include "planner/sharding/sharding.h"

namespace rannc::sharding {

namespace {

std::string_view collectiveOp(CollectiveKind k) {
  switch (k) {
  case CollectiveKind::CopyToGroup: return ir::kTensorParallelCopy;
  case CollectiveKind::SumOverGroup: return ir::kTensorParallelSum;
  case CollectiveKind::GatherAxis: return ir::kTensorParallelGather;
  }
  return ir::kTensorParallelCopy;
}

ir::Tensor int64Tensor(const std::vector<int64_t> &v) {
  ir::Tensor t;
  t.dtype = ir::DType::I64;
  t.dims = {static_cast<int64_t>(v.size())};
  t.data.resize(v.size() * sizeof(int64_t));
  if (!v.empty()) std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

} // namespace

Expected<ir::Graph> localGraph(const ir::Graph &g, const Analysis &a, int degree) {
  if (degree == 1) return g;
  if (a.values.size() != g.values.size() || a.node_split.size() != g.nodes.size())
    return Error{"tensor parallel: the analysis does not belong to this graph"};
  if (!a.validDegree(degree))
    return Error{"tensor parallel degree " + std::to_string(degree) + " does not divide every cut size"};
  ir::Graph out = g;
  // Cut values at 1/degree of their size.
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.values.size()); ++v) {
    const int axis = a.values[v].axis;
    if (axis < 0) continue;
    ir::Dim &d = out.values[v].shape[axis];
    if (!d.isFixed() || d.offset % degree != 0)
      return Error{"tensor parallel: value '" + g.values[v].name + "' has no fixed size on its cut axis"};
    d.offset /= degree;
  }
  // Target shapes that name a cut size become constants of the local shape
  // (whether the model computed them from Shape/Gather/Concat or not).
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g.nodes.size()); ++n) {
    ir::Node &node = out.nodes[n];
    if (node.inputs.size() < 2 || node.outputs.empty() || node.outputs[0] == ir::kNoValue ||
        !detail::rewrittenShapeInput(node, 1) || a.values[node.outputs[0]].axis < 0)
      continue;
    const ir::Value &res = out.values[node.outputs[0]];
    std::optional<std::vector<int64_t>> target =
        node.op_type == "Reshape" ? detail::localReshapeTarget(res.shape)
                                  : detail::localExpandTarget(out.values[node.inputs[0]].shape, res.shape);
    if (!target) return Error{"tensor parallel: node '" + node.name + "': cannot write its local target shape"};
    ir::Value shape{node.name + "/tp_shape", ir::DType::I64, {ir::Dim::fixed(static_cast<int64_t>(target->size()))},
                    true, ir::ValueKind::Constant};
    const ir::ValueId id = out.addValue(std::move(shape));
    out.constants.push_back(id);
    out.constant_data[id] = int64Tensor(*target);
    node.inputs[1] = id;
  }
  // Collectives, each right before its first reader.
  std::map<ir::NodeId, std::vector<ir::NodeId>> before; // reader -> new nodes placed before it
  std::vector<ir::Node> added;
  for (const Collective &c : a.collectives) {
    if (c.readers.empty()) continue;
    const ir::Value &src = out.values[c.value];
    ir::Value res = src;
    res.name = src.name + "/tp_" + std::string(collectiveName(c.kind));
    res.kind = ir::ValueKind::Intermediate;
    res.producer = -1;
    if (c.kind == CollectiveKind::GatherAxis) res.shape = g.values[c.value].shape;
    const ir::ValueId id = out.addValue(std::move(res));
    ir::Node node{out.values[id].name, std::string(collectiveOp(c.kind)), std::string(ir::kRanncDomain), {c.value}, {id}, {}};
    if (c.kind == CollectiveKind::GatherAxis) node.attrs["axis"] = int64_t{c.axis};
    for (ir::NodeId r : c.readers)
      for (ir::ValueId &in : out.nodes[r].inputs)
        if (in == c.value) in = id;
    ir::NodeId first = *std::min_element(c.readers.begin(), c.readers.end());
    before[first].push_back(static_cast<ir::NodeId>(added.size()));
    added.push_back(std::move(node));
  }
  std::vector<ir::Node> nodes;
  nodes.reserve(out.nodes.size() + added.size());
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(out.nodes.size()); ++n) {
    if (auto it = before.find(n); it != before.end())
      for (ir::NodeId k : it->second) nodes.push_back(std::move(added[k]));
    nodes.push_back(std::move(out.nodes[n]));
  }
  out.nodes = std::move(nodes);
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(out.nodes.size()); ++n)
    for (ir::ValueId v : out.nodes[n].outputs)
      if (v != ir::kNoValue) out.values[v].producer = n;
  if (std::string err = out.verify(); !err.empty()) return Error{"tensor parallel local graph: " + err};
  return out;
}

} // namespace rannc::sharding
