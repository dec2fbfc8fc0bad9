#include "planner/import/onnx_shape_inference.h"

#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <map>
#include <memory>
#include <mutex>

#include "planner/import/onnx_import.h"

namespace rannc::import {
namespace {

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

/// The rank of input i, or -1 where it is absent, untyped or of unknown shape.
int inputRank(onnx::InferenceContext &ctx, size_t i) {
  if (i >= ctx.getNumInputs() || !ctx.getInputType(i)) return -1;
  const auto &tt = ctx.getInputType(i)->tensor_type();
  return tt.has_shape() ? tt.shape().dim_size() : -1;
}

/// For the window ops: ranks that agree ([N, C, spatial...] input, weight of
/// the same rank) and window attributes of the right length, positive where
/// inference divides by them. ONNX 1.12 indexes with them unchecked.
void guardWindowOp(onnx::InferenceContext &ctx, const std::string &op) {
  auto rankOf = [&](size_t i) { return inputRank(ctx, i); };
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
  auto rankOf = [&](size_t i) { return inputRank(ctx, i); };
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

using Inferred = BatchShapes::Inferred;
using ShapeMap = BatchShapes::ShapeMap;

/// Concrete shapes of every typed value after ONNX shape inference with the
/// batch dimension of each data input fixed to `batch`.
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

// Two inference runs at different batch sizes give every dim as a*B+c.
constexpr int64_t kB1 = 3, kB2 = 5;

} // namespace

BatchShapes::BatchShapes(const onnx::ModelProto &model, const std::set<std::string> &data_inputs)
    : at1_(inferConcreteShapes(model, data_inputs, kB1)), at2_(inferConcreteShapes(model, data_inputs, kB2)) {}

void BatchShapes::apply(ir::Value &v) const {
  auto i1 = at1_.find(v.name), i2 = at2_.find(v.name);
  if (i1 == at1_.end() || i2 == at2_.end()) return;
  if (v.dtype == ir::DType::Undefined) v.dtype = i1->second.dtype;
  if (i1->second.has_shape && i2->second.has_shape)
    v.shape_known = affineShape(i1->second.dims, kB1, i2->second.dims, kB2, v.shape);
}

} // namespace rannc::import
