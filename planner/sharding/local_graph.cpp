// localGraph: the SPMD graph each device of a tensor-parallel group runs.
#include <algorithm>
#include <cstring>
#include <map>

#include "planner/ir/aten_args.h"
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

/// A constant i64 vector value for node `owner`.
ir::ValueId addInts(ir::Graph &g, const std::string &name, const std::vector<int64_t> &v) {
  ir::Value shape{name, ir::DType::I64, {ir::Dim::fixed(static_cast<int64_t>(v.size()))}, true,
                  ir::ValueKind::Constant};
  const ir::ValueId id = g.addValue(std::move(shape));
  g.constants.push_back(id);
  g.constant_data[id] = int64Tensor(v);
  return id;
}

/// Rewrites the target shape of a Reshape/Expand (or aten::view/reshape/expand) whose output is cut.
Status rewriteTarget(ir::Graph &g, ir::Node &node) {
  const ir::Value &res = g.values[node.outputs[0]];
  const std::string where = "tensor parallel: node '" + node.name + "': cannot write its local target shape";
  if (auto arg = detail::atenShapeArg(node)) {
    const bool expand = detail::atenName(node) == "expand";
    std::optional<std::vector<int64_t>> target;
    if (expand) {
      const ir::Shape &in = g.values[node.inputs[0]].shape;
      target = detail::localExpandTarget(in, res.shape);
      if (target) // aten::expand keeps a size with -1, not 1
        for (size_t j = res.shape.size() - in.size(); j < res.shape.size(); ++j)
          if (in[j - (res.shape.size() - in.size())] == res.shape[j]) (*target)[j] = -1;
    } else {
      target = detail::localReshapeTarget(res.shape);
    }
    if (!target) return Error{where};
    const std::vector<detail::AtenArg> args = detail::atenArgs(node);
    if (*arg >= args.size()) return Error{where};
    if (args[*arg].constant) {
      node.attrs[ir::aten_args::valueKey(*arg)] = *target;
    } else if (args[*arg].inputs.size() == 1) {
      node.inputs[args[*arg].inputs[0]] = addInts(g, node.name + "/tp_shape", *target);
    } else {
      return Error{where};
    }
    return Status::success();
  }
  if (!detail::rewrittenShapeInput(node, 1)) return Status::success();
  std::optional<std::vector<int64_t>> target =
      node.op_type == "Reshape" ? detail::localReshapeTarget(res.shape)
                                : detail::localExpandTarget(g.values[node.inputs[0]].shape, res.shape);
  if (!target) return Error{where};
  node.inputs[1] = addInts(g, node.name + "/tp_shape", *target);
  return Status::success();
}

// Note [row-parallel bias]
// A row-parallel product's partial sums must not each add the bias: t devices
// would add it t times. ONNX graphs add it in a separate Add, which reads the
// summed value. aten::linear carries it as an argument: the local graph drops
// it from the linear (addmm becomes mm) and adds it (aten::add) to the summed
// result instead.

/// Moves the bias of the row-parallel aten::linear producing `partial` after its sum `summed`;
/// returns the value the sum's readers read instead (kNoValue: no bias to move).
ir::ValueId moveRowParallelBias(ir::Graph &g, ir::NodeId linear, ir::ValueId summed, std::vector<ir::Node> &added) {
  ir::Node &node = g.nodes[linear];
  const auto bias_input = detail::rowParallelBias(node, true);
  if (!bias_input) return ir::kNoValue;
  const ir::ValueId bias = node.inputs[*bias_input];
  node.inputs.erase(node.inputs.begin() + static_cast<std::ptrdiff_t>(*bias_input));
  if (detail::atenName(node) == "addmm") { // addmm(b, x, W) becomes mm(x, W)
    node.op_type = "aten::mm";
    node.attrs = {{ir::aten_args::kOverload, std::string()},
                  {ir::aten_args::kNargs, int64_t{2}},
                  {ir::aten_args::kindKey(0), ir::aten_args::kTensor},
                  {ir::aten_args::kindKey(1), ir::aten_args::kTensor}};
  } else {
    node.attrs[ir::aten_args::kindKey(2)] = ir::aten_args::kConstNone;
  }
  ir::Value res = g.values[summed];
  res.name = g.values[summed].name + "/bias";
  const ir::ValueId id = g.addValue(std::move(res));
  ir::AttrMap attrs{{ir::aten_args::kOverload, std::string("Tensor")},
                    {ir::aten_args::kNargs, int64_t{3}},
                    {ir::aten_args::kindKey(0), ir::aten_args::kTensor},
                    {ir::aten_args::kindKey(1), ir::aten_args::kTensor},
                    {ir::aten_args::kindKey(2), ir::aten_args::kConstInt},
                    {ir::aten_args::valueKey(2), int64_t{1}}};
  added.push_back({node.name + "/tp_bias", "aten::add", std::string(ir::kAtenDomain), {summed, bias}, {id}, attrs});
  return id;
}

} // namespace

Expected<ir::Graph> localGraph(const ir::Graph &g, const Analysis &a, int degree) {
  if (degree == 1) return g;
  if (a.values.size() != g.values.size() || a.node_split.size() != g.nodes.size())
    return Error{"tensor parallel: the analysis does not belong to this graph"};
  if (!a.validDegree(degree))
    return Error{"tensor parallel degree " + std::to_string(degree) + " does not divide every cut size"};
  ir::Graph out = g;
  // Cut values at 1/degree of their size (a batch-folded axis: of its groups, Note [batch-folded cuts]).
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.values.size()); ++v) {
    const int axis = a.values[v].axis;
    if (axis < 0) continue;
    if (!g.values[v].shape_known || axis >= static_cast<int>(g.values[v].shape.size()))
      return Error{"tensor parallel: value '" + g.values[v].name + "' has no cut axis " + std::to_string(axis)};
    ir::Dim &d = out.values[v].shape[axis];
    const std::optional<int64_t> size = cutSize(d);
    if (!size || *size % degree != 0)
      return Error{"tensor parallel: value '" + g.values[v].name + "' has no size on its cut axis that " +
                   std::to_string(degree) + " divides"};
    (d.isFixed() ? d.offset : d.batch_coeff) /= degree;
  }
  // Target shapes that name a cut size become constants of the local shape
  // (whether the model computed them from Shape/Gather/Concat or not); where
  // an input's size is unknown, a target computed at run time keeps being
  // computed, with the cut axis's entry replaced (Note [target shapes of
  // unknown inputs] in sharding.cpp).
  std::map<ir::NodeId, std::vector<ir::NodeId>> before; // reader -> new nodes placed before it
  std::vector<ir::Node> added;
  const bool unknown_sizes = detail::inputSizesUnknown(g);
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g.nodes.size()); ++n) {
    ir::Node &node = out.nodes[n];
    if (node.outputs.empty() || node.outputs[0] == ir::kNoValue || a.values[node.outputs[0]].axis < 0) continue;
    if (unknown_sizes && detail::rewrittenShapeInput(node, 1) && !detail::constantInts(g, node.inputs[1])) {
      auto patch = detail::runTimeTargetPatch(g, a.values, g.nodes[n], degree);
      if (!patch) return Error{patch.error().message};
      if (!*patch) continue;
      const int p = a.values[node.outputs[0]].axis, rank = static_cast<int>(g.values[node.outputs[0]].shape.size());
      std::vector<ir::ValueId> parts;
      auto slice = [&](int64_t from, int64_t to, int64_t n_out, const std::string &tag) {
        ir::Value v{node.name + "/tp_target_" + tag, ir::DType::I64, {ir::Dim::fixed(n_out)}, true};
        const ir::ValueId id = out.addValue(std::move(v));
        const std::string base = node.name + "/tp_target_" + tag;
        ir::Node sl{base, "Slice", "", {node.inputs[1], addInts(out, base + "/starts", {from}),
                                        addInts(out, base + "/ends", {to}), addInts(out, base + "/axes", {0})},
                    {id}, {}};
        before[n].push_back(static_cast<ir::NodeId>(added.size()));
        added.push_back(std::move(sl));
        parts.push_back(id);
      };
      if (p > 0) slice(0, p, p, "head");
      parts.push_back(addInts(out, node.name + "/tp_target_cut", {**patch}));
      if (p + 1 < rank) slice(p + 1, rank, rank - p - 1, "tail");
      ir::Value t{node.name + "/tp_target", ir::DType::I64, {ir::Dim::fixed(rank)}, true};
      const ir::ValueId target = out.addValue(std::move(t));
      before[n].push_back(static_cast<ir::NodeId>(added.size()));
      added.push_back({node.name + "/tp_target", "Concat", "", parts, {target}, {{"axis", int64_t{0}}}});
      out.nodes[n].inputs[1] = target;
      continue;
    }
    if (Status s = rewriteTarget(out, node); !s) return Error{s.message()};
  }
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g.nodes.size()); ++n)
    if (Status s = detail::rewriteVocabOp(out, n, a.values); !s) return Error{s.message()};
  // Collectives, each right before its first reader.
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
    const ir::NodeId first = *std::min_element(c.readers.begin(), c.readers.end());
    before[first].push_back(static_cast<ir::NodeId>(added.size()));
    added.push_back(std::move(node));
    ir::ValueId read = id;
    if (c.kind == CollectiveKind::SumOverGroup && g.values[c.value].producer >= 0) {
      const ir::ValueId biased = moveRowParallelBias(out, g.values[c.value].producer, id, added);
      if (biased != ir::kNoValue) {
        before[first].push_back(static_cast<ir::NodeId>(added.size()) - 1);
        read = biased;
      }
    }
    for (ir::NodeId r : c.readers)
      for (ir::ValueId &in : out.nodes[r].inputs)
        if (in == c.value) in = read;
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
