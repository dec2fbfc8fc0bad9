#include "planner/import/onnx_import.h"

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <map>
#include <set>

#include "planner/import/onnx_opset.h"
#include "planner/import/onnx_shape_inference.h"
#include "planner/import/onnx_signature.h"
#include "planner/import/onnx_tensors.h"
#include "planner/import/onnx_validation.h"
#include "planner/import/onnx_weights.h"

namespace rannc::import {

using onnx::TensorProto;

namespace {

/// The graph's data inputs (those that are not initializers) as input values.
Status importInputs(const onnx::GraphProto &mg, const std::set<std::string> &initializer_names,
                    const BatchShapes &shapes, ir::Graph &g, const std::string &where) {
  for (const auto &in : mg.input()) {
    if (initializer_names.count(in.name())) continue;
    if (g.findValue(in.name()) != ir::kNoValue)
      return Error{where + ": graph input '" + in.name() + "' is declared twice"};
    ir::Value v;
    v.name = in.name();
    v.kind = ir::ValueKind::Input;
    v.dtype = elemType(in);
    if (v.dtype == ir::DType::Undefined)
      return Error{where + ": graph input '" + in.name() + "' has no supported tensor element type"};
    shapes.apply(v);
    g.inputs.push_back(g.addValue(std::move(v)));
  }
  return Status::success();
}

/// The initializers as parameters, buffers or constants; `weights`, when
/// given, receives the parameters' and buffers' contents.
Status importInitializers(const onnx::GraphProto &mg, const std::set<std::string> &initializer_names,
                          const ExportSignature &sig, std::map<std::string, ir::Tensor> *weights, ir::Graph &g,
                          const std::string &where) {
  // Floating-point initializers are the trainable parameters, except the
  // ones only BatchNormalization reads as running statistics: buffers (Note
  // [buffers]). A dynamo export names its parameters; its other
  // floating-point initializers are constants (Note [export signature]). The
  // others (index tables, shape constants) are constants kept inline in the
  // graph.
  std::map<std::string, bool> running_stat_only; // initializer -> every read is a BN input 3 or 4
  for (const auto &n : mg.node())
    for (int i = 0; i < n.input_size(); ++i) {
      if (!initializer_names.count(n.input(i))) continue;
      bool stat = n.op_type() == "BatchNormalization" && (n.domain().empty() || n.domain() == "ai.onnx") &&
                  (i == 3 || i == 4);
      auto [it, fresh] = running_stat_only.emplace(n.input(i), stat);
      if (!fresh) it->second = it->second && stat;
    }
  for (const auto &t : mg.initializer()) {
    auto dt = dtypeFromOnnx(t.data_type());
    if (!dt)
      return Error{where + ": initializer '" + t.name() + "' has unsupported element type " +
                   std::to_string(t.data_type())};
    if (g.findValue(t.name()) != ir::kNoValue)
      return Error{where + ": initializer '" + t.name() + "' is defined twice"};
    ir::Value v;
    v.name = t.name();
    v.dtype = *dt;
    v.shape_known = true;
    for (int64_t d : t.dims()) v.shape.push_back(ir::Dim::fixed(d));
    auto stat = running_stat_only.find(t.name());
    const bool buffer = ir::isFloating(*dt) && stat != running_stat_only.end() && stat->second;
    const bool trained = ir::isFloating(*dt) && !buffer && (!sig.present || sig.parameters.count(t.name()));
    if (buffer || trained) {
      v.kind = buffer ? ir::ValueKind::Buffer : ir::ValueKind::Parameter;
      if (weights) {
        auto data = tensorFromOnnx(t, where);
        if (!data) return data.error();
        weights->emplace(t.name(), std::move(*data));
      }
      (buffer ? g.buffers : g.parameters).push_back(g.addValue(std::move(v)));
    } else {
      // The dynamo exporter puts integer buffers (Swin's relative position
      // index) and folded constants in the external data file too: read them from there.
      v.kind = ir::ValueKind::Constant;
      auto data = t.data_location() == TensorProto::EXTERNAL
                      ? readExternal(t, std::filesystem::path(where).parent_path(), where)
                      : tensorFromOnnx(t, where);
      if (!data) return data.error();
      ir::ValueId id = g.addValue(std::move(v));
      g.constants.push_back(id);
      g.constant_data.emplace(id, std::move(*data));
    }
  }
  return Status::success();
}

/// The nodes, in the model's (topological) order, their outputs shaped by `shapes`.
Status importNodes(const onnx::GraphProto &mg, const BatchShapes &shapes, ir::Graph &g, const std::string &where) {
  for (int i = 0; i < mg.node_size(); ++i) {
    const auto &n = mg.node(i);
    ir::Node node;
    node.name = n.name().empty() ? n.op_type() + "_" + std::to_string(i) : n.name();
    node.op_type = n.op_type();
    std::string node_where = where + ": node '" + node.name + "' (" + n.op_type() + ")";
    for (const auto &in : n.input()) {
      if (in.empty()) {
        node.inputs.push_back(ir::kNoValue);
        continue;
      }
      ir::ValueId id = g.findValue(in);
      if (id == ir::kNoValue)
        return Error{node_where + ": input '" + in + "' is not produced by any earlier node "
                                  "(graph not in topological order, or a subgraph reference)"};
      node.inputs.push_back(id);
    }
    for (const auto &out : n.output()) {
      if (out.empty()) {
        node.outputs.push_back(ir::kNoValue);
        continue;
      }
      if (g.findValue(out) != ir::kNoValue)
        return Error{node_where + ": output '" + out + "' is already defined"};
      ir::Value v;
      v.name = out;
      shapes.apply(v);
      node.outputs.push_back(g.addValue(std::move(v)));
    }
    for (const auto &a : n.attribute()) {
      auto av = attrFromOnnx(a, node_where);
      if (!av) return av.error();
      node.attrs.emplace(a.name(), std::move(*av));
    }
    g.addNode(std::move(node));
  }
  return Status::success();
}

/// Every graph output, the first set as the loss so the graph verifies (inference).
Status importOutputs(const onnx::GraphProto &mg, std::vector<ir::ValueId> &outputs, ir::Graph &g,
                     const std::string &where) {
  if (mg.output_size() == 0) return Error{where + ": the graph has no outputs"};
  for (const auto &out : mg.output()) {
    ir::ValueId id = g.findValue(out.name());
    if (id == ir::kNoValue)
      return Error{where + ": graph output '" + out.name() + "' is not produced by any node"};
    outputs.push_back(id);
  }
  g.loss = outputs.front();
  return Status::success();
}

/// The one graph output, which must be the scalar floating-point training loss.
Status importLoss(const onnx::GraphProto &mg, ir::Graph &g, const std::string &where) {
  if (mg.output_size() != 1)
    return Error{where + ": the graph must have exactly one output, the scalar training loss (it has " +
                 std::to_string(mg.output_size()) + ")"};
  const auto &out = mg.output(0);
  g.loss = g.findValue(out.name());
  if (g.loss == ir::kNoValue)
    return Error{where + ": graph output '" + out.name() + "' is not produced by any node"};
  // The loss must be a scalar: a model that returns logits (or a per-sample
  // loss) would otherwise train on whatever the executor made of it.
  const ir::Value &loss = g.values[g.loss];
  std::string shape;
  if (loss.shape_known && !loss.shape.empty()) {
    shape = ir::shapeString(loss.shape);
  } else if (!loss.shape_known && out.type().tensor_type().has_shape() &&
             out.type().tensor_type().shape().dim_size() > 0) {
    shape = "of rank " + std::to_string(out.type().tensor_type().shape().dim_size());
  }
  if (!shape.empty())
    return Error{where + ": graph output '" + out.name() + "' has shape " + shape +
                 ", but the output must be the scalar training loss (as in "
                 "`loss = model(input, labels)`)"};
  ir::DType dt = loss.dtype != ir::DType::Undefined ? loss.dtype : elemType(out);
  if (dt != ir::DType::Undefined && !ir::isFloating(dt))
    return Error{where + ": graph output '" + out.name() + "' is " + std::string(ir::dtypeName(dt)) +
                 ", but the output must be the scalar floating-point training loss"};
  return Status::success();
}

/// The part of the import shared by training and inference imports.
/// `outputs`, when given, receives every graph output (inference);
/// otherwise the graph must have one scalar floating-point output, the loss.
/// `weights`, when given, receives the floating-point initializers' contents.
Expected<ir::Graph> importModelProto(const onnx::ModelProto &model, const ExportSignature &sig,
                                     const std::string &where, std::vector<ir::ValueId> *outputs,
                                     std::map<std::string, ir::Tensor> *weights) {
  if (!model.has_graph() || model.graph().node_size() == 0)
    return Error{where + ": ONNX model has no graph nodes"};

  ir::Graph g;
  const auto &mg = model.graph();
  g.name = mg.name();
  auto opset = defaultOpset(model, where);
  if (!opset) return opset.error();
  g.opset = *opset;
  if (Status st = validateGraph(mg, g.opset, where); !st) return Error{st.message()};

  std::set<std::string> initializer_names, external;
  for (const auto &t : mg.initializer()) {
    initializer_names.insert(t.name());
    if (t.data_location() == TensorProto::EXTERNAL)
      for (const auto &kv : t.external_data())
        if (kv.key() == "location") external.insert(kv.value());
  }
  g.external_data.assign(external.begin(), external.end());
  std::set<std::string> data_inputs;
  for (const auto &in : mg.input())
    if (!initializer_names.count(in.name())) data_inputs.insert(in.name());
  const BatchShapes shapes(model, data_inputs);

  if (Status st = importInputs(mg, initializer_names, shapes, g, where); !st) return Error{st.message()};
  if (Status st = importInitializers(mg, initializer_names, sig, weights, g, where); !st) return Error{st.message()};
  if (Status st = importNodes(mg, shapes, g, where); !st) return Error{st.message()};
  for (ir::Node &n : g.nodes) // Note [embedding padding row]
    if (n.domain.empty() && n.op_type == "Gather" && n.outputs.size() == 1)
      if (auto it = sig.embedding_padding.find(g.values[n.outputs[0]].name); it != sig.embedding_padding.end())
        n.attrs["padding_idx"] = it->second;
  if (Status st = outputs ? importOutputs(mg, *outputs, g, where) : importLoss(mg, g, where); !st)
    return Error{st.message()};
  const std::string problem = g.verify();
  if (!problem.empty()) return Error{where + ": " + problem};
  return g;
}

/// A parsed model, its newer opset rewritten into opset-17 forms (Note
/// [newer opsets]) and a dynamo export's parameters restored (Note [export signature]).
struct ParsedModel {
  onnx::ModelProto model;
  ExportSignature signature;
};

Expected<ParsedModel> parseModel(const std::string &bytes, const std::string &where, ImportAudit *audit) {
  ParsedModel parsed;
  onnx::ModelProto &model = parsed.model;
  if (bytes.empty()) return Error{where + ": empty file, not an ONNX model"};
  if (!model.ParseFromString(bytes))
    return Error{where + ": not a valid ONNX model (protobuf parse failed; truncated or another format?)"};
  auto opset = lowerToKnownOpset(model, where);
  if (!opset) return opset.error();
  auto sig = restoreSignature(model, std::filesystem::path(where).parent_path().string(), where, audit);
  if (!sig) return sig.error();
  parsed.signature = std::move(*sig);
  return parsed;
}

} // namespace

Expected<ir::Graph> importOnnxBytes(const std::string &bytes, const std::string &where) {
  return importOnnxBytes(bytes, where, nullptr);
}

Expected<ir::Graph> importOnnxBytes(const std::string &bytes, const std::string &where, ImportAudit *audit) {
  auto parsed = parseModel(bytes, where, audit);
  if (!parsed) return parsed.error();
  return importModelProto(parsed->model, parsed->signature, where, nullptr, nullptr);
}

Expected<InferenceModel> importOnnxInference(const std::string &bytes, const std::string &where) {
  auto parsed = parseModel(bytes, where, nullptr);
  if (!parsed) return parsed.error();
  InferenceModel m;
  auto g = importModelProto(parsed->model, parsed->signature, where, &m.outputs, &m.weights);
  if (!g) return g.error();
  m.graph = std::move(*g);
  return m;
}

} // namespace rannc::import
