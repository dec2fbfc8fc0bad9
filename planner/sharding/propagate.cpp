#include "planner/sharding/propagate.h"

#include "planner/ir/fused_ops.h"
#include "planner/ir/op_set.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>

namespace rannc::sharding::detail {

namespace {

int64_t intAttr(const ir::Node &n, const char *name, int64_t dflt) {
  auto it = n.attrs.find(name);
  if (it == n.attrs.end()) return dflt;
  if (const auto *v = std::get_if<int64_t>(&it->second)) return *v;
  return dflt;
}

std::optional<std::vector<int64_t>> intsAttr(const ir::Node &n, const char *name) {
  auto it = n.attrs.find(name);
  if (it == n.attrs.end()) return std::nullopt;
  if (const auto *v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  return std::nullopt;
}

bool fixedSize(const ir::Dim &d, int64_t n) { return d.isFixed() && d.offset == n; }

ValueSharding cutAt(int axis) { return ValueSharding{axis, false}; }

/// The one cut axis among the inputs listed, aligned to an output of rank `out_rank`
/// (numpy broadcasting: trailing axes line up); -1 when none is cut, nullopt on disagreement.
std::optional<int> alignedCut(const std::vector<OpInput> &in, const std::vector<size_t> &which, int out_rank) {
  int axis = -1;
  for (size_t i : which) {
    if (i >= in.size() || !in[i].value || in[i].sh.axis < 0) continue;
    int a = in[i].sh.axis + out_rank - rankOf(in[i]);
    if (axis >= 0 && axis != a) return std::nullopt;
    axis = a;
  }
  return axis;
}

/// Broadcasting element-wise ops: every input either cut at the output's
/// cut axis, broadcast along it (size 1 or absent), or a weight cut to match.
OpResult elementwise(const ir::Node &n, const std::vector<OpInput> &in, const std::vector<size_t> &operands) {
  if (n.outputs.empty() || n.outputs[0] == ir::kNoValue) return fail();
  int out_rank = -1;
  for (size_t i : operands)
    if (i < in.size() && in[i].value) out_rank = std::max(out_rank, rankOf(in[i]));
  auto axis = alignedCut(in, operands, out_rank);
  if (!axis) return fail();
  if (*axis < 0) return allOutputs(n, {});
  OpResult r = allOutputs(n, cutAt(*axis));
  for (size_t i : operands) {
    if (i >= in.size() || !in[i].value || in[i].sh.axis >= 0) continue;
    int a = *axis - (out_rank - rankOf(in[i]));
    if (a < 0 || fixedSize(in[i].value->shape[a], 1)) continue; // broadcast along the cut
    if (!in[i].weight) return fail();
    r.cut_weights.push_back({i, a});
  }
  return r;
}

/// MatMul with numpy semantics for ranks >= 2 (Note [tensor parallel sharding]).
OpResult matmul(const ir::Node &n, const std::vector<OpInput> &in, bool seed_allowed) {
  if (in.size() != 2 || !in[0].value || !in[1].value) return fail();
  const int ra = rankOf(in[0]), rb = rankOf(in[1]), ro = std::max(ra, rb);
  const int ca = in[0].sh.axis, cb = in[1].sh.axis;
  if (ra < 2 || rb < 2) return ca < 0 && cb < 0 ? allOutputs(n, {}) : fail();
  auto broadcastOk = [&](const OpInput &x, int r, int out_axis) { // x replicated along output batch axis
    int a = out_axis - (ro - r);
    return a < 0 || fixedSize(x.value->shape[a], 1);
  };
  if (ca >= 0) {
    if (ca == ra - 1) { // contracted axis: a partial sum
      if (cb == rb - 2) return allOutputs(n, ValueSharding{-1, true});
      if (cb < 0 && in[1].weight) {
        OpResult r = allOutputs(n, ValueSharding{-1, true});
        r.cut_weights.push_back({1, rb - 2});
        return r;
      }
      return fail();
    }
    if (ca == ra - 2) return cb < 0 && !in[1].weight ? allOutputs(n, cutAt(ro - 2)) : fail();
    const int oa = ca + ro - ra; // a batch axis
    const int bb = oa - (ro - rb);
    if (cb >= 0) return cb == bb ? allOutputs(n, cutAt(oa)) : fail();
    if (broadcastOk(in[1], rb, oa)) return allOutputs(n, cutAt(oa));
    return fail();
  }
  if (cb >= 0) {
    if (cb == rb - 1) return in[0].weight ? fail() : allOutputs(n, cutAt(ro - 1));
    if (cb == rb - 2) return fail();
    const int oa = cb + ro - rb;
    return broadcastOk(in[0], ra, oa) ? allOutputs(n, cutAt(oa)) : fail();
  }
  if (seed_allowed && columnCandidate(n, in)) {
    OpResult r = allOutputs(n, cutAt(ro - 1));
    r.cut_weights.push_back({1, 1});
    r.column = true;
    return r;
  }
  return allOutputs(n, {});
}

/// Gemm: Y = alpha * A' B' + beta * C, A' = transA ? A^T : A, B' likewise.
OpResult gemm(const ir::Node &n, const std::vector<OpInput> &in, bool seed_allowed) {
  if (in.size() < 2 || !in[0].value || !in[1].value) return fail();
  const bool ta = intAttr(n, "transA", 0) != 0, tb = intAttr(n, "transB", 0) != 0;
  const bool has_c = in.size() > 2 && in[2].value;
  const int ca = in[0].sh.axis, cb = in[1].sh.axis, cc = has_c ? in[2].sh.axis : -1;
  if (ca < 0 && cb < 0 && cc < 0) {
    if (!seed_allowed || !columnCandidate(n, in)) return allOutputs(n, {});
    OpResult r = allOutputs(n, cutAt(1));
    r.cut_weights.push_back({1, tb ? 0 : 1});
    r.column = true;
    if (has_c) {
      const ir::Shape &c = in[2].value->shape;
      if (!c.empty() && !fixedSize(c.back(), 1)) {
        if (!in[2].weight) return allOutputs(n, {});
        r.cut_weights.push_back({2, static_cast<int>(c.size()) - 1});
      }
    }
    return r;
  }
  // A cut along the contracted axis and a weight B: a partial sum; C would be added t times.
  if (ca == (ta ? 0 : 1) && cb < 0 && in[1].weight && !has_c) {
    OpResult r = allOutputs(n, ValueSharding{-1, true});
    r.cut_weights.push_back({1, tb ? 1 : 0});
    return r;
  }
  return fail();
}

/// Transpose: the cut moves with its axis.
OpResult transpose(const ir::Node &n, const std::vector<OpInput> &in) {
  if (in.empty() || !in[0].value || in[0].sh.axis < 0) return allOutputs(n, {});
  const int r = rankOf(in[0]);
  std::vector<int64_t> perm(r);
  for (int i = 0; i < r; ++i) perm[i] = r - 1 - i;
  if (auto p = intsAttr(n, "perm")) perm = *p;
  for (int j = 0; j < static_cast<int>(perm.size()); ++j)
    if (perm[j] == in[0].sh.axis) return allOutputs(n, cutAt(j));
  return fail();
}

/// Reshape, Squeeze, Unsqueeze, Flatten: row-major relabelling of the same elements.
OpResult reshapeLike(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in) {
  if (in.empty() || !in[0].value || n.outputs.size() != 1 || n.outputs[0] == ir::kNoValue || !onlyFirstCut(in))
    return fail();
  if (in[0].sh.axis < 0) return allOutputs(n, {});
  const ir::Value &out = g.values[n.outputs[0]];
  if (!out.shape_known || !in[0].value->shape_known) return fail();
  auto a = reshapeAxis(in[0].value->shape, out.shape, in[0].sh.axis);
  if (!a) return fail();
  if (n.op_type == "Reshape" && !localReshapeTarget(out.shape)) return fail();
  return allOutputs(n, cutAt(*a));
}

OpResult expand(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in) {
  if (in.size() != 2 || !in[0].value || in[1].sh.axis >= 0 || n.outputs.size() != 1) return fail();
  if (in[0].sh.axis < 0) return allOutputs(n, {});
  const ir::Value &out = g.values[n.outputs[0]];
  if (!out.shape_known || !in[0].value->shape_known || !localExpandTarget(in[0].value->shape, out.shape))
    return fail();
  return allOutputs(n, cutAt(in[0].sh.axis + static_cast<int>(out.shape.size()) - rankOf(in[0])));
}

/// Softmax-like ops normalize over `axis` (opset >= 13) or over every axis from it (before).
OpResult normalizing(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in) {
  if (in.empty() || !in[0].value || in[0].sh.axis < 0) return allOutputs(n, {});
  const int r = rankOf(in[0]);
  const bool one_axis = g.opset >= 13;
  const int axis = normAxis(intAttr(n, "axis", one_axis ? -1 : 1), r);
  const int cut = in[0].sh.axis;
  if (one_axis ? cut == axis : cut >= axis) return fail();
  return allOutputs(n, cutAt(cut));
}

OpResult layerNorm(const std::vector<OpInput> &in, const ir::Node &n) {
  if (in.empty() || !in[0].value || !onlyFirstCut(in)) return fail();
  if (in[0].sh.axis < 0) return allOutputs(n, {});
  const int axis = normAxis(intAttr(n, "axis", -1), rankOf(in[0]));
  if (in[0].sh.axis >= axis) return fail();
  return allOutputs(n, cutAt(in[0].sh.axis));
}

/// The import's fused kernels (Note [pattern fusion] in planner/import/fuse.cpp):
/// attention splits along an axis before its last two (heads, batch), as its
/// MatMuls and Softmax would; RMSNorm as LayerNorm; SiLU as any unary op.
OpResult fused(const ir::Node &n, const std::vector<OpInput> &in) {
  if (n.op_type == ir::kSiLU) return elementwise(n, in, {0});
  if (n.op_type == ir::kRMSNormalization) return layerNorm(in, n);
  if (n.op_type != ir::kScaledDotProductAttention || in.size() < 3) return fail();
  std::vector<size_t> all(in.size());
  for (size_t i = 0; i < in.size(); ++i) all[i] = i;
  OpResult r = elementwise(n, in, all);
  if (r.ok && !r.outs.empty() && r.outs[0].axis >= rankOf(in[0]) - 2) return fail();
  return r;
}

/// Slice and Split along axes other than the cut one.
OpResult sliceLike(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in) {
  if (in.empty() || !in[0].value || !onlyFirstCut(in)) return fail();
  const int cut = in[0].sh.axis, r = rankOf(in[0]);
  if (cut < 0) return allOutputs(n, {});
  std::vector<int64_t> axes;
  if (n.op_type == "Split") {
    axes = {intAttr(n, "axis", 0)};
  } else if (g.opset >= 10) {
    if (in.size() > 3 && in[3].value) {
      auto c = constantInts(g, in[3].id);
      if (!c) return fail();
      axes = *c;
    } else {
      auto starts = in.size() > 1 ? constantInts(g, in[1].id) : std::nullopt;
      if (!starts) return fail();
      for (size_t i = 0; i < starts->size(); ++i) axes.push_back(static_cast<int64_t>(i));
    }
  } else {
    auto a = intsAttr(n, "axes");
    auto s = intsAttr(n, "starts");
    if (a) axes = *a;
    else if (s)
      for (size_t i = 0; i < s->size(); ++i) axes.push_back(static_cast<int64_t>(i));
    else return fail();
  }
  for (size_t k = 0; k < axes.size(); ++k) {
    if (normAxis(axes[k], r) != cut) continue;
    // Exporters slice every axis from 0 to the end (a no-op): that stays local.
    if (n.op_type != "Slice" || g.opset < 10 || !in[0].value->shape[cut].isFixed()) return fail();
    auto starts = constantInts(g, in[1].id), ends = constantInts(g, in[2].id);
    auto steps = in.size() > 4 && in[4].value ? constantInts(g, in[4].id) : std::optional<std::vector<int64_t>>();
    const int64_t size = in[0].value->shape[cut].offset;
    if (!starts || !ends || k >= starts->size() || k >= ends->size() || (*starts)[k] != 0 || (*ends)[k] < size ||
        (in.size() > 4 && in[4].value && (!steps || k >= steps->size() || (*steps)[k] != 1)))
      return fail();
  }
  return allOutputs(n, cutAt(cut));
}

OpResult concat(const ir::Node &n, const std::vector<OpInput> &in) {
  std::vector<size_t> all;
  int r = -1;
  for (size_t i = 0; i < in.size(); ++i) {
    all.push_back(i);
    if (in[i].value) r = rankOf(in[i]);
  }
  auto axis = alignedCut(in, all, r);
  if (!axis) return fail();
  if (*axis < 0) return allOutputs(n, {});
  if (normAxis(intAttr(n, "axis", 0), r) == *axis) return fail();
  // Every input holds its share of the cut axis: all cut, or weights cut to match.
  OpResult r2 = allOutputs(n, cutAt(*axis));
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].value || in[i].sh.axis >= 0) continue;
    if (!in[i].weight) return fail();
    r2.cut_weights.push_back({i, *axis});
  }
  return r2;
}

/// ReduceX over axes that leave the cut axis alone.
OpResult reduce(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in) {
  if (in.empty() || !in[0].value || !onlyFirstCut(in)) return fail();
  const int cut = in[0].sh.axis, r = rankOf(in[0]);
  if (cut < 0) return allOutputs(n, {});
  std::optional<std::vector<int64_t>> axes = intsAttr(n, "axes");
  if (!axes && in.size() > 1 && in[1].value) axes = constantInts(g, in[1].id);
  if (!axes || axes->empty()) return fail(); // every axis (or unknown ones)
  const bool keep = intAttr(n, "keepdims", 1) != 0;
  int shift = 0;
  for (int64_t a : *axes) {
    int na = normAxis(a, r);
    if (na == cut) return fail();
    if (na < cut && !keep) ++shift;
  }
  return allOutputs(n, cutAt(cut - shift));
}

/// Gather from a cut table along another axis, with replicated indices.
OpResult gather(const std::vector<OpInput> &in, const ir::Node &n) {
  if (in.size() != 2 || !in[0].value || !in[1].value || in[1].sh.axis >= 0) return fail();
  const int cut = in[0].sh.axis;
  if (cut < 0) return allOutputs(n, {});
  const int axis = normAxis(intAttr(n, "axis", 0), rankOf(in[0]));
  if (axis == cut) return fail();
  return allOutputs(n, cutAt(cut < axis ? cut : cut + rankOf(in[1]) - 1));
}

bool isUnary(std::string_view op) {
  static const std::set<std::string_view> kOps = {
      "Abs",     "Acos",        "Acosh",     "Asin",  "Asinh",   "Atan",     "Atanh",    "BitwiseNot", "Cast",  "Ceil", "Celu",
      "Cos",     "Cosh",        "Elu",       "Erf",   "Exp",     "Floor",    "Gelu",     "HardSigmoid",  "HardSwish",
      "Identity", "IsInf",      "IsNaN",     "LeakyRelu", "Log", "Neg",      "Not",      "Reciprocal", "Relu",
      "Round",   "Selu",        "Sigmoid",   "Sign",  "Sin",     "Sinh",     "Softplus", "Softsign", "Sqrt", "Tan",
      "Tanh",    "ThresholdedRelu"};
  return kOps.count(op) > 0;
}

bool isBroadcasting(std::string_view op) {
  static const std::set<std::string_view> kOps = {"Add",  "And",  "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Div",   "Equal", "Greater", "GreaterOrEqual",
                                                  "Less", "LessOrEqual", "Max", "Min", "Mod", "Mul", "Or", "Pow",
                                                  "Sub",  "Sum",  "Where", "Xor", "Mean"};
  return kOps.count(op) > 0;
}

// Exporters write small integer vectors (Slice's axes, Reshape's targets) as
// Unsqueeze/Concat/Cast of scalar Constants: fold those few ops.
std::optional<std::vector<int64_t>> foldInts(const ir::Graph &g, ir::ValueId v, int depth) {
  if (v == ir::kNoValue || depth > 8) return std::nullopt;
  const ir::Tensor *t = nullptr;
  if (auto it = g.constant_data.find(v); it != g.constant_data.end()) t = &it->second;
  const ir::Value &val = g.values[v];
  if (!t && val.kind == ir::ValueKind::Intermediate && val.producer >= 0) {
    const ir::Node &p = g.nodes[val.producer];
    const std::string_view op = p.op_type;
    if (!p.domain.empty()) return std::nullopt;
    if (op == "Unsqueeze" || op == "Squeeze" || op == "Reshape" || op == "Identity" || op == "Cast" ||
        op == "Flatten") {
      if (p.inputs.empty() || (val.dtype != ir::DType::I64 && val.dtype != ir::DType::I32)) return std::nullopt;
      return foldInts(g, p.inputs[0], depth + 1);
    }
    if (op == "Concat") {
      std::vector<int64_t> all;
      for (ir::ValueId in : p.inputs) {
        auto part = foldInts(g, in, depth + 1);
        if (!part) return std::nullopt;
        all.insert(all.end(), part->begin(), part->end());
      }
      return all;
    }
    if (op != "Constant") return std::nullopt;
    for (const auto &[k, a] : p.attrs) {
      if (k == "value") t = std::get_if<ir::Tensor>(&a);
      if (k == "value_ints")
        if (const auto *ints = std::get_if<std::vector<int64_t>>(&a)) return *ints;
      if (k == "value_int")
        if (const auto *i = std::get_if<int64_t>(&a)) return std::vector<int64_t>{*i};
    }
  }
  if (!t) return std::nullopt;
  const int64_t n = t->numel(), size = ir::dtypeSize(t->dtype);
  if ((t->dtype != ir::DType::I64 && t->dtype != ir::DType::I32) || static_cast<int64_t>(t->data.size()) != n * size)
    return std::nullopt;
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    if (size == 8) {
      std::memcpy(&out[i], t->data.data() + i * 8, 8);
    } else {
      int32_t x;
      std::memcpy(&x, t->data.data() + i * 4, 4);
      out[i] = x;
    }
  }
  return out;
}
} // namespace

std::optional<std::vector<int64_t>> constantInts(const ir::Graph &g, ir::ValueId v) { return foldInts(g, v, 0); }

namespace {

/// One element of a target shape the model computes at run time.
struct Entry {
  bool local = false;             ///< a size read from a cut axis (a local size on each device)
  std::optional<int64_t> value;   ///< its value where it is a constant of the model
};

/// The elements of the 1-D integer value `v`; nullopt where `v` is computed by
/// ops this does not follow (Shape, Slice, Concat, Gather, Unsqueeze,
/// Squeeze, Cast, Identity and constants are followed).
std::optional<std::vector<Entry>> entriesOf(const ir::Graph &g, const std::vector<ValueSharding> &values,
                                            ir::ValueId v, int depth) {
  if (v == ir::kNoValue || depth > 16) return std::nullopt;
  if (auto c = constantInts(g, v)) {
    std::vector<Entry> out;
    for (int64_t x : *c) out.push_back({false, x});
    return out;
  }
  const ir::Value &val = g.values[v];
  if (val.kind != ir::ValueKind::Intermediate || val.producer < 0) return std::nullopt;
  const ir::Node &p = g.nodes[val.producer];
  if (!p.domain.empty() || p.inputs.empty()) return std::nullopt;
  const std::string_view op = p.op_type;
  if (op == "Shape") {
    const ir::Value &x = g.values[p.inputs[0]];
    if (!x.shape_known) return std::nullopt;
    const int r = static_cast<int>(x.shape.size());
    auto clamp = [&](int64_t i) { return static_cast<int>(std::clamp<int64_t>(i < 0 ? i + r : i, 0, r)); };
    const int start = clamp(intAttr(p, "start", 0)), end = clamp(intAttr(p, "end", r));
    std::vector<Entry> out;
    for (int i = start; i < end; ++i) out.push_back({values[p.inputs[0]].axis == i, std::nullopt});
    return out;
  }
  if (op == "Unsqueeze" || op == "Squeeze" || op == "Cast" || op == "Identity")
    return entriesOf(g, values, p.inputs[0], depth + 1);
  if (op == "Concat") {
    std::vector<Entry> out;
    for (ir::ValueId in : p.inputs) {
      auto part = entriesOf(g, values, in, depth + 1);
      if (!part) return std::nullopt;
      out.insert(out.end(), part->begin(), part->end());
    }
    return out;
  }
  auto whole = entriesOf(g, values, p.inputs[0], depth + 1);
  if (!whole) return std::nullopt;
  const int64_t r = static_cast<int64_t>(whole->size());
  if (op == "Gather" && p.inputs.size() == 2 && intAttr(p, "axis", 0) == 0) {
    auto idx = constantInts(g, p.inputs[1]);
    if (!idx) return std::nullopt;
    std::vector<Entry> out;
    for (int64_t i : *idx) {
      if (i < -r || i >= r) return std::nullopt;
      out.push_back((*whole)[i < 0 ? i + r : i]);
    }
    return out;
  }
  if (op == "Slice" && p.inputs.size() >= 3) {
    auto starts = constantInts(g, p.inputs[1]), ends = constantInts(g, p.inputs[2]);
    auto axes = p.inputs.size() > 3 && p.inputs[3] != ir::kNoValue ? constantInts(g, p.inputs[3])
                                                                    : std::optional<std::vector<int64_t>>(std::vector<int64_t>{0});
    auto steps = p.inputs.size() > 4 && p.inputs[4] != ir::kNoValue ? constantInts(g, p.inputs[4])
                                                                     : std::optional<std::vector<int64_t>>(std::vector<int64_t>{1});
    if (!starts || !ends || !axes || !steps || starts->size() != 1 || ends->size() != 1 || axes->size() != 1 ||
        steps->size() != 1 || ((*axes)[0] != 0 && (*axes)[0] != -1) || (*steps)[0] != 1)
      return std::nullopt;
    auto clamp = [&](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + r : i, 0, r); };
    const int64_t from = clamp((*starts)[0]), to = clamp((*ends)[0]);
    return std::vector<Entry>(whole->begin() + from, whole->begin() + std::max(from, to));
  }
  return std::nullopt;
}

} // namespace

bool inputSizesUnknown(const ir::Graph &g) {
  for (ir::ValueId in : g.inputs) {
    const ir::Value &v = g.values[in];
    if (!v.shape_known) return true;
    for (const ir::Dim &d : v.shape)
      if (!d.known) return true;
  }
  return false;
}

Expected<std::optional<int64_t>> runTimeTargetPatch(const ir::Graph &g, const std::vector<ValueSharding> &values,
                                                    const ir::Node &n, int degree) {
  const std::string where = "tensor parallel: node '" + n.name + "': its target shape is computed at run time ";
  if (!n.domain.empty() || (n.op_type != "Reshape" && n.op_type != "Expand") || n.inputs.size() != 2 ||
      n.outputs.empty() || n.outputs[0] == ir::kNoValue)
    return Error{where + "by an op that is not an ONNX Reshape or Expand"};
  const ir::Value &out = g.values[n.outputs[0]];
  const int p = values[n.outputs[0]].axis;
  auto entries = entriesOf(g, values, n.inputs[1], 0);
  if (!entries || entries->size() != out.shape.size() || p < 0 || p >= static_cast<int>(entries->size()))
    return Error{where + "from ops it cannot follow"};
  for (int j = 0; j < static_cast<int>(entries->size()); ++j)
    if ((*entries)[j].local && j != p) return Error{where + "and names a cut size at another axis"};
  const Entry &e = (*entries)[p];
  // Read from the cut value itself (local already), or Reshape's -1 (inferred
  // from the local input): kept as it is.
  if (e.local || (n.op_type == "Reshape" && e.value == -1)) return std::optional<int64_t>();
  // A fixed cut size: its local size, whatever the model wrote there (the
  // whole size, or 0 for Reshape's copy of the input's size).
  if (out.shape[p].isFixed()) return std::optional<int64_t>(out.shape[p].offset / degree);
  return Error{where + "with a batch-folded cut axis it cannot rewrite"};
}

bool columnCandidate(const ir::Node &n, const std::vector<OpInput> &in) {
  if (!n.domain.empty() || (n.op_type != "MatMul" && n.op_type != "Gemm")) return false;
  if (in.size() < 2 || !in[0].value || !in[1].value) return false;
  if (in[0].weight || !in[1].weight || !ir::isFloating(in[0].value->dtype)) return false;
  const ir::Shape &w = in[1].value->shape;
  if (!in[1].value->shape_known || w.size() != 2 || rankOf(in[0]) < 2) return false;
  const bool tb = n.op_type == "Gemm" && intAttr(n, "transB", 0) != 0;
  const ir::Dim &cols = w[tb ? 0 : 1];
  return cols.isFixed() && cols.offset >= 2;
}

bool rewrittenShapeInput(const ir::Node &n, size_t i) {
  if (auto arg = atenShapeArg(n)) {
    const std::vector<AtenArg> args = atenArgs(n);
    return *arg < args.size() && args[*arg].inputs.size() == 1 && static_cast<size_t>(args[*arg].inputs[0]) == i;
  }
  return n.domain.empty() && i == 1 && (n.op_type == "Reshape" || n.op_type == "Expand");
}

// Note [reshapes of a cut axis]
// A reshape relabels the row-major order of the same elements. Say the cut
// axis a has cut size c (Note [batch-folded cuts]) and `inner` elements per
// step along it (the product of the axes after it): the cut factor spans the
// element strides [inner, c * inner), and each device holds a contiguous
// 1/t of it. The output axis j whose strides hold the top of that span,
// suffix(j+1) < c * inner <= suffix(j), carries the cut when
//   - axis j holds one such span (a fixed axis), or one per batch row (a
//     batch-folded axis, its size c' * B), and no other outer factor: a
//     span of the whole heads, not of a head and its neighbour's;
//   - its own group is either the cut factor with whole inner elements
//     merged below it (c * inner / suffix(j+1), as [H, D] -> [H*D]) or the
//     outer factor of the cut factor (as [H*D] -> [H, D], cut on H).
// The sizes are affine in the batch, so the test runs at two batch sizes.

std::optional<int> reshapeAxis(const ir::Shape &in, const ir::Shape &out, int a) {
  if (a < 0 || a >= static_cast<int>(in.size())) return std::nullopt;
  const std::optional<int64_t> c = cutSize(in[a]);
  if (!c || *c < 1) return std::nullopt;
  for (const ir::Dim &d : in)
    if (!d.known) return std::nullopt;
  for (const ir::Dim &d : out)
    if (!d.known) return std::nullopt;
  auto suffix = [](const ir::Shape &s, int from, int64_t b) {
    int64_t p = 1;
    for (int i = from; i < static_cast<int>(s.size()); ++i) p *= s[i].at(b);
    return p;
  };
  std::optional<int> found;
  for (int64_t b : {3, 7}) {
    const int64_t inner = suffix(in, a + 1, b), top = *c * inner;
    if (inner < 1 || suffix(in, 0, b) != suffix(out, 0, b)) return std::nullopt;
    int j = -1;
    for (int k = 0; k < static_cast<int>(out.size()) && j < 0; ++k)
      if (suffix(out, k + 1, b) < top && top <= suffix(out, k, b)) j = k;
    if (j < 0 || (found && *found != j)) return std::nullopt;
    const int64_t above = suffix(out, j, b), below = suffix(out, j + 1, b);
    if (above % top != 0 || (above / top != 1 && above / top != b)) return std::nullopt;
    int64_t group = 0;
    if (below <= inner) {
      if (inner % below != 0) return std::nullopt;
      group = *c * (inner / below); // whole inner elements merged below the cut factor
    } else {
      if (below % inner != 0 || top % below != 0) return std::nullopt;
      group = top / below; // the outer factor of the cut factor
    }
    if (!(out[j] == (above == top ? ir::Dim::fixed(group) : ir::Dim::batch(group)))) return std::nullopt;
    found = j;
  }
  return found;
}

std::optional<std::vector<int64_t>> localExpandTarget(const ir::Shape &in, const ir::Shape &out) {
  if (out.size() < in.size()) return std::nullopt;
  const size_t off = out.size() - in.size();
  std::vector<int64_t> t(out.size());
  for (size_t j = 0; j < out.size(); ++j) {
    if (!out[j].known) return std::nullopt;
    const bool has_in = j >= off;
    if (has_in && in[j - off] == out[j]) {
      t[j] = 1; // keep the input's (possibly cut or batch-dependent) size
    } else if ((!has_in || fixedSize(in[j - off], 1)) && out[j].isFixed()) {
      t[j] = out[j].offset;
    } else {
      return std::nullopt;
    }
  }
  return t;
}

std::optional<std::vector<int64_t>> localReshapeTarget(const ir::Shape &out) {
  std::vector<int64_t> t;
  bool inferred = false;
  for (const ir::Dim &d : out) {
    if (d.isFixed()) {
      t.push_back(d.offset);
    } else if (!inferred) {
      t.push_back(-1);
      inferred = true;
    } else {
      return std::nullopt;
    }
  }
  return t;
}

OpResult propagate(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in, bool seed_allowed) {
  bool any_cut = false, all_ranks = true;
  for (const OpInput &x : in) {
    any_cut = any_cut || x.sh.axis >= 0;
    all_ranks = all_ranks && (!x.value || x.value->shape_known);
  }
  for (ir::ValueId out : n.outputs)
    all_ranks = all_ranks && (out == ir::kNoValue || g.values[out].shape_known);
  if (ir::isAten(n)) return propagateAten(g, n, in, seed_allowed);
  const bool onnx = n.domain.empty();
  const std::string_view op = n.op_type;
  if (onnx && op == "MatMul") return matmul(n, in, seed_allowed);
  if (onnx && op == "Gemm") return gemm(n, in, seed_allowed);
  if (!any_cut) {
    if (seed_allowed)
      if (auto r = vocabLookupSeed(g, n, in)) return *r;
    return allOutputs(n, {});
  }
  if (auto r = vocabLoss(g, n, in)) return *r;
  if (ir::isFused(n) && all_ranks) return fused(n, in);
  if (!onnx) return fail();
  if (op == "Shape" || op == "Size") return allOutputs(n, {}); // sizes: analyze() tracks the cut one
  if (!all_ranks) return fail();
  if (isUnary(op)) return elementwise(n, in, {0});
  if (op == "CastLike") return elementwise(n, in, {0});
  if (op == "Clip") return in.size() > 1 && (in[1].sh.axis >= 0 || (in.size() > 2 && in[2].sh.axis >= 0)) ? fail()
                                                                                                    : elementwise(n, in, {0});
  if (op == "Dropout") return in.size() > 1 && in[1].sh.axis >= 0 ? fail() : elementwise(n, in, {0});
  if (isBroadcasting(op)) {
    std::vector<size_t> all(in.size());
    for (size_t i = 0; i < in.size(); ++i) all[i] = i;
    return elementwise(n, in, all);
  }
  if (op == "Transpose") return transpose(n, in);
  if (op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten") return reshapeLike(g, n, in);
  if (op == "Expand") return expand(g, n, in);
  if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") return normalizing(g, n, in);
  if (op == "LayerNormalization") return layerNorm(in, n);
  if (op == "Slice" || op == "Split") return sliceLike(g, n, in);
  if (op == "Concat") return concat(n, in);
  if (op.rfind("Reduce", 0) == 0) return reduce(g, n, in);
  if (op == "Gather") return gather(in, n);
  return fail();
}

} // namespace rannc::sharding::detail
