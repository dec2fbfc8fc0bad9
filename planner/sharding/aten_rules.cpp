// Sharding rules for ATen nodes (TorchScript and torch.export graphs), the
// same semantics as the ONNX rules in propagate.cpp read through the argument
// encoding of Note [aten argument encoding].
#include <set>
#include <string_view>

#include "planner/ir/aten_args.h"
#include "planner/ir/op_set.h"
#include "planner/sharding/propagate.h"

namespace rannc::sharding::detail {

namespace {

namespace aa = ir::aten_args;

/// The node's inputs re-indexed as a rule for the ONNX op of the same meaning expects them.
std::vector<OpInput> pick(const std::vector<OpInput> &in, std::initializer_list<int> which) {
  std::vector<OpInput> out;
  for (int i : which) out.push_back(i >= 0 && i < static_cast<int>(in.size()) ? in[i] : OpInput{});
  return out;
}

/// Results of an ONNX-shaped rule mapped back: cut weights name the picked positions.
OpResult remap(OpResult r, std::initializer_list<int> which) {
  std::vector<int> w(which);
  for (auto &[idx, axis] : r.cut_weights) idx = static_cast<size_t>(w[idx]);
  return r;
}

bool isElementwise(std::string_view op) {
  static const std::set<std::string_view> kOps = {
      "abs",  "add",   "add_",   "sub",     "rsub",      "mul",      "div",      "neg",     "exp",     "log",
      "sqrt", "rsqrt", "pow",    "relu",    "gelu",      "silu",     "tanh",     "sigmoid", "erf",     "to",
      "contiguous", "clone", "dropout", "masked_fill", "where", "type_as", "float", "half", "bfloat16", "sin", "cos",
      "reciprocal", "square", "detach", "alias", "lift_fresh", "_to_copy", "clamp", "leaky_relu", "softplus",
      "mish", "hardtanh", "elu", "eq", "ne", "gt", "lt", "ge", "le", "logical_and", "logical_or", "logical_not",
      "bitwise_and", "bitwise_or", "__and__", "__or__", "minimum", "maximum", "native_dropout", "expand_as"};
  return kOps.count(op) > 0;
}

} // namespace

std::optional<int64_t> atenInt(const ir::Graph &g, const ir::Node &n, const std::vector<AtenArg> &args, size_t i) {
  if (i >= args.size()) return std::nullopt;
  const AtenArg &a = args[i];
  if (a.constant)
    if (const auto *v = std::get_if<int64_t>(a.constant)) return *v;
  if (a.inputs.size() == 1) {
    auto c = constantInts(g, n.inputs[a.inputs[0]]);
    if (c && c->size() == 1) return (*c)[0];
  }
  return std::nullopt;
}

std::optional<std::vector<int64_t>> atenInts(const ir::Graph &g, const ir::Node &n, const std::vector<AtenArg> &args,
                                             size_t i) {
  if (i >= args.size()) return std::nullopt;
  const AtenArg &a = args[i];
  if (a.constant) {
    if (const auto *v = std::get_if<std::vector<int64_t>>(a.constant)) return *v;
    if (const auto *v = std::get_if<int64_t>(a.constant)) return std::vector<int64_t>{*v};
  }
  if (a.inputs.size() == 1) return constantInts(g, n.inputs[a.inputs[0]]);
  return std::nullopt;
}

std::string_view atenName(const ir::Node &n) {
  std::string_view op = n.op_type;
  return op.rfind("aten::", 0) == 0 ? op.substr(6) : std::string_view{};
}

std::optional<size_t> atenShapeArg(const ir::Node &n) {
  if (!ir::isAten(n)) return std::nullopt;
  const std::string_view op = atenName(n);
  if (op == "view" || op == "reshape" || op == "_unsafe_view" || op == "expand") return 1;
  return std::nullopt;
}

std::optional<size_t> rowParallelBias(const ir::Node &n, bool output_partial) {
  if (!output_partial) return std::nullopt;
  const std::string_view op = atenName(n);
  const size_t arg = op == "linear" ? 2 : op == "addmm" ? 0 : 99;
  const std::vector<AtenArg> args = atenArgs(n);
  if (arg >= args.size() || args[arg].kind != aa::kTensor || args[arg].inputs.size() != 1) return std::nullopt;
  return static_cast<size_t>(args[arg].inputs[0]);
}

OpResult propagateAten(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in, bool seed_allowed) {
  const std::string_view op = atenName(n);
  const std::vector<AtenArg> args = atenArgs(n);
  bool any_cut = false;
  for (const OpInput &x : in) any_cut = any_cut || x.sh.axis >= 0;
  if (args.empty() || op.empty()) return any_cut ? fail() : allOutputs(n, {});
  if (auto r = any_cut ? vocabLoss(g, n, in) : seed_allowed ? vocabLookupSeed(g, n, in) : std::nullopt) return *r;
  auto input = [&](size_t arg) { return args.size() > arg && args[arg].inputs.size() == 1 ? args[arg].inputs[0] : -1; };
  if (op == "linear") { // x @ W^T + b, W [out, in]
    const int x = input(0), w = input(1), b = input(2);
    if (x < 0 || w < 0 || !in[w].weight || rankOf(in[w]) != 2) return any_cut ? fail() : allOutputs(n, {});
    const int rx = rankOf(in[x]);
    if (rx < 1 || (b >= 0 && in[b].sh.axis >= 0)) return any_cut ? fail() : allOutputs(n, {});
    if (in[x].sh.axis < 0) {
      const ir::Dim &rows = in[w].value->shape[0];
      if (!seed_allowed || in[x].weight || !rows.isFixed() || rows.offset < 2 || (b >= 0 && !in[b].weight))
        return allOutputs(n, {});
      OpResult r = allOutputs(n, {rx - 1, false});
      r.cut_weights.push_back({static_cast<size_t>(w), 0});
      if (b >= 0) r.cut_weights.push_back({static_cast<size_t>(b), 0});
      r.column = true;
      return r;
    }
    if (in[x].sh.axis == rx - 1) { // row-parallel; localGraph adds the bias after the sum
      OpResult r = allOutputs(n, {-1, true});
      r.cut_weights.push_back({static_cast<size_t>(w), 1});
      return r;
    }
    return allOutputs(n, {in[x].sh.axis, false}); // cut rows of x: every row's product is whole
  }
  if (op == "addmm") { // bias + x @ W (torch.export's nn.Linear), W [in, out]; alpha = beta = 1 only
    const int b = input(0), x = input(1), w = input(2);
    auto one = [&](size_t i) { // beta, alpha
      if (i >= args.size()) return true;
      const ir::AttrValue *c = args[i].constant;
      return c && ((std::holds_alternative<int64_t>(*c) && std::get<int64_t>(*c) == 1) ||
                   (std::holds_alternative<double>(*c) && std::get<double>(*c) == 1.0));
    };
    if (b < 0 || x < 0 || w < 0 || !one(3) || !one(4)) return any_cut ? fail() : allOutputs(n, {});
    if (!in[w].weight || in[b].sh.axis >= 0 || rankOf(in[x]) != 2 || rankOf(in[w]) != 2)
      return any_cut ? fail() : allOutputs(n, {});
    if (in[x].sh.axis == 1) { // row-parallel; localGraph adds the bias after the sum
      OpResult r = allOutputs(n, {-1, true});
      r.cut_weights.push_back({static_cast<size_t>(w), 0});
      return r;
    }
    if (in[x].sh.axis >= 0) return fail();
    const ir::Dim &cols = in[w].value->shape[1];
    const ir::Shape &bs = in[b].value ? in[b].value->shape : ir::Shape{};
    if (!seed_allowed || in[x].weight || !cols.isFixed() || cols.offset < 2 || !in[b].weight || bs.empty())
      return allOutputs(n, {});
    OpResult r = allOutputs(n, {1, false});
    r.cut_weights.push_back({static_cast<size_t>(w), 1});
    if (!(bs.back() == ir::Dim::fixed(1))) r.cut_weights.push_back({static_cast<size_t>(b), static_cast<int>(bs.size()) - 1});
    r.column = true;
    return r;
  }
  if (op == "matmul" || op == "mm" || op == "bmm") {
    ir::Node mm = n;
    mm.op_type = "MatMul";
    mm.domain.clear();
    const int a = input(0), b = input(1);
    if (a < 0 || b < 0) return fail();
    return remap(propagate(g, mm, pick(in, {a, b}), seed_allowed), {a, b});
  }
  // Reuse the ONNX rules where the semantics are the same.
  auto onnx = [&](const char *type, std::vector<OpInput> ins, ir::AttrMap attrs) {
    ir::Node m{n.name, type, "", {}, n.outputs, std::move(attrs)};
    for (const OpInput &i : ins) m.inputs.push_back(i.id);
    return propagate(g, m, ins, false);
  };
  if (!any_cut) return allOutputs(n, {});
  for (ir::ValueId out : n.outputs)
    if (out != ir::kNoValue && !g.values[out].shape_known) return fail();
  if (op == "cat") {
    auto d = atenInt(g, n, args, 1);
    if (!d || args[0].kind != aa::kTensors || args[0].inputs.empty()) return fail();
    std::vector<OpInput> parts;
    for (int i : args[0].inputs) parts.push_back(in[i]);
    const int rank = rankOf(in[args[0].inputs[0]]);
    OpResult res = onnx("Concat", parts, {{"axis", int64_t{normAxis(*d, rank)}}});
    for (auto &[idx, axis] : res.cut_weights) idx = static_cast<size_t>(args[0].inputs[idx]);
    return res;
  }
  const int x = input(0);
  if (x < 0 || !in[x].value || !in[x].value->shape_known) return fail();
  const int r = rankOf(in[x]), cut = in[x].sh.axis;
  if (op == "size" || op == "numel" || op == "dim") return allOutputs(n, {});
  if (isElementwise(op)) {
    std::vector<OpInput> tensors;
    std::vector<int> which;
    for (const AtenArg &a : args)
      if (a.kind == aa::kTensor || a.kind == aa::kScalar || a.kind == aa::kWrappedInt || a.kind == aa::kWrappedFloat)
        for (int i : a.inputs) tensors.push_back(in[i]), which.push_back(i);
    OpResult res = onnx("Add", tensors, {});
    for (auto &[idx, axis] : res.cut_weights) idx = static_cast<size_t>(which[idx]);
    return res;
  }
  if (cut < 0) return fail(); // a cut operand other than the first
  if (op == "transpose" || op == "t" || op == "permute") {
    std::vector<int64_t> perm(r);
    for (int i = 0; i < r; ++i) perm[i] = i;
    if (op == "permute") {
      auto p = atenInts(g, n, args, 1);
      if (!p || static_cast<int>(p->size()) != r) return fail();
      for (int i = 0; i < r; ++i) perm[i] = normAxis((*p)[i], r);
    } else {
      auto d0 = op == "t" ? std::optional<int64_t>(0) : atenInt(g, n, args, 1);
      auto d1 = op == "t" ? std::optional<int64_t>(1) : atenInt(g, n, args, 2);
      if (!d0 || !d1) return fail();
      std::swap(perm[normAxis(*d0, r)], perm[normAxis(*d1, r)]);
    }
    return onnx("Transpose", {in[x]}, {{"perm", perm}});
  }
  if (op == "view" || op == "reshape" || op == "_unsafe_view" || op == "unsqueeze" || op == "squeeze" ||
      op == "flatten") {
    const ir::Value &out = g.values[n.outputs[0]];
    auto a = reshapeAxis(in[x].value->shape, out.shape, cut);
    if (!a || (atenShapeArg(n) && !localReshapeTarget(out.shape))) return fail();
    return allOutputs(n, {*a, false});
  }
  if (op == "expand") {
    const ir::Value &out = g.values[n.outputs[0]];
    if (!localExpandTarget(in[x].value->shape, out.shape)) return fail();
    return allOutputs(n, {cut + static_cast<int>(out.shape.size()) - r, false});
  }
  if (op == "softmax" || op == "log_softmax" || op == "_softmax") {
    auto d = atenInt(g, n, args, 1);
    if (!d || normAxis(*d, r) == cut) return fail();
    return allOutputs(n, {cut, false});
  }
  if (op == "layer_norm" || op == "rms_norm") {
    auto shape = atenInts(g, n, args, 1);
    if (!shape || cut >= r - static_cast<int>(shape->size()) || !onlyFirstCut(in)) return fail();
    return allOutputs(n, {cut, false});
  }
  if (op == "mean" || op == "sum" || op == "amax" || op == "amin") {
    auto dims = atenInts(g, n, args, 1);
    auto keep = atenInt(g, n, args, 2);
    if (!dims || dims->empty()) return fail();
    int shift = 0;
    for (int64_t d : *dims) {
      if (normAxis(d, r) == cut) return fail();
      if (normAxis(d, r) < cut && !(keep && *keep)) ++shift;
    }
    return allOutputs(n, {cut - shift, false});
  }
  if (op == "slice") { // along another axis, or the whole of the cut one
    auto d = atenInt(g, n, args, 1);
    if (!d) return fail();
    if (normAxis(*d, r) == cut) {
      if (!in[x].value->shape[cut].isFixed()) return fail(); // a batch-folded cut (Note [batch-folded cuts])
      auto isNone = [&](size_t i) { return i >= args.size() || args[i].kind == aa::kConstNone; };
      auto start = atenInt(g, n, args, 2), end = atenInt(g, n, args, 3), step = atenInt(g, n, args, 4);
      const bool whole = (isNone(2) || (start && *start == 0)) &&
                         (isNone(3) || (end && *end >= in[x].value->shape[cut].offset)) &&
                         (isNone(4) || (step && *step == 1));
      if (!whole) return fail();
    }
    return allOutputs(n, {cut, false});
  }
  if (op == "scaled_dot_product_attention") { // q, k, v batched over every axis but the last two
    const int q = input(0), k = input(1), v = input(2), mask = input(3);
    if (q < 0 || k < 0 || v < 0 || cut >= r - 2) return fail();
    for (int i : {k, v})
      if (in[i].sh.axis != cut) return fail();
    if (mask >= 0) {
      const int rm = rankOf(in[mask]);
      const int a = cut - (r - rm);
      if (in[mask].sh.axis >= 0 || rm < 0 || (a >= 0 && !(in[mask].value->shape[a] == ir::Dim::fixed(1))))
        return fail();
    }
    return allOutputs(n, {cut, false});
  }
  return fail();
}

} // namespace rannc::sharding::detail
