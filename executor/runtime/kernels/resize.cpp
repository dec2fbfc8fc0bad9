// ONNX Resize, the older Upsample, and GridSample.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

/// Note [Resize]
/// Resize is separable: each resized axis is interpolated on its own, from
/// the last axis to the first (as ONNX's reference does), as a weighted sum of
/// index_select taps, so autograd differentiates it. Every mode (nearest,
/// linear, cubic), coordinate_transformation_mode and nearest_mode of opsets
/// 10-17 is implemented; opset 18's antialias, axes and keep_aspect_ratio_policy
/// are not (the op set stops at 17).
struct ResizeMode {
  std::string mode, coord, nearest;
  double cubic_a = -0.75, extrapolation = 0.0;
  bool exclude_outside = false;
};

torch::Tensor resizeAxis(const OpCtx &c, const torch::Tensor &x, int64_t axis, int64_t out_len,
                         double scale, double roi_start, double roi_end, const ResizeMode &m) {
  int64_t in_len = x.size(axis);
  if (in_len == 0) c.fail("cannot resize an empty dimension");
  double out_width = scale * double(in_len); // the reference's unrounded length
  int taps = m.mode == "nearest" ? 1 : m.mode == "linear" ? 2 : 4;
  std::vector<int64_t> idx(size_t(out_len * taps));
  std::vector<double> w(size_t(out_len * taps));
  std::vector<bool> outside(size_t(out_len), false);
  bool any_outside = false;
  for (int64_t i = 0; i < out_len; ++i) {
    double xr = double(i), xo;
    if (m.coord == "half_pixel") xo = (xr + 0.5) / scale - 0.5;
    else if (m.coord == "pytorch_half_pixel") xo = out_width == 1 ? -0.5 : (xr + 0.5) / scale - 0.5;
    else if (m.coord == "align_corners") xo = out_width == 1 ? 0 : xr * double(in_len - 1) / (out_width - 1);
    else if (m.coord == "asymmetric") xo = xr / scale;
    else if (m.coord == "tf_half_pixel_for_nn") xo = (xr + 0.5) / scale;
    else if (m.coord == "tf_crop_and_resize") {
      xo = out_width == 1 ? (roi_end - roi_start) * double(in_len - 1) / 2
                          : xr * (roi_end - roi_start) * double(in_len - 1) / (out_width - 1);
      xo += roi_start * double(in_len - 1);
      if (xo < 0 || xo > double(in_len - 1)) outside[size_t(i)] = any_outside = true;
    } else c.fail("unsupported coordinate_transformation_mode '" + m.coord + "'");
    auto clampIdx = [&](double v) { return std::min<int64_t>(std::max<int64_t>(int64_t(v), 0), in_len - 1); };
    double fl = std::floor(xo);
    if (taps == 1) {
      double r = xo - fl, pick = fl;
      if (r != 0) {
        if (m.nearest == "round_prefer_floor") pick = r <= 0.5 ? fl : fl + 1;
        else if (m.nearest == "round_prefer_ceil") pick = r < 0.5 ? fl : fl + 1;
        else if (m.nearest == "floor") pick = fl;
        else if (m.nearest == "ceil") pick = fl + 1;
        else c.fail("unsupported nearest_mode '" + m.nearest + "'");
      }
      idx[size_t(i)] = clampIdx(pick);
      w[size_t(i)] = 1;
      continue;
    }
    // Taps at base, base+1 (linear) or base-1 .. base+2 (cubic), base = ceil(x)-1.
    double base = std::ceil(xo) - 1, r = xo - base;
    double coeff[4];
    int64_t first;
    if (taps == 2) {
      coeff[0] = 1 - r;
      coeff[1] = r;
      first = int64_t(base);
    } else {
      double A = m.cubic_a, s = 1 - r;
      coeff[0] = ((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A;
      coeff[1] = ((A + 2) * r - (A + 3)) * r * r + 1;
      coeff[2] = ((A + 2) * s - (A + 3)) * s * s + 1;
      coeff[3] = ((A * (s + 1) - 5 * A) * (s + 1) + 8 * A) * (s + 1) - 4 * A;
      first = int64_t(base) - 1;
    }
    if (m.exclude_outside) {
      double sum = 0;
      for (int t = 0; t < taps; ++t) {
        int64_t j = first + t;
        if (j < 0 || j >= in_len) coeff[t] = 0;
        sum += coeff[t];
      }
      if (sum != 0)
        for (int t = 0; t < taps; ++t) coeff[t] /= sum;
    }
    for (int t = 0; t < taps; ++t) {
      idx[size_t(i * taps + t)] = clampIdx(double(first + t));
      w[size_t(i * taps + t)] = coeff[t];
    }
  }
  torch::Tensor it = longTensor(idx, x.device()).reshape({out_len, taps});
  torch::Tensor y;
  if (taps == 1) {
    y = x.index_select(axis, it.select(1, 0));
  } else {
    if (!x.is_floating_point()) c.fail(m.mode + " mode needs a floating-point input");
    torch::Tensor wt = torch::tensor(w, torch::TensorOptions(torch::kDouble))
                           .to(x.device(), x.scalar_type())
                           .reshape({out_len, taps});
    std::vector<int64_t> wshape(size_t(x.dim()), 1);
    wshape[axis] = out_len;
    for (int t = 0; t < taps; ++t) {
      torch::Tensor term = x.index_select(axis, it.select(1, t)) * wt.select(1, t).reshape(wshape);
      y = t == 0 ? term : y + term;
    }
  }
  if (any_outside) {
    std::vector<int64_t> mshape(size_t(x.dim()), 1);
    mshape[axis] = out_len;
    std::vector<uint8_t> raw(outside.begin(), outside.end());
    torch::Tensor mask =
        torch::tensor(c10::ArrayRef<uint8_t>(raw), torch::kByte).to(x.device(), torch::kBool);
    y = torch::where(mask.reshape(mshape), torch::full({}, m.extrapolation, y.options()), y);
  }
  return y;
}

/// Resizes x to `sizes`, each axis with the given scale (output / input unless
/// given as a scale) and roi ([starts..., ends...], tf_crop_and_resize only).
torch::Tensor resizeTo(const OpCtx &c, const torch::Tensor &x, const std::vector<int64_t> &sizes,
                       const std::vector<double> &scales, const std::vector<double> &roi,
                       const ResizeMode &m) {
  torch::Tensor y = x;
  int64_t r = x.dim();
  for (int64_t d = r - 1; d >= 0; --d) {
    double start = roi.empty() ? 0 : roi[size_t(d)], end = roi.empty() ? 1 : roi[size_t(d + r)];
    bool identity = sizes[size_t(d)] == x.size(d) && scales[size_t(d)] == 1.0 &&
                    m.coord != "tf_crop_and_resize";
    if (identity) continue;
    if (scales[size_t(d)] <= 0) c.fail("scales must be positive");
    y = resizeAxis(c, y, d, sizes[size_t(d)], scales[size_t(d)], start, end, m);
  }
  return y;
}

std::vector<double> doubleValues(const OpCtx &c, const torch::Tensor &t, const char *what) {
  if (t.dim() > 1) c.fail(std::string(what) + " must be 1-D");
  torch::Tensor d = t.detach().to(torch::kCPU, torch::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

/// Output sizes from scales: floor(in * scale).
std::vector<int64_t> scaledSizes(const OpCtx &c, const torch::Tensor &x, const std::vector<double> &scales) {
  if (int64_t(scales.size()) != x.dim()) c.fail("scales must have one entry per input dimension");
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < x.dim(); ++d)
    sizes.push_back(int64_t(std::floor(double(x.size(d)) * scales[size_t(d)])));
  return sizes;
}

Outputs opResize(const OpCtx &c) {
  const auto &x = c.in(0);
  ResizeMode m;
  m.mode = c.attrString("mode", "nearest");
  if (m.mode != "nearest" && m.mode != "linear" && m.mode != "cubic")
    c.fail("unsupported mode '" + m.mode + "'");
  std::vector<double> scales, roi;
  std::vector<int64_t> sizes;
  if (c.opset() < 11) { // Resize-10: (X, scales), asymmetric coordinates
    m.coord = "asymmetric";
    m.nearest = "floor";
    scales = doubleValues(c, c.in(1), "scales");
  } else {
    m.coord = c.attrString("coordinate_transformation_mode", "half_pixel");
    m.nearest = c.attrString("nearest_mode", "round_prefer_floor");
    m.cubic_a = c.attrFloat("cubic_coeff_a", -0.75);
    m.exclude_outside = c.attrInt("exclude_outside", 0) != 0;
    m.extrapolation = c.attrFloat("extrapolation_value", 0.0);
    if (c.has(1) && c.in(1).numel() > 0) roi = doubleValues(c, c.in(1), "roi");
    if (c.has(2) && c.in(2).numel() > 0) scales = doubleValues(c, c.in(2), "scales");
    if (c.has(3) && c.in(3).numel() > 0) sizes = intValues(c, c.in(3), "sizes");
  }
  if (!roi.empty() && int64_t(roi.size()) != 2 * x.dim()) c.fail("roi must have 2 * rank entries");
  if (!sizes.empty() && !scales.empty()) c.fail("only one of scales and sizes may be given");
  if (!sizes.empty()) {
    if (int64_t(sizes.size()) != x.dim()) c.fail("sizes must have one entry per input dimension");
    for (int64_t d = 0; d < x.dim(); ++d)
      scales.push_back(x.size(d) == 0 ? 1.0 : double(sizes[size_t(d)]) / double(x.size(d)));
  } else if (!scales.empty()) {
    sizes = scaledSizes(c, x, scales);
  } else {
    c.fail("needs scales or sizes");
  }
  return {resizeTo(c, x, sizes, scales, roi, m)};
}

Outputs opUpsample(const OpCtx &c) {
  const auto &x = c.in(0);
  ResizeMode m;
  m.mode = c.attrString("mode", "nearest");
  if (m.mode == "bilinear") m.mode = "linear";
  if (m.mode != "nearest" && m.mode != "linear") c.fail("unsupported mode '" + m.mode + "'");
  m.coord = "asymmetric";
  m.nearest = "floor";
  std::vector<double> scales;
  if (c.has(1)) scales = doubleValues(c, c.in(1), "scales");
  else if (auto s = c.attrFloats("scales")) scales = *s;
  else c.fail("needs scales");
  return {resizeTo(c, x, scaledSizes(c, x, scales), scales, {}, m)};
}

Outputs opGridSample(const OpCtx &c) {
  const auto &x = c.in(0), &grid = c.in(1);
  std::string mode = c.attrString("mode", "bilinear"), pad = c.attrString("padding_mode", "zeros");
  int64_t interp = mode == "bilinear" ? 0 : mode == "nearest" ? 1 : mode == "bicubic" ? 2 : -1;
  int64_t padding = pad == "zeros" ? 0 : pad == "border" ? 1 : pad == "reflection" ? 2 : -1;
  if (interp < 0) c.fail("unsupported mode '" + mode + "'");
  if (padding < 0) c.fail("unsupported padding_mode '" + pad + "'");
  return {torch::grid_sampler(x, grid.to(x.scalar_type()), interp, padding,
                              c.attrInt("align_corners", 0) != 0)};
}

} // namespace

std::vector<KernelDef> resizeKernels() {
  return {
      {"GridSample", 2, 2, opGridSample},
      {"Resize", 1, 4, opResize},
      {"Upsample", 1, 2, opUpsample},
  };
}

} // namespace rannc::runtime::kernels
