// ONNX ops that create tensors from attributes or sizes: Constant,
// ConstantOfShape, Range, EyeLike.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <algorithm>
#include <cmath>
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"
#include "executor/runtime/tensor_convert.h"

namespace rannc::runtime::kernels {
namespace {

Outputs opConstant(const OpCtx &c) {
  if (const ir::Tensor *t = c.attrTensor("value")) return {toTorch(*t)};
  if (c.hasAttr("value_float"))
    return {torch::scalar_tensor(c.attrFloat("value_float", 0), torch::kFloat)};
  if (c.hasAttr("value_int")) return {torch::scalar_tensor(c.attrInt("value_int"), torch::kLong)};
  if (auto v = c.attrInts("value_ints")) return {longTensor(*v, torch::kCPU)};
  if (auto v = c.attrFloats("value_floats"))
    return {torch::tensor(c10::ArrayRef<double>(*v), torch::kDouble).to(torch::kFloat)};
  c.fail("needs a value, value_float(s) or value_int(s) attribute (strings and sparse tensors are "
         "unsupported)");
}

Outputs opConstantOfShape(const OpCtx &c) {
  const auto &shape_t = c.in(0);
  std::vector<int64_t> shape = intValues(c, shape_t, "shape");
  torch::Tensor value = torch::zeros({1}, torch::kFloat); // default: float32 0
  if (const ir::Tensor *t = c.attrTensor("value")) value = toTorch(*t);
  if (value.numel() != 1) c.fail("value must have exactly one element");
  return {torch::full(shape, value.reshape({}).item(),
                      torch::TensorOptions(value.scalar_type()).device(shape_t.device()))};
}

Outputs opRange(const OpCtx &c) {
  const auto &start_t = c.in(0);
  auto opts = torch::TensorOptions().device(start_t.device());
  // n = max(ceil((limit - start) / delta), 0); element i is start + i * delta.
  if (start_t.is_floating_point()) {
    double s = start_t.item<double>(), l = c.in(1).item<double>(), d = c.in(2).item<double>();
    if (d == 0) c.fail("delta is 0");
    int64_t n = std::max<int64_t>(int64_t(std::ceil((l - s) / d)), 0);
    return {(torch::arange(n, opts.dtype(torch::kDouble)) * d + s).to(start_t.scalar_type())};
  }
  int64_t s = intScalar(c, start_t, "start"), l = intScalar(c, c.in(1), "limit"),
          d = intScalar(c, c.in(2), "delta");
  if (d == 0) c.fail("delta is 0");
  int64_t diff = l - s;
  int64_t n = d > 0 ? (diff > 0 ? (diff + d - 1) / d : 0) : (diff < 0 ? (diff + d + 1) / d : 0);
  return {(torch::arange(n, opts.dtype(torch::kLong)) * d + s).to(start_t.scalar_type())};
}

Outputs opEyeLike(const OpCtx &c) {
  const auto &x = c.in(0);
  if (x.dim() != 2) c.fail("input must be 2-D");
  auto dtype = c.hasAttr("dtype") ? onnxScalarType(c, c.attrInt("dtype")) : x.scalar_type();
  int64_t k = c.attrInt("k", 0), rows = x.size(0), cols = x.size(1);
  torch::Tensor y = torch::zeros({rows, cols}, torch::TensorOptions(dtype).device(x.device()));
  if (k < cols && -k < rows) y.diagonal(k).fill_(1);
  return {y};
}

} // namespace

std::vector<KernelDef> creationKernels() {
  return {
      {"Constant", 0, 0, opConstant},
      {"ConstantOfShape", 1, 1, opConstantOfShape},
      {"EyeLike", 1, 1, opEyeLike},
      {"Range", 3, 3, opRange},
  };
}

} // namespace rannc::runtime::kernels
