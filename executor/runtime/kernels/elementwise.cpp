// ONNX element-wise ops: arithmetic with numpy (or, before opset 7, legacy)
// broadcasting, comparisons and logic, activations, casts.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <limits>
#include <string>
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

// ---------------------------------------------------------------------------
// Legacy forms (opsets before 7)

/// Opsets 1-6 broadcast B to A only when `broadcast` is 1, aligned at `axis`
/// (default: the trailing dimensions, which is numpy's rule too).
torch::Tensor legacyBroadcast(const OpCtx &c, const torch::Tensor &a, const torch::Tensor &b) {
  if (c.opset() >= 7 || !c.attrInt("broadcast", 0) || !c.hasAttr("axis")) return b;
  int64_t axis = normBoundary(c, c.attrInt("axis"), a.dim());
  if (axis + b.dim() > a.dim()) c.fail("B does not fit into A at axis " + std::to_string(axis));
  std::vector<int64_t> shape(b.sizes().begin(), b.sizes().end());
  shape.resize(size_t(a.dim() - axis), 1);
  return b.reshape(shape);
}

/// Add/Sub/Mul (and Div, Pow): opset 7+ broadcast like numpy; older ones as legacyBroadcast.
template <torch::Tensor (*F)(const torch::Tensor &, const torch::Tensor &)>
Outputs binaryOp(const OpCtx &c) {
  const auto &a = c.in(0);
  return {F(a, legacyBroadcast(c, a, c.in(1)))};
}
torch::Tensor subFn(const torch::Tensor &a, const torch::Tensor &b) { return a - b; }
torch::Tensor mulFn(const torch::Tensor &a, const torch::Tensor &b) { return a * b; }

// ---------------------------------------------------------------------------
// Kernels of more than one line (the one-line ones are in the table below)

Outputs opDiv(const OpCtx &c) {
  const auto &a = c.in(0);
  torch::Tensor b = legacyBroadcast(c, a, c.in(1));
  // ONNX integer division truncates; torch's `/` would return floats.
  if (isIntegral(a)) return {torch::div(a, b, "trunc")};
  return {a / b};
}

Outputs opPow(const OpCtx &c) {
  torch::Tensor x = c.in(0), y = legacyBroadcast(c, x, c.in(1));
  // The result has the base's type. A float base keeps the float path (and its
  // gradient) by raising to the exponent converted to the base's type.
  if (x.is_floating_point() && y.scalar_type() != x.scalar_type()) y = y.to(x.scalar_type());
  torch::Tensor r = torch::pow(x, y);
  return {r.scalar_type() == x.scalar_type() ? r : r.to(x.scalar_type())};
}

Outputs opWhere(const OpCtx &c) {
  torch::Tensor cond = c.in(0);
  if (cond.scalar_type() != torch::kBool) cond = cond.to(torch::kBool);
  return {torch::where(cond, c.in(1), c.in(2))};
}

Outputs opClip(const OpCtx &c) {
  const auto &x = c.in(0);
  if (c.opset() < 11) {
    double lo = c.attrFloat("min", std::numeric_limits<float>::lowest());
    double hi = c.attrFloat("max", std::numeric_limits<float>::max());
    return {torch::clamp(x, lo, hi)};
  }
  if (!c.has(1) && !c.has(2)) return {x};
  return {torch::clamp(x, c.opt(1), c.opt(2))};
}

/// Variadic Min/Max/Sum/Mean: a left fold of a broadcasting binary op.
template <torch::Tensor (*F)(const torch::Tensor &, const torch::Tensor &)>
Outputs foldInputs(const OpCtx &c) {
  torch::Tensor acc = c.in(0);
  for (size_t i = 1; i < c.numInputs(); ++i) acc = F(acc, c.in(i));
  return {acc};
}
torch::Tensor addFn(const torch::Tensor &a, const torch::Tensor &b) { return a + b; }
torch::Tensor minFn(const torch::Tensor &a, const torch::Tensor &b) { return torch::minimum(a, b); }
torch::Tensor maxFn(const torch::Tensor &a, const torch::Tensor &b) { return torch::maximum(a, b); }

Outputs opMean(const OpCtx &c) {
  return {foldInputs<addFn>(c)[0] / static_cast<double>(c.numInputs())};
}

Outputs opCast(const OpCtx &c) { return {c.in(0).to(onnxScalarType(c, c.attrInt("to")))}; }

Outputs opMod(const OpCtx &c) {
  const auto &a = c.in(0), &b = c.in(1);
  // fmod=1: the sign of the dividend (C fmod); fmod=0: the sign of the
  // divisor (Python %), which ONNX allows for integers only.
  if (c.attrInt("fmod", 0)) return {torch::fmod(a, b)};
  if (a.is_floating_point()) c.fail("fmod must be 1 for floating-point inputs");
  return {torch::remainder(a, b)};
}

Outputs opBitShift(const OpCtx &c) {
  const auto &a = c.in(0), &b = c.in(1);
  std::string dir = c.attrString("direction", "");
  if (dir == "LEFT") return {torch::bitwise_left_shift(a, b)};
  if (dir == "RIGHT") return {torch::bitwise_right_shift(a, b)};
  c.fail("direction must be LEFT or RIGHT");
}

Outputs opIsInf(const OpCtx &c) {
  const auto &x = c.in(0);
  bool neg = c.attrInt("detect_negative", 1) != 0, pos = c.attrInt("detect_positive", 1) != 0;
  torch::Tensor inf = torch::isinf(x);
  if (neg && pos) return {inf};
  if (pos) return {inf & (x > 0)};
  if (neg) return {inf & (x < 0)};
  return {torch::zeros_like(x, torch::kBool)};
}

Outputs opPRelu(const OpCtx &c) {
  const auto &x = c.in(0);
  torch::Tensor slope = c.in(1);
  // Opset 6 gives a per-channel slope as [C]; later opsets broadcast it
  // numpy-style, which for [C] would align C with the last dimension.
  if (c.opset() < 7 && slope.dim() == 1 && x.dim() > 2 && slope.size(0) == x.size(1) &&
      slope.size(0) != 1) {
    std::vector<int64_t> shape(size_t(x.dim() - 1), 1);
    shape[0] = slope.size(0);
    slope = slope.reshape(shape);
  }
  return {torch::where(x < 0, x * slope, x)};
}

Outputs opShrink(const OpCtx &c) {
  const auto &x = c.in(0);
  double lambd = c.attrFloat("lambd", 0.5), bias = c.attrFloat("bias", 0.0);
  torch::Tensor zero = torch::zeros_like(x);
  return {torch::where(x < -lambd, x + bias, torch::where(x > lambd, x - bias, zero))};
}

Outputs opCastLike(const OpCtx &c) { return {c.in(0).to(c.in(1).scalar_type())}; }

} // namespace

// One-line kernels: `x` is input 0; `a` and `b` are inputs 0 and 1.
#define UNARY(expr)                                                                                \
  [](const OpCtx &c) -> Outputs {                                                                  \
    const auto &x = c.in(0);                                                                       \
    return {expr};                                                                                 \
  }
#define BINARY(expr)                                                                               \
  [](const OpCtx &c) -> Outputs {                                                                  \
    const auto &a = c.in(0), &b = c.in(1);                                                         \
    return {expr};                                                                                 \
  }

std::vector<KernelDef> elementwiseKernels() {
  return {
      {"Abs", 1, 1, UNARY(torch::abs(x))},
      {"Acos", 1, 1, UNARY(torch::acos(x))},
      {"Acosh", 1, 1, UNARY(torch::acosh(x))},
      {"Add", 2, 2, binaryOp<addFn>},
      {"And", 2, 2, BINARY(torch::logical_and(a, b))},
      {"Asin", 1, 1, UNARY(torch::asin(x))},
      {"Asinh", 1, 1, UNARY(torch::asinh(x))},
      {"Atan", 1, 1, UNARY(torch::atan(x))},
      {"Atanh", 1, 1, UNARY(torch::atanh(x))},
      {"BitShift", 2, 2, opBitShift},
      {"BitwiseAnd", 2, 2, BINARY(torch::bitwise_and(a, b))},
      {"BitwiseNot", 1, 1, UNARY(torch::bitwise_not(x))},
      {"BitwiseOr", 2, 2, BINARY(torch::bitwise_or(a, b))},
      {"BitwiseXor", 2, 2, BINARY(torch::bitwise_xor(a, b))},
      {"Cast", 1, 1, opCast},
      {"CastLike", 2, 2, opCastLike},
      {"Ceil", 1, 1, UNARY(torch::ceil(x))},
      {"Celu", 1, 1, UNARY(torch::celu(x, c.attrFloat("alpha", 1.0)))},
      {"Clip", 1, 3, opClip},
      {"Cos", 1, 1, UNARY(torch::cos(x))},
      {"Cosh", 1, 1, UNARY(torch::cosh(x))},
      {"Div", 2, 2, opDiv},
      {"Elu", 1, 1, UNARY(torch::elu(x, c.attrFloat("alpha", 1.0)))},
      {"Equal", 2, 2, BINARY(torch::eq(a, b))},
      {"Erf", 1, 1, UNARY(torch::erf(x))},
      {"Exp", 1, 1, UNARY(torch::exp(x))},
      {"Floor", 1, 1, UNARY(torch::floor(x))},
      {"Gelu", 1, 1, UNARY(torch::gelu(x, c.attrString("approximate", "none")))},
      {"Greater", 2, 2, BINARY(torch::gt(a, b))},
      {"GreaterOrEqual", 2, 2, BINARY(torch::ge(a, b))},
      {"HardSigmoid", 1, 1,
       UNARY(torch::clamp(x * c.attrFloat("alpha", 0.2) + c.attrFloat("beta", 0.5), 0, 1))},
      {"HardSwish", 1, 1, UNARY(torch::hardswish(x))},
      {"Identity", 1, 1, UNARY(x)},
      {"IsInf", 1, 1, opIsInf},
      {"IsNaN", 1, 1, UNARY(torch::isnan(x))},
      {"LeakyRelu", 1, 1, UNARY(torch::leaky_relu(x, c.attrFloat("alpha", 0.01)))},
      {"Less", 2, 2, BINARY(torch::lt(a, b))},
      {"LessOrEqual", 2, 2, BINARY(torch::le(a, b))},
      {"Log", 1, 1, UNARY(torch::log(x))},
      {"Max", 1, kVariadic, foldInputs<maxFn>},
      {"Mean", 1, kVariadic, opMean},
      {"Min", 1, kVariadic, foldInputs<minFn>},
      {"Mod", 2, 2, opMod},
      {"Mul", 2, 2, binaryOp<mulFn>},
      {"Neg", 1, 1, UNARY(torch::neg(x))},
      {"Not", 1, 1, UNARY(torch::logical_not(x))},
      {"Or", 2, 2, BINARY(torch::logical_or(a, b))},
      {"PRelu", 2, 2, opPRelu},
      {"Pow", 2, 2, opPow},
      {"Reciprocal", 1, 1, UNARY(torch::reciprocal(x))},
      {"Relu", 1, 1, UNARY(torch::relu(x))},
      {"Round", 1, 1, UNARY(torch::round(x))}, // half to even, as ONNX
      {"Selu", 1, 1,
       UNARY(torch::elu(x, c.attrFloat("alpha", 1.67326319217681884765625),
                        c.attrFloat("gamma", 1.05070102214813232421875)))},
      {"Shrink", 1, 1, opShrink},
      {"Sigmoid", 1, 1, UNARY(torch::sigmoid(x))},
      {"Sign", 1, 1, UNARY(torch::sign(x))},
      {"Sin", 1, 1, UNARY(torch::sin(x))},
      {"Sinh", 1, 1, UNARY(torch::sinh(x))},
      {"Softplus", 1, 1, UNARY(torch::softplus(x))},
      {"Softsign", 1, 1, UNARY(x / (torch::abs(x) + 1))},
      {"Sqrt", 1, 1, UNARY(torch::sqrt(x))},
      {"Sub", 2, 2, binaryOp<subFn>},
      {"Sum", 1, kVariadic, foldInputs<addFn>},
      {"Tan", 1, 1, UNARY(torch::tan(x))},
      {"Tanh", 1, 1, UNARY(torch::tanh(x))},
      {"ThresholdedRelu", 1, 1,
       UNARY(torch::where(x > c.attrFloat("alpha", 1.0), x, torch::zeros_like(x)))},
      {"Where", 3, 3, opWhere},
      {"Xor", 2, 2, BINARY(torch::logical_xor(a, b))},
  };
}

#undef UNARY
#undef BINARY

} // namespace rannc::runtime::kernels
