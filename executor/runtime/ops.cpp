#include "executor/runtime/ops.h"

#include <algorithm>
#include <cmath>
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
// Elementwise

Outputs opDiv(const OpCtx &c) {
  const auto &a = c.in(0), &b = c.in(1);
  // ONNX integer division truncates; torch's `/` would return floats.
  if (isIntegral(a)) return {torch::div(a, b, "trunc")};
  return {a / b};
}

Outputs opPow(const OpCtx &c) {
  torch::Tensor x = c.in(0), y = c.in(1);
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

enum class Reduce { Max, Mean, Min, Prod, Sum };

template <Reduce R> Outputs opReduce(const OpCtx &c) {
  const auto &x = c.in(0);
  auto axes = reduceAxes(c, x.dim());
  if (!axes) return {x};
  bool keep = c.attrInt("keepdims", 1) != 0;
  torch::Tensor y;
  if (axes->empty()) {
    y = x; // a scalar input: nothing to reduce (torch would read {} as "all")
  } else if constexpr (R == Reduce::Max) {
    y = torch::amax(x, *axes, keep);
  } else if constexpr (R == Reduce::Min) {
    y = torch::amin(x, *axes, keep);
  } else if constexpr (R == Reduce::Sum) {
    y = torch::sum(x, *axes, keep, x.scalar_type()); // int32 sums stay int32
  } else if constexpr (R == Reduce::Mean) {
    y = x.is_floating_point() ? torch::mean(x, *axes, keep)
                              : torch::mean(x.to(torch::kDouble), *axes, keep);
  } else { // torch::prod reduces one axis at a time; go from the back
    y = x;
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
      {"Add", 2, 2, BINARY(a + b)},
      {"And", 2, 2, BINARY(torch::logical_and(a, b))},
      {"ArgMax", 1, 1, opArgMax},
      {"Cast", 1, 1, opCast},
      {"Clip", 1, 3, opClip},
      {"Concat", 1, kVariadic, opConcat},
      {"Constant", 0, 0, opConstant},
      {"ConstantOfShape", 1, 1, opConstantOfShape},
      {"Div", 2, 2, opDiv},
      {"Dropout", 1, 3, opDropout},
      {"Equal", 2, 2, BINARY(torch::eq(a, b))},
      {"Erf", 1, 1, UNARY(torch::erf(x))},
      {"Exp", 1, 1, UNARY(torch::exp(x))},
      {"Expand", 2, 2, opExpand},
      {"Flatten", 1, 1, opFlatten},
      {"Gather", 2, 2, opGather},
      {"GatherElements", 2, 2, opGatherElements},
      {"Gemm", 2, 3, opGemm},
      {"Greater", 2, 2, BINARY(torch::gt(a, b))},
      {"GreaterOrEqual", 2, 2, BINARY(torch::ge(a, b))},
      {"Identity", 1, 1, UNARY(x)},
      {"LayerNormalization", 2, 3, opLayerNormalization},
      {"Less", 2, 2, BINARY(torch::lt(a, b))},
      {"LessOrEqual", 2, 2, BINARY(torch::le(a, b))},
      {"Log", 1, 1, UNARY(torch::log(x))},
      {"LogSoftmax", 1, 1, opLogSoftmax},
      {"MatMul", 2, 2, BINARY(torch::matmul(a, b))},
      {"Max", 1, kVariadic, foldInputs<maxFn>},
      {"Mean", 1, kVariadic, opMean},
      {"Min", 1, kVariadic, foldInputs<minFn>},
      {"Mul", 2, 2, BINARY(a * b)},
      {"Neg", 1, 1, UNARY(torch::neg(x))},
      {"NegativeLogLikelihoodLoss", 2, 3, opNegativeLogLikelihoodLoss},
      {"Not", 1, 1, UNARY(torch::logical_not(x))},
      {"Or", 2, 2, BINARY(torch::logical_or(a, b))},
      {"Pow", 2, 2, opPow},
      {"Range", 3, 3, opRange},
      {"Reciprocal", 1, 1, UNARY(torch::reciprocal(x))},
      {"ReduceMax", 1, 2, opReduce<Reduce::Max>},
      {"ReduceMean", 1, 2, opReduce<Reduce::Mean>},
      {"ReduceMin", 1, 2, opReduce<Reduce::Min>},
      {"ReduceProd", 1, 2, opReduce<Reduce::Prod>},
      {"ReduceSum", 1, 2, opReduce<Reduce::Sum>},
      {"Relu", 1, 1, UNARY(torch::relu(x))},
      {"Reshape", 2, 2, opReshape},
      {"Shape", 1, 1, opShape},
      {"Sigmoid", 1, 1, UNARY(torch::sigmoid(x))},
      {"Size", 1, 1, opSize},
      {"Slice", 1, 5, opSlice},
      {"Softmax", 1, 1, opSoftmax},
      {"SoftmaxCrossEntropyLoss", 2, 3, opSoftmaxCrossEntropyLoss},
      {"Split", 1, 2, opSplit},
      {"Sqrt", 1, 1, UNARY(torch::sqrt(x))},
      {"Squeeze", 1, 2, opSqueeze},
      {"Sub", 2, 2, BINARY(a - b)},
      {"Sum", 1, kVariadic, foldInputs<addFn>},
      {"Tanh", 1, 1, UNARY(torch::tanh(x))},
      {"Tile", 2, 2, opTile},
      {"Transpose", 1, 1, opTranspose},
      {"Trilu", 1, 2, opTrilu},
      {"Unsqueeze", 1, 2, opUnsqueeze},
      {"Where", 3, 3, opWhere},
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
