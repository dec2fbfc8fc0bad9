// ONNX convolutions and pooling.
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

/// Kernel geometry of a Conv/ConvTranspose/pool node over the spatial dims of x.
struct Window {
  std::vector<int64_t> kernel, strides, dilations, pad_begin, pad_end;
  bool symmetric() const { return pad_begin == pad_end; }
};

std::vector<int64_t> intsOr(const OpCtx &c, const std::string &name, size_t n, int64_t dflt) {
  auto v = c.attrInts(name);
  if (!v || v->empty()) return std::vector<int64_t>(n, dflt);
  if (v->size() != n)
    c.fail("attribute '" + name + "' has " + std::to_string(v->size()) + " entries, expected " +
           std::to_string(n));
  return *v;
}

/// Reads strides, dilations and pads (ONNX order: all begins, then all ends),
/// resolving auto_pad SAME_UPPER/SAME_LOWER/VALID against x's spatial sizes.
Window windowOf(const OpCtx &c, const torch::Tensor &x, std::vector<int64_t> kernel) {
  size_t n = kernel.size();
  if (n == 0 || x.dim() != int64_t(n) + 2)
    c.fail("input of rank " + std::to_string(x.dim()) + " does not fit a " + std::to_string(n) +
           "-D kernel (expected [N, C, spatial...])");
  Window w;
  w.kernel = std::move(kernel);
  w.strides = intsOr(c, "strides", n, 1);
  w.dilations = intsOr(c, "dilations", n, 1);
  std::vector<int64_t> pads = intsOr(c, "pads", 2 * n, 0);
  w.pad_begin.assign(pads.begin(), pads.begin() + int64_t(n));
  w.pad_end.assign(pads.begin() + int64_t(n), pads.end());
  for (size_t i = 0; i < n; ++i)
    if (w.strides[i] <= 0 || w.dilations[i] <= 0 || w.kernel[i] <= 0)
      c.fail("kernel, strides and dilations must be positive");
  std::string auto_pad = c.attrString("auto_pad", "NOTSET");
  if (auto_pad == "VALID") {
    std::fill(w.pad_begin.begin(), w.pad_begin.end(), 0);
    std::fill(w.pad_end.begin(), w.pad_end.end(), 0);
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    // Output size ceil(in / stride); the odd pad goes at the end (UPPER) or
    // the beginning (LOWER).
    for (size_t i = 0; i < n; ++i) {
      int64_t in = x.size(int64_t(i) + 2), s = w.strides[i];
      int64_t out = (in + s - 1) / s;
      int64_t total =
          std::max<int64_t>((out - 1) * s + (w.kernel[i] - 1) * w.dilations[i] + 1 - in, 0);
      int64_t small = total / 2;
      w.pad_begin[i] = auto_pad == "SAME_UPPER" ? small : total - small;
      w.pad_end[i] = total - w.pad_begin[i];
    }
  } else if (auto_pad != "NOTSET") {
    c.fail("unsupported auto_pad '" + auto_pad + "'");
  }
  return w;
}

std::vector<int64_t> kernelShape(const OpCtx &c, const torch::Tensor &w) {
  if (auto k = c.attrInts("kernel_shape")) return *k;
  return std::vector<int64_t>(w.sizes().begin() + 2, w.sizes().end());
}

/// A convolution through the ATen ops PyTorch's modules call (conv2d,
/// conv_transpose2d, ...): those are on autocast's lower-precision list,
/// torch::convolution is not on the CPU's (Note [autocast dtypes] in
/// planner/cost/precision.cpp). Same arithmetic in fp32.
torch::Tensor convolve(const torch::Tensor &x, const torch::Tensor &w, const std::optional<torch::Tensor> &bias,
                       const std::vector<int64_t> &stride, const std::vector<int64_t> &pad,
                       const std::vector<int64_t> &dil, bool transposed, int64_t group) {
  const std::vector<int64_t> zeros(pad.size(), 0);
  switch (transposed ? -int64_t(pad.size()) : int64_t(pad.size())) {
  case 1: return torch::conv1d(x, w, bias, stride, pad, dil, group);
  case 2: return torch::conv2d(x, w, bias, stride, pad, dil, group);
  case 3: return torch::conv3d(x, w, bias, stride, pad, dil, group);
  case -1: return torch::conv_transpose1d(x, w, bias, stride, pad, zeros, group, dil);
  case -2: return torch::conv_transpose2d(x, w, bias, stride, pad, zeros, group, dil);
  case -3: return torch::conv_transpose3d(x, w, bias, stride, pad, zeros, group, dil);
  default: return torch::convolution(x, w, bias, stride, pad, dil, transposed, zeros, group);
  }
}

Outputs opConv(const OpCtx &c) {
  const auto &x = c.in(0), &w = c.in(1);
  if (w.dim() < 3) c.fail("weight must be [M, C/group, k...]");
  Window win = windowOf(c, x, kernelShape(c, w));
  int64_t group = c.attrInt("group", 1);
  torch::Tensor xi = x;
  std::vector<int64_t> pad = win.pad_begin;
  if (!win.symmetric()) { // torch pads symmetrically: pad explicitly instead
    xi = torch::constant_pad_nd(x, torchPads(win.pad_begin, win.pad_end), 0);
    std::fill(pad.begin(), pad.end(), 0);
  }
  return {convolve(xi, w, c.opt(2), win.strides, pad, win.dilations, false, group)};
}

Outputs opConvTranspose(const OpCtx &c) {
  const auto &x = c.in(0), &w = c.in(1);
  if (w.dim() < 3) c.fail("weight must be [C, M/group, k...]");
  std::vector<int64_t> kernel = kernelShape(c, w);
  size_t n = kernel.size();
  if (x.dim() != int64_t(n) + 2) c.fail("input rank does not fit the kernel");
  std::vector<int64_t> strides = intsOr(c, "strides", n, 1), dil = intsOr(c, "dilations", n, 1);
  std::vector<int64_t> out_pad = intsOr(c, "output_padding", n, 0);
  std::vector<int64_t> pads = intsOr(c, "pads", 2 * n, 0);
  std::vector<int64_t> begin(pads.begin(), pads.begin() + int64_t(n)),
      end(pads.begin() + int64_t(n), pads.end());
  std::string auto_pad = c.attrString("auto_pad", "NOTSET");
  auto out_shape = c.attrInts("output_shape");
  if (out_shape && out_shape->size() == n + 2)
    out_shape = std::vector<int64_t>(out_shape->begin() + 2, out_shape->end());
  if (out_shape && out_shape->size() != n) c.fail("output_shape must have one entry per spatial dim");
  if (!out_shape && (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER")) {
    out_shape = std::vector<int64_t>(n);
    for (size_t i = 0; i < n; ++i) (*out_shape)[i] = x.size(int64_t(i) + 2) * strides[i];
  }
  // Full size stride*(in-1) + (k-1)*d + 1 (+ output_padding) minus the pads;
  // an explicit output_shape fixes the pads instead, as ONNX's reference does:
  // floor(total/2) at the beginning for SAME_UPPER, at the end otherwise
  // (a negative total grows the output).
  if (out_shape) {
    for (size_t i = 0; i < n; ++i) {
      int64_t full = strides[i] * (x.size(int64_t(i) + 2) - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1;
      int64_t total = full - (*out_shape)[i];
      int64_t half = total >= 0 ? total / 2 : -((1 - total) / 2); // floor(total / 2)
      if (auto_pad == "SAME_UPPER") {
        begin[i] = half;
        end[i] = total - half;
      } else {
        begin[i] = total - half;
        end[i] = half;
      }
    }
  } else if (auto_pad == "VALID") {
    std::fill(begin.begin(), begin.end(), 0);
    std::fill(end.begin(), end.end(), 0);
  }
  int64_t group = c.attrInt("group", 1);
  torch::Tensor y = convolve(x, w, std::nullopt, strides, std::vector<int64_t>(n, 0), dil, true, group);
  // output_padding adds zeros at the end; pads crop (negative pads grow).
  std::vector<int64_t> crop_begin(n), crop_end(n);
  for (size_t i = 0; i < n; ++i) {
    crop_begin[i] = -begin[i];
    crop_end[i] = out_pad[i] - end[i];
  }
  if (std::any_of(crop_begin.begin(), crop_begin.end(), [](int64_t v) { return v != 0; }) ||
      std::any_of(crop_end.begin(), crop_end.end(), [](int64_t v) { return v != 0; }))
    y = torch::constant_pad_nd(y, torchPads(crop_begin, crop_end), 0);
  if (c.has(2)) {
    std::vector<int64_t> shape(size_t(y.dim()), 1);
    shape[1] = -1;
    y = y + c.in(2).reshape(shape);
  }
  return {y};
}

/// torch pools pad symmetrically and at most half the (dilated) kernel.
bool torchCanPad(const Window &w) {
  if (!w.symmetric()) return false;
  for (size_t i = 0; i < w.kernel.size(); ++i)
    if (w.pad_begin[i] * 2 > (w.kernel[i] - 1) * w.dilations[i] + 1) return false;
  return true;
}

Outputs opMaxPool(const OpCtx &c) {
  const auto &x = c.in(0);
  Window win = windowOf(c, x, c.attrIntsRequired("kernel_shape"));
  size_t n = win.kernel.size();
  if (n > 3) c.fail("only 1-D to 3-D pooling is supported");
  bool ceil_mode = c.attrInt("ceil_mode", 0) != 0;
  // torch pools floating point only; small integers are exact in double.
  torch::Tensor xf = x.is_floating_point() ? x : x.to(torch::kDouble);
  std::vector<int64_t> pad = win.pad_begin;
  bool native = torchCanPad(win);
  if (!native) {
    xf = torch::constant_pad_nd(xf, torchPads(win.pad_begin, win.pad_end),
                                -std::numeric_limits<double>::infinity());
    std::fill(pad.begin(), pad.end(), 0);
  }
  torch::Tensor y, idx;
  if (n == 1)
    std::tie(y, idx) =
        torch::max_pool1d_with_indices(xf, win.kernel, win.strides, pad, win.dilations, ceil_mode);
  else if (n == 2)
    std::tie(y, idx) =
        torch::max_pool2d_with_indices(xf, win.kernel, win.strides, pad, win.dilations, ceil_mode);
  else
    std::tie(y, idx) =
        torch::max_pool3d_with_indices(xf, win.kernel, win.strides, pad, win.dilations, ceil_mode);
  if (!x.is_floating_point()) y = y.to(x.scalar_type());
  if (!c.wants(1)) return {y};

  // torch's indices count within one padded (n, c) plane; ONNX's count over
  // the whole unpadded input, row-major (storage_order 0) or column-major.
  std::vector<int64_t> dims(x.sizes().begin() + 2, x.sizes().end());
  std::vector<int64_t> pdims = dims;
  for (size_t i = 0; i < n; ++i) pdims[i] += native ? 0 : win.pad_begin[i] + win.pad_end[i];
  std::vector<torch::Tensor> coord(n);
  torch::Tensor rest = idx;
  for (size_t i = n; i-- > 0;) {
    coord[i] = rest.remainder(pdims[i]) - (native ? 0 : win.pad_begin[i]);
    rest = rest.div(pdims[i], "floor");
  }
  bool col_major = c.attrInt("storage_order", 0) == 1;
  torch::Tensor flat = torch::zeros_like(idx);
  if (!col_major) {
    for (size_t i = 0; i < n; ++i) flat = flat * dims[i] + coord[i];
  } else {
    for (size_t i = n; i-- > 0;) flat = flat * dims[i] + coord[i];
  }
  int64_t plane = product(dims);
  torch::Tensor nc = torch::arange(x.size(0) * x.size(1), idx.options()).reshape({x.size(0), x.size(1)});
  for (size_t i = 0; i < n; ++i) nc = nc.unsqueeze(-1);
  return {y, flat + nc * plane};
}

Outputs opAveragePool(const OpCtx &c) {
  const auto &x = c.in(0);
  Window win = windowOf(c, x, c.attrIntsRequired("kernel_shape"));
  size_t n = win.kernel.size();
  if (n > 3) c.fail("only 1-D to 3-D pooling is supported");
  for (int64_t d : win.dilations)
    if (d != 1) c.fail("dilations are not supported");
  bool ceil_mode = c.attrInt("ceil_mode", 0) != 0;
  bool include_pad = c.attrInt("count_include_pad", 0) != 0;
  auto pool = [&](const torch::Tensor &t, const std::vector<int64_t> &pad, bool include) {
    if (n == 1) return torch::avg_pool1d(t, win.kernel, win.strides, pad, ceil_mode, include);
    if (n == 2) return torch::avg_pool2d(t, win.kernel, win.strides, pad, ceil_mode, include);
    return torch::avg_pool3d(t, win.kernel, win.strides, pad, ceil_mode, include);
  };
  if (torchCanPad(win)) return {pool(x, win.pad_begin, include_pad)};
  // Pads torch cannot apply: pad with zeros, and without count_include_pad
  // divide by the share of real elements in each window.
  std::vector<int64_t> zeros(n, 0), tp = torchPads(win.pad_begin, win.pad_end);
  torch::Tensor y = pool(torch::constant_pad_nd(x, tp, 0), zeros, true);
  if (include_pad) return {y};
  std::vector<int64_t> mshape(x.sizes().begin(), x.sizes().end());
  mshape[0] = mshape[1] = 1;
  torch::Tensor mask = torch::constant_pad_nd(torch::ones(mshape, x.options()), tp, 0);
  return {y / pool(mask, zeros, true)};
}

Outputs opMaxUnpool(const OpCtx &c) {
  const auto &x = c.in(0);
  torch::Tensor idx = c.in(1);
  if (!isIntegral(idx)) c.fail("indices must be integers");
  Window win = windowOf(c, x, c.attrIntsRequired("kernel_shape"));
  size_t n = win.kernel.size();
  // The unpooled size MaxPool started from; indices (MaxPool's Indices) are
  // flat over [N, C, that size]. An explicit output_shape may be larger: each
  // value keeps its coordinates, the extra space stays 0.
  std::vector<int64_t> dims;
  for (size_t i = 0; i < n; ++i)
    dims.push_back((x.size(int64_t(i) + 2) - 1) * win.strides[i] + win.kernel[i] - win.pad_begin[i] -
                   win.pad_end[i]);
  std::vector<int64_t> shape = {x.size(0), x.size(1)};
  if (c.has(2)) {
    shape = intValues(c, c.in(2), "output_shape");
    if (shape.size() != n + 2) c.fail("output_shape must have the input's rank");
  } else {
    shape.insert(shape.end(), dims.begin(), dims.end());
  }
  std::vector<int64_t> out_dims(shape.begin() + 2, shape.end());
  torch::Tensor flat = idx.reshape({-1}).to(torch::kLong);
  if (out_dims != dims) {
    torch::Tensor rest = flat;
    std::vector<torch::Tensor> coord(n);
    for (size_t i = n; i-- > 0;) {
      coord[i] = rest.remainder(dims[i]);
      rest = rest.div(dims[i], "floor");
    }
    flat = rest; // the (n, c) plane
    for (size_t i = 0; i < n; ++i) flat = flat * out_dims[i] + coord[i];
  }
  torch::Tensor out = torch::zeros({product(shape)}, x.options());
  return {out.scatter(0, flat, x.reshape({-1})).reshape(shape)};
}

Outputs opGlobalPool(const OpCtx &c, bool max) {
  const auto &x = c.in(0);
  if (x.dim() < 3) c.fail("input must be [N, C, spatial...]");
  std::vector<int64_t> dims;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return {max ? torch::amax(x, dims, true) : torch::mean(x, dims, true)};
}
Outputs opGlobalAveragePool(const OpCtx &c) { return opGlobalPool(c, false); }
Outputs opGlobalMaxPool(const OpCtx &c) { return opGlobalPool(c, true); }

} // namespace

std::vector<KernelDef> convPoolKernels() {
  return {
      {"AveragePool", 1, 1, opAveragePool},
      {"Conv", 2, 3, opConv},
      {"ConvTranspose", 2, 3, opConvTranspose},
      {"GlobalAveragePool", 1, 1, opGlobalAveragePool},
      {"GlobalMaxPool", 1, 1, opGlobalMaxPool},
      {"MaxPool", 1, 1, opMaxPool},
      {"MaxUnpool", 2, 3, opMaxUnpool},
  };
}

} // namespace rannc::runtime::kernels
