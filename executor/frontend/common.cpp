#include "executor/frontend/common.h"

#include <functional>
#include <vector>

#include "executor/runtime/interpreter.h"
#include "executor/runtime/ops.h"
#include "executor/runtime/stage.h"
#include "planner/import/onnx_import.h"

namespace rannc::import {
namespace {

/// Runs `g` without gradients on `inputs` (one per graph input); every value's
/// tensor (undefined for one it could not compute).
std::vector<torch::Tensor> evaluate(const ir::Graph &g, const std::map<std::string, torch::Tensor> &weights,
                                    const std::vector<torch::Tensor> &inputs) {
  torch::NoGradGuard no_grad;
  runtime::ValueMap env;
  for (size_t i = 0; i < g.inputs.size(); ++i) env[g.inputs[i]] = inputs[i];
  for (ir::ValueId p : g.parameters) env[p] = weights.at(g.values[p].name);
  for (ir::ValueId p : g.buffers) env[p] = weights.at(g.values[p].name).clone(); // batch_norm updates them
  for (const auto &[id, t] : g.constant_data) env[id] = runtime::toTorch(t);
  for (ir::ValueId c : g.constants) // ONNX initializers that are not trained
    if (!env[c].defined())
      if (auto it = weights.find(g.values[c].name); it != weights.end()) env[c] = it->second;
  runtime::NodeHooks hooks;
  hooks.missing = [](const ir::Node &, ir::ValueId) { return std::optional<torch::Tensor>(torch::Tensor()); };
  runtime::runNodes(g, runtime::allNodes(g), env, hooks);
  std::vector<torch::Tensor> values(g.values.size());
  for (auto &[id, t] : env) values[id] = std::move(t);
  return values;
}

/// Synthetic data for every graph input at batch size `b`.
std::vector<torch::Tensor> syntheticBatch(const ir::Graph &g, int64_t b) {
  std::vector<torch::Tensor> inputs;
  for (ir::ValueId in : g.inputs) inputs.push_back(runtime::syntheticInput(g.values[in], b, uint64_t(b)));
  return inputs;
}

/// True when every dimension of `v` is known.
bool shapeComplete(const ir::Value &v) {
  if (!v.shape_known) return false;
  for (const ir::Dim &d : v.shape)
    if (!d.known) return false;
  return true;
}

/// The index of `v`'s batch axis (the first dimension affine in B), or -1.
int batchAxisOf(const ir::Value &v) {
  if (!v.shape_known) return -1;
  for (size_t i = 0; i < v.shape.size(); ++i)
    if (v.shape[i].known && v.shape[i].batch_coeff != 0) return int(i);
  return -1;
}

/// True when the samples' layout along the batch axis needs finding: the
/// axis holds several rows per sample, or more than the samples.
bool layoutAmbiguous(const ir::Value &v) {
  const int axis = batchAxisOf(v);
  return axis >= 0 && (v.shape[size_t(axis)].batch_coeff != 1 || v.shape[size_t(axis)].offset != 0);
}

// Note [batch layout]
// A value's batch axis of size c*B (c > 1) holds c rows per sample, but a
// shape cannot tell in which order: a batch-first reshape ([B, T, C] ->
// [B*T, C]) keeps each sample's rows together, a sequence-first one
// (nn.MultiheadAttention's [T, B, C] -> [T*B, C]) interleaves them. Splitting
// such a value between replicas needs the order, so it is found by running:
// sample 0 of a batch-3 run, viewed as [o, 3, c/o] along the axis for each
// divisor o of c, must equal a run on that sample alone. The first o that
// matches is Value::batch_blocks; none (an op that mixes samples, such as
// BatchNorm in training mode) leaves 0, and the executor refuses to split it.

/// The batch_blocks of `v` from its tensors at batch 3 and at batch 1 (sample 0).
int64_t findBatchBlocks(const ir::Value &v, const torch::Tensor &at3, const torch::Tensor &at1) {
  const int axis = batchAxisOf(v);
  const ir::Dim d = v.shape[size_t(axis)];
  const int64_t c = d.batch_coeff;
  if (d.offset != 0 || c < 1 || !at1.defined() || at1.dim() != at3.dim() || at1.size(axis) != c ||
      at3.size(axis) != 3 * c)
    return 0;
  for (int64_t o = 1; o <= c; ++o) {
    if (c % o != 0) continue;
    std::vector<int64_t> split(at3.sizes().begin(), at3.sizes().end());
    split[size_t(axis)] = c / o;
    split.insert(split.begin() + axis, {o, 3});
    const torch::Tensor first = at3.reshape(split).select(axis + 1, 0).reshape(at1.sizes());
    const bool same = at1.is_floating_point() ? torch::allclose(first, at1, 1e-4, 1e-5) : torch::equal(first, at1);
    if (same) return o;
  }
  return 0;
}

/// Sets the dtype and shape of the intermediate values `which` selects from
/// two runs of `g` at batch sizes 3 and 5, each dimension solved for a*B+c
/// (Note [symbolic batch]), and the batch layout of every value whose layout
/// a shape leaves open (Note [batch layout]). Returns how many values it set.
int solveShapes(ir::Graph &g, const std::map<std::string, torch::Tensor> &weights,
                const std::function<bool(const ir::Value &)> &which) {
  std::vector<char> wanted(g.values.size(), 0);
  bool any = false;
  for (ir::ValueId id = 0; id < ir::ValueId(g.values.size()); ++id)
    any |= wanted[id] = g.values[id].kind == ir::ValueKind::Intermediate && which(g.values[id]);
  const std::vector<torch::Tensor> in3 = syntheticBatch(g, 3);
  const std::vector<torch::Tensor> at3 = evaluate(g, weights, in3);
  // The batch-5 run only solves shapes: a layout-only pass does without it.
  const std::vector<torch::Tensor> at5 = any ? evaluate(g, weights, syntheticBatch(g, 5)) : at3;
  int set = 0;
  for (ir::ValueId id = 0; id < ir::ValueId(g.values.size()); ++id) {
    ir::Value &v = g.values[id];
    if (!wanted[id]) continue;
    const torch::Tensor &a = at3[id], &b = at5[id];
    if (!a.defined() || !b.defined()) continue;
    v.dtype = runtime::fromScalarType(a.scalar_type());
    v.shape.clear();
    v.shape_known = a.dim() == b.dim();
    ++set;
    if (!v.shape_known) continue;
    for (int64_t d = 0; d < a.dim(); ++d) {
      const int64_t s3 = a.size(d), s5 = b.size(d);
      if (s3 == s5) {
        v.shape.push_back(ir::Dim::fixed(s3));
      } else if ((s5 - s3) % 2 == 0) {
        const int64_t coeff = (s5 - s3) / 2;
        v.shape.push_back(ir::Dim::batch(coeff, s3 - 3 * coeff));
      } else {
        v.shape.push_back(ir::Dim::unknown());
      }
    }
  }
  bool ambiguous = false;
  for (const ir::Value &v : g.values) ambiguous |= v.kind == ir::ValueKind::Intermediate && layoutAmbiguous(v);
  if (!ambiguous) return set;
  std::vector<torch::Tensor> in1;
  for (const torch::Tensor &t : in3) in1.push_back(t.narrow(0, 0, 1));
  std::vector<torch::Tensor> at1;
  try {
    at1 = evaluate(g, weights, in1);
  } catch (const std::exception &) {
    return set; // a graph that cannot run on one sample keeps the contiguous layout
  }
  for (ir::ValueId id = 0; id < ir::ValueId(g.values.size()); ++id) {
    ir::Value &v = g.values[id];
    if (v.kind == ir::ValueKind::Intermediate && layoutAmbiguous(v) && at3[id].defined())
      v.batch_blocks = findBatchBlocks(v, at3[id], at1[id]);
  }
  return set;
}

} // namespace

ir::Value tensorValue(const std::string &name, const torch::Tensor &t, ir::ValueKind kind) {
  ir::Value v;
  v.name = name;
  v.kind = kind;
  v.dtype = runtime::fromScalarType(t.scalar_type());
  v.shape_known = true;
  for (int64_t s : t.sizes()) v.shape.push_back(ir::Dim::fixed(s));
  return v;
}

Status findShapesByRunning(ir::Graph &g, const std::map<std::string, torch::Tensor> &weights,
                           const std::string &where) {
  try {
    solveShapes(g, weights, [](const ir::Value &) { return true; });
  } catch (const std::exception &e) {
    return Error{where + ": running the graph to find its shapes failed: " + firstLine(e.what())};
  }
  if (std::string problem = g.verify(); !problem.empty()) return Error{where + ": " + problem};
  const ir::Value &loss = g.values[g.loss];
  if (!loss.shape_known || !loss.shape.empty() || !ir::isFloating(loss.dtype))
    return Error{where + ": forward must return the scalar training loss, got " + ir::shapeString(loss.shape)};
  return Status::success();
}


Expected<int> completeShapesByRunning(ir::Graph &g, const std::string &model, int64_t max_weight_bytes) {
  int unknown = 0, ambiguous = 0;
  for (const ir::Value &v : g.values)
    if (v.kind == ir::ValueKind::Intermediate) {
      unknown += !shapeComplete(v);
      ambiguous += layoutAmbiguous(v);
    }
  if (unknown == 0 && ambiguous == 0) return 0;
  std::vector<std::string> names;
  int64_t bytes = 0;
  for (const auto *ids : {&g.parameters, &g.buffers, &g.constants})
    for (ir::ValueId id : *ids) {
      const ir::Value &v = g.values[id];
      if (g.constant_data.count(id)) continue;
      names.push_back(v.name);
      bytes += ir::numelAt(v.shape, 1) * ir::dtypeSize(v.dtype);
    }
  if (bytes > max_weight_bytes)
    return Error{std::to_string(unknown) + " values have unknown shapes and " + std::to_string(ambiguous) +
                 " an unknown batch layout, and the weights (" + std::to_string(bytes >> 20) +
                 " MiB) are too large to run the graph for them"};
  std::vector<MissingWeight> missing;
  auto loaded = loadModelWeights(model, names, &missing);
  if (!loaded) return loaded.error();
  std::map<std::string, torch::Tensor> weights;
  for (const auto &[name, t] : *loaded) weights[name] = runtime::toTorch(t);
  // A weightless model (Note [weightless models]): random weights give the same shapes.
  for (const MissingWeight &m : missing) {
    if (const ir::ValueId id = g.findValue(m.name); id != ir::kNoValue)
      weights[m.name] = runtime::syntheticInput(g.values[id], 1, 0);
  }
  try {
    return solveShapes(g, weights, [](const ir::Value &v) { return !shapeComplete(v); });
  } catch (const std::exception &e) {
    return Error{"running the graph to find the shapes ONNX's inference left unknown failed: " +
                 firstLine(e.what())};
  }
}

} // namespace rannc::import
