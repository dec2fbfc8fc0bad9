// ONNX ops that change a tensor's shape or rearrange its elements without
// arithmetic: Shape, Reshape, Transpose, Slice, Concat, Pad, DepthToSpace, ...
// Note [kernel conventions] in op_context.h holds for every kernel here.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "executor/runtime/kernels/helpers.h"
#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {
namespace {

// ---------------------------------------------------------------------------
// Shape manipulation

Outputs opShape(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t rank = x.dim();
  // Opset 15 start/end: negative counts from the back; both clamp to [0, rank].
  auto clampDim = [&](int64_t v) {
    if (v < 0) v += rank;
    return std::min(std::max<int64_t>(v, 0), rank);
  };
  int64_t start = clampDim(c.attrInt("start", 0));
  int64_t end = std::max(start, clampDim(c.attrInt("end", rank)));
  std::vector<int64_t> dims(x.sizes().begin() + start, x.sizes().begin() + end);
  return {longTensor(dims, x.device())};
}

Outputs opSize(const OpCtx &c) {
  const auto &x = c.in(0);
  return {torch::scalar_tensor(x.numel(), torch::TensorOptions(torch::kLong).device(x.device()))};
}

Outputs opReshape(const OpCtx &c) {
  const auto &x = c.in(0);
  std::vector<int64_t> shape = intValues(c, c.in(1), "shape");
  bool allowzero = c.attrInt("allowzero", 0) != 0;
  if (std::count(shape.begin(), shape.end(), -1) > 1) c.fail("more than one -1 in shape");
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != 0 || allowzero) continue;
    // 0 copies the input's dimension (unless allowzero makes it a literal 0).
    if (int64_t(i) >= x.dim())
      c.fail("shape has 0 at index " + std::to_string(i) + " beyond the input's rank");
    shape[i] = x.size(i);
  }
  return {x.reshape(shape)};
}

Outputs opFlatten(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t axis = normBoundary(c, c.attrInt("axis", 1), x.dim());
  return {x.reshape({product(x.sizes().slice(0, axis)), product(x.sizes().slice(axis))})};
}

Outputs opTranspose(const OpCtx &c) {
  const auto &x = c.in(0);
  std::vector<int64_t> perm;
  if (auto p = c.attrInts("perm")) {
    perm = *p;
    if (int64_t(perm.size()) != x.dim()) c.fail("perm has the wrong length");
  } else {
    for (int64_t d = x.dim() - 1; d >= 0; --d) perm.push_back(d);
  }
  return {x.permute(perm)};
}

Outputs opUnsqueeze(const OpCtx &c) {
  torch::Tensor x = c.in(0);
  // Opset 13 moved axes from an attribute to an input.
  std::vector<int64_t> axes = c.has(1) ? intValues(c, c.in(1), "axes") : c.attrIntsRequired("axes");
  // Axes index the output, so unsqueezing in ascending order places each.
  for (int64_t a : normAxes(c, axes, x.dim() + int64_t(axes.size()))) x = x.unsqueeze(a);
  return {x};
}

Outputs opSqueeze(const OpCtx &c) {
  torch::Tensor x = c.in(0);
  std::optional<std::vector<int64_t>> axes =
      c.has(1) ? std::optional<std::vector<int64_t>>(intValues(c, c.in(1), "axes"))
               : c.attrInts("axes");
  if (!axes || axes->empty()) return {x.squeeze()};
  std::vector<int64_t> sorted = normAxes(c, *axes, x.dim());
  for (auto it = sorted.rbegin(); it != sorted.rend(); ++it) {
    if (x.size(*it) != 1)
      c.fail("cannot squeeze axis " + std::to_string(*it) + " of size " +
             std::to_string(x.size(*it)));
    x = x.squeeze(*it);
  }
  return {x};
}

Outputs opConcat(const OpCtx &c) {
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < c.numInputs(); ++i) parts.push_back(c.in(i));
  return {torch::cat(parts, normAxis(c, c.attrInt("axis"), parts[0].dim()))};
}

Outputs opSplit(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t axis = normAxis(c, c.attrInt("axis", 0), x.dim());
  int64_t dim = x.size(axis);
  int64_t n = int64_t(c.numOutputs());
  std::vector<int64_t> sizes;
  if (c.has(1)) {
    sizes = intValues(c, c.in(1), "split"); // opset 13+ (and 1)
  } else if (auto s = c.attrInts("split")) {
    sizes = *s; // opsets 2-12
  } else {
    if (n == 0 || dim % n != 0)
      c.fail("dimension " + std::to_string(dim) + " does not split into " + std::to_string(n) +
             " equal parts");
    sizes.assign(n, dim / n);
  }
  if (int64_t(sizes.size()) != n)
    c.fail("split has " + std::to_string(sizes.size()) + " entries for " + std::to_string(n) +
           " outputs");
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (total != dim)
    c.fail("split sizes sum to " + std::to_string(total) + ", not " + std::to_string(dim));
  return x.split_with_sizes(sizes, axis);
}

Outputs opSlice(const OpCtx &c) {
  torch::Tensor x = c.in(0);
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset() < 10) { // starts/ends/axes attributes, unit steps
    starts = c.attrIntsRequired("starts");
    ends = c.attrIntsRequired("ends");
    if (auto a = c.attrInts("axes")) axes = *a;
  } else {
    starts = intValues(c, c.in(1), "starts");
    ends = intValues(c, c.in(2), "ends");
    if (c.has(3)) axes = intValues(c, c.in(3), "axes");
    if (c.has(4)) steps = intValues(c, c.in(4), "steps");
  }
  size_t n = starts.size();
  if (axes.empty())
    for (size_t i = 0; i < n; ++i) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(n, 1);
  if (ends.size() != n || axes.size() != n || steps.size() != n)
    c.fail("starts, ends, axes and steps differ in length");

  for (size_t i = 0; i < n; ++i) {
    int64_t axis = normAxis(c, axes[i], x.dim());
    int64_t dim = x.size(axis), step = steps[i];
    if (step == 0) c.fail("step is 0");
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (step > 0) {
      s = std::min(std::max<int64_t>(s, 0), dim);
      e = std::min(std::max<int64_t>(e, s), dim);
      x = x.slice(axis, s, e, step);
    } else if (dim == 0) {
      x = x.slice(axis, 0, 0);
    } else {
      // Walk backwards from s (clamped to [0, dim-1]) while > e (clamped to
      // [-1, dim-1]). torch slices only forwards, so slice the flipped axis,
      // where original index i sits at dim-1-i.
      s = std::min(std::max<int64_t>(s, 0), dim - 1);
      e = std::min(std::max<int64_t>(e, -1), dim - 1);
      int64_t fs = dim - 1 - s, fe = std::max(fs, dim - 1 - e);
      x = x.flip(axis).slice(axis, fs, fe, -step);
    }
  }
  return {x};
}

Outputs opExpand(const OpCtx &c) {
  const auto &x = c.in(0);
  std::vector<int64_t> shape = intValues(c, c.in(1), "shape");
  // Bidirectional broadcast: the result rank is the larger of the two, and a
  // 1 in `shape` keeps the input's dimension.
  int64_t rank = std::max<int64_t>(x.dim(), int64_t(shape.size()));
  std::vector<int64_t> out(rank);
  for (int64_t i = 0; i < rank; ++i) {
    int64_t xi = i - (rank - x.dim()), si = i - (rank - int64_t(shape.size()));
    int64_t a = xi >= 0 ? x.size(xi) : 1, b = si >= 0 ? shape[si] : 1;
    if (a != b && a != 1 && b != 1)
      c.fail("cannot broadcast dimension " + std::to_string(a) + " to " + std::to_string(b));
    out[i] = a == 1 ? b : a;
  }
  return {x.expand(out)};
}

Outputs opTile(const OpCtx &c) {
  const auto &x = c.in(0);
  std::vector<int64_t> repeats = intValues(c, c.in(1), "repeats");
  if (int64_t(repeats.size()) != x.dim()) c.fail("repeats must have one entry per input dimension");
  return {x.repeat(repeats)};
}

Outputs opTrilu(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t k = c.has(1) ? intScalar(c, c.in(1), "k") : 0;
  return {c.attrInt("upper", 1) ? torch::triu(x, k) : torch::tril(x, k)};
}

// ---------------------------------------------------------------------------
// Rearrangement

Outputs opDepthToSpace(const OpCtx &c) {
  const auto &x = c.in(0);
  if (x.dim() != 4) c.fail("input must be [N, C, H, W]");
  int64_t b = c.attrInt("blocksize"), n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
  if (b <= 0 || ch % (b * b) != 0) c.fail("channels are not divisible by blocksize^2");
  std::string mode = c.attrString("mode", "DCR");
  torch::Tensor y;
  if (mode == "DCR")
    y = x.reshape({n, b, b, ch / (b * b), h, w}).permute({0, 3, 4, 1, 5, 2});
  else if (mode == "CRD")
    y = x.reshape({n, ch / (b * b), b, b, h, w}).permute({0, 1, 4, 2, 5, 3});
  else
    c.fail("mode must be DCR or CRD");
  return {y.reshape({n, ch / (b * b), h * b, w * b})};
}

Outputs opSpaceToDepth(const OpCtx &c) {
  const auto &x = c.in(0);
  if (x.dim() != 4) c.fail("input must be [N, C, H, W]");
  int64_t b = c.attrInt("blocksize"), n = x.size(0), ch = x.size(1), h = x.size(2), w = x.size(3);
  if (b <= 0 || h % b != 0 || w % b != 0) c.fail("height and width must be divisible by blocksize");
  return {x.reshape({n, ch, h / b, b, w / b, b})
              .permute({0, 3, 5, 1, 2, 4})
              .reshape({n, ch * b * b, h / b, w / b})};
}

/// Pad's index map for reflect/edge along one axis: output i reads input map[i].
torch::Tensor padIndex(int64_t n, int64_t before, int64_t after, bool reflect, const torch::Device &dev) {
  torch::Tensor i = torch::arange(-before, n + after, torch::TensorOptions(torch::kLong).device(dev));
  if (!reflect || n == 1) return i.clamp(0, n - 1);
  // Reflect without repeating the edge: period 2(n-1).
  int64_t period = 2 * (n - 1);
  torch::Tensor m = i.remainder(period);
  return torch::where(m >= n, period - m, m);
}

Outputs opPad(const OpCtx &c) {
  const auto &x = c.in(0);
  std::vector<int64_t> pads;
  double value = 0;
  torch::Tensor value_t;
  if (c.opset() < 11) {
    pads = c.attrIntsRequired(c.hasAttr("pads") ? "pads" : "paddings");
    value = c.attrFloat("value", 0.0);
  } else {
    pads = intValues(c, c.in(1), "pads");
    if (c.has(2) && c.in(2).numel() > 0) value_t = c.in(2).reshape({});
  }
  int64_t r = x.dim();
  if (int64_t(pads.size()) != 2 * r) c.fail("pads must have 2 * rank entries");
  std::vector<int64_t> begin(pads.begin(), pads.begin() + r), end(pads.begin() + r, pads.end());
  std::string mode = c.attrString("mode", "constant");
  if (mode == "constant") {
    if (!value_t.defined()) return {torch::constant_pad_nd(x, torchPads(begin, end), value)};
    if (value_t.requires_grad() && x.is_floating_point()) {
      // A trainable pad value: pad with 0 and add value * (1 - mask).
      torch::Tensor mask = torch::constant_pad_nd(torch::ones_like(x), torchPads(begin, end), 0);
      return {torch::constant_pad_nd(x, torchPads(begin, end), 0) + (1 - mask) * value_t};
    }
    return {torch::constant_pad_nd(x, torchPads(begin, end), value_t.item())};
  }
  if (mode != "reflect" && mode != "edge") c.fail("unsupported mode '" + mode + "'");
  torch::Tensor y = x;
  for (int64_t d = 0; d < r; ++d) {
    if (begin[d] == 0 && end[d] == 0) continue;
    int64_t n = y.size(d);
    if (n == 0) c.fail("cannot " + mode + "-pad an empty dimension");
    if (mode == "reflect" && (begin[d] >= n || end[d] >= n))
      c.fail("reflect pads must be smaller than the dimension");
    y = y.index_select(d, padIndex(n, begin[d], end[d], mode == "reflect", x.device()));
  }
  return {y};
}

Outputs opReverseSequence(const OpCtx &c) {
  const auto &x = c.in(0);
  std::vector<int64_t> lens = intValues(c, c.in(1), "sequence_lens");
  int64_t batch_axis = normAxis(c, c.attrInt("batch_axis", 1), x.dim());
  int64_t time_axis = normAxis(c, c.attrInt("time_axis", 0), x.dim());
  if (batch_axis == time_axis) c.fail("batch_axis equals time_axis");
  int64_t B = x.size(batch_axis), T = x.size(time_axis);
  if (int64_t(lens.size()) != B) c.fail("sequence_lens needs one entry per batch element");
  std::vector<int64_t> map(size_t(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      int64_t len = std::min(std::max<int64_t>(lens[b], 0), T);
      map[size_t(b * T + t)] = t < len ? len - 1 - t : t;
    }
  torch::Tensor idx = longTensor(map, x.device()).reshape({B, T});
  if (batch_axis > time_axis) idx = idx.t();
  std::vector<int64_t> shape(size_t(x.dim()), 1);
  shape[batch_axis] = B;
  shape[time_axis] = T;
  return {torch::gather(x, time_axis, idx.reshape(shape).expand(x.sizes()))};
}

} // namespace

std::vector<KernelDef> tensorShapeKernels() {
  return {
      {"Concat", 1, kVariadic, opConcat},
      {"DepthToSpace", 1, 1, opDepthToSpace},
      {"Expand", 2, 2, opExpand},
      {"Flatten", 1, 1, opFlatten},
      {"Pad", 1, 3, opPad},
      {"Reshape", 2, 2, opReshape},
      {"ReverseSequence", 2, 2, opReverseSequence},
      {"Shape", 1, 1, opShape},
      {"Size", 1, 1, opSize},
      {"Slice", 1, 5, opSlice},
      {"SpaceToDepth", 1, 1, opSpaceToDepth},
      {"Split", 1, 2, opSplit},
      {"Squeeze", 1, 2, opSqueeze},
      {"Tile", 2, 2, opTile},
      {"Transpose", 1, 1, opTranspose},
      {"Trilu", 1, 2, opTrilu},
      {"Unsqueeze", 1, 2, opUnsqueeze},
  };
}

} // namespace rannc::runtime::kernels
