#include "executor/runtime/ops.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "planner/ir/op_set.h"

// Note [kernel conventions]
// - Float paths use only ATen ops that autograd differentiates; integer and
//   shape arithmetic (axes, sizes, Slice bounds) is plain C++ on values read
//   back from int64 tensors, so shape chains (Shape -> Gather -> Concat ->
//   Reshape) follow the real batch size instead of sizes baked in at import.
// - Integer tensors stay integer: results are cast back where torch promotes
//   (Div truncates, sums of int32 stay int32, Pow keeps the base's type).
// - Tensors created from nothing but sizes (Shape, Size, ConstantOfShape, Range)
//   go on the device of an input; Constant has no input and goes on the CPU.

namespace rannc::runtime {

namespace {

using Outputs = std::vector<torch::Tensor>;

/// An error already worded with the node's name and op type.
class OpError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// What a kernel sees: the node, its input tensors and the opset, with checked
/// accessors whose errors name the node.
class OpCtx {
public:
  OpCtx(const ir::Node &node, const std::vector<torch::Tensor> &inputs, int64_t opset)
      : node_(node), in_(inputs), opset_(opset) {}

  int64_t opset() const { return opset_; }

  [[noreturn]] void fail(const std::string &what) const {
    throw OpError("node '" + node_.name + "' (" + node_.op_type + "): " + what);
  }

  size_t numInputs() const { return in_.size(); }
  /// True when input i is given (not omitted, not past the end).
  bool has(size_t i) const { return i < in_.size() && in_[i].defined(); }
  const torch::Tensor &in(size_t i) const {
    if (!has(i)) fail("missing required input " + std::to_string(i));
    return in_[i];
  }
  c10::optional<torch::Tensor> opt(size_t i) const {
    return has(i) ? c10::optional<torch::Tensor>(in_[i]) : c10::nullopt;
  }

  size_t numOutputs() const { return node_.outputs.size(); }
  /// True when output i is consumed (optional outputs may be skipped).
  bool wants(size_t i) const {
    return i < node_.outputs.size() && node_.outputs[i] != ir::kNoValue;
  }

  bool hasAttr(const std::string &name) const { return node_.attrs.count(name) != 0; }
  int64_t attrInt(const std::string &name, int64_t dflt) const {
    const auto *v = attr<int64_t>(name);
    return v ? *v : dflt;
  }
  int64_t attrInt(const std::string &name) const { return *required<int64_t>(name); }
  double attrFloat(const std::string &name, double dflt) const {
    if (!hasAttr(name)) return dflt;
    // An importer may store a whole-number float as an int; both mean the same.
    if (const auto *i = std::get_if<int64_t>(&node_.attrs.at(name))) return double(*i);
    return *attr<double>(name);
  }
  std::string attrString(const std::string &name, const std::string &dflt) const {
    const auto *v = attr<std::string>(name);
    return v ? *v : dflt;
  }
  std::optional<std::vector<int64_t>> attrInts(const std::string &name) const {
    const auto *v = attr<std::vector<int64_t>>(name);
    return v ? std::optional<std::vector<int64_t>>(*v) : std::nullopt;
  }
  std::optional<std::vector<double>> attrFloats(const std::string &name) const {
    const auto *v = attr<std::vector<double>>(name);
    return v ? std::optional<std::vector<double>>(*v) : std::nullopt;
  }
  std::optional<std::vector<std::string>> attrStrings(const std::string &name) const {
    const auto *v = attr<std::vector<std::string>>(name);
    return v ? std::optional<std::vector<std::string>>(*v) : std::nullopt;
  }
  std::vector<int64_t> attrIntsRequired(const std::string &name) const {
    return *required<std::vector<int64_t>>(name);
  }
  const ir::Tensor *attrTensor(const std::string &name) const { return attr<ir::Tensor>(name); }

private:
  template <typename T> const T *attr(const std::string &name) const {
    auto it = node_.attrs.find(name);
    if (it == node_.attrs.end()) return nullptr;
    const T *v = std::get_if<T>(&it->second);
    if (!v) fail("attribute '" + name + "' has the wrong type");
    return v;
  }
  template <typename T> const T *required(const std::string &name) const {
    const T *v = attr<T>(name);
    if (!v) fail("missing required attribute '" + name + "'");
    return v;
  }

  const ir::Node &node_;
  const std::vector<torch::Tensor> &in_;
  int64_t opset_;
};

// ---------------------------------------------------------------------------
// Shared helpers

bool isIntegral(const torch::Tensor &t) {
  return c10::isIntegralType(t.scalar_type(), /*includeBool=*/false);
}

/// The values of an integer tensor (shapes, axes, indices given as data).
std::vector<int64_t> intValues(const OpCtx &c, const torch::Tensor &t, const char *what) {
  if (!isIntegral(t)) c.fail(std::string(what) + " must be an integer tensor");
  if (t.dim() > 1) c.fail(std::string(what) + " must be a scalar or 1-D tensor");
  torch::Tensor l = t.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t *p = l.data_ptr<int64_t>(); // integer, never requires grad
  return std::vector<int64_t>(p, p + l.numel());
}

int64_t intScalar(const OpCtx &c, const torch::Tensor &t, const char *what) {
  if (t.numel() != 1) c.fail(std::string(what) + " must have one element");
  return intValues(c, t.reshape({-1}), what)[0];
}

/// Maps an axis in [-rank, rank) to [0, rank).
int64_t normAxis(const OpCtx &c, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    c.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

/// Maps a boundary between dimensions in [-rank, rank] to [0, rank] (Flatten,
/// and pre-13 Softmax, split the dimensions into [0, axis) and [axis, rank)).
int64_t normBoundary(const OpCtx &c, int64_t axis, int64_t rank) {
  if (axis < -rank || axis > rank)
    c.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

/// Normalises and sorts a list of axes; a repeated axis is an error.
std::vector<int64_t> normAxes(const OpCtx &c, std::vector<int64_t> axes, int64_t rank) {
  for (int64_t &a : axes) a = normAxis(c, a, rank);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) c.fail("repeated axis");
  return axes;
}

int64_t product(c10::IntArrayRef sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

torch::Tensor longTensor(const std::vector<int64_t> &v, const torch::Device &device) {
  return torch::tensor(c10::IntArrayRef(v), torch::TensorOptions().dtype(torch::kLong)).to(device);
}

/// ONNX TensorProto.DataType code -> ScalarType (Cast's `to`).
torch::ScalarType onnxScalarType(const OpCtx &c, int64_t code) {
  switch (code) {
  case 1: return torch::kFloat;
  case 2: return torch::kByte;
  case 3: return torch::kChar;
  case 5: return torch::kShort;
  case 6: return torch::kInt;
  case 7: return torch::kLong;
  case 9: return torch::kBool;
  case 10: return torch::kHalf;
  case 11: return torch::kDouble;
  case 16: return torch::kBFloat16;
  default: c.fail("unsupported element type code " + std::to_string(code));
  }
}

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
// Elementwise

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

// ---------------------------------------------------------------------------
// Softmax family

/// Opsets 1-12 coerce the input to 2-D at `axis` (default 1) and normalise each
/// row; 13+ normalise along the one axis `axis` (default -1).
Outputs softmaxLike(const OpCtx &c, bool log) {
  const auto &x = c.in(0);
  auto apply = [&](const torch::Tensor &t, int64_t dim) {
    return log ? torch::log_softmax(t, dim) : torch::softmax(t, dim);
  };
  if (c.opset() >= 13) return {apply(x, normAxis(c, c.attrInt("axis", -1), x.dim()))};
  int64_t axis = normBoundary(c, c.attrInt("axis", 1), x.dim());
  int64_t outer = product(x.sizes().slice(0, axis));
  int64_t inner = product(x.sizes().slice(axis));
  return {apply(x.reshape({outer, inner}), 1).reshape(x.sizes())};
}
Outputs opSoftmax(const OpCtx &c) { return softmaxLike(c, false); }
Outputs opLogSoftmax(const OpCtx &c) { return softmaxLike(c, true); }

// ---------------------------------------------------------------------------
// Linear algebra and normalisation

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

Outputs opLayerNormalization(const OpCtx &c) {
  const auto &x = c.in(0);
  const auto &scale = c.in(1);
  auto bias = c.opt(2);
  int64_t axis = normAxis(c, c.attrInt("axis", -1), x.dim());
  double eps = c.attrFloat("epsilon", 1e-5);
  c10::IntArrayRef normalized = x.sizes().slice(axis);
  bool plain_params =
      scale.sizes() == normalized && scale.scalar_type() == x.scalar_type() &&
      (!bias || (bias->sizes() == normalized && bias->scalar_type() == x.scalar_type()));
  // The fused kernel saves memory, but autograd ignores gradients arriving at
  // its mean/rstd results, so it is used only when Mean/InvStdDev are unused.
  if (!c.wants(1) && !c.wants(2) && plain_params)
    return {torch::layer_norm(x, normalized, scale, bias, eps)};

  // stash_type 1 (the default): statistics in float32 for 16-bit inputs.
  bool stash_f32 = c.attrInt("stash_type", 1) == 1 &&
                   (x.scalar_type() == torch::kHalf || x.scalar_type() == torch::kBFloat16);
  torch::Tensor xs = stash_f32 ? x.to(torch::kFloat) : x;
  std::vector<int64_t> dims;
  for (int64_t d = axis; d < x.dim(); ++d) dims.push_back(d);
  torch::Tensor mean = xs.mean(dims, /*keepdim=*/true);
  torch::Tensor centered = xs - mean;
  torch::Tensor inv_std = torch::rsqrt(centered.pow(2).mean(dims, true) + eps);
  torch::Tensor y = (centered * inv_std).to(x.scalar_type()) * scale;
  if (bias) y = y + *bias;
  return {y, mean, inv_std};
}

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

Outputs opGather(const OpCtx &c) {
  const auto &x = c.in(0);
  torch::Tensor idx = c.in(1);
  if (!isIntegral(idx)) c.fail("indices must be integers");
  int64_t axis = normAxis(c, c.attrInt("axis", 0), x.dim());
  idx = idx.to(torch::kLong);
  idx = torch::where(idx < 0, idx + x.size(axis), idx); // negative counts from the back
  // Output shape: x.shape[:axis] + indices.shape + x.shape[axis+1:].
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().begin() + axis);
  shape.insert(shape.end(), idx.sizes().begin(), idx.sizes().end());
  shape.insert(shape.end(), x.sizes().begin() + axis + 1, x.sizes().end());
  return {torch::index_select(x, axis, idx.reshape({-1})).reshape(shape)};
}

Outputs opGatherElements(const OpCtx &c) {
  const auto &x = c.in(0);
  torch::Tensor idx = c.in(1);
  if (!isIntegral(idx)) c.fail("indices must be integers");
  int64_t axis = normAxis(c, c.attrInt("axis", 0), x.dim());
  idx = idx.to(torch::kLong);
  idx = torch::where(idx < 0, idx + x.size(axis), idx);
  return {torch::gather(x, axis, idx)};
}

Outputs opTrilu(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t k = c.has(1) ? intScalar(c, c.in(1), "k") : 0;
  return {c.attrInt("upper", 1) ? torch::triu(x, k) : torch::tril(x, k)};
}

// ---------------------------------------------------------------------------
// Tensor creation

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

// ---------------------------------------------------------------------------
// Reductions

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

// ---------------------------------------------------------------------------
// Losses and dropout

at::Reduction::Reduction reductionMode(const OpCtx &c) {
  std::string r = c.attrString("reduction", "mean");
  if (r == "mean") return at::Reduction::Mean;
  if (r == "sum") return at::Reduction::Sum;
  if (r == "none") return at::Reduction::None;
  c.fail("unsupported reduction '" + r + "'");
}

/// ONNX and torch agree on NLL: per-element -w[t] * in[n, t, ...]; mean divides
/// by the summed weights of the elements not ignored.
torch::Tensor nllLoss(const OpCtx &c, const torch::Tensor &log_prob) {
  const auto &target = c.in(1);
  if (!isIntegral(target)) c.fail("target must be an integer tensor");
  if (log_prob.dim() < 2) c.fail("input must have shape [N, C, ...]");
  // Without ignore_index nothing is ignored; no valid class equals INT64_MIN.
  int64_t ignore = c.attrInt("ignore_index", std::numeric_limits<int64_t>::min());
  return torch::nll_loss_nd(log_prob, target.to(torch::kLong), c.opt(2), reductionMode(c), ignore);
}

Outputs opNegativeLogLikelihoodLoss(const OpCtx &c) { return {nllLoss(c, c.in(0))}; }

Outputs opSoftmaxCrossEntropyLoss(const OpCtx &c) {
  torch::Tensor log_prob = torch::log_softmax(c.in(0), 1);
  return {nllLoss(c, log_prob), log_prob};
}

Outputs opDropout(const OpCtx &c) {
  const auto &x = c.in(0);
  if (c.opset() < 12) {
    // Opsets 7-11 (ratio attribute) describe inference only: the identity.
    // The mask is all true (bool from opset 10, the input's type before).
    torch::Tensor mask;
    if (c.wants(1))
      mask = torch::ones_like(x, torch::TensorOptions(c.opset() >= 10 ? torch::kBool : x.scalar_type()));
    return {x, mask};
  }
  double ratio = c.has(1) ? c.in(1).item<double>() : 0.5;
  bool training = c.has(2) && c.in(2).item<bool>();
  if (!training || ratio == 0.0) {
    torch::Tensor mask;
    if (c.wants(1)) mask = torch::ones_like(x, torch::TensorOptions(torch::kBool));
    return {x, mask};
  }
  // Scales kept elements by 1/(1-ratio), as ONNX does. The seed attribute is
  // not honoured: torch's generator is seeded by the trainer.
  auto [y, mask] = torch::native_dropout(x, ratio, true);
  return {y, mask.scalar_type() == torch::kBool ? mask : mask.to(torch::kBool)};
}

// ---------------------------------------------------------------------------
// More elementwise ops

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

Outputs opEyeLike(const OpCtx &c) {
  const auto &x = c.in(0);
  if (x.dim() != 2) c.fail("input must be 2-D");
  auto dtype = c.hasAttr("dtype") ? onnxScalarType(c, c.attrInt("dtype")) : x.scalar_type();
  int64_t k = c.attrInt("k", 0), rows = x.size(0), cols = x.size(1);
  torch::Tensor y = torch::zeros({rows, cols}, torch::TensorOptions(dtype).device(x.device()));
  if (k < cols && -k < rows) y.diagonal(k).fill_(1);
  return {y};
}

// ---------------------------------------------------------------------------
// Random ops. The seed attribute is not honoured: torch's generator is seeded
// by the trainer (as for Dropout).

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

// ---------------------------------------------------------------------------
// Convolution and pooling

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

/// ONNX per-dimension (begin, end) pads -> torch's constant_pad_nd order (last dim first).
std::vector<int64_t> torchPads(const std::vector<int64_t> &begin, const std::vector<int64_t> &end) {
  std::vector<int64_t> p;
  for (size_t i = begin.size(); i-- > 0;) {
    p.push_back(begin[i]);
    p.push_back(end[i]);
  }
  return p;
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

// ---------------------------------------------------------------------------
// Normalisation

/// Note [BatchNormalization in training]
/// In training mode (opset 14+: training_mode=1; opsets 6-13: when the
/// optional outputs are requested, or is_test=0 before opset 7) Y uses the
/// batch's mean and biased variance, and the optional outputs are the updated
/// running statistics, per the ONNX formula
///   running_mean = input_mean * momentum + batch_mean * (1 - momentum)
///   running_var  = input_var  * momentum + batch_var  * (1 - momentum)
/// with the biased batch variance. PyTorch's own module updates running_var
/// with the unbiased one (times n/(n-1), n = samples x spatial positions), so
/// after training rannc's running_var is slightly smaller than PyTorch's;
/// running_mean agrees, and so do training-mode losses, which use the batch
/// statistics only. They are returned detached; the stage copies them into the
/// running-statistics buffers after the node runs (Note [buffers] in ir.h).
/// Opsets 9-13 add saved_mean and saved_var outputs: the batch statistics.
Outputs opBatchNormalization(const OpCtx &c) {
  const auto &x = c.in(0), &scale = c.in(1), &bias = c.in(2), &mean = c.in(3), &var = c.in(4);
  if (x.dim() < 2) c.fail("input must be [N, C, ...]");
  double eps = c.attrFloat("epsilon", 1e-5), momentum = c.attrFloat("momentum", 0.9);
  bool training;
  if (c.opset() >= 14)
    training = c.attrInt("training_mode", 0) != 0;
  else if (c.opset() < 7 && c.hasAttr("is_test"))
    training = c.attrInt("is_test", 0) == 0 && c.numOutputs() > 1;
  else
    training = c.numOutputs() > 1;
  bool spatial = c.opset() >= 9 || c.attrInt("spatial", 1) != 0;
  if (!spatial) {
    // Opsets 6-8 spatial=0: statistics per activation ([C, D1, ...] params).
    if (training) c.fail("spatial=0 is supported in inference mode only");
    auto u = [](const torch::Tensor &t) { return t.unsqueeze(0); };
    return {(x - u(mean)) / torch::sqrt(u(var) + eps) * u(scale) + u(bias)};
  }
  if (!training) return {torch::batch_norm(x, scale, bias, mean, var, false, 0.0, eps, false)};

  torch::Tensor y = torch::batch_norm(x, scale, bias, {}, {}, true, 0.0, eps, false);
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  torch::Tensor xd = x.detach();
  torch::Tensor batch_mean = xd.mean(dims);
  torch::Tensor batch_var = xd.var(dims, /*unbiased=*/false);
  torch::Tensor run_mean = mean.detach() * momentum + batch_mean.to(mean.scalar_type()) * (1 - momentum);
  torch::Tensor run_var = var.detach() * momentum + batch_var.to(var.scalar_type()) * (1 - momentum);
  return {y, run_mean, run_var, batch_mean, batch_var};
}

Outputs opInstanceNormalization(const OpCtx &c) {
  const auto &x = c.in(0);
  if (x.dim() < 3) c.fail("input must be [N, C, spatial...]");
  return {torch::instance_norm(x, c.in(1), c.in(2), {}, {}, true, 0.0, c.attrFloat("epsilon", 1e-5),
                               false)};
}

Outputs opLRN(const OpCtx &c) {
  const auto &x = c.in(0);
  if (x.dim() < 3) c.fail("input must be [N, C, spatial...]");
  int64_t size = c.attrInt("size");
  if (size <= 0) c.fail("size must be positive");
  double alpha = c.attrFloat("alpha", 1e-4), beta = c.attrFloat("beta", 0.75),
         bias = c.attrFloat("bias", 1.0);
  // Sum of squares over channels [c - floor((size-1)/2), c + ceil((size-1)/2)].
  int64_t before = (size - 1) / 2, after = size - 1 - before;
  std::vector<int64_t> pad(size_t(2 * (x.dim() - 2)), 0);
  pad.push_back(before);
  pad.push_back(after);
  torch::Tensor sq = torch::constant_pad_nd(x * x, pad, 0);
  torch::Tensor sum = sq.unfold(1, size, 1).sum(-1);
  return {x / torch::pow(bias + (alpha / double(size)) * sum, beta)};
}

Outputs opMeanVarianceNormalization(const OpCtx &c) {
  const auto &x = c.in(0);
  std::vector<int64_t> axes =
      normAxes(c, c.attrInts("axes").value_or(std::vector<int64_t>{0, 2, 3}), x.dim());
  torch::Tensor mean = x.mean(axes, true);
  torch::Tensor var = (x * x).mean(axes, true) - mean * mean;
  return {(x - mean) / (torch::sqrt(var) + 1e-9)};
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

// ---------------------------------------------------------------------------
// Indexing and selection

Outputs opArgMin(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t axis = normAxis(c, c.attrInt("axis", 0), x.dim());
  bool keep = c.attrInt("keepdims", 1) != 0;
  if (!c.attrInt("select_last_index", 0)) return {torch::argmin(x, axis, keep)};
  return {(x.size(axis) - 1) - torch::argmin(x.flip(axis), axis, keep)};
}

Outputs opHardmax(const OpCtx &c) {
  const auto &x = c.in(0);
  // One at the first maximum along the axis (coerced to 2-D before opset 13).
  auto oneHot = [](const torch::Tensor &t, int64_t dim) {
    return torch::zeros_like(t).scatter(dim, torch::argmax(t, dim, true), 1.0);
  };
  if (c.opset() >= 13) return {oneHot(x, normAxis(c, c.attrInt("axis", -1), x.dim()))};
  int64_t axis = normBoundary(c, c.attrInt("axis", 1), x.dim());
  int64_t outer = product(x.sizes().slice(0, axis)), inner = product(x.sizes().slice(axis));
  return {oneHot(x.reshape({outer, inner}), 1).reshape(x.sizes())};
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

Outputs opTopK(const OpCtx &c) {
  const auto &x = c.in(0);
  int64_t k = c.opset() >= 10 ? intScalar(c, c.in(1), "K") : c.attrInt("k");
  int64_t axis = normAxis(c, c.attrInt("axis", -1), x.dim());
  if (k < 0 || k > x.size(axis))
    c.fail("K = " + std::to_string(k) + " is outside [0, " + std::to_string(x.size(axis)) + "]");
  // A stable sort keeps equal values in index order, as ONNX requires.
  auto [values, indices] = torch::sort(x, /*stable=*/true, axis, /*descending=*/c.attrInt("largest", 1) != 0);
  return {values.narrow(axis, 0, k), indices.narrow(axis, 0, k)};
}

Outputs opOneHot(const OpCtx &c) {
  const auto &indices = c.in(0), &depth_t = c.in(1), &values = c.in(2);
  if (values.numel() != 2) c.fail("values must hold [off_value, on_value]");
  if (depth_t.numel() != 1) c.fail("depth must have one element");
  int64_t depth = depth_t.is_floating_point() ? int64_t(depth_t.reshape({-1})[0].item<double>())
                                              : intScalar(c, depth_t, "depth");
  if (depth <= 0) c.fail("depth must be positive");
  int64_t axis = normAxis(c, c.attrInt("axis", -1), indices.dim() + 1);
  torch::Tensor idx = indices.to(torch::kLong); // float indices truncate
  idx = torch::where(idx < 0, idx + depth, idx);
  std::vector<int64_t> shape(size_t(indices.dim() + 1), 1);
  shape[axis] = depth;
  torch::Tensor hit = idx.unsqueeze(axis) == torch::arange(depth, idx.options()).reshape(shape);
  torch::Tensor v = values.reshape({-1});
  return {torch::where(hit, v[1], v[0])};
}

torch::Tensor wrapIndices(const OpCtx &c, torch::Tensor idx, int64_t size) {
  if (!isIntegral(idx)) c.fail("indices must be integers");
  idx = idx.to(torch::kLong);
  return torch::where(idx < 0, idx + size, idx);
}

Outputs opScatterElements(const OpCtx &c) {
  const auto &data = c.in(0), &updates = c.in(2);
  int64_t axis = normAxis(c, c.attrInt("axis", 0), data.dim());
  torch::Tensor idx = wrapIndices(c, c.in(1), data.size(axis));
  std::string r = c.attrString("reduction", "none");
  if (r == "none") return {torch::scatter(data, axis, idx, updates)};
  if (r == "add") return {torch::scatter_add(data, axis, idx, updates)};
  if (r == "mul") return {torch::scatter_reduce(data, axis, idx, updates, "prod", true)};
  if (r == "max") return {torch::scatter_reduce(data, axis, idx, updates, "amax", true)};
  if (r == "min") return {torch::scatter_reduce(data, axis, idx, updates, "amin", true)};
  c.fail("unsupported reduction '" + r + "'");
}

/// Row numbers of the index tuples in idx's last dimension over dims `lead`.
torch::Tensor linearIndex(const OpCtx &c, const torch::Tensor &idx, c10::IntArrayRef lead) {
  if (!isIntegral(idx)) c.fail("indices must be integers");
  torch::Tensor li = idx.to(torch::kLong);
  torch::Tensor lin = torch::zeros(li.sizes().slice(0, li.dim() - 1), li.options());
  for (size_t i = 0; i < lead.size(); ++i) {
    torch::Tensor comp = li.select(-1, int64_t(i));
    comp = torch::where(comp < 0, comp + lead[i], comp);
    lin = lin * lead[i] + comp;
  }
  return lin;
}

Outputs opScatterND(const OpCtx &c) {
  const auto &data = c.in(0), &updates = c.in(2), &idx = c.in(1);
  if (idx.dim() < 1) c.fail("indices must have rank >= 1");
  int64_t k = idx.size(-1);
  if (k > data.dim()) c.fail("index tuples are longer than the data's rank");
  c10::IntArrayRef lead = data.sizes().slice(0, k);
  int64_t rows = product(lead), rest = product(data.sizes().slice(k));
  // Rows of data viewed as [rows, rest]; each update row goes to one of them.
  torch::Tensor lin = linearIndex(c, idx, lead).reshape({-1, 1});
  torch::Tensor d2 = data.reshape({rows, rest}), u2 = updates.reshape({lin.size(0), rest});
  torch::Tensor at = lin.expand({lin.size(0), rest});
  std::string r = c.attrString("reduction", "none");
  torch::Tensor y;
  if (r == "none") y = d2.scatter(0, at, u2);
  else if (r == "add") y = d2.scatter_add(0, at, u2);
  else if (r == "mul") y = d2.scatter_reduce(0, at, u2, "prod", true);
  else if (r == "max") y = d2.scatter_reduce(0, at, u2, "amax", true);
  else if (r == "min") y = d2.scatter_reduce(0, at, u2, "amin", true);
  else c.fail("unsupported reduction '" + r + "'");
  return {y.reshape(data.sizes())};
}

Outputs opGatherND(const OpCtx &c) {
  const auto &data = c.in(0), &idx = c.in(1);
  int64_t b = c.attrInt("batch_dims", 0);
  if (idx.dim() < 1 || b < 0 || b >= idx.dim()) c.fail("bad batch_dims for the indices' rank");
  int64_t k = idx.size(-1);
  if (b + k > data.dim()) c.fail("index tuples are longer than the data's rank");
  c10::IntArrayRef batch = data.sizes().slice(0, b), lead = data.sizes().slice(b, k);
  c10::IntArrayRef rest = data.sizes().slice(b + k);
  int64_t nb = product(batch), rows = product(lead);
  int64_t per_batch = product(idx.sizes().slice(b, idx.dim() - 1 - b));
  // Row of each tuple in data viewed as [batch * rows, rest].
  torch::Tensor lin = linearIndex(c, idx, lead).reshape({nb, per_batch});
  lin = lin + torch::arange(nb, lin.options()).unsqueeze(1) * rows;
  torch::Tensor out = data.reshape({nb * rows, product(rest)}).index_select(0, lin.reshape({-1}));
  std::vector<int64_t> shape(batch.begin(), batch.end());
  shape.insert(shape.end(), idx.sizes().begin() + b, idx.sizes().end() - 1);
  shape.insert(shape.end(), rest.begin(), rest.end());
  return {out.reshape(shape)};
}

Outputs opCompress(const OpCtx &c) {
  torch::Tensor x = c.in(0);
  torch::Tensor cond = c.in(1).reshape({-1}).to(torch::kBool);
  int64_t axis = 0;
  if (c.hasAttr("axis")) axis = normAxis(c, c.attrInt("axis"), x.dim());
  else x = x.reshape({-1});
  int64_t n = std::min(cond.size(0), x.size(axis));
  return {x.index_select(axis, torch::nonzero(cond.narrow(0, 0, n)).reshape({-1}))};
}

Outputs opNonZero(const OpCtx &c) { return {torch::nonzero(c.in(0)).t().contiguous()}; }

/// Lexicographic order of the rows of a contiguous [n, m] double tensor.
struct RowLess {
  const double *p;
  int64_t m;
  bool operator()(int64_t a, int64_t b) const {
    return std::lexicographical_compare(p + a * m, p + a * m + m, p + b * m, p + b * m + m);
  }
};

Outputs opUnique(const OpCtx &c) {
  const auto &x = c.in(0);
  bool has_axis = c.hasAttr("axis");
  int64_t axis = has_axis ? normAxis(c, c.attrInt("axis"), x.dim()) : 0;
  torch::Tensor flat = has_axis ? x : x.reshape({-1});
  int64_t n = flat.size(axis);
  torch::Tensor rows =
      flat.movedim(axis, 0).reshape({n, -1}).detach().to(torch::kCPU, torch::kDouble).contiguous();
  RowLess less{rows.data_ptr<double>(), rows.size(1)};
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(), less);
  // Groups of equal rows in sorted order; a group's first member is its
  // first occurrence (the sort is stable).
  std::vector<int64_t> first, count, group_of(static_cast<size_t>(n));
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || less(order[i - 1], order[i])) {
      first.push_back(order[i]);
      count.push_back(0);
    }
    ++count.back();
    group_of[size_t(order[i])] = int64_t(first.size()) - 1;
  }
  std::vector<int64_t> pos(first.size()); // output position of each group
  for (size_t g = 0; g < pos.size(); ++g) pos[g] = int64_t(g);
  if (!c.attrInt("sorted", 1))
    std::sort(pos.begin(), pos.end(), [&](int64_t a, int64_t b) { return first[a] < first[b]; });
  std::vector<int64_t> out_first(first.size()), out_count(first.size()), rank(first.size());
  for (size_t p = 0; p < pos.size(); ++p) {
    out_first[p] = first[size_t(pos[p])];
    out_count[p] = count[size_t(pos[p])];
    rank[size_t(pos[p])] = int64_t(p);
  }
  std::vector<int64_t> inverse(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) inverse[size_t(i)] = rank[size_t(group_of[size_t(i)])];
  torch::Tensor idx = longTensor(out_first, x.device());
  return {flat.index_select(axis, idx), idx, longTensor(inverse, x.device()),
          longTensor(out_count, x.device())};
}

Outputs opEinsum(const OpCtx &c) {
  std::string eq = c.attrString("equation", "");
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  std::vector<torch::Tensor> ins;
  for (size_t i = 0; i < c.numInputs(); ++i) ins.push_back(c.in(i));
  return {torch::einsum(eq, ins)};
}

// ---------------------------------------------------------------------------
// Resize (and the older Upsample)

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

Outputs opNonMaxSuppression(const OpCtx &c) {
  torch::Tensor boxes = c.in(0).detach().to(torch::kCPU, torch::kDouble).contiguous();
  torch::Tensor scores = c.in(1).detach().to(torch::kCPU, torch::kDouble).contiguous();
  if (boxes.dim() != 3 || boxes.size(2) != 4) c.fail("boxes must be [batch, boxes, 4]");
  if (scores.dim() != 3 || scores.size(0) != boxes.size(0) || scores.size(2) != boxes.size(1))
    c.fail("scores must be [batch, classes, boxes]");
  int64_t max_out = c.has(2) && c.in(2).numel() > 0 ? intScalar(c, c.in(2), "max_output_boxes_per_class") : 0;
  double iou_max = c.has(3) && c.in(3).numel() > 0 ? c.in(3).reshape({-1})[0].item<double>() : 0.0;
  bool has_min = c.has(4) && c.in(4).numel() > 0;
  double score_min = has_min ? c.in(4).reshape({-1})[0].item<double>() : 0.0;
  bool center = c.attrInt("center_point_box", 0) != 0;
  int64_t B = boxes.size(0), N = boxes.size(1), C = scores.size(1);
  const double *bp = boxes.data_ptr<double>(), *sp = scores.data_ptr<double>();
  // Corners (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2.
  auto corners = [&](int64_t b, int64_t i, double out[4]) {
    const double *p = bp + (b * N + i) * 4;
    if (center) {
      out[0] = p[1] - p[3] / 2;
      out[1] = p[0] - p[2] / 2;
      out[2] = p[1] + p[3] / 2;
      out[3] = p[0] + p[2] / 2;
    } else {
      out[0] = std::min(p[0], p[2]);
      out[1] = std::min(p[1], p[3]);
      out[2] = std::max(p[0], p[2]);
      out[3] = std::max(p[1], p[3]);
    }
  };
  auto overlaps = [&](int64_t b, int64_t i, int64_t j) {
    double p[4], q[4];
    corners(b, i, p);
    corners(b, j, q);
    double ih = std::min(p[2], q[2]) - std::max(p[0], q[0]);
    double iw = std::min(p[3], q[3]) - std::max(p[1], q[1]);
    if (ih <= 0 || iw <= 0) return false;
    double inter = ih * iw;
    double uni = (p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - inter;
    return uni > 0 && inter / uni > iou_max;
  };
  std::vector<int64_t> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < C; ++k) {
      const double *s = sp + (b * C + k) * N;
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < N; ++i)
        if (!has_min || s[i] > score_min) cand.push_back(i);
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t i, int64_t j) { return s[i] > s[j]; });
      std::vector<int64_t> kept;
      for (int64_t i : cand) {
        if (int64_t(kept.size()) >= max_out) break;
        if (std::none_of(kept.begin(), kept.end(), [&](int64_t j) { return overlaps(b, i, j); }))
          kept.push_back(i);
      }
      for (int64_t i : kept) out.insert(out.end(), {b, k, i});
    }
  return {longTensor(out, c.in(0).device()).reshape({int64_t(out.size() / 3), 3})};
}

// ---------------------------------------------------------------------------
// Signal processing (opset 17)

/// [..., 1] real or [..., 2] complex ONNX signal -> a torch complex/real tensor.
torch::Tensor signalOf(const OpCtx &c, const torch::Tensor &x) {
  if (x.dim() < 2 || (x.size(-1) != 1 && x.size(-1) != 2))
    c.fail("signal must end in a dimension of 1 (real) or 2 (complex)");
  if (x.size(-1) == 1) return x.select(-1, 0);
  return torch::view_as_complex(x.contiguous());
}

Outputs opDFT(const OpCtx &c) {
  const auto &x = c.in(0);
  torch::Tensor s = signalOf(c, x);
  int64_t axis = normAxis(c, c.attrInt("axis", 1), x.dim());
  if (axis == x.dim() - 1) c.fail("axis cannot be the last (real/imaginary) dimension");
  c10::optional<int64_t> n;
  if (c.has(1) && c.in(1).numel() > 0) n = intScalar(c, c.in(1), "dft_length");
  bool inverse = c.attrInt("inverse", 0) != 0, onesided = c.attrInt("onesided", 0) != 0;
  torch::Tensor y;
  if (inverse) {
    if (onesided) c.fail("onesided inverse DFT is not supported");
    y = torch::fft_ifft(s, n, axis);
  } else {
    y = torch::fft_fft(s, n, axis);
    if (onesided) y = y.narrow(axis, 0, y.size(axis) / 2 + 1);
  }
  return {torch::view_as_real(y).contiguous()};
}

Outputs opSTFT(const OpCtx &c) {
  const auto &x = c.in(0);
  torch::Tensor s = signalOf(c, x);
  if (s.dim() != 2) c.fail("signal must be [batch, length, 1 or 2]");
  int64_t step = intScalar(c, c.in(1), "frame_step");
  torch::Tensor window = c.has(2) && c.in(2).numel() > 0 ? c.in(2) : torch::Tensor();
  int64_t len = c.has(3) && c.in(3).numel() > 0 ? intScalar(c, c.in(3), "frame_length")
                : window.defined()                ? window.size(0)
                                                  : -1;
  if (len <= 0 || step <= 0) c.fail("needs a positive frame_step and a window or frame_length");
  if (len > s.size(1)) c.fail("frame_length exceeds the signal length");
  torch::Tensor frames = s.unfold(1, len, step); // [batch, frames, len]
  if (window.defined()) frames = frames * window.to(x.scalar_type());
  bool onesided = c.attrInt("onesided", 1) != 0 && !frames.is_complex();
  torch::Tensor y =
      onesided ? torch::fft_rfft(frames, c10::nullopt, -1) : torch::fft_fft(frames, c10::nullopt, -1);
  return {torch::view_as_real(y).contiguous()};
}

/// Generalised cosine windows: a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N).
Outputs cosineWindow(const OpCtx &c, double a0, double a1, double a2) {
  int64_t size = intScalar(c, c.in(0), "size");
  if (size < 0) c.fail("size must be non-negative");
  bool periodic = c.attrInt("periodic", 1) != 0;
  double N = double(periodic ? size : size - 1);
  torch::Tensor n = torch::arange(size, torch::kDouble);
  torch::Tensor w = a0 - a1 * torch::cos(2 * M_PI * n / N) + a2 * torch::cos(4 * M_PI * n / N);
  return {w.to(c.in(0).device(), onnxScalarType(c, c.attrInt("output_datatype", 1)))};
}
Outputs opHannWindow(const OpCtx &c) { return cosineWindow(c, 0.5, 0.5, 0); }
Outputs opHammingWindow(const OpCtx &c) { return cosineWindow(c, 25.0 / 46, 21.0 / 46, 0); }
Outputs opBlackmanWindow(const OpCtx &c) { return cosineWindow(c, 0.42, 0.5, 0.08); }

// ---------------------------------------------------------------------------
// Recurrent layers (RNN, GRU, LSTM)

/// Note [recurrent layers]
/// The loop over time is unrolled into ATen calls, so autograd differentiates
/// it (no cuDNN fused kernels: correctness first). Each direction runs the
/// same forward loop; the reverse direction reverses every sequence within its
/// length before and after. Steps past a sequence's length leave the state
/// unchanged and output zeros, as ONNX specifies.
using Activation = std::function<torch::Tensor(const torch::Tensor &)>;

/// The activation named `name`; alpha/beta come from the attribute lists,
/// consumed in order by the functions that take them.
Activation recurrentActivation(const OpCtx &c, std::string name, const std::vector<double> &alphas,
                               const std::vector<double> &betas, size_t &ai, size_t &bi) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  auto next = [](const std::vector<double> &v, size_t &i, double dflt) {
    return i < v.size() ? v[i++] : dflt;
  };
  if (name == "sigmoid") return [](const torch::Tensor &x) { return torch::sigmoid(x); };
  if (name == "tanh") return [](const torch::Tensor &x) { return torch::tanh(x); };
  if (name == "relu") return [](const torch::Tensor &x) { return torch::relu(x); };
  if (name == "softsign") return [](const torch::Tensor &x) { return x / (torch::abs(x) + 1); };
  if (name == "softplus") return [](const torch::Tensor &x) { return torch::softplus(x); };
  if (name == "affine") {
    double a = next(alphas, ai, 1.0), b = next(betas, bi, 0.0);
    return [a, b](const torch::Tensor &x) { return x * a + b; };
  }
  if (name == "leakyrelu") {
    double a = next(alphas, ai, 0.01);
    return [a](const torch::Tensor &x) { return torch::leaky_relu(x, a); };
  }
  if (name == "thresholdedrelu") {
    double a = next(alphas, ai, 1.0);
    return [a](const torch::Tensor &x) { return torch::where(x > a, x, torch::zeros_like(x)); };
  }
  if (name == "scaledtanh") {
    double a = next(alphas, ai, 1.0), b = next(betas, bi, 1.0);
    return [a, b](const torch::Tensor &x) { return torch::tanh(x * b) * a; };
  }
  if (name == "hardsigmoid") {
    double a = next(alphas, ai, 0.2), b = next(betas, bi, 0.5);
    return [a, b](const torch::Tensor &x) { return torch::clamp(x * a + b, 0, 1); };
  }
  if (name == "elu") {
    double a = next(alphas, ai, 1.0);
    return [a](const torch::Tensor &x) { return torch::elu(x, a); };
  }
  c.fail("unsupported activation '" + name + "'");
}

/// Reverses each sequence of x ([T, B, ...]) within its length.
torch::Tensor reverseWithin(const torch::Tensor &x, const std::vector<int64_t> &lens) {
  if (lens.empty()) return x.flip(0);
  int64_t T = x.size(0), B = x.size(1);
  std::vector<int64_t> map(static_cast<size_t>(T * B));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      int64_t len = std::min(std::max<int64_t>(lens[size_t(b)], 0), T);
      map[size_t(t * B + b)] = t < len ? len - 1 - t : t;
    }
  std::vector<int64_t> shape(size_t(x.dim()), 1);
  shape[0] = T;
  shape[1] = B;
  torch::Tensor idx = longTensor(map, x.device()).reshape(shape).expand(x.sizes());
  return torch::gather(x, 0, idx);
}

enum class Cell { RNN, GRU, LSTM };

Outputs opRecurrent(const OpCtx &c, Cell cell) {
  const int64_t G = cell == Cell::RNN ? 1 : cell == Cell::GRU ? 3 : 4;
  const bool layout = c.attrInt("layout", 0) != 0;
  torch::Tensor X = layout ? c.in(0).transpose(0, 1) : c.in(0); // [T, B, I]
  const auto &W = c.in(1), &R = c.in(2);
  if (X.dim() != 3 || W.dim() != 3 || R.dim() != 3) c.fail("X, W and R must be 3-D");
  std::string direction = c.attrString("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    c.fail("unsupported direction '" + direction + "'");
  const int64_t D = direction == "bidirectional" ? 2 : 1;
  const int64_t H = c.attrInt("hidden_size", R.size(-1));
  const int64_t T = X.size(0), B = X.size(1);
  if (W.size(0) != D || W.size(1) != G * H || R.size(0) != D || R.size(1) != G * H || R.size(2) != H)
    c.fail("W or R does not match hidden_size " + std::to_string(H) + " and the direction");
  auto opts = X.options();
  torch::Tensor bias = c.has(3) ? c.in(3) : torch::zeros({D, 2 * G * H}, opts);
  std::vector<int64_t> lens;
  if (c.has(4)) {
    lens = intValues(c, c.in(4), "sequence_lens");
    if (int64_t(lens.size()) != B) c.fail("sequence_lens needs one entry per batch element");
    if (std::all_of(lens.begin(), lens.end(), [&](int64_t l) { return l == T; })) lens.clear();
  }
  auto state = [&](size_t i) {
    if (!c.has(i)) return torch::zeros({D, B, H}, opts);
    return layout ? c.in(i).transpose(0, 1) : c.in(i); // [D, B, H]
  };
  torch::Tensor h0 = state(5), c0 = cell == Cell::LSTM ? state(6) : torch::Tensor();
  torch::Tensor peep = cell == Cell::LSTM && c.has(7) ? c.in(7) : torch::Tensor();

  // Activations: per direction f (RNN); f, g (GRU); f, g, h (LSTM).
  std::vector<std::string> names = c.attrStrings("activations").value_or(std::vector<std::string>{});
  const size_t per_dir = cell == Cell::RNN ? 1 : cell == Cell::GRU ? 2 : 3;
  if (names.empty()) {
    if (cell == Cell::RNN) names = {"Tanh"};
    else if (cell == Cell::GRU) names = {"Sigmoid", "Tanh"};
    else names = {"Sigmoid", "Tanh", "Tanh"};
  }
  if (names.size() == per_dir && D == 2) names.insert(names.end(), names.begin(), names.end());
  if (names.size() != per_dir * size_t(D)) c.fail("activations has the wrong number of entries");
  std::vector<double> alphas = c.attrFloats("activation_alpha").value_or(std::vector<double>{});
  std::vector<double> betas = c.attrFloats("activation_beta").value_or(std::vector<double>{});
  size_t ai = 0, bi = 0;
  std::vector<Activation> acts;
  for (const auto &n : names) acts.push_back(recurrentActivation(c, n, alphas, betas, ai, bi));
  const bool clip = c.hasAttr("clip");
  const double clip_v = c.attrFloat("clip", 0.0);
  auto clipped = [&](const torch::Tensor &t) { return clip ? torch::clamp(t, -clip_v, clip_v) : t; };
  const bool lbr = c.attrInt("linear_before_reset", 0) != 0;
  const bool input_forget = c.attrInt("input_forget", 0) != 0;

  std::vector<torch::Tensor> ys, hs, cs;
  for (int64_t d = 0; d < D; ++d) {
    bool reverse = direction == "reverse" || d == 1;
    torch::Tensor xs = reverse ? reverseWithin(X, lens) : X;
    torch::Tensor wb = bias[d].narrow(0, 0, G * H), rb = bias[d].narrow(0, G * H, G * H);
    torch::Tensor xw = torch::matmul(xs, W[d].t()) + wb; // [T, B, G*H]
    torch::Tensor Rd = R[d];
    const Activation &f = acts[size_t(d) * per_dir];
    torch::Tensor h = h0[d], cst = cell == Cell::LSTM ? c0[d] : torch::Tensor();
    std::vector<torch::Tensor> steps;
    for (int64_t t = 0; t < T; ++t) {
      torch::Tensor x_t = xw[t], h_new, c_new;
      if (cell == Cell::RNN) {
        h_new = f(clipped(x_t + torch::matmul(h, Rd.t()) + rb));
      } else if (cell == Cell::GRU) {
        const Activation &g = acts[size_t(d) * per_dir + 1];
        torch::Tensor hzr = torch::matmul(h, Rd.narrow(0, 0, 2 * H).t()) + rb.narrow(0, 0, 2 * H);
        torch::Tensor z = f(clipped(x_t.narrow(1, 0, H) + hzr.narrow(1, 0, H)));
        torch::Tensor r = f(clipped(x_t.narrow(1, H, H) + hzr.narrow(1, H, H)));
        torch::Tensor Rh = Rd.narrow(0, 2 * H, H), rbh = rb.narrow(0, 2 * H, H);
        torch::Tensor pre = lbr ? x_t.narrow(1, 2 * H, H) + r * (torch::matmul(h, Rh.t()) + rbh)
                                : x_t.narrow(1, 2 * H, H) + torch::matmul(r * h, Rh.t()) + rbh;
        torch::Tensor hh = g(clipped(pre));
        h_new = (1 - z) * hh + z * h;
      } else {
        const Activation &g = acts[size_t(d) * per_dir + 1], &hact = acts[size_t(d) * per_dir + 2];
        torch::Tensor gates = x_t + torch::matmul(h, Rd.t()) + rb; // i, o, f, c
        torch::Tensor gi = gates.narrow(1, 0, H), go = gates.narrow(1, H, H);
        torch::Tensor gf = gates.narrow(1, 2 * H, H), gc = gates.narrow(1, 3 * H, H);
        if (peep.defined()) {
          gi = gi + peep[d].narrow(0, 0, H) * cst;
          gf = gf + peep[d].narrow(0, 2 * H, H) * cst;
        }
        torch::Tensor i = f(clipped(gi));
        torch::Tensor fg = input_forget ? 1 - i : f(clipped(gf));
        c_new = fg * cst + i * g(clipped(gc));
        if (peep.defined()) go = go + peep[d].narrow(0, H, H) * c_new;
        h_new = f(clipped(go)) * hact(c_new);
      }
      if (!lens.empty()) {
        std::vector<uint8_t> live(static_cast<size_t>(B));
        for (int64_t b = 0; b < B; ++b) live[size_t(b)] = t < lens[size_t(b)];
        torch::Tensor m = torch::tensor(c10::ArrayRef<uint8_t>(live), torch::kByte)
                              .to(X.device(), torch::kBool)
                              .unsqueeze(1);
        steps.push_back(torch::where(m, h_new, torch::zeros_like(h_new)));
        h = torch::where(m, h_new, h);
        if (cell == Cell::LSTM) cst = torch::where(m, c_new, cst);
      } else {
        steps.push_back(h_new);
        h = h_new;
        if (cell == Cell::LSTM) cst = c_new;
      }
    }
    torch::Tensor y = T > 0 ? torch::stack(steps) : torch::zeros({0, B, H}, opts);
    ys.push_back(reverse ? reverseWithin(y, lens) : y);
    hs.push_back(h);
    if (cell == Cell::LSTM) cs.push_back(cst);
  }
  torch::Tensor Y = torch::stack(ys, 1), Yh = torch::stack(hs), Yc;
  if (cell == Cell::LSTM) Yc = torch::stack(cs);
  if (layout) { // [B, T, D, H] and [B, D, H]
    Y = Y.permute({2, 0, 1, 3});
    Yh = Yh.transpose(0, 1);
    if (Yc.defined()) Yc = Yc.transpose(0, 1);
  }
  return {Y, Yh, Yc};
}
Outputs opRNN(const OpCtx &c) { return opRecurrent(c, Cell::RNN); }
Outputs opGRU(const OpCtx &c) { return opRecurrent(c, Cell::GRU); }
Outputs opLSTM(const OpCtx &c) { return opRecurrent(c, Cell::LSTM); }

// ---------------------------------------------------------------------------
// The kernel table

using Kernel = Outputs (*)(const OpCtx &);
constexpr int kVariadic = -1;

struct KernelDef {
  std::string_view type;
  int min_inputs;
  int max_inputs; ///< kVariadic: no limit
  Kernel fn;
};

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

/// Sorted by type (checked on first use).
const std::vector<KernelDef> &kernels() {
  static const std::vector<KernelDef> kTable = {
      {"Abs", 1, 1, UNARY(torch::abs(x))},
      {"Acos", 1, 1, UNARY(torch::acos(x))},
      {"Acosh", 1, 1, UNARY(torch::acosh(x))},
      {"Add", 2, 2, binaryOp<addFn>},
      {"And", 2, 2, BINARY(torch::logical_and(a, b))},
      {"ArgMax", 1, 1, opArgMax},
      {"ArgMin", 1, 1, opArgMin},
      {"Asin", 1, 1, UNARY(torch::asin(x))},
      {"Asinh", 1, 1, UNARY(torch::asinh(x))},
      {"Atan", 1, 1, UNARY(torch::atan(x))},
      {"Atanh", 1, 1, UNARY(torch::atanh(x))},
      {"AveragePool", 1, 1, opAveragePool},
      {"BatchNormalization", 5, 5, opBatchNormalization},
      {"Bernoulli", 1, 1, opBernoulli},
      {"BitShift", 2, 2, opBitShift},
      {"BlackmanWindow", 1, 1, opBlackmanWindow},
      {"Cast", 1, 1, opCast},
      {"CastLike", 2, 2, opCastLike},
      {"Ceil", 1, 1, UNARY(torch::ceil(x))},
      {"Celu", 1, 1, UNARY(torch::celu(x, c.attrFloat("alpha", 1.0)))},
      {"Clip", 1, 3, opClip},
      {"Compress", 2, 2, opCompress},
      {"Concat", 1, kVariadic, opConcat},
      {"Constant", 0, 0, opConstant},
      {"ConstantOfShape", 1, 1, opConstantOfShape},
      {"Conv", 2, 3, opConv},
      {"ConvTranspose", 2, 3, opConvTranspose},
      {"Cos", 1, 1, UNARY(torch::cos(x))},
      {"Cosh", 1, 1, UNARY(torch::cosh(x))},
      {"CumSum", 2, 2, opCumSum},
      {"DFT", 1, 2, opDFT},
      {"DepthToSpace", 1, 1, opDepthToSpace},
      {"Det", 1, 1, UNARY(torch::linalg_det(x))},
      {"Div", 2, 2, opDiv},
      {"Dropout", 1, 3, opDropout},
      {"Einsum", 1, kVariadic, opEinsum},
      {"Elu", 1, 1, UNARY(torch::elu(x, c.attrFloat("alpha", 1.0)))},
      {"Equal", 2, 2, BINARY(torch::eq(a, b))},
      {"Erf", 1, 1, UNARY(torch::erf(x))},
      {"Exp", 1, 1, UNARY(torch::exp(x))},
      {"Expand", 2, 2, opExpand},
      {"EyeLike", 1, 1, opEyeLike},
      {"Flatten", 1, 1, opFlatten},
      {"Floor", 1, 1, UNARY(torch::floor(x))},
      {"GRU", 3, 6, opGRU},
      {"Gather", 2, 2, opGather},
      {"GatherElements", 2, 2, opGatherElements},
      {"GatherND", 2, 2, opGatherND},
      {"Gelu", 1, 1, UNARY(torch::gelu(x, c.attrString("approximate", "none")))},
      {"Gemm", 2, 3, opGemm},
      {"GlobalAveragePool", 1, 1, opGlobalAveragePool},
      {"GlobalMaxPool", 1, 1, opGlobalMaxPool},
      {"Greater", 2, 2, BINARY(torch::gt(a, b))},
      {"GreaterOrEqual", 2, 2, BINARY(torch::ge(a, b))},
      {"GridSample", 2, 2, opGridSample},
      {"HammingWindow", 1, 1, opHammingWindow},
      {"HannWindow", 1, 1, opHannWindow},
      {"HardSigmoid", 1, 1,
       UNARY(torch::clamp(x * c.attrFloat("alpha", 0.2) + c.attrFloat("beta", 0.5), 0, 1))},
      {"HardSwish", 1, 1, UNARY(torch::hardswish(x))},
      {"Hardmax", 1, 1, opHardmax},
      {"Identity", 1, 1, UNARY(x)},
      {"InstanceNormalization", 3, 3, opInstanceNormalization},
      {"IsInf", 1, 1, opIsInf},
      {"IsNaN", 1, 1, UNARY(torch::isnan(x))},
      {"LRN", 1, 1, opLRN},
      {"LSTM", 3, 8, opLSTM},
      {"LayerNormalization", 2, 3, opLayerNormalization},
      {"LeakyRelu", 1, 1, UNARY(torch::leaky_relu(x, c.attrFloat("alpha", 0.01)))},
      {"Less", 2, 2, BINARY(torch::lt(a, b))},
      {"LessOrEqual", 2, 2, BINARY(torch::le(a, b))},
      {"Log", 1, 1, UNARY(torch::log(x))},
      {"LogSoftmax", 1, 1, opLogSoftmax},
      {"MatMul", 2, 2, BINARY(torch::matmul(a, b))},
      {"Max", 1, kVariadic, foldInputs<maxFn>},
      {"MaxPool", 1, 1, opMaxPool},
      {"MaxUnpool", 2, 3, opMaxUnpool},
      {"Mean", 1, kVariadic, opMean},
      {"MeanVarianceNormalization", 1, 1, opMeanVarianceNormalization},
      {"Min", 1, kVariadic, foldInputs<minFn>},
      {"Mod", 2, 2, opMod},
      {"Mul", 2, 2, binaryOp<mulFn>},
      {"Neg", 1, 1, UNARY(torch::neg(x))},
      {"NegativeLogLikelihoodLoss", 2, 3, opNegativeLogLikelihoodLoss},
      {"NonMaxSuppression", 2, 5, opNonMaxSuppression},
      {"NonZero", 1, 1, opNonZero},
      {"Not", 1, 1, UNARY(torch::logical_not(x))},
      {"OneHot", 3, 3, opOneHot},
      {"Or", 2, 2, BINARY(torch::logical_or(a, b))},
      {"PRelu", 2, 2, opPRelu},
      {"Pad", 1, 3, opPad},
      {"Pow", 2, 2, opPow},
      {"RNN", 3, 6, opRNN},
      {"RandomNormal", 0, 0, opRandomNormal},
      {"RandomNormalLike", 1, 1, opRandomNormalLike},
      {"RandomUniform", 0, 0, opRandomUniform},
      {"RandomUniformLike", 1, 1, opRandomUniformLike},
      {"Range", 3, 3, opRange},
      {"Reciprocal", 1, 1, UNARY(torch::reciprocal(x))},
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
      {"Relu", 1, 1, UNARY(torch::relu(x))},
      {"Reshape", 2, 2, opReshape},
      {"Resize", 1, 4, opResize},
      {"ReverseSequence", 2, 2, opReverseSequence},
      {"Round", 1, 1, UNARY(torch::round(x))}, // half to even, as ONNX
      {"STFT", 2, 4, opSTFT},
      {"Scatter", 3, 3, opScatterElements}, // opsets 9-10: ScatterElements' old name
      {"ScatterElements", 3, 3, opScatterElements},
      {"ScatterND", 3, 3, opScatterND},
      {"Selu", 1, 1,
       UNARY(torch::elu(x, c.attrFloat("alpha", 1.67326319217681884765625),
                        c.attrFloat("gamma", 1.05070102214813232421875)))},
      {"Shape", 1, 1, opShape},
      {"Shrink", 1, 1, opShrink},
      {"Sigmoid", 1, 1, UNARY(torch::sigmoid(x))},
      {"Sign", 1, 1, UNARY(torch::sign(x))},
      {"Sin", 1, 1, UNARY(torch::sin(x))},
      {"Sinh", 1, 1, UNARY(torch::sinh(x))},
      {"Size", 1, 1, opSize},
      {"Slice", 1, 5, opSlice},
      {"Softmax", 1, 1, opSoftmax},
      {"SoftmaxCrossEntropyLoss", 2, 3, opSoftmaxCrossEntropyLoss},
      {"Softplus", 1, 1, UNARY(torch::softplus(x))},
      {"Softsign", 1, 1, UNARY(x / (torch::abs(x) + 1))},
      {"SpaceToDepth", 1, 1, opSpaceToDepth},
      {"Split", 1, 2, opSplit},
      {"Sqrt", 1, 1, UNARY(torch::sqrt(x))},
      {"Squeeze", 1, 2, opSqueeze},
      {"Sub", 2, 2, binaryOp<subFn>},
      {"Sum", 1, kVariadic, foldInputs<addFn>},
      {"Tan", 1, 1, UNARY(torch::tan(x))},
      {"Tanh", 1, 1, UNARY(torch::tanh(x))},
      {"ThresholdedRelu", 1, 1,
       UNARY(torch::where(x > c.attrFloat("alpha", 1.0), x, torch::zeros_like(x)))},
      {"Tile", 2, 2, opTile},
      {"TopK", 1, 2, opTopK},
      {"Transpose", 1, 1, opTranspose},
      {"Trilu", 1, 2, opTrilu},
      {"Unique", 1, 1, opUnique},
      {"Unsqueeze", 1, 2, opUnsqueeze},
      {"Upsample", 1, 2, opUpsample},
      {"Where", 3, 3, opWhere},
      {"Xor", 2, 2, BINARY(torch::logical_xor(a, b))},
  };
  static const bool sorted =
      std::is_sorted(kTable.begin(), kTable.end(),
                     [](const KernelDef &a, const KernelDef &b) { return a.type < b.type; });
  if (!sorted) throw std::logic_error("rannc::runtime kernel table is not sorted");
  return kTable;
}

#undef UNARY
#undef BINARY

const KernelDef *findKernel(std::string_view type) {
  const auto &table = kernels();
  auto it = std::lower_bound(table.begin(), table.end(), type,
                             [](const KernelDef &k, std::string_view t) { return k.type < t; });
  return it != table.end() && it->type == type ? &*it : nullptr;
}

} // namespace

std::vector<torch::Tensor> runOp(const ir::Node &node, const std::vector<torch::Tensor> &inputs,
                                 int64_t opset) {
  if (node.domain == "aten") return runAtenOp(node, inputs);
  OpCtx c(node, inputs, opset);
  if (!node.domain.empty() && node.domain != "ai.onnx")
    c.fail("unsupported domain '" + node.domain + "'");
  const KernelDef *k = findKernel(node.op_type);
  const ir::OpInfo *info = ir::findOp(node.op_type);
  if (!k || !info) c.fail("unsupported op type");
  if (opset < info->min_opset || opset > info->max_opset)
    c.fail("opset " + std::to_string(opset) + " is outside the supported range " +
           std::to_string(info->min_opset) + ".." + std::to_string(info->max_opset));
  if (inputs.size() != node.inputs.size())
    c.fail("given " + std::to_string(inputs.size()) + " tensors for " +
           std::to_string(node.inputs.size()) + " inputs");
  int n = int(inputs.size());
  if (n < k->min_inputs || (k->max_inputs != kVariadic && n > k->max_inputs))
    c.fail("expects " + std::to_string(k->min_inputs) + ".." +
           (k->max_inputs == kVariadic ? std::string("any") : std::to_string(k->max_inputs)) +
           " inputs, got " + std::to_string(n));

  Outputs out;
  try {
    out = k->fn(c);
  } catch (const OpError &) {
    throw;
  } catch (const c10::Error &e) {
    c.fail(e.what_without_backtrace());
  } catch (const std::exception &e) {
    c.fail(e.what());
  }
  out.resize(std::max(out.size(), node.outputs.size()));
  for (size_t i = 0; i < node.outputs.size(); ++i)
    if (c.wants(i) && !out[i].defined()) c.fail("does not produce output " + std::to_string(i));
  out.resize(node.outputs.size());
  for (size_t i = 0; i < out.size(); ++i)
    if (!c.wants(i)) out[i] = torch::Tensor();
  return out;
}

std::vector<std::string> kernelOpTypes() {
  std::vector<std::string> types;
  for (const KernelDef &k : kernels()) types.emplace_back(k.type);
  return types;
}

torch::ScalarType toScalarType(ir::DType t) {
  switch (t) {
  case ir::DType::F32: return torch::kFloat;
  case ir::DType::F64: return torch::kDouble;
  case ir::DType::F16: return torch::kHalf;
  case ir::DType::BF16: return torch::kBFloat16;
  case ir::DType::I64: return torch::kLong;
  case ir::DType::I32: return torch::kInt;
  case ir::DType::I16: return torch::kShort;
  case ir::DType::I8: return torch::kChar;
  case ir::DType::U8: return torch::kByte;
  case ir::DType::Bool: return torch::kBool;
  case ir::DType::Undefined: break;
  }
  throw std::runtime_error("toScalarType: undefined element type");
}

ir::DType fromScalarType(torch::ScalarType t) {
  switch (t) {
  case torch::kFloat: return ir::DType::F32;
  case torch::kDouble: return ir::DType::F64;
  case torch::kHalf: return ir::DType::F16;
  case torch::kBFloat16: return ir::DType::BF16;
  case torch::kLong: return ir::DType::I64;
  case torch::kInt: return ir::DType::I32;
  case torch::kShort: return ir::DType::I16;
  case torch::kChar: return ir::DType::I8;
  case torch::kByte: return ir::DType::U8;
  case torch::kBool: return ir::DType::Bool;
  default: return ir::DType::Undefined; // complex, quantized, ...: no IR name
  }
}

torch::Tensor toTorch(const ir::Tensor &t) {
  torch::Tensor out = torch::empty(t.dims, torch::TensorOptions(toScalarType(t.dtype)));
  size_t bytes = size_t(t.numel() * ir::dtypeSize(t.dtype));
  if (t.data.size() != bytes)
    throw std::runtime_error("toTorch: tensor has " + std::to_string(t.data.size()) +
                             " bytes of data, its shape needs " + std::to_string(bytes));
  if (bytes) std::memcpy(out.data_ptr(), t.data.data(), bytes); // little-endian host
  return out;
}

ir::Tensor fromTorch(const torch::Tensor &t) {
  torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
  ir::Tensor out;
  out.dtype = fromScalarType(c.scalar_type());
  if (out.dtype == ir::DType::Undefined)
    throw std::runtime_error(std::string("fromTorch: unsupported element type ") +
                             c10::toString(c.scalar_type()));
  out.dims.assign(c.sizes().begin(), c.sizes().end());
  out.data.assign(static_cast<const char *>(c.data_ptr()), c.nbytes());
  return out;
}

} // namespace rannc::runtime
