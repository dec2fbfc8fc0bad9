#include "planner/import/onnx_import.h"

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <cstring>
#include <set>
#include <unordered_map>

#include "planner/ir/op_set.h"
#include "planner/support/files.h"

namespace rannc::import {
namespace {

using onnx::TensorProto;

std::optional<ir::DType> dtypeFromOnnx(int32_t t) {
  switch (t) {
  case TensorProto::FLOAT: return ir::DType::F32;
  case TensorProto::DOUBLE: return ir::DType::F64;
  case TensorProto::FLOAT16: return ir::DType::F16;
  case TensorProto::BFLOAT16: return ir::DType::BF16;
  case TensorProto::INT64: return ir::DType::I64;
  case TensorProto::INT32: return ir::DType::I32;
  case TensorProto::INT16: return ir::DType::I16;
  case TensorProto::INT8: return ir::DType::I8;
  case TensorProto::UINT8: return ir::DType::U8;
  case TensorProto::BOOL: return ir::DType::Bool;
  default: return std::nullopt;
  }
}

template <typename Src, typename Dst> void appendAs(std::string &out, const Src &values) {
  for (auto v : values) {
    Dst d = static_cast<Dst>(v);
    out.append(reinterpret_cast<const char *>(&d), sizeof d);
  }
}

/// TensorProto -> ir::Tensor; handles raw_data and the typed repeated fields.
Expected<ir::Tensor> tensorFromOnnx(const TensorProto &p, const std::string &where) {
  auto dt = dtypeFromOnnx(p.data_type());
  if (!dt)
    return Error{where + ": tensor '" + p.name() + "' has unsupported element type " +
                 std::to_string(p.data_type())};
  if (p.data_location() == TensorProto::EXTERNAL)
    return Error{where + ": tensor '" + p.name() +
                 "' stores its data in an external file, which is not supported yet"};
  ir::Tensor t;
  t.dtype = *dt;
  t.dims.assign(p.dims().begin(), p.dims().end());
  const int64_t bytes = t.numel() * ir::dtypeSize(t.dtype);
  if (p.has_raw_data()) {
    t.data = p.raw_data();
  } else {
    switch (t.dtype) {
    case ir::DType::F32: appendAs<decltype(p.float_data()), float>(t.data, p.float_data()); break;
    case ir::DType::F64: appendAs<decltype(p.double_data()), double>(t.data, p.double_data()); break;
    case ir::DType::I64: appendAs<decltype(p.int64_data()), int64_t>(t.data, p.int64_data()); break;
    case ir::DType::I32: appendAs<decltype(p.int32_data()), int32_t>(t.data, p.int32_data()); break;
    case ir::DType::I16: appendAs<decltype(p.int32_data()), int16_t>(t.data, p.int32_data()); break;
    case ir::DType::I8: appendAs<decltype(p.int32_data()), int8_t>(t.data, p.int32_data()); break;
    case ir::DType::U8:
    case ir::DType::Bool: appendAs<decltype(p.int32_data()), uint8_t>(t.data, p.int32_data()); break;
    case ir::DType::F16:
    case ir::DType::BF16: appendAs<decltype(p.int32_data()), uint16_t>(t.data, p.int32_data()); break;
    default: break;
    }
  }
  if (static_cast<int64_t>(t.data.size()) != bytes)
    return Error{where + ": tensor '" + p.name() + "' holds " + std::to_string(t.data.size()) +
                 " bytes, its shape needs " + std::to_string(bytes)};
  return t;
}

Expected<ir::AttrValue> attrFromOnnx(const onnx::AttributeProto &a, const std::string &where) {
  using A = onnx::AttributeProto;
  switch (a.type()) {
  case A::INT: return ir::AttrValue(static_cast<int64_t>(a.i()));
  case A::FLOAT: return ir::AttrValue(static_cast<double>(a.f()));
  case A::STRING: return ir::AttrValue(a.s());
  case A::INTS: return ir::AttrValue(std::vector<int64_t>(a.ints().begin(), a.ints().end()));
  case A::FLOATS: return ir::AttrValue(std::vector<double>(a.floats().begin(), a.floats().end()));
  case A::STRINGS:
    return ir::AttrValue(std::vector<std::string>(a.strings().begin(), a.strings().end()));
  case A::TENSOR: {
    auto t = tensorFromOnnx(a.t(), where);
    if (!t) return t.error();
    return ir::AttrValue(std::move(*t));
  }
  default:
    return Error{where + ": attribute '" + a.name() + "' has a type rannc does not support (" +
                 std::to_string(a.type()) + ")"};
  }
}

/// Concrete shapes of every typed value after ONNX shape inference with the
/// batch dimension of each data input fixed to `batch`.
struct Inferred {
  ir::DType dtype = ir::DType::Undefined;
  bool has_shape = false;
  std::vector<int64_t> dims; // -1 = unknown dim
};
using ShapeMap = std::unordered_map<std::string, Inferred>;

ShapeMap inferConcreteShapes(const onnx::ModelProto &model, const std::set<std::string> &data_inputs,
                             int64_t batch) {
  onnx::ModelProto m = model;
  auto *g = m.mutable_graph();
  g->clear_value_info();
  for (auto &out : *g->mutable_output())
    if (out.type().has_tensor_type()) out.mutable_type()->mutable_tensor_type()->clear_shape();
  for (auto &in : *g->mutable_input()) {
    if (!data_inputs.count(in.name()) || !in.type().tensor_type().has_shape()) continue;
    auto *shape = in.mutable_type()->mutable_tensor_type()->mutable_shape();
    if (shape->dim_size() > 0) shape->mutable_dim(0)->set_dim_value(batch);
  }
  ShapeMap shapes;
  try {
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(false, 0, true));
  } catch (const std::exception &) {
    return shapes; // shapes are estimates only: an inference failure leaves them unknown
  }
  auto record = [&](const onnx::ValueInfoProto &vi) {
    if (!vi.type().has_tensor_type()) return;
    Inferred &inf = shapes[vi.name()];
    if (auto dt = dtypeFromOnnx(vi.type().tensor_type().elem_type())) inf.dtype = *dt;
    if (!vi.type().tensor_type().has_shape()) return;
    inf.has_shape = true;
    for (const auto &d : vi.type().tensor_type().shape().dim())
      inf.dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
  };
  for (const auto &vi : g->input()) record(vi);
  for (const auto &vi : g->value_info()) record(vi);
  for (const auto &vi : g->output()) record(vi);
  return shapes;
}

/// Combines the shapes at two batch sizes into affine dims (Note [symbolic batch]).
bool affineShape(const std::vector<int64_t> &s1, int64_t b1, const std::vector<int64_t> &s2,
                 int64_t b2, ir::Shape &out) {
  if (s1.size() != s2.size()) return false;
  out.clear();
  for (size_t i = 0; i < s1.size(); ++i) {
    if (s1[i] < 0 || s2[i] < 0) {
      out.push_back(ir::Dim::unknown());
      continue;
    }
    int64_t diff = s2[i] - s1[i];
    if (diff % (b2 - b1) != 0) {
      out.push_back(ir::Dim::unknown());
      continue;
    }
    int64_t coeff = diff / (b2 - b1);
    out.push_back(ir::Dim{coeff, s1[i] - coeff * b1, true});
  }
  return true;
}

ir::DType elemType(const onnx::ValueInfoProto &vi) {
  auto dt = dtypeFromOnnx(vi.type().tensor_type().elem_type());
  return dt ? *dt : ir::DType::Undefined;
}

} // namespace

Expected<ir::Graph> importOnnxBytes(const std::string &bytes, const std::string &where) {
  onnx::ModelProto model;
  if (bytes.empty()) return Error{where + ": empty file, not an ONNX model"};
  if (!model.ParseFromString(bytes))
    return Error{where + ": not a valid ONNX model (protobuf parse failed; truncated or another format?)"};
  if (!model.has_graph() || model.graph().node_size() == 0)
    return Error{where + ": ONNX model has no graph nodes"};

  ir::Graph g;
  const auto &mg = model.graph();
  g.name = mg.name();
  for (const auto &os : model.opset_import())
    if (os.domain().empty() || os.domain() == "ai.onnx") g.opset = os.version();
  if (g.opset == 0) return Error{where + ": model imports no default-domain opset"};

  // Validate the op vocabulary first, so an unsupported op is reported before
  // anything else about the graph.
  for (int i = 0; i < mg.node_size(); ++i) {
    const auto &n = mg.node(i);
    std::string node_name = n.name().empty() ? "#" + std::to_string(i) : n.name();
    const ir::OpInfo *info = (n.domain().empty() || n.domain() == "ai.onnx") ? ir::findOp(n.op_type()) : nullptr;
    if (!info)
      return Error{where + ": unsupported op '" + (n.domain().empty() ? "" : n.domain() + ".") +
                   n.op_type() + "' (node '" + node_name + "', opset " + std::to_string(g.opset) + ")"};
    if (g.opset < info->min_opset || g.opset > info->max_opset)
      return Error{where + ": op '" + n.op_type() + "' (node '" + node_name + "') is supported for opsets " +
                   std::to_string(info->min_opset) + "-" + std::to_string(info->max_opset) +
                   ", the model uses opset " + std::to_string(g.opset)};
  }

  std::set<std::string> initializer_names;
  for (const auto &t : mg.initializer()) initializer_names.insert(t.name());
  std::set<std::string> data_inputs;
  for (const auto &in : mg.input())
    if (!initializer_names.count(in.name())) data_inputs.insert(in.name());

  // Two inference runs at different batch sizes give every dim as a*B+c.
  constexpr int64_t kB1 = 3, kB2 = 5;
  ShapeMap at1 = inferConcreteShapes(model, data_inputs, kB1);
  ShapeMap at2 = inferConcreteShapes(model, data_inputs, kB2);
  auto setShape = [&](ir::Value &v) {
    auto i1 = at1.find(v.name), i2 = at2.find(v.name);
    if (i1 == at1.end() || i2 == at2.end()) return;
    if (v.dtype == ir::DType::Undefined) v.dtype = i1->second.dtype;
    if (i1->second.has_shape && i2->second.has_shape)
      v.shape_known = affineShape(i1->second.dims, kB1, i2->second.dims, kB2, v.shape);
  };

  for (const auto &in : mg.input()) {
    if (initializer_names.count(in.name())) continue;
    ir::Value v;
    v.name = in.name();
    v.kind = ir::ValueKind::Input;
    v.dtype = elemType(in);
    if (v.dtype == ir::DType::Undefined)
      return Error{where + ": graph input '" + in.name() + "' has no supported tensor element type"};
    setShape(v);
    g.inputs.push_back(g.addValue(std::move(v)));
  }
  // Floating-point initializers are the trainable parameters; the others
  // (index tables, shape constants) are constants kept inline in the graph.
  for (const auto &t : mg.initializer()) {
    auto dt = dtypeFromOnnx(t.data_type());
    if (!dt)
      return Error{where + ": initializer '" + t.name() + "' has unsupported element type " +
                   std::to_string(t.data_type())};
    ir::Value v;
    v.name = t.name();
    v.dtype = *dt;
    v.shape_known = true;
    for (int64_t d : t.dims()) v.shape.push_back(ir::Dim::fixed(d));
    if (ir::isFloating(*dt)) {
      v.kind = ir::ValueKind::Parameter;
      g.parameters.push_back(g.addValue(std::move(v)));
    } else {
      v.kind = ir::ValueKind::Constant;
      auto data = tensorFromOnnx(t, where);
      if (!data) return data.error();
      ir::ValueId id = g.addValue(std::move(v));
      g.constants.push_back(id);
      g.constant_data.emplace(id, std::move(*data));
    }
  }

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
      setShape(v);
      node.outputs.push_back(g.addValue(std::move(v)));
    }
    for (const auto &a : n.attribute()) {
      auto av = attrFromOnnx(a, node_where);
      if (!av) return av.error();
      node.attrs.emplace(a.name(), std::move(*av));
    }
    g.addNode(std::move(node));
  }

  if (mg.output_size() != 1)
    return Error{where + ": the graph must have exactly one output, the scalar training loss (it has " +
                 std::to_string(mg.output_size()) + ")"};
  g.loss = g.findValue(mg.output(0).name());
  if (g.loss == ir::kNoValue)
    return Error{where + ": graph output '" + mg.output(0).name() + "' is not produced by any node"};
  std::string problem = g.verify();
  if (!problem.empty()) return Error{where + ": " + problem};
  return g;
}

Expected<ir::Graph> importModel(const std::string &path) {
  std::string ext = extensionOf(path);
  if (ext == ".pt" || ext == ".pth" || ext == ".torchscript")
    return Error{path + ": TorchScript models are not supported yet; export the model to ONNX "
                        "(torch.onnx.export with training=TrainingMode.TRAINING)"};
  auto bytes = readFile(path);
  if (!bytes) return bytes.error();
  return importOnnxBytes(*bytes, path);
}

Expected<std::map<std::string, ir::Tensor>> loadModelWeights(const std::string &path,
                                                             const std::vector<std::string> &names) {
  auto bytes = readFile(path);
  if (!bytes) return bytes.error();
  onnx::ModelProto model;
  if (!model.ParseFromString(*bytes)) return Error{path + ": not a valid ONNX model"};
  std::set<std::string> wanted(names.begin(), names.end());
  std::map<std::string, ir::Tensor> out;
  for (const auto &t : model.graph().initializer()) {
    if (!wanted.count(t.name())) continue;
    auto tensor = tensorFromOnnx(t, path);
    if (!tensor) return tensor.error();
    out.emplace(t.name(), std::move(*tensor));
  }
  for (const auto &n : names)
    if (!out.count(n)) return Error{path + ": model has no initializer named '" + n + "'"};
  return out;
}

} // namespace rannc::import
