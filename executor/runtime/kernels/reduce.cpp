// ONNX reductions: Reduce*, ArgMax/ArgMin and the running sum CumSum.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <optional>
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

/// The reduced axes (sorted), or nullopt when the op is the identity
/// (empty axes with noop_with_empty_axes).
std::optional<std::vector<int64_t>> reduceAxes(const OpCtx &c, int64_t rank) {
  // ReduceSum's axes became an input in opset 13 (the others in 18).
  std::vector<int64_t> axes;
  if (c.has(1))
    axes = intValues(c, c.in(1), "axes");
  else if (auto a = c.attrInts("axes"))
    axes = *a;
  if (axes.empty()) {
    if (c.attrInt("noop_with_empty_axes", 0)) return std::nullopt;
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
    return axes;
  }
  return normAxes(c, axes, rank);
}

enum class Reduce { L1, L2, LogSum, LogSumExp, Max, Mean, Min, Prod, Sum, SumSquare };

template <Reduce R> Outputs opReduce(const OpCtx &c) {
  const auto &x = c.in(0);
  auto axes = reduceAxes(c, x.dim());
  if (!axes) return {x};
  bool keep = c.attrInt("keepdims", 1) != 0;
  torch::Tensor xr = x;
  if (axes->empty()) { // a scalar input (torch would read {} as "all"): reduce a [1]
    xr = x.reshape({1});
    axes = std::vector<int64_t>{0};
    keep = false;
  }
  // The L1/L2/log reductions of integers are computed in double, then cast back.
  torch::Tensor xf = xr.is_floating_point() ? xr : xr.to(torch::kDouble);
  torch::Tensor y;
  if constexpr (R == Reduce::L1) {
    y = torch::sum(xf.abs(), *axes, keep);
  } else if constexpr (R == Reduce::L2) {
    y = torch::sqrt(torch::sum(xf * xf, *axes, keep));
  } else if constexpr (R == Reduce::LogSum) {
    y = torch::log(torch::sum(xf, *axes, keep));
  } else if constexpr (R == Reduce::LogSumExp) {
    y = torch::logsumexp(xf, *axes, keep);
  } else if constexpr (R == Reduce::SumSquare) {
    y = torch::sum(xr * xr, *axes, keep, x.scalar_type());
  } else if constexpr (R == Reduce::Max) {
    y = torch::amax(xr, *axes, keep);
  } else if constexpr (R == Reduce::Min) {
    y = torch::amin(xr, *axes, keep);
  } else if constexpr (R == Reduce::Sum) {
    y = torch::sum(xr, *axes, keep, x.scalar_type()); // int32 sums stay int32
  } else if constexpr (R == Reduce::Mean) {
    y = torch::mean(xf, *axes, keep);
  } else { // torch::prod reduces one axis at a time; go from the back
    y = xr;
    for (auto it = axes->rbegin(); it != axes->rend(); ++it) y = torch::prod(y, *it, keep);
  }
  return {y.scalar_type() == x.scalar_type() ? y : y.to(x.scalar_type())};
}

Outputs opArgMax(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t axis = normAxis(c, c.attrInt("axis", 0), x.dim());
  bool keep = c.attrInt("keepdims", 1) != 0;
  if (!c.attrInt("select_last_index", 0)) return {torch::argmax(x, axis, keep)};
  // The last maximum is the first one of the flipped axis.
  return {(x.size(axis) - 1) - torch::argmax(x.flip(axis), axis, keep)};
}

Outputs opArgMin(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t axis = normAxis(c, c.attrInt("axis", 0), x.dim());
  bool keep = c.attrInt("keepdims", 1) != 0;
  if (!c.attrInt("select_last_index", 0)) return {torch::argmin(x, axis, keep)};
  return {(x.size(axis) - 1) - torch::argmin(x.flip(axis), axis, keep)};
}

Outputs opCumSum(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t axis = normAxis(c, intScalar(c, c.in(1), "axis"), x.dim());
  bool reverse = c.attrInt("reverse", 0) != 0;
  torch::Tensor t = reverse ? x.flip(axis) : x;
  torch::Tensor y = torch::cumsum(t, axis, x.scalar_type());
  if (c.attrInt("exclusive", 0) && t.size(axis) > 0) {
    // Shift by one along the axis: element i sums elements [0, i).
    std::vector<int64_t> pad(size_t(2 * (x.dim() - 1 - axis)), 0);
    pad.push_back(1);
    pad.push_back(-1);
    y = torch::constant_pad_nd(y, pad, 0);
  }
  return {reverse ? y.flip(axis) : y};
}

} // namespace

std::vector<KernelDef> reduceKernels() {
  return {
      {"ArgMax", 1, 1, opArgMax},
      {"ArgMin", 1, 1, opArgMin},
      {"CumSum", 2, 2, opCumSum},
      {"ReduceL1", 1, 2, opReduce<Reduce::L1>},
      {"ReduceL2", 1, 2, opReduce<Reduce::L2>},
      {"ReduceLogSum", 1, 2, opReduce<Reduce::LogSum>},
      {"ReduceLogSumExp", 1, 2, opReduce<Reduce::LogSumExp>},
      {"ReduceMax", 1, 2, opReduce<Reduce::Max>},
      {"ReduceMean", 1, 2, opReduce<Reduce::Mean>},
      {"ReduceMin", 1, 2, opReduce<Reduce::Min>},
      {"ReduceProd", 1, 2, opReduce<Reduce::Prod>},
      {"ReduceSum", 1, 2, opReduce<Reduce::Sum>},
      {"ReduceSumSquare", 1, 2, opReduce<Reduce::SumSquare>},
  };
}

} // namespace rannc::runtime::kernels
