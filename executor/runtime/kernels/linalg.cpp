// ONNX linear algebra: matrix products (MatMul, Gemm), Einsum, Det.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <algorithm>
#include <string>
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

Outputs opGemm(const OpCtx &c) {
  torch::Tensor a = c.in(0), b = c.in(1);
  if (a.dim() != 2 || b.dim() != 2) c.fail("A and B must be 2-D");
  if (c.attrInt("transA", 0)) a = a.t();
  if (c.attrInt("transB", 0)) b = b.t();
  double alpha = c.attrFloat("alpha", 1.0), beta = c.attrFloat("beta", 1.0);
  if (a.is_floating_point()) {
    if (c.has(2)) return {torch::addmm(c.in(2), a, b, beta, alpha)}; // C broadcasts to (M, N)
    torch::Tensor y = torch::mm(a, b);
    return {alpha == 1.0 ? y : y * alpha};
  }
  torch::Tensor y = torch::mm(a, b);
  if (alpha != 1.0) y = (y * alpha).to(a.scalar_type());
  if (c.has(2)) y = y + (beta == 1.0 ? c.in(2) : (c.in(2) * beta).to(a.scalar_type()));
  return {y};
}

Outputs opEinsum(const OpCtx &c) {
  std::string eq = c.attrString("equation", "");
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  std::vector<torch::Tensor> ins;
  for (size_t i = 0; i < c.numInputs(); ++i) ins.push_back(c.in(i));
  return {torch::einsum(eq, ins)};
}

Outputs opMatMul(const OpCtx &c) { return {torch::matmul(c.in(0), c.in(1))}; }
Outputs opDet(const OpCtx &c) { return {torch::linalg_det(c.in(0))}; }

} // namespace

std::vector<KernelDef> linalgKernels() {
  return {
      {"Det", 1, 1, opDet},
      {"Einsum", 1, kVariadic, opEinsum},
      {"Gemm", 2, 3, opGemm},
      {"MatMul", 2, 2, opMatMul},
  };
}

} // namespace rannc::runtime::kernels
