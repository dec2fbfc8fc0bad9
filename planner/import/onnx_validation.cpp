#include "planner/import/onnx_validation.h"

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <limits>
#include <set>

#include "planner/import/onnx_import.h"
#include "planner/import/onnx_opset.h"
#include "planner/ir/op_set.h"

namespace rannc::import {
namespace {

/// The newest default-domain opset every supported op is checked against.
int64_t maxSupportedOpset() {
  int64_t v = 0;
  for (const ir::OpInfo &op : ir::supportedOps()) v = std::max(v, op.max_opset);
  return v;
}

std::string attrTypeName(int t) {
  return onnx::AttributeProto::AttributeType_IsValid(t)
             ? onnx::AttributeProto::AttributeType_Name(onnx::AttributeProto::AttributeType(t))
             : std::to_string(t);
}

/// Checks a node against its ONNX schema: input and output counts, attribute
/// types, required attributes. Kernels and cost models index inputs and read
/// attributes by type, so a damaged or hand-made model is refused here with a
/// clear message rather than failing (or worse) later.
std::string checkAgainstSchema(const onnx::NodeProto &n, int64_t opset) {
  const onnx::OpSchema *schema =
      onnx::OpSchemaRegistry::Schema(n.op_type(), static_cast<int>(opset), "");
  if (!schema) return "";
  auto range = [](int lo, int hi) {
    return hi == std::numeric_limits<int>::max() ? "at least " + std::to_string(lo)
           : lo == hi                            ? std::to_string(lo)
                                                 : std::to_string(lo) + " to " + std::to_string(hi);
  };
  if (n.input_size() < schema->min_input() || n.input_size() > schema->max_input())
    return "has " + std::to_string(n.input_size()) + " inputs, the ONNX schema (opset " +
           std::to_string(schema->since_version()) + ") allows " +
           range(schema->min_input(), schema->max_input());
  if (n.output_size() < schema->min_output() || n.output_size() > schema->max_output())
    return "has " + std::to_string(n.output_size()) + " outputs, the ONNX schema (opset " +
           std::to_string(schema->since_version()) + ") allows " +
           range(schema->min_output(), schema->max_output());
  const auto &attrs = schema->attributes();
  std::set<std::string> seen;
  for (const auto &a : n.attribute()) {
    if (!seen.insert(a.name()).second) return "repeats attribute '" + a.name() + "'";
    auto it = attrs.find(a.name());
    if (it == attrs.end())
      return "has attribute '" + a.name() + "', which the ONNX schema (opset " +
             std::to_string(schema->since_version()) + ") does not define";
    if (int(a.type()) != int(it->second.type))
      return "attribute '" + a.name() + "' is " + attrTypeName(a.type()) + ", the ONNX schema wants " +
             attrTypeName(it->second.type);
  }
  for (const auto &[name, attr] : attrs)
    if (attr.required && !seen.count(name)) return "lacks required attribute '" + name + "'";
  return "";
}

/// Checks what ONNX shape inference assumes without checking: every node
/// input is a graph input, an initializer or an earlier node's output; no
/// value is defined twice; graph inputs are tensors with sane dims;
/// initializer dims are sane. Returns the problem, or "".
std::string checkStructure(const onnx::GraphProto &mg, const std::string &where) {
  std::set<std::string> defined;
  auto badDims = [](const auto &dims) {
    int64_t numel = 1;
    for (int64_t d : dims) {
      if (d < 0 || (d != 0 && numel > (int64_t(1) << 40) / d)) return true;
      numel *= d;
    }
    return false;
  };
  for (const auto &t : mg.initializer()) {
    if (!defined.insert(t.name()).second) return where + ": initializer '" + t.name() + "' is defined twice";
    if (badDims(t.dims()))
      return where + ": initializer '" + t.name() + "' has a negative or implausibly large shape";
  }
  std::set<std::string> inputs;
  for (const auto &in : mg.input()) {
    if (!inputs.insert(in.name()).second)
      return where + ": graph input '" + in.name() + "' is declared twice";
    if (defined.count(in.name())) continue; // an initializer listed as an input (old exporters)
    defined.insert(in.name());
    if (!in.type().has_tensor_type() || !dtypeFromOnnx(in.type().tensor_type().elem_type()))
      return where + ": graph input '" + in.name() + "' has no supported tensor element type";
    for (const auto &d : in.type().tensor_type().shape().dim())
      if (d.has_dim_value() && d.dim_value() < 0)
        return where + ": graph input '" + in.name() + "' has a negative dimension";
  }
  for (int i = 0; i < mg.node_size(); ++i) {
    const auto &n = mg.node(i);
    std::string node_where =
        where + ": node '" + (n.name().empty() ? n.op_type() + "_" + std::to_string(i) : n.name()) + "' (" +
        n.op_type() + ")";
    for (const auto &in : n.input())
      if (!in.empty() && !defined.count(in))
        return node_where + ": input '" + in + "' is not produced by any earlier node "
                                               "(graph not in topological order, or a subgraph reference)";
    for (const auto &out : n.output())
      if (!out.empty() && !defined.insert(out).second)
        return node_where + ": output '" + out + "' is already defined";
  }
  for (const auto &out : mg.output())
    if (!defined.count(out.name()))
      return where + ": graph output '" + out.name() + "' is not produced by any node";
  return "";
}

} // namespace

Expected<int64_t> defaultOpset(const onnx::ModelProto &model, const std::string &where) {
  int64_t opset = 0;
  for (const auto &os : model.opset_import())
    if (os.domain().empty() || os.domain() == "ai.onnx") opset = os.version();
  if (opset <= 0) return Error{where + ": model imports no default-domain opset"};
  const int64_t max_opset = maxSupportedOpset();
  if (opset > max_opset)
    return Error{where + ": model uses ONNX opset " + std::to_string(opset) +
                 ", newer than rannc supports (up to " + std::to_string(max_opset) +
                 "); export with opset_version=" + std::to_string(max_opset) + " or lower"};
  return opset;
}

Status validateGraph(const onnx::GraphProto &mg, int64_t opset, const std::string &where) {
  // Validate the op vocabulary first, so an unsupported op is reported before
  // anything else about the graph.
  for (int i = 0; i < mg.node_size(); ++i) {
    const auto &n = mg.node(i);
    std::string node_name = n.name().empty() ? "#" + std::to_string(i) : n.name();
    const ir::OpInfo *info = (n.domain().empty() || n.domain() == "ai.onnx" || n.domain() == kNewOpsDomain)
                                 ? ir::findOp(n.op_type())
                                 : nullptr;
    if (!info)
      return Error{where + ": unsupported op '" + (n.domain().empty() ? "" : n.domain() + ".") +
                   n.op_type() + "' (node '" + node_name + "', opset " + std::to_string(opset) + ")"};
    if (opset < info->min_opset || opset > info->max_opset)
      return Error{where + ": op '" + n.op_type() + "' (node '" + node_name + "') is supported for opsets " +
                   std::to_string(info->min_opset) + "-" + std::to_string(info->max_opset) +
                   ", the model uses opset " + std::to_string(opset)};
    std::string problem = checkAgainstSchema(n, opset);
    if (!problem.empty())
      return Error{where + ": node '" + node_name + "' (" + n.op_type() + ") " + problem};
  }
  // ONNX shape inference trusts the graph (a dangling input name crashes it),
  // so the structure is checked before it runs.
  std::string problem = checkStructure(mg, where);
  if (!problem.empty()) return Error{problem};
  return Status::success();
}

} // namespace rannc::import
