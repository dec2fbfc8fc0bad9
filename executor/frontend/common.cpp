#include "executor/frontend/common.h"

#include <vector>

#include "executor/runtime/ops.h"
#include "executor/runtime/stage.h"

namespace rannc::import {
namespace {

/// Runs `g` without gradients at batch size `b`; every value's tensor.
std::vector<torch::Tensor> evaluate(const ir::Graph &g, const std::map<std::string, torch::Tensor> &weights,
                                    int64_t b) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> env(g.values.size());
  for (ir::ValueId in : g.inputs) env[in] = runtime::syntheticInput(g.values[in], b, uint64_t(b));
  for (ir::ValueId p : g.parameters) env[p] = weights.at(g.values[p].name);
  for (ir::ValueId p : g.buffers) env[p] = weights.at(g.values[p].name).clone(); // batch_norm updates them
  for (const auto &[id, t] : g.constant_data) env[id] = runtime::toTorch(t);
  std::vector<torch::Tensor> args;
  for (const ir::Node &n : g.nodes) {
    args.clear();
    for (ir::ValueId in : n.inputs) args.push_back(in == ir::kNoValue ? torch::Tensor() : env[in]);
    std::vector<torch::Tensor> outs = runtime::runOp(n, args, g.opset);
    for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i) env[n.outputs[i]] = outs[i];
  }
  return env;
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
  std::vector<torch::Tensor> at3, at5;
  try {
    at3 = evaluate(g, weights, 3);
    at5 = evaluate(g, weights, 5);
  } catch (const std::exception &e) {
    std::string what = e.what();
    return Error{where + ": running the graph to find its shapes failed: " + what.substr(0, what.find('\n'))};
  }
  for (ir::ValueId id = 0; id < ir::ValueId(g.values.size()); ++id) {
    ir::Value &v = g.values[id];
    if (v.kind != ir::ValueKind::Intermediate) continue;
    const torch::Tensor &a = at3[id], &b = at5[id];
    if (!a.defined() || !b.defined()) continue;
    v.dtype = runtime::fromScalarType(a.scalar_type());
    v.shape.clear();
    v.shape_known = a.dim() == b.dim();
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
  if (std::string problem = g.verify(); !problem.empty()) return Error{where + ": " + problem};
  const ir::Value &loss = g.values[g.loss];
  if (!loss.shape_known || !loss.shape.empty() || !ir::isFloating(loss.dtype))
    return Error{where + ": forward must return the scalar training loss, got " + ir::shapeString(loss.shape)};
  return Status::success();
}

} // namespace rannc::import
