// Note [pattern fusion]
// An ONNX exporter writes one PyTorch kernel as several ops: attention as
// MatMul, scale, mask, Softmax and MatMul (the dynamo exporter's
// decomposition of scaled_dot_product_attention adds an IsNaN/Where guard and
// splits the scale as sqrt(scale) on both operands); LayerNorm, before opset
// 17, as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add; GELU, before
// opset 20, as Div/Erf/Add/Mul/Mul (or its tanh form, which Hugging Face's
// GPT-2 writes out by hand); RMSNorm as Pow/ReduceMean/Add/Sqrt/Reciprocal
// (or Div)/Mul/Mul; SiLU as Sigmoid and Mul. Each op is a kernel and a saved
// tensor: a decomposed attention keeps the B*heads*S^2 score matrix, which
// PyTorch's own kernel never stores.
//
// fusePatterns rewrites each such chain into one node that runs the ATen
// composite (executor/runtime/kernels/fused.cpp), autograd included:
//   - ScaledDotProductAttention(q, kT, v[, mask]), domain "rannc", attributes
//     `scale` (the product of every constant factor found on the scores, q or
//     kT; 1 when none) and `key_transposed` 1: the key arrives as the
//     exporter transposed it for the MatMul ([..., E, S]) and the kernel takes
//     its transpose, a view, so the shape chain the exporter wrote is kept
//     untouched. An additive mask (Add before the Softmax, either operand) is
//     passed as it is; a masked fill Where(cond, fill, scores) (Megatron's
//     -10000 above the diagonal) passes cond with attributes `mask_fill` and
//     `mask_fill_where` (the cond value that takes the fill), which the kernel
//     turns into the additive mask (equal wherever a row keeps one score);
//     a Dropout of ratio 0 between Softmax and MatMul, and
//     the dynamo exporter's NaN guard, are part of the pattern.
//   - LayerNormalization(x, gamma[, beta]) axis -1: the ONNX op, at any opset.
//   - Gelu(x) approximate "none" or "tanh": the ONNX op (rewritten to opset
//     17 from 20 anyway, Note [newer opsets]).
//   - RMSNormalization(x, w) epsilon, axis -1, domain "rannc".
//   - SiLU(x), domain "rannc" (SwiGLU is then SiLU(gate) * up).
// A chain is fused only when every value inside it is read by the chain
// alone (never the loss), every constant is the number the formula needs
// (within 1e-3 relative: exporters write sqrt(2/pi) and 1/sqrt(2) at float
// precision), and reductions and the softmax run over the last axis. The
// fused node takes the place of the chain's last op and writes its output
// value, so nothing downstream changes; ops and constant initializers only the
// chain read (its Constant nodes, a scale's Sqrt, GELU's 0.5) go too, so no
// value is left that no op reads. Softmax-cross-entropy needs no pass: both
// exporters write SoftmaxCrossEntropyLoss, one kernel already; a MatMul+Add
// linear is left as it is, because tensor parallelism (planner/sharding)
// seeds its regions at the MatMul and sums a row-parallel product before its
// bias (Note [tensor parallel sharding]).
#include "planner/import/fuse.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "planner/ir/fused_ops.h"

namespace rannc::import {
namespace {

/// A float from IEEE half bits.
double halfToDouble(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1 : 1;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? NAN : sign * INFINITY;
  return sign * std::ldexp(mant + 1024, exp - 25);
}

/// The elements of a small tensor as doubles (nullopt past 64 elements or for other types).
std::optional<std::vector<double>> valuesOf(const ir::Tensor &t) {
  const int64_t n = t.numel(), size = ir::dtypeSize(t.dtype);
  if (n > 64 || size == 0 || int64_t(t.data.size()) < n * size) return std::nullopt;
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) {
    const char *p = t.data.data() + i * size;
    switch (t.dtype) {
    case ir::DType::F32: { float f; std::memcpy(&f, p, 4); out.push_back(f); break; }
    case ir::DType::F64: { double d; std::memcpy(&d, p, 8); out.push_back(d); break; }
    case ir::DType::F16: { uint16_t h; std::memcpy(&h, p, 2); out.push_back(halfToDouble(h)); break; }
    case ir::DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t u = uint32_t(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      out.push_back(f);
      break;
    }
    case ir::DType::I64: { int64_t v; std::memcpy(&v, p, 8); out.push_back(double(v)); break; }
    case ir::DType::I32: { int32_t v; std::memcpy(&v, p, 4); out.push_back(double(v)); break; }
    default: return std::nullopt;
    }
  }
  return out;
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-3 * std::max(std::abs(a), std::abs(b)); }

/// The matcher's view of the graph: producers, readers, and what was fused.
class Fuser {
public:
  explicit Fuser(ir::Graph &g) : g_(g), users_(g.users()), dead_(g.nodes.size(), false) {}

  /// The live ONNX node of type `op` that writes `v` (an intermediate), or nullptr.
  const ir::Node *producer(ir::ValueId v, std::string_view op) const {
    if (v == ir::kNoValue || g_.values[v].kind != ir::ValueKind::Intermediate) return nullptr;
    const ir::NodeId p = g_.values[v].producer;
    if (p < 0 || dead(p)) return nullptr;
    const ir::Node &n = g_.nodes[p];
    return n.domain.empty() && n.op_type == op ? &n : nullptr;
  }
  /// producer(v, op), which joins the chain.
  const ir::Node *take(ir::ValueId v, std::string_view op) {
    const ir::Node *n = producer(v, op);
    if (n) claimed_.insert(g_.values[v].producer);
    return n;
  }
  /// The readers of `v`.
  const std::vector<ir::NodeId> &readers(ir::ValueId v) const { return users_[v]; }
  /// The chain so far, to go back to when a branch of a pattern fails.
  std::set<ir::NodeId> mark() const { return claimed_; }
  void reset(std::set<ir::NodeId> mark) { claimed_ = std::move(mark); }

  /// The scalar constant `v` holds (Note [pattern fusion]: folded through shape arithmetic).
  std::optional<double> constant(ir::ValueId v) const {
    auto c = constants(v, 0);
    return c && c->size() == 1 ? std::optional<double>((*c)[0]) : std::nullopt;
  }
  /// The small constant `v` holds: an initializer, a Constant node, or what
  /// the exporters compute from them and from fixed sizes (the scale of
  /// attention from the head size: Shape, Gather/Slice, Cast, Sqrt, Div).
  std::optional<std::vector<double>> constants(ir::ValueId v, int depth) const {
    if (v == ir::kNoValue || depth > 16) return std::nullopt;
    const ir::Value &val = g_.values[v];
    if (val.kind == ir::ValueKind::Constant) {
      auto it = g_.constant_data.find(v);
      return it == g_.constant_data.end() ? std::nullopt : valuesOf(it->second);
    }
    if (val.kind != ir::ValueKind::Intermediate || val.producer < 0) return std::nullopt;
    const ir::Node &n = g_.nodes[val.producer];
    if (!n.domain.empty()) return std::nullopt;
    const std::string &op = n.op_type;
    if (op == "Constant") {
      for (const auto &[name, a] : n.attrs) {
        if (const auto *t = std::get_if<ir::Tensor>(&a)) return valuesOf(*t);
        if (const auto *d = std::get_if<double>(&a)) return std::vector<double>{*d};
        if (const auto *i = std::get_if<int64_t>(&a)) return std::vector<double>{double(*i)};
        if (const auto *is = std::get_if<std::vector<int64_t>>(&a)) return std::vector<double>(is->begin(), is->end());
        if (const auto *ds = std::get_if<std::vector<double>>(&a)) return *ds;
      }
      return std::nullopt;
    }
    if (op == "Shape") {
      const ir::Value &x = g_.values[n.inputs[0]];
      if (!x.shape_known) return std::nullopt;
      const auto rank = int64_t(x.shape.size());
      auto bound = [&](const char *name, int64_t dflt) {
        auto it = n.attrs.find(name);
        int64_t b = it == n.attrs.end() || !std::holds_alternative<int64_t>(it->second) ? dflt
                                                                                       : std::get<int64_t>(it->second);
        if (b < 0) b += rank;
        return std::clamp<int64_t>(b, 0, rank);
      };
      std::vector<double> dims;
      for (int64_t d = bound("start", 0); d < bound("end", rank); ++d) {
        if (!x.shape[d].isFixed()) return std::nullopt;
        dims.push_back(double(x.shape[d].offset));
      }
      return dims;
    }
    if (n.inputs.empty()) return std::nullopt;
    auto x = constants(n.inputs[0], depth + 1);
    if (!x) return std::nullopt;
    if (op == "Cast" || op == "CastLike" || op == "Identity" || op == "Reshape" || op == "Squeeze" ||
        op == "Unsqueeze")
      return x; // a scale's values, whatever its shape
    auto map = [&](auto fn) {
      for (double &e : *x) e = fn(e);
      return x;
    };
    if (op == "Sqrt") return map([](double e) { return std::sqrt(e); });
    if (op == "Reciprocal") return map([](double e) { return 1 / e; });
    if (op == "Neg") return map([](double e) { return -e; });
    if (op == "Gather" || op == "Slice") {
      auto idx = n.inputs.size() > 1 ? constants(n.inputs[1], depth + 1) : std::nullopt;
      if (!idx || idx->size() != 1) return std::nullopt;
      auto at = [&](double i) { return int64_t(i) < 0 ? int64_t(i) + int64_t(x->size()) : int64_t(i); };
      int64_t begin = std::clamp<int64_t>(at((*idx)[0]), 0, int64_t(x->size())), end = begin + 1;
      if (op == "Slice") {
        auto ends = n.inputs.size() > 2 ? constants(n.inputs[2], depth + 1) : std::nullopt;
        if (!ends || ends->size() != 1 || n.inputs.size() > 4) return std::nullopt;
        end = (*ends)[0] > 1e15 ? int64_t(x->size()) : std::clamp<int64_t>(at((*ends)[0]), 0, int64_t(x->size()));
      }
      if (begin >= end) return std::nullopt;
      return std::vector<double>(x->begin() + begin, x->begin() + end);
    }
    if (n.inputs.size() == 2 && (op == "Div" || op == "Mul" || op == "Add" || op == "Sub")) {
      auto y = constants(n.inputs[1], depth + 1);
      if (!y || (y->size() != 1 && y->size() != x->size()) || (x->size() != 1 && y->size() != x->size() && x->size() != 1))
        return std::nullopt;
      const size_t len = std::max(x->size(), y->size());
      std::vector<double> out(len);
      for (size_t i = 0; i < len; ++i) {
        const double a = (*x)[x->size() == 1 ? 0 : i], b = (*y)[y->size() == 1 ? 0 : i];
        out[i] = op == "Div" ? a / b : op == "Mul" ? a * b : op == "Add" ? a + b : a - b;
      }
      const ir::DType dt = g_.values[n.outputs[0]].dtype;
      if (op == "Div" && dt != ir::DType::Undefined && !ir::isFloating(dt)) // integer division truncates
        for (double &e : out) e = std::trunc(e);
      return out;
    }
    return std::nullopt;
  }
  /// True when `v` is the constant `want`.
  bool isConstant(ir::ValueId v, double want) const {
    auto c = constant(v);
    return c && near(*c, want);
  }
  /// For a two-input node, the input that is not `v`, or kNoValue.
  static ir::ValueId other(const ir::Node &n, ir::ValueId v) {
    if (n.inputs.size() != 2) return ir::kNoValue;
    if (n.inputs[0] == v) return n.inputs[1];
    if (n.inputs[1] == v) return n.inputs[0];
    return ir::kNoValue;
  }
  /// True when `axes` (attribute or constant input 1) is the last axis of `v`.
  bool lastAxis(const ir::Node &n, ir::ValueId v) const {
    std::vector<int64_t> axes;
    if (auto it = n.attrs.find("axes"); it != n.attrs.end()) {
      if (const auto *a = std::get_if<std::vector<int64_t>>(&it->second)) axes = *a;
    } else if (n.inputs.size() > 1) {
      auto c = constant(n.inputs[1]);
      if (c) axes = {int64_t(*c)};
    }
    if (axes.size() != 1) return false;
    const ir::Value &val = g_.values[v];
    return axes[0] == -1 || (val.shape_known && axes[0] == int64_t(val.shape.size()) - 1);
  }
  bool keepsDims(const ir::Node &n) const {
    auto it = n.attrs.find("keepdims");
    return it == n.attrs.end() || std::get_if<int64_t>(&it->second) == nullptr || std::get<int64_t>(it->second) != 0;
  }

  /// Starts a chain rooted at node `root` (its last node).
  void begin(ir::NodeId root) {
    claimed_.clear();
    claimed_.insert(root);
  }
  /// Commits the chain when only it reads the values it computes (but its
  /// output, `output`): `fused` replaces the chain's last node. False, and
  /// nothing changes, otherwise.
  bool commit(const std::string &pattern, ir::Node fused, ir::ValueId output) {
    const ir::NodeId last = g_.values[output].producer;
    for (ir::NodeId n : claimed_)
      for (ir::ValueId o : g_.nodes[n].outputs) {
        if (o == ir::kNoValue || o == output) continue;
        if (o == g_.loss) return false;
        for (ir::NodeId r : users_[o])
          if (!claimed_.count(r)) return false;
      }
    fused.outputs = {output};
    fused.name = g_.nodes[last].name;
    report_.fused[pattern].push_back(fused.name);
    report_.removed_ops += int(claimed_.size()) - 1;
    for (ir::NodeId n : claimed_) dead_[n] = n != last;
    replacement_.emplace(last, std::move(fused));
    recountReaders();
    // The chain's inputs may now be unread: their Constant nodes, a scale's
    // Sqrt. The last op's too (as exported: GELU's final Mul by 0.5), whose
    // inputs the fused node reads are counted above and stay.
    std::vector<ir::NodeId> stack(claimed_.begin(), claimed_.end());
    while (!stack.empty()) {
      const ir::Node &n = g_.nodes[stack.back()];
      stack.pop_back();
      for (ir::ValueId in : n.inputs) {
        if (in == ir::kNoValue || g_.values[in].kind != ir::ValueKind::Intermediate) continue;
        const ir::NodeId p = g_.values[in].producer;
        if (p < 0 || dead(p)) continue;
        bool unread = true;
        for (ir::ValueId o : g_.nodes[p].outputs)
          unread = unread && (o == ir::kNoValue || (o != g_.loss && users_[o].empty()));
        if (!unread) continue;
        dead_[p] = true;
        report_.removed_ops += 1;
        for (ir::ValueId i : g_.nodes[p].inputs)
          if (i != ir::kNoValue) std::erase(users_[i], p);
        stack.push_back(p);
      }
    }
    claimed_.clear();
    return true;
  }

  /// The readers of every value in the graph as it now stands.
  void recountReaders() {
    for (auto &u : users_) u.clear();
    for (ir::NodeId n = 0; n < ir::NodeId(g_.nodes.size()); ++n) {
      if (dead_[n]) continue;
      const ir::Node &node = replacement_.count(n) ? replacement_.at(n) : g_.nodes[n];
      for (ir::ValueId in : node.inputs)
        if (in != ir::kNoValue && (users_[in].empty() || users_[in].back() != n)) users_[in].push_back(n);
    }
  }

  bool dead(ir::NodeId n) const { return dead_[n] || replacement_.count(n); }
  ir::Graph &graph() { return g_; }
  FusionReport finish();

private:
  ir::Graph &g_;
  std::vector<std::vector<ir::NodeId>> users_;
  std::vector<bool> dead_;
  std::set<ir::NodeId> claimed_;
  std::map<ir::NodeId, ir::Node> replacement_;
  FusionReport report_;
};

/// The graph without the dead nodes and the values only they wrote, ids renumbered.
FusionReport Fuser::finish() {
  if (replacement_.empty()) return report_;
  ir::Graph out;
  out.name = g_.name;
  out.opset = g_.opset;
  out.external_data = g_.external_data;
  std::vector<bool> live_value(g_.values.size(), false), read_before(g_.values.size(), false),
      read_now(g_.values.size(), false);
  for (const ir::Node &node : g_.nodes)
    for (ir::ValueId in : node.inputs)
      if (in != ir::kNoValue) read_before[in] = true;
  for (ir::NodeId n = 0; n < ir::NodeId(g_.nodes.size()); ++n) {
    if (dead_[n]) continue;
    const ir::Node &node = replacement_.count(n) ? replacement_.at(n) : g_.nodes[n];
    for (ir::ValueId o : node.outputs)
      if (o != ir::kNoValue) live_value[o] = true;
    for (ir::ValueId in : node.inputs)
      if (in != ir::kNoValue) read_now[in] = true;
  }
  // A constant initializer only the fused chains read (GELU's 0.5, a norm's
  // 2 or epsilon) goes with them: left behind it would be an input of no op.
  // One the exported graph already left unread is not fusion's to drop.
  for (ir::ValueId v = 0; v < ir::ValueId(g_.values.size()); ++v) {
    const ir::ValueKind kind = g_.values[v].kind;
    if (kind == ir::ValueKind::Intermediate) continue;
    live_value[v] = kind != ir::ValueKind::Constant || read_now[v] || !read_before[v] || v == g_.loss;
  }
  std::vector<ir::ValueId> remap(g_.values.size(), ir::kNoValue);
  for (ir::ValueId v = 0; v < ir::ValueId(g_.values.size()); ++v) {
    if (!live_value[v]) continue;
    ir::Value val = g_.values[v];
    val.producer = -1;
    remap[v] = out.addValue(std::move(val));
  }
  auto map = [&](ir::ValueId v) { return v == ir::kNoValue ? v : remap[v]; };
  for (ir::NodeId n = 0; n < ir::NodeId(g_.nodes.size()); ++n) {
    if (dead_[n]) continue;
    ir::Node node = replacement_.count(n) ? replacement_.at(n) : g_.nodes[n];
    for (auto &v : node.inputs) v = map(v);
    for (auto &v : node.outputs) v = map(v);
    out.addNode(std::move(node));
  }
  for (auto [list, from] : {std::pair{&out.inputs, &g_.inputs}, std::pair{&out.parameters, &g_.parameters},
                            std::pair{&out.constants, &g_.constants}, std::pair{&out.buffers, &g_.buffers}})
    for (ir::ValueId v : *from)
      if (map(v) != ir::kNoValue) list->push_back(map(v));
  for (const auto &[v, t] : g_.constant_data)
    if (map(v) != ir::kNoValue) out.constant_data.emplace(map(v), t);
  out.loss = map(g_.loss);
  g_ = std::move(out);
  return report_;
}

/// Softmax over the last axis: attribute `axis` -1 or rank-1 (opset 13+), or
/// the default of earlier opsets, which flattens to 2-D at axis 1 and equals
/// the last axis only for 2-D inputs.
bool softmaxOverLast(const ir::Graph &g, const ir::Node &sm) {
  const ir::Value &x = g.values[sm.inputs[0]];
  int64_t axis = g.opset >= 13 ? -1 : 1;
  if (auto it = sm.attrs.find("axis"); it != sm.attrs.end())
    if (const auto *a = std::get_if<int64_t>(&it->second)) axis = *a;
  if (axis == -1) return true;
  return x.shape_known && axis == int64_t(x.shape.size()) - 1;
}

/// Attention rooted at out = MatMul(P, v) (Note [pattern fusion]).
bool fuseAttention(Fuser &f, ir::NodeId root) {
  const ir::Graph &g = f.graph();
  const ir::Node &mm = g.nodes[root];
  if (mm.inputs.size() != 2) return false;
  f.begin(root);
  ir::ValueId p = mm.inputs[0];
  if (const ir::Node *drop = f.take(p, "Dropout")) { // ratio 0: the identity (BERT's attention dropout)
    const bool zero = drop->inputs.size() < 2 || drop->inputs[1] == ir::kNoValue || f.isConstant(drop->inputs[1], 0);
    auto ratio = drop->attrs.find("ratio");
    const bool attr_zero = ratio == drop->attrs.end() || (std::holds_alternative<double>(ratio->second) &&
                                                          std::get<double>(ratio->second) == 0);
    if (!zero || !attr_zero) return false;
    p = drop->inputs[0];
  }
  if (const ir::Node *guard = f.take(p, "Where")) { // Where(IsNaN(s), 0, s): the dynamo export's safe softmax
    if (guard->inputs.size() != 3 || !f.isConstant(guard->inputs[1], 0)) return false;
    const ir::Node *isnan = f.take(guard->inputs[0], "IsNaN");
    if (!isnan || isnan->inputs[0] != guard->inputs[2]) return false;
    p = guard->inputs[2];
  }
  const ir::Node *sm = f.take(p, "Softmax");
  if (!sm || !softmaxOverLast(g, *sm)) return false;
  double scale = 1;
  // Constant factors on `v` (Mul either way round, Div by): stripped, multiplied into `scale`.
  auto unscale = [&](ir::ValueId &v) {
    for (bool found = true; found;) {
      found = false;
      for (const char *op : {"Mul", "Div"}) {
        const ir::Node *n = f.producer(v, op);
        if (!n || n->inputs.size() != 2) continue;
        for (int i = 0; i < (n->op_type == "Div" ? 1 : 2) && !found; ++i) {
          auto c = f.constant(n->inputs[1 - i]);
          if (!c || *c == 0 || !std::isfinite(*c)) continue;
          f.take(v, op);
          scale *= n->op_type == "Div" ? 1 / *c : *c;
          v = n->inputs[i];
          found = true;
        }
        if (found) break;
      }
    }
  };
  ir::ValueId x = sm->inputs[0], mask = ir::kNoValue;
  std::optional<double> fill; // a masked fill: Where(cond, fill, scores) or Where(cond, scores, fill)
  int64_t fill_where = 1;
  // The scores: constant factors (taken back, with the nodes, when no MatMul is under them), then the MatMul.
  auto scoresOf = [&](ir::ValueId v) -> const ir::Node * {
    const std::set<ir::NodeId> before = f.mark();
    const double scale_before = scale;
    unscale(v);
    if (const ir::Node *m = f.take(v, "MatMul")) return m;
    f.reset(before);
    scale = scale_before;
    return nullptr;
  };
  const ir::Node *scores = scoresOf(x);
  if (const ir::Node *add = scores ? nullptr : f.take(x, "Add"); add && add->inputs.size() == 2) {
    for (int i = 0; i < 2 && !scores; ++i) // an additive mask, either way round
      if ((scores = scoresOf(add->inputs[i]))) mask = add->inputs[1 - i];
  } else if (const ir::Node *where = scores ? nullptr : f.take(x, "Where"); where && where->inputs.size() == 3) {
    for (int i = 1; i < 3 && !scores; ++i) { // a masked fill far below any score (-10000, -inf)
      auto c = f.constant(where->inputs[i]);
      if (!c || *c > -1e3) continue;
      const std::set<ir::NodeId> before = f.mark();
      if (const ir::Node *like = f.take(where->inputs[i], "CastLike"); like && like->inputs[1] != where->inputs[3 - i])
        f.reset(before); // the dynamo exporter casts the fill like the scores: part of the chain
      if ((scores = scoresOf(where->inputs[3 - i]))) {
        mask = where->inputs[0];
        fill = *c;
        fill_where = i == 1 ? 1 : 0;
      }
    }
  }
  if (!scores) return false;
  ir::ValueId q = scores->inputs[0], kt = scores->inputs[1];
  unscale(q);
  unscale(kt);
  const ir::Value &qv = g.values[q];
  if (qv.shape_known && qv.shape.size() < 2) return false;
  if (mask != ir::kNoValue && !fill && !ir::isFloating(g.values[mask].dtype)) return false;
  ir::Node fused;
  fused.op_type = std::string(ir::kScaledDotProductAttention);
  fused.domain = std::string(ir::kFusedDomain);
  fused.inputs = {q, kt, mm.inputs[1]};
  if (mask != ir::kNoValue) fused.inputs.push_back(mask);
  fused.attrs["scale"] = scale;
  fused.attrs["key_transposed"] = int64_t(1);
  if (fill) {
    fused.attrs["mask_fill"] = *fill;
    fused.attrs["mask_fill_where"] = fill_where;
  }
  return f.commit("attention", std::move(fused), mm.outputs[0]);
}

/// `v` times a weight (Mul either way round): the weight, and `v` becomes the product.
ir::ValueId weightOf(Fuser &f, ir::ValueId &v) {
  const ir::Graph &g = f.graph();
  if (f.readers(v).size() != 1) return ir::kNoValue;
  const ir::Node &n = g.nodes[f.readers(v)[0]];
  if (!n.domain.empty() || n.op_type != "Mul" || n.inputs.size() != 2 || f.dead(f.readers(v)[0])) return ir::kNoValue;
  const ir::ValueId w = Fuser::other(n, v);
  const bool weight = w != ir::kNoValue && (g.values[w].kind == ir::ValueKind::Parameter ||
                                            g.values[w].kind == ir::ValueKind::Constant);
  if (!weight) return ir::kNoValue;
  f.take(n.outputs[0], "Mul");
  v = n.outputs[0];
  return w;
}

/// The reader of `v` of type `op` when `v` has that one reader; it joins the chain.
const ir::Node *readBy(Fuser &f, ir::ValueId v, std::string_view op) {
  if (f.readers(v).size() != 1) return nullptr;
  const ir::Node &n = f.graph().nodes[f.readers(v)[0]];
  if (n.outputs.empty()) return nullptr;
  return f.take(n.outputs[0], op);
}

/// LayerNorm rooted at Div(x - mean(x), Sqrt(mean((x - mean)^2) + eps)) (legacy exports before opset 17).
bool fuseLayerNorm(Fuser &f, ir::NodeId root) {
  const ir::Graph &g = f.graph();
  const ir::Node &div = g.nodes[root];
  if (div.inputs.size() != 2) return false;
  f.begin(root);
  const ir::Node *sub = f.take(div.inputs[0], "Sub");
  const ir::Node *sqrt = f.take(div.inputs[1], "Sqrt");
  if (!sub || !sqrt || sub->inputs.size() != 2) return false;
  const ir::ValueId x = sub->inputs[0];
  const ir::Node *mean = f.take(sub->inputs[1], "ReduceMean");
  const ir::Node *add = f.take(sqrt->inputs[0], "Add");
  if (!mean || !add || mean->inputs[0] != x || !f.lastAxis(*mean, x) || !f.keepsDims(*mean)) return false;
  double eps = 0;
  const ir::Node *var = nullptr;
  for (int i = 0; i < 2 && !var; ++i) {
    auto c = f.constant(add->inputs[1 - i]);
    if (c && (var = f.take(add->inputs[i], "ReduceMean"))) eps = *c;
  }
  if (!var || !f.keepsDims(*var)) return false;
  const ir::Node *pow = f.take(var->inputs[0], "Pow");
  if (!pow || pow->inputs[0] != div.inputs[0] || !f.isConstant(pow->inputs[1], 2) || !f.lastAxis(*var, x)) return false;
  ir::ValueId out = div.outputs[0];
  const ir::ValueId gamma = weightOf(f, out);
  if (gamma == ir::kNoValue) return false;
  ir::ValueId beta = ir::kNoValue;
  if (f.readers(out).size() == 1) {
    const ir::Node &n = g.nodes[f.readers(out)[0]];
    const ir::ValueId b = n.op_type == "Add" && n.domain.empty() ? Fuser::other(n, out) : ir::kNoValue;
    if (b != ir::kNoValue && g.values[b].kind == ir::ValueKind::Parameter && f.take(n.outputs[0], "Add")) {
      beta = b;
      out = n.outputs[0];
    }
  }
  ir::Node fused;
  fused.op_type = "LayerNormalization";
  fused.inputs = {x, gamma};
  if (beta != ir::kNoValue) fused.inputs.push_back(beta);
  fused.attrs["axis"] = int64_t(-1);
  fused.attrs["epsilon"] = eps;
  return f.commit("layer_norm", std::move(fused), out);
}

/// RMSNorm rooted at Pow(x, 2): x * 1/Sqrt(mean(x^2) + eps) * w (Llama's, as both exporters write it).
bool fuseRmsNorm(Fuser &f, ir::NodeId root) {
  const ir::Graph &g = f.graph();
  const ir::Node &pow = g.nodes[root];
  if (pow.inputs.size() != 2 || !f.isConstant(pow.inputs[1], 2)) return false;
  f.begin(root);
  const ir::ValueId x = pow.inputs[0];
  const ir::Node *mean = readBy(f, pow.outputs[0], "ReduceMean");
  if (!mean || !f.lastAxis(*mean, x) || !f.keepsDims(*mean)) return false;
  const ir::Node *add = readBy(f, mean->outputs[0], "Add");
  if (!add) return false;
  auto eps = f.constant(Fuser::other(*add, mean->outputs[0]));
  const ir::Node *sqrt = eps ? readBy(f, add->outputs[0], "Sqrt") : nullptr;
  if (!sqrt) return false;
  ir::ValueId inv = ir::kNoValue;
  if (const ir::Node *r = readBy(f, sqrt->outputs[0], "Reciprocal")) inv = r->outputs[0];
  else if (const ir::Node *d = readBy(f, sqrt->outputs[0], "Div"); d && d->inputs[1] == sqrt->outputs[0] &&
                                                                   f.isConstant(d->inputs[0], 1))
    inv = d->outputs[0];
  if (inv == ir::kNoValue) return false;
  const ir::Node *mul = readBy(f, inv, "Mul");
  if (!mul || Fuser::other(*mul, inv) != x) return false;
  ir::ValueId out = mul->outputs[0];
  if (f.readers(out).size() == 1) { // a Cast back to the input's own type (Hugging Face's float32 round trip)
    const ir::Node &c = g.nodes[f.readers(out)[0]];
    auto to = c.attrs.find("to");
    const ir::DType dt = g.values[x].dtype;
    if (c.op_type == "Cast" && c.domain.empty() && to != c.attrs.end() && dt == ir::DType::F32 &&
        std::get_if<int64_t>(&to->second) && std::get<int64_t>(to->second) == 1 && f.take(c.outputs[0], "Cast"))
      out = c.outputs[0];
  }
  const ir::ValueId w = weightOf(f, out);
  if (w == ir::kNoValue || g.values[w].kind != ir::ValueKind::Parameter) return false;
  ir::Node fused;
  fused.op_type = std::string(ir::kRMSNormalization);
  fused.domain = std::string(ir::kFusedDomain);
  fused.inputs = {x, w};
  fused.attrs["axis"] = int64_t(-1);
  fused.attrs["epsilon"] = *eps;
  return f.commit("rms_norm", std::move(fused), out);
}

/// `a * b` rooted at a Mul whose one operand is `x`: the other operand.
ir::ValueId timesX(const ir::Node &mul, ir::ValueId x) { return mul.inputs.size() == 2 ? Fuser::other(mul, x) : ir::kNoValue; }

/// GELU rooted at Erf (x/sqrt2 or x*(1/sqrt2)) or Tanh (sqrt(2/pi) * (x + 0.044715 x^3)):
/// 0.5 * x * (1 + f(...)), its factors in any order.
bool fuseGelu(Fuser &f, ir::NodeId root) {
  const ir::Graph &g = f.graph();
  const ir::Node &act = g.nodes[root];
  f.begin(root);
  ir::ValueId x = ir::kNoValue;
  const bool erf = act.op_type == "Erf";
  if (erf) {
    if (const ir::Node *d = f.take(act.inputs[0], "Div"); d && f.isConstant(d->inputs[1], std::sqrt(2.0))) x = d->inputs[0];
    else if (const ir::Node *m = f.take(act.inputs[0], "Mul"))
      for (int i = 0; i < 2 && x == ir::kNoValue; ++i)
        if (f.isConstant(m->inputs[1 - i], std::sqrt(0.5))) x = m->inputs[i];
  } else {
    const ir::Node *m = f.take(act.inputs[0], "Mul");
    ir::ValueId inner = ir::kNoValue;
    for (int i = 0; m && i < 2 && inner == ir::kNoValue; ++i)
      if (f.isConstant(m->inputs[1 - i], std::sqrt(2 / M_PI))) inner = m->inputs[i];
    const ir::Node *add = f.take(inner, "Add");
    for (int i = 0; add && i < 2 && x == ir::kNoValue; ++i) {
      const ir::Node *cube = f.take(add->inputs[1 - i], "Mul");
      if (!cube) continue;
      for (int j = 0; j < 2 && x == ir::kNoValue; ++j) {
        if (!f.isConstant(cube->inputs[1 - j], 0.044715)) continue;
        const ir::Node *p = f.take(cube->inputs[j], "Pow");
        if (p && p->inputs[0] == add->inputs[i] && f.isConstant(p->inputs[1], 3)) x = add->inputs[i];
      }
    }
  }
  if (x == ir::kNoValue) return false;
  const ir::Node *one = readBy(f, act.outputs[0], "Add");
  if (!one || !f.isConstant(Fuser::other(*one, act.outputs[0]), 1)) return false;
  const ir::Node *mul = readBy(f, one->outputs[0], "Mul");
  if (!mul) return false;
  const ir::ValueId t = timesX(*mul, one->outputs[0]);
  ir::ValueId out = mul->outputs[0];
  if (t == x) { // x * (1 + f) then * 0.5
    const ir::Node *half = readBy(f, out, "Mul");
    if (!half || !f.isConstant(Fuser::other(*half, out), 0.5)) return false;
    out = half->outputs[0];
  } else { // (x * 0.5) * (1 + f)
    const ir::Node *half = f.take(t, "Mul");
    if (!half || !f.isConstant(Fuser::other(*half, x), 0.5) || timesX(*half, x) == ir::kNoValue) return false;
  }
  ir::Node fused;
  fused.op_type = "Gelu";
  fused.inputs = {x};
  fused.attrs["approximate"] = std::string(erf ? "none" : "tanh");
  return f.commit(erf ? "gelu" : "gelu_tanh", std::move(fused), out);
}

/// SiLU rooted at Sigmoid(x): x * Sigmoid(x).
bool fuseSilu(Fuser &f, ir::NodeId root) {
  const ir::Graph &g = f.graph();
  const ir::Node &sig = g.nodes[root];
  f.begin(root);
  const ir::Node *mul = readBy(f, sig.outputs[0], "Mul");
  if (!mul || Fuser::other(*mul, sig.outputs[0]) != sig.inputs[0]) return false;
  ir::Node fused;
  fused.op_type = std::string(ir::kSiLU);
  fused.domain = std::string(ir::kFusedDomain);
  fused.inputs = {sig.inputs[0]};
  return f.commit("silu", std::move(fused), mul->outputs[0]);
}

} // namespace

int FusionReport::total() const {
  int n = 0;
  for (const auto &[pattern, nodes] : fused) n += int(nodes.size());
  return n;
}

FusionReport fusePatterns(ir::Graph &g) {
  Fuser f(g);
  using Pattern = bool (*)(Fuser &, ir::NodeId);
  const std::pair<std::string_view, Pattern> kRoots[] = {
      {"MatMul", fuseAttention}, {"Div", fuseLayerNorm}, {"Pow", fuseRmsNorm},
      {"Erf", fuseGelu},         {"Tanh", fuseGelu},     {"Sigmoid", fuseSilu}};
  const auto n = ir::NodeId(g.nodes.size());
  for (ir::NodeId id = 0; id < n; ++id) {
    if (f.dead(id) || !g.nodes[id].domain.empty()) continue;
    for (const auto &[op, fuse] : kRoots)
      if (g.nodes[id].op_type == op && fuse(f, id)) break;
  }
  return f.finish();
}

void printFusion(const FusionReport &report, std::ostream &out, bool names) {
  out << "fusion:";
  if (report.fused.empty()) out << " nothing fused";
  for (const auto &[pattern, nodes] : report.fused) out << " " << pattern << " " << nodes.size();
  if (!report.fused.empty()) out << " (" << report.removed_ops << " ops fewer)";
  out << "\n";
  if (!names) return;
  for (const auto &[pattern, nodes] : report.fused) {
    out << "fusion: " << pattern << ":";
    for (const auto &n : nodes) out << " " << n;
    out << "\n";
  }
}

} // namespace rannc::import
