// ONNX random ops. The seed attribute is not honoured: torch's generator is
// seeded by the trainer (as for Dropout).
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

torch::ScalarType randomDtype(const OpCtx &c, torch::ScalarType dflt) {
  return c.hasAttr("dtype") ? onnxScalarType(c, c.attrInt("dtype")) : dflt;
}

Outputs opRandomUniformLike(const OpCtx &c) {
  const auto &x = c.in(0);
  double lo = c.attrFloat("low", 0.0), hi = c.attrFloat("high", 1.0);
  auto dt = randomDtype(c, x.scalar_type());
  return {torch::rand(x.sizes(), torch::TensorOptions(torch::kDouble).device(x.device()))
              .mul(hi - lo)
              .add(lo)
              .to(dt)};
}

Outputs opRandomNormalLike(const OpCtx &c) {
  const auto &x = c.in(0);
  double mean = c.attrFloat("mean", 0.0), scale = c.attrFloat("scale", 1.0);
  auto dt = randomDtype(c, x.scalar_type());
  return {torch::randn(x.sizes(), torch::TensorOptions(torch::kDouble).device(x.device()))
              .mul(scale)
              .add(mean)
              .to(dt)};
}

Outputs opRandomUniform(const OpCtx &c) {
  double lo = c.attrFloat("low", 0.0), hi = c.attrFloat("high", 1.0);
  return {torch::rand(c.attrIntsRequired("shape"), torch::kDouble).mul(hi - lo).add(lo).to(
      randomDtype(c, torch::kFloat))};
}

Outputs opRandomNormal(const OpCtx &c) {
  double mean = c.attrFloat("mean", 0.0), scale = c.attrFloat("scale", 1.0);
  return {torch::randn(c.attrIntsRequired("shape"), torch::kDouble).mul(scale).add(mean).to(
      randomDtype(c, torch::kFloat))};
}

Outputs opBernoulli(const OpCtx &c) {
  const auto &x = c.in(0);
  return {torch::bernoulli(x.detach().to(torch::kDouble)).to(randomDtype(c, x.scalar_type()))};
}

} // namespace

std::vector<KernelDef> randomKernels() {
  return {
      {"Bernoulli", 1, 1, opBernoulli},
      {"RandomNormal", 0, 0, opRandomNormal},
      {"RandomNormalLike", 1, 1, opRandomNormalLike},
      {"RandomUniform", 0, 0, opRandomUniform},
      {"RandomUniformLike", 1, 1, opRandomUniformLike},
  };
}

} // namespace rannc::runtime::kernels
