#include "planner/import/onnx_import.h"

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "planner/import/onnx_opset.h"
#include "planner/ir/op_set.h"
#include "planner/support/files.h"

namespace rannc::import {

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

namespace {

template <typename Src, typename Dst> void appendAs(std::string &out, const Src &values) {
  for (auto v : values) {
    Dst d = static_cast<Dst>(v);
    out.append(reinterpret_cast<const char *>(&d), sizeof d);
  }
}

} // namespace

Expected<ir::Tensor> tensorFromOnnx(const TensorProto &p, const std::string &where) {
  auto dt = dtypeFromOnnx(p.data_type());
  if (!dt)
    return Error{where + ": tensor '" + p.name() + "' has unsupported element type " +
                 std::to_string(p.data_type())};
  if (p.data_location() == TensorProto::EXTERNAL)
    return Error{where + ": tensor '" + p.name() +
                 "' stores its data in an external file, which rannc reads only for initializers"};
  ir::Tensor t;
  t.dtype = *dt;
  t.dims.assign(p.dims().begin(), p.dims().end());
  // Check the dims before multiplying them: a damaged file can hold any int64.
  int64_t numel = 1;
  for (int64_t d : t.dims) {
    if (d < 0)
      return Error{where + ": tensor '" + p.name() + "' has a negative dimension " + std::to_string(d)};
    if (d != 0 && numel > (int64_t(1) << 40) / d)
      return Error{where + ": tensor '" + p.name() + "' is implausibly large (over 2^40 elements)"};
    numel *= d;
  }
  const int64_t bytes = numel * ir::dtypeSize(t.dtype);
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

namespace {

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

/// The ops whose inference divides by or indexes with window attributes.
bool isWindowOp(const std::string &op) {
  return op == "Conv" || op == "ConvTranspose" || op == "MaxPool" || op == "AveragePool" ||
         op == "LpPool" || op == "MaxUnpool";
}

/// Checks what ONNX's inference and data-propagation functions assume about
/// a node's inputs: every required input has a tensor type. Throws
/// InferenceError (which inference reports as a node failure) instead of
/// letting the function dereference a null type.
template <typename Ctx>
void guardInputs(Ctx &ctx, const onnx::OpSchema &schema) {
  const auto &formal = schema.inputs();
  for (size_t i = 0; i < ctx.getNumInputs(); ++i) {
    const onnx::TypeProto *t = ctx.getInputType(i);
    bool optional = !formal.empty() && i < formal.size() &&
                    formal[i].GetOption() == onnx::OpSchema::Optional;
    if (!t) {
      if (!optional) fail_type_inference("input ", i, " has no inferred type");
      continue;
    }
    if (t->value_case() != onnx::TypeProto::kTensorType) fail_type_inference("input ", i, " is not a tensor");
  }
}

/// For the window ops: ranks that agree ([N, C, spatial...] input, weight of
/// the same rank) and window attributes of the right length, positive where
/// inference divides by them. ONNX 1.12 indexes with them unchecked.
void guardWindowOp(onnx::InferenceContext &ctx, const std::string &op) {
  auto rankOf = [&](size_t i) -> int {
    if (i >= ctx.getNumInputs() || !ctx.getInputType(i)) return -1;
    const auto &tt = ctx.getInputType(i)->tensor_type();
    return tt.has_shape() ? tt.shape().dim_size() : -1;
  };
  int r = rankOf(0);
  if (r >= 0 && r < 3) fail_shape_inference("input must be [N, C, spatial...]");
  if ((op == "Conv" || op == "ConvTranspose") && r >= 0) {
    int w = rankOf(1);
    if (w >= 0 && w != r) fail_shape_inference("weight rank differs from input rank");
  }
  // MaxUnpool's inference reads the indices' dim 1 whether or not it is known.
  if (op == "MaxUnpool" && (rankOf(1) < 2 || (r >= 0 && rankOf(1) != r)))
    fail_shape_inference("indices must have the input's shape");
  auto ints = [&](const char *name, size_t want, bool positive) {
    const onnx::AttributeProto *a = ctx.getAttribute(name);
    if (!a) return;
    if (r >= 0 && size_t(a->ints_size()) != want &&
        !(std::string(name) == "output_shape" && a->ints_size() == r))
      fail_shape_inference("attribute ", name, " has the wrong length");
    for (int64_t v : a->ints())
      if (positive ? v <= 0 : v < 0) fail_shape_inference("attribute ", name, " has a bad value");
  };
  size_t n = r >= 0 ? size_t(r - 2) : 0;
  ints("kernel_shape", n, true);
  ints("strides", n, true);
  ints("dilations", n, true);
  ints("pads", 2 * n, false);
  ints("output_padding", n, false);
  ints("output_shape", n, false);
  if (const onnx::AttributeProto *g = ctx.getAttribute("group"))
    if (g->i() <= 0) fail_shape_inference("group must be positive");
}

/// The signal ops (opset 17) index their inputs' dims unchecked in ONNX 1.12:
/// STFT's signal must be [batch, length, 1 or 2] and its window 1-D; DFT's axis
/// must name a dimension before the last.
void guardSignalOp(onnx::InferenceContext &ctx, const std::string &op) {
  auto rankOf = [&](size_t i) -> int {
    if (i >= ctx.getNumInputs() || !ctx.getInputType(i)) return -1;
    const auto &tt = ctx.getInputType(i)->tensor_type();
    return tt.has_shape() ? tt.shape().dim_size() : -1;
  };
  int r = rankOf(0);
  if (op == "STFT") {
    if (r >= 0 && r != 3) fail_shape_inference("signal must be [batch, length, 1 or 2]");
    if (rankOf(2) > 1) fail_shape_inference("window must be 1-D");
    for (size_t i : {size_t(1), size_t(3)})
      if (rankOf(i) > 0) fail_shape_inference("frame_step and frame_length must be scalars");
  } else if (op == "DFT") {
    int64_t axis = 1;
    if (const onnx::AttributeProto *a = ctx.getAttribute("axis")) axis = a->i();
    if (r >= 0 && (r < 2 || axis < -r || axis >= r - 1 || (axis < 0 && axis + r >= r - 1)))
      fail_shape_inference("axis must name a dimension before the last");
    if (rankOf(1) > 0) fail_shape_inference("dft_length must be a scalar");
  }
}

/// Whether ONNX 1.12's data propagation for `op` can run on these values:
/// the elementwise propagators index an empty (Shape of a scalar) operand,
/// and Gather's indexes with unchecked indices. Propagation only sharpens
/// shapes, so where it cannot run safely it is skipped, not failed.
bool dataPropagationIsSafe(onnx::DataPropagationContext &ctx, const std::string &op) {
  for (size_t i = 0; i < ctx.getNumInputs(); ++i)
    if (const onnx::TensorShapeProto *d = ctx.getInputData(i); d && d->dim_size() == 0) return false;
  if (op == "Gather" && ctx.getNumInputs() >= 2) {
    const onnx::TensorShapeProto *data = ctx.getInputData(0), *idx = ctx.getInputData(1);
    if (data && idx) {
      const int64_t n = data->dim_size();
      for (const auto &d : idx->dim())
        if (!d.has_dim_value() || d.dim_value() < -n || d.dim_value() >= n) return false;
    }
  }
  return true;
}

/// ONNX's schemas with each inference and data-propagation function wrapped
/// in the guards above (Note [robust shape inference]).
class GuardedRegistry : public onnx::ISchemaRegistry {
public:
  const onnx::OpSchema *GetSchema(const std::string &key, const int version,
                                  const std::string &domain) const override {
    const onnx::OpSchema *s = onnx::OpSchemaRegistry::Schema(key, version, domain);
    if (!s) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = wrapped_.find(s); // lookup only: the order of this map is never observed
    if (it != wrapped_.end()) return it->second.get();
    auto copy = std::make_unique<onnx::OpSchema>(*s);
    const onnx::OpSchema *orig_schema = s;
    auto infer = s->GetTypeAndShapeInferenceFunction();
    auto propagate = s->GetDataPropagationFunction();
    std::string op = key;
    // Only existing functions are wrapped: an op without an inference function
    // is inferred through its function body, which a wrapper would disable.
    if (s->has_type_and_shape_inference_function())
      copy->TypeAndShapeInferenceFunction([infer, orig_schema, op](onnx::InferenceContext &ctx) {
        guardInputs(ctx, *orig_schema);
        if (isWindowOp(op)) guardWindowOp(ctx, op);
        if (op == "STFT" || op == "DFT") guardSignalOp(ctx, op);
        if (const onnx::AttributeProto *a = ctx.getAttribute("blocksize"))
          if (a->i() <= 0) fail_shape_inference("attribute blocksize must be positive");
        infer(ctx);
      });
    if (s->has_data_propagation_function())
      copy->PartialDataPropagationFunction([propagate, orig_schema, op](onnx::DataPropagationContext &ctx) {
        guardInputs(ctx, *orig_schema);
        if (dataPropagationIsSafe(ctx, op)) propagate(ctx);
      });
    return wrapped_.emplace(s, std::move(copy)).first->second.get();
  }

private:
  mutable std::mutex mu_;
  mutable std::map<const onnx::OpSchema *, std::unique_ptr<onnx::OpSchema>> wrapped_;
};


const onnx::ISchemaRegistry *guardedRegistry() {
  static const GuardedRegistry registry;
  return &registry;
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
  // Note [robust shape inference]
  // ONNX 1.12's inference carries on past a node it cannot infer, leaving that
  // node's outputs untyped, and some inference and data-propagation functions
  // (Shape's, for one) dereference an input's type without checking: a
  // damaged model would crash the importer. So inference runs twice. First
  // strictly and without data propagation: any error means the shapes stay
  // unknown (they are estimates only). Then, with every value typed by that
  // first run (element types only), with data propagation, which turns
  // Shape -> Gather -> Concat -> Reshape chains into concrete sizes; a node
  // that fails there leaves its outputs typed, shapeless, and harmless.
  const onnx::ISchemaRegistry *registry = guardedRegistry();
  try {
    onnx::shape_inference::InferShapes(m, registry, onnx::ShapeInferenceOptions(false, 1, false));
  } catch (const std::exception &) {
    return {};
  }
  for (auto &vi : *g->mutable_value_info())
    if (vi.type().has_tensor_type()) vi.mutable_type()->mutable_tensor_type()->clear_shape();
  for (auto &out : *g->mutable_output())
    if (out.type().has_tensor_type()) out.mutable_type()->mutable_tensor_type()->clear_shape();
  try {
    onnx::shape_inference::InferShapes(m, registry, onnx::ShapeInferenceOptions(false, 0, true));
  } catch (const std::exception &) {
    return {};
  }
  ShapeMap shapes;
  auto record = [&](const onnx::ValueInfoProto &vi) {
    if (!vi.type().has_tensor_type()) return;
    Inferred &inf = shapes[vi.name()];
    if (auto dt = dtypeFromOnnx(vi.type().tensor_type().elem_type())) inf.dtype = *dt;
    if (!vi.type().tensor_type().has_shape()) return;
    // A value can be listed twice (value_info and output): the last one wins.
    inf.has_shape = true;
    inf.dims.clear();
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

Expected<ir::Tensor> readExternal(const TensorProto &t, const std::filesystem::path &dir, const std::string &where);

/// The part of the import shared by training and inference imports.
/// `outputs`, when given, receives every graph output (inference);
/// otherwise the graph must have one scalar floating-point output, the loss.
/// `weights`, when given, receives the floating-point initializers' contents.
Expected<ir::Graph> importModelProto(const onnx::ModelProto &model, const std::string &where,
                                     std::vector<ir::ValueId> *outputs,
                                     std::map<std::string, ir::Tensor> *weights) {
  if (!model.has_graph() || model.graph().node_size() == 0)
    return Error{where + ": ONNX model has no graph nodes"};

  ir::Graph g;
  const auto &mg = model.graph();
  g.name = mg.name();
  for (const auto &os : model.opset_import())
    if (os.domain().empty() || os.domain() == "ai.onnx") g.opset = os.version();
  if (g.opset <= 0) return Error{where + ": model imports no default-domain opset"};
  const int64_t max_opset = maxSupportedOpset();
  if (g.opset > max_opset)
    return Error{where + ": model uses ONNX opset " + std::to_string(g.opset) +
                 ", newer than rannc supports (up to " + std::to_string(max_opset) +
                 "); export with opset_version=" + std::to_string(max_opset) + " or lower"};

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
                   n.op_type() + "' (node '" + node_name + "', opset " + std::to_string(g.opset) + ")"};
    if (g.opset < info->min_opset || g.opset > info->max_opset)
      return Error{where + ": op '" + n.op_type() + "' (node '" + node_name + "') is supported for opsets " +
                   std::to_string(info->min_opset) + "-" + std::to_string(info->max_opset) +
                   ", the model uses opset " + std::to_string(g.opset)};
    std::string problem = checkAgainstSchema(n, g.opset);
    if (!problem.empty())
      return Error{where + ": node '" + node_name + "' (" + n.op_type() + ") " + problem};
  }

  // ONNX shape inference trusts the graph (a dangling input name crashes it),
  // so the structure is checked before it runs.
  std::string problem = checkStructure(mg, where);
  if (!problem.empty()) return Error{problem};

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
    if (g.findValue(in.name()) != ir::kNoValue)
      return Error{where + ": graph input '" + in.name() + "' is declared twice"};
    ir::Value v;
    v.name = in.name();
    v.kind = ir::ValueKind::Input;
    v.dtype = elemType(in);
    if (v.dtype == ir::DType::Undefined)
      return Error{where + ": graph input '" + in.name() + "' has no supported tensor element type"};
    setShape(v);
    g.inputs.push_back(g.addValue(std::move(v)));
  }
  // Floating-point initializers are the trainable parameters, except the
  // ones only BatchNormalization reads as running statistics: buffers (Note
  // [buffers]). The others (index tables, shape constants) are constants kept
  // inline in the graph.
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
    if (ir::isFloating(*dt)) {
      auto stat = running_stat_only.find(t.name());
      const bool buffer = stat != running_stat_only.end() && stat->second;
      v.kind = buffer ? ir::ValueKind::Buffer : ir::ValueKind::Parameter;
      if (weights) {
        auto data = tensorFromOnnx(t, where);
        if (!data) return data.error();
        weights->emplace(t.name(), std::move(*data));
      }
      (buffer ? g.buffers : g.parameters).push_back(g.addValue(std::move(v)));
    } else {
      // The dynamo exporter puts integer buffers (Swin's relative position
      // index) in the external data file too: read them from there.
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

  if (outputs) {
    if (mg.output_size() == 0) return Error{where + ": the graph has no outputs"};
    for (const auto &out : mg.output()) {
      ir::ValueId id = g.findValue(out.name());
      if (id == ir::kNoValue)
        return Error{where + ": graph output '" + out.name() + "' is not produced by any node"};
      outputs->push_back(id);
    }
    g.loss = outputs->front();
  } else {
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
  }
  problem = g.verify();
  if (!problem.empty()) return Error{where + ": " + problem};
  return g;
}

/// Parses a model and rewrites a newer opset into opset-17 forms (Note [newer opsets]).
Expected<onnx::ModelProto> parseModel(const std::string &bytes, const std::string &where) {
  onnx::ModelProto model;
  if (bytes.empty()) return Error{where + ": empty file, not an ONNX model"};
  if (!model.ParseFromString(bytes))
    return Error{where + ": not a valid ONNX model (protobuf parse failed; truncated or another format?)"};
  auto opset = lowerToKnownOpset(model, where);
  if (!opset) return opset.error();
  return model;
}

} // namespace

Expected<ir::Graph> importOnnxBytes(const std::string &bytes, const std::string &where) {
  auto model = parseModel(bytes, where);
  if (!model) return model.error();
  return importModelProto(*model, where, nullptr, nullptr);
}

Expected<InferenceModel> importOnnxInference(const std::string &bytes, const std::string &where) {
  auto model = parseModel(bytes, where);
  if (!model) return model.error();
  InferenceModel m;
  auto g = importModelProto(*model, where, &m.outputs, &m.weights);
  if (!g) return g.error();
  m.graph = std::move(*g);
  return m;
}

namespace {

/// Note [weightless models]
/// An initializer may come without its contents: ONNX external data whose file
/// is absent, or dims and no data at all. Import and planning need only the
/// dims, so such a model (models/make_large.py writes 100-billion-parameter
/// ones in seconds) plans like any other; only rannc-exec needs the contents,
/// and says which are missing unless told to make them up (--init-weights).
/// External data that is present is read: `location` relative to the model's
/// folder, optional `offset` and `length` (ONNX's external data convention).

/// Why `t`'s contents cannot be read ("" when they can); `dir` is the model's folder.
std::string absentReason(const TensorProto &t, const std::filesystem::path &dir) {
  if (t.data_location() == TensorProto::EXTERNAL) {
    for (const auto &kv : t.external_data())
      if (kv.key() == "location") {
        std::error_code ec;
        if (!std::filesystem::is_regular_file(dir / kv.value(), ec))
          return "its external data file '" + kv.value() + "' does not exist";
        return "";
      }
    return "it is marked external but names no location";
  }
  if (t.has_raw_data()) return "";
  int64_t numel = 1;
  for (int64_t d : t.dims()) numel *= d;
  const int stored = t.float_data_size() + t.double_data_size() + t.int32_data_size() + t.int64_data_size();
  if (numel > 0 && stored == 0) return "it has dims but no data";
  return "";
}

/// Reads `t`'s external data from its file next to the model.
Expected<ir::Tensor> readExternal(const TensorProto &t, const std::filesystem::path &dir, const std::string &where) {
  std::string location;
  int64_t offset = 0, length = -1;
  try {
    for (const auto &kv : t.external_data()) {
      if (kv.key() == "location") location = kv.value();
      else if (kv.key() == "offset") offset = std::stoll(kv.value());
      else if (kv.key() == "length") length = std::stoll(kv.value());
    }
  } catch (const std::exception &) {
    return Error{where + ": tensor '" + t.name() + "' has a malformed external data offset or length"};
  }
  const std::filesystem::path file = dir / location;
  if (std::filesystem::path(location).is_absolute())
    return Error{where + ": tensor '" + t.name() + "': external data location '" + location +
                 "' must be relative to the model's folder"};
  TensorProto inline_copy = t;
  inline_copy.clear_external_data();
  inline_copy.set_data_location(TensorProto::DEFAULT);
  int64_t numel = 1;
  for (int64_t d : t.dims()) numel *= d;
  auto dt = dtypeFromOnnx(t.data_type());
  const int64_t want = dt ? numel * ir::dtypeSize(*dt) : 0;
  if (length < 0) length = want;
  std::ifstream in(file, std::ios::binary);
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (!in || ec || offset < 0 || length < 0 || uint64_t(offset) + uint64_t(length) > size)
    return Error{where + ": tensor '" + t.name() + "': cannot read " + std::to_string(length) + " bytes at offset " +
                 std::to_string(offset) + " of external data file '" + file.string() + "'"};
  std::string bytes(size_t(length), '\0');
  in.seekg(offset);
  in.read(bytes.data(), length);
  if (!in) return Error{where + ": tensor '" + t.name() + "': reading '" + file.string() + "' failed"};
  inline_copy.set_raw_data(std::move(bytes));
  return tensorFromOnnx(inline_copy, where);
}

} // namespace

Expected<std::map<std::string, ir::Tensor>> loadModelWeights(const std::string &path,
                                                             const std::vector<std::string> &names,
                                                             std::vector<MissingWeight> *missing) {
  auto bytes = readFile(path);
  if (!bytes) return bytes.error();
  onnx::ModelProto model;
  if (!model.ParseFromString(*bytes)) return Error{path + ": not a valid ONNX model"};
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::set<std::string> wanted(names.begin(), names.end()), seen;
  std::map<std::string, ir::Tensor> out;
  for (const auto &t : model.graph().initializer()) {
    if (!wanted.count(t.name())) continue;
    seen.insert(t.name());
    if (std::string why = absentReason(t, dir); !why.empty()) {
      if (!missing)
        return Error{path + ": initializer '" + t.name() + "' has no weight data (" + why + ")"};
      missing->push_back({t.name(), why});
      continue;
    }
    auto tensor = t.data_location() == TensorProto::EXTERNAL ? readExternal(t, dir, path) : tensorFromOnnx(t, path);
    if (!tensor) return tensor.error();
    out.emplace(t.name(), std::move(*tensor));
  }
  for (const auto &n : names)
    if (!seen.count(n)) return Error{path + ": model has no initializer named '" + n + "'"};
  return out;
}

} // namespace rannc::import
