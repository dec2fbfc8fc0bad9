#include "planner/sharding/sharding.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "planner/sharding/propagate.h"

namespace rannc::sharding {

// Note [sharding regions]
// Every cut starts at a column-parallel product (a seed). A value carries the
// seed it came from; a node that reads cuts of several seeds joins them into
// one region (union-find), as attention joins the query, key and value
// products. A partial value joins nothing: its readers read it summed, whole
// (so a Llama's first residual add, of the vocabulary-parallel lookup and the
// attention's row-parallel product, leaves the two regions apart). A pass
// propagates every enabled seed through the graph in node order (rules in
// propagate.h). Where a rule fails on a cut input, the input is gathered
// whole if nothing downstream of it multiplies a weight (the output layer's
// logits before the loss), else the region is marked bad. A region is also
// bad where two readers of one weight want it cut differently (a tied
// embedding), where a shape computed from a cut value reaches anything but a
// target shape localGraph rewrites, or where a cut axis has no cut size
// (cutSize(), Note [batch-folded cuts]). Bad regions' seeds are disabled and
// the pass reruns until no region is bad: seeds only ever get disabled, so it
// ends, and the result depends on the graph alone (deterministic).
//
// A lookup in a parameter table seeds a region too, cutting the table by rows
// (Note [vocabulary parallelism] in vocab.cpp); a loss over logits cut by
// classes keeps them cut, so the output layer's logits are never gathered.

namespace {

using detail::OpInput;
using detail::OpResult;

struct UnionFind {
  std::vector<int> parent;
  explicit UnionFind(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int find(int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  int join(int a, int b) {
    if (a < 0) return b < 0 ? -1 : find(b);
    if (b < 0) return find(a);
    a = find(a), b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
    return std::min(a, b);
  }
};

constexpr int kNoTaint = -1, kWholeTaint = -2;

/// Facts about the graph that do not depend on which seeds are enabled.
struct GraphFacts {
  std::vector<bool> param_only;   ///< per node: computed from weights alone
  std::vector<bool> weight;       ///< per value: a parameter, constant, buffer or param-only result
  std::vector<bool> needs_grad;   ///< per value: floating and computed from a parameter
  std::vector<bool> feeds_weight; ///< per value: some node downstream reads a weight matrix
  std::vector<std::vector<ir::NodeId>> users;
  bool unknown_input_sizes = false; ///< an input has a size other than the batch unknown

  explicit GraphFacts(const ir::Graph &g)
      : param_only(ir::parameterOnlyNodes(g)), weight(g.values.size(), false), needs_grad(g.values.size(), false),
        feeds_weight(g.values.size(), false), users(g.users()) {
    for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.values.size()); ++v) {
      const ir::Value &val = g.values[v];
      weight[v] = val.kind == ir::ValueKind::Parameter || val.kind == ir::ValueKind::Constant ||
                  val.kind == ir::ValueKind::Buffer;
      needs_grad[v] = val.kind == ir::ValueKind::Parameter;
    }
    for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g.nodes.size()); ++n) {
      bool grad = false;
      for (ir::ValueId in : g.nodes[n].inputs)
        if (in != ir::kNoValue) grad = grad || needs_grad[in];
      for (ir::ValueId out : g.nodes[n].outputs) {
        if (out == ir::kNoValue) continue;
        weight[out] = param_only[n];
        needs_grad[out] = grad && ir::isFloating(g.values[out].dtype);
      }
    }
    unknown_input_sizes = detail::inputSizesUnknown(g);
    std::vector<bool> node_feeds(g.nodes.size(), false);
    for (auto n = static_cast<ir::NodeId>(g.nodes.size()) - 1; n >= 0; --n) {
      const ir::Node &node = g.nodes[n];
      bool f = false;
      for (ir::ValueId in : node.inputs) // a node that reads a weight matrix
        if (!param_only[n] && in != ir::kNoValue && weight[in] && ir::isFloating(g.values[in].dtype) &&
            g.values[in].shape.size() >= 2)
          f = true;
      for (ir::ValueId out : node.outputs)
        if (out != ir::kNoValue) f = f || feeds_weight[out];
      node_feeds[n] = f;
      for (ir::ValueId in : node.inputs)
        if (in != ir::kNoValue && f) feeds_weight[in] = true;
    }
  }
};

/// One propagation pass with a set of disabled seeds (Note [sharding regions]).
class Pass {
public:
  Pass(const ir::Graph &g, const GraphFacts &f, const std::set<ir::NodeId> &disabled)
      : g_(g), f_(f), disabled_(disabled), uf_(g.nodes.size()), sh_(g.values.size()), region_(g.values.size(), -1),
        taint_(g.values.size(), kNoTaint), demands_(g.values.size()), split_(g.nodes.size(), false),
        bad_(g.nodes.size(), false) {}

  void run() {
    for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g_.nodes.size()); ++n)
      if (!f_.param_only[n]) visit(n);
    resolveWeights();
    addCopiesAndSums();
    for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g_.values.size()); ++v)
      if (sh_[v].axis >= 0 && valueCutSize(v) < 2) markBad(region_[v]);
    if (f_.unknown_input_sizes) markRunTimeTargetsBad();
    if (g_.loss != ir::kNoValue && !sh_[g_.loss].replicated()) markBad(region_[g_.loss]);
    markOddRegionsBad();
  }

  /// The seeds of bad regions (none when the pass is consistent).
  std::vector<ir::NodeId> badSeeds() {
    std::vector<ir::NodeId> out;
    for (ir::NodeId s : seeds_)
      if (bad_[uf_.find(s)]) out.push_back(s);
    return out;
  }

  Analysis result() const {
    Analysis a;
    a.values = sh_;
    a.node_split = split_;
    a.collectives = collectives_;
    std::set<int64_t> sizes;
    for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g_.values.size()); ++v)
      if (sh_[v].axis >= 0) sizes.insert(valueCutSize(v));
    a.cut_sizes.assign(sizes.begin(), sizes.end());
    return a;
  }

private:
  /// The cut size of value `v` along its cut axis (Note [batch-folded cuts]); 0 when it has none.
  int64_t valueCutSize(ir::ValueId v) const {
    const int a = sh_[v].axis;
    const ir::Value &val = g_.values[v];
    if (a < 0 || !val.shape_known || a >= static_cast<int>(val.shape.size())) return 0;
    return cutSize(val.shape[a]).value_or(0);
  }

  void markBad(int region) {
    if (region >= 0) bad_[uf_.find(region)] = true;
  }

  // Note [target shapes of unknown inputs]
  // localGraph writes a cut Reshape's or Expand's target as a constant of the
  // local shape. Where an input's size is unknown (a dynamic sequence in the
  // dynamo ONNX exporter's files, `input_ids [B,?]`), the graph's shapes were
  // found by running it at a stand-in size (1), and a target the model
  // computes at run time (Shape, Slice, Concat) would be frozen at that
  // stand-in. There the target stays computed at run time, and only its
  // entry at the output's cut axis is replaced (runTimeTargetPatch()): by
  // the local cut size, or kept where it is Reshape's -1 or was read from
  // the cut value itself (already local). A region whose target cannot be
  // followed that way (other ops, a cut size at another axis, ATen's
  // arguments) stays whole; a target that is a constant of the model is
  // rewritten as always.
  void markRunTimeTargetsBad() {
    for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g_.nodes.size()); ++n) {
      const ir::Node &node = g_.nodes[n];
      if (f_.param_only[n] || node.outputs.empty() || node.outputs[0] == ir::kNoValue || sh_[node.outputs[0]].axis < 0)
        continue;
      for (size_t i = 0; i < node.inputs.size(); ++i)
        if (node.inputs[i] != ir::kNoValue && detail::rewrittenShapeInput(node, i) &&
            !detail::constantInts(g_, node.inputs[i]) && (i != 1 || !detail::runTimeTargetPatch(g_, sh_, node, 1)))
          markBad(region_[node.outputs[0]]);
    }
  }

  // Note [regions that cannot be cut]
  // A degree must divide every cut size of the graph, so one region whose
  // sizes share no factor of 2 (a vocabulary of 50,257 or 97) would leave
  // only t = 1 for the whole model. Such a region is given up instead:
  // tensor-parallel groups are powers of two in practice (a node's 8
  // devices), and the rest of the graph keeps its degrees.
  void markOddRegionsBad() {
    std::map<int, int64_t> gcd; // region root -> gcd of its cut sizes
    for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g_.values.size()); ++v) {
      if (region_[v] < 0 || valueCutSize(v) < 1) continue;
      int64_t &d = gcd[uf_.find(region_[v])];
      d = std::gcd(d, valueCutSize(v));
    }
    for (const auto &[root, d] : gcd)
      if (d % 2 != 0) markBad(root);
  }

  std::vector<OpInput> inputsOf(const ir::Node &node) const {
    std::vector<OpInput> in(node.inputs.size());
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ir::ValueId v = node.inputs[i];
      if (v == ir::kNoValue) continue;
      in[i] = OpInput{v, &g_.values[v], sh_[v], f_.weight[v]};
      if (in[i].sh.partial) in[i].sh = {}; // read through its SumOverGroup
    }
    return in;
  }

  void visit(ir::NodeId n) {
    const ir::Node &node = g_.nodes[n];
    std::vector<OpInput> in = inputsOf(node);
    // Partial inputs are read through their sum, whole: only cut ones join
    // their regions to this node's (Note [sharding regions]).
    int region = -1;
    for (const OpInput &x : in)
      if (x.id != ir::kNoValue && x.sh.axis >= 0) region = uf_.join(region, region_[x.id]);
    OpResult res = detail::propagate(g_, node, in, disabled_.count(n) == 0);
    if (!res.ok) {
      for (size_t i = 0; i < in.size(); ++i) {
        if (in[i].sh.axis < 0) continue;
        // An all-gather cannot rebuild a batch-folded cut (Note [batch-folded cuts]).
        const ir::Shape &shape = in[i].value->shape;
        const bool fixed = in[i].sh.axis < static_cast<int>(shape.size()) && shape[in[i].sh.axis].isFixed();
        if (f_.feeds_weight[in[i].id] || !fixed) markBad(region_[in[i].id]);
        else gathers_[{in[i].id, in[i].sh.axis}].insert(n);
        in[i].sh = {};
      }
      res = detail::propagate(g_, node, in, false);
      if (!res.ok) res.outs.assign(node.outputs.size(), ValueSharding{});
      res.cut_weights.clear();
    }
    if (res.column || res.seed) {
      seeds_.push_back(n);
      region = uf_.join(region, n);
    }
    bool split = false;
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const ir::ValueId out = node.outputs[k];
      if (out == ir::kNoValue) continue;
      sh_[out] = k < res.outs.size() ? res.outs[k] : ValueSharding{};
      region_[out] = sh_[out].replicated() ? -1 : region;
      split = split || !sh_[out].replicated();
    }
    split_[n] = split || res.runs_split;
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i].id == ir::kNoValue || !in[i].weight) continue;
      int axis = -1;
      for (const auto &[idx, a] : res.cut_weights)
        if (idx == i) axis = a;
      demands_[in[i].id].push_back({axis, axis >= 0 ? region : -1});
    }
    propagateTaint(n, in, res);
  }

  // Shapes read from a cut value hold local sizes at the cut position
  // (Note [sharding regions]); track which integers may hold one.
  void propagateTaint(ir::NodeId n, const std::vector<OpInput> &in, const OpResult &res) {
    const ir::Node &node = g_.nodes[n];
    if (node.domain.empty() && (node.op_type == "Shape" || node.op_type == "Size") && !in.empty() &&
        in[0].sh.axis >= 0) {
      const ir::ValueId out = node.outputs[0];
      int pos = in[0].sh.axis;
      if (node.op_type == "Shape") {
        const int r = static_cast<int>(in[0].value->shape.size());
        auto it = node.attrs.find("start");
        int64_t start = it == node.attrs.end() ? 0 : std::get<int64_t>(it->second);
        if (start < 0) start += r;
        pos -= static_cast<int>(start);
        auto e = node.attrs.find("end");
        int64_t end = e == node.attrs.end() ? r : std::get<int64_t>(e->second);
        if (end < 0) end += r;
        if (pos < 0 || pos + start >= end) pos = kNoTaint;
      } else {
        pos = kWholeTaint;
      }
      taint_[out] = pos;
      taint_region_[out] = region_[in[0].id];
      return;
    }
    if (const std::string_view op = detail::atenName(node);
        (op == "size" || op == "sym_size") && !in.empty() && in[0].sh.axis >= 0 && !node.outputs.empty()) {
      const auto args = detail::atenArgs(node);
      const int r = static_cast<int>(in[0].value->shape.size());
      int pos = in[0].sh.axis; // size(x): the whole list, the cut size at its position
      if (args.size() > 1) {
        auto d = detail::atenInt(g_, node, args, 1);
        pos = !d ? kWholeTaint : (*d < 0 ? *d + r : *d) == in[0].sh.axis ? kWholeTaint : kNoTaint;
      }
      taint_[node.outputs[0]] = pos;
      taint_region_[node.outputs[0]] = region_[in[0].id];
      return;
    }
    int taint = kNoTaint, region = -1;
    for (size_t i = 0; i < in.size(); ++i) {
      const ir::ValueId v = in[i].id;
      if (v == ir::kNoValue || taint_[v] == kNoTaint) continue;
      const int r = taint_region_[v];
      if (detail::rewrittenShapeInput(node, i)) {
        if (res.outs.empty() || res.outs[0].axis < 0) markBad(r);
        continue;
      }
      int t = kWholeTaint;
      if (node.domain.empty() && node.op_type == "Gather" && i == 0 && taint_[v] >= 0) {
        auto idx = detail::constantInts(g_, node.inputs.size() > 1 ? node.inputs[1] : ir::kNoValue);
        const ir::Shape &s = g_.values[v].shape;
        if (idx && idx->size() == 1 && s.size() == 1 && s[0].isFixed()) {
          const int64_t i = (*idx)[0] < 0 ? (*idx)[0] + s[0].offset : (*idx)[0];
          if (i != taint_[v]) t = kNoTaint;
        }
      }
      if (t == kNoTaint) continue;
      taint = kWholeTaint;
      region = region < 0 ? r : uf_.join(region, r);
    }
    if (taint == kNoTaint) return;
    for (ir::ValueId out : node.outputs) {
      if (out == ir::kNoValue) continue;
      const ir::DType dt = g_.values[out].dtype;
      if (ir::isFloating(dt)) {
        markBad(region); // a size of a cut axis flows into data
      } else {
        taint_[out] = taint;
        taint_region_[out] = region;
      }
    }
  }

  /// The axis of input 0 of weight op `node` that its output's cut `axis` comes from; -1: none.
  int weightInputAxis(const ir::Node &node, int axis) const {
    if (node.domain.empty()) {
      if (node.op_type == "Cast" || node.op_type == "Identity") return axis;
      if (node.op_type == "Transpose")
        if (auto it = node.attrs.find("perm"); it != node.attrs.end())
          if (const auto *perm = std::get_if<std::vector<int64_t>>(&it->second))
            if (axis < static_cast<int>(perm->size())) return static_cast<int>((*perm)[axis]);
      return -1;
    }
    const std::string_view op = detail::atenName(node);
    if (op == "to" || op == "contiguous" || op == "detach" || op == "clone" || op == "_to_copy") return axis;
    const ir::Value &in = g_.values[node.inputs[0]];
    if (!in.shape_known || in.shape.size() != 2) return -1;
    if (op == "t" || op == "numpy_T") return 1 - axis;
    if (op == "transpose" || op == "permute") {
      const auto args = detail::atenArgs(node);
      auto d = op == "permute" ? detail::atenInts(g_, node, args, 1)
                               : std::optional<std::vector<int64_t>>(std::vector<int64_t>{1, 0});
      if (!d || d->size() != 2) return -1;
      if (op == "transpose") {
        auto d0 = detail::atenInt(g_, node, args, 1), d1 = detail::atenInt(g_, node, args, 2);
        if (!d0 || !d1 || (*d0 + 2) % 2 == (*d1 + 2) % 2) return -1; // transposing a matrix with itself
      }
      return static_cast<int>(((*d)[axis] + 2) % 2);
    }
    return -1;
  }

  /// Every reader of a weight must want it the same way (Note [sharding rules are conservative]).
  void resolveWeights() {
    auto resolve = [&](ir::ValueId v) -> int {
      const auto &d = demands_[v];
      if (d.empty()) return -1;
      bool same = std::all_of(d.begin(), d.end(), [&](const auto &x) { return x.first == d[0].first; });
      if (!same) {
        for (const auto &x : d) markBad(x.second);
        return -1;
      }
      int region = -1;
      for (const auto &x : d) region = uf_.join(region, x.second);
      region_[v] = region;
      return d[0].first;
    };
    for (auto n = static_cast<ir::NodeId>(g_.nodes.size()) - 1; n >= 0; --n) {
      if (!f_.param_only[n]) continue;
      const ir::Node &node = g_.nodes[n];
      int axis = -1, region = -1;
      for (ir::ValueId out : node.outputs) {
        if (out == ir::kNoValue) continue;
        const int a = resolve(out);
        if (a >= 0) sh_[out] = {a, false}, axis = a, region = region_[out];
      }
      const int in_axis = axis >= 0 && node.outputs.size() == 1 ? weightInputAxis(node, axis) : -1;
      if (axis >= 0 && in_axis < 0) {
        markBad(region);
        sh_[node.outputs[0]] = {};
      }
      split_[n] = in_axis >= 0;
      for (size_t i = 0; i < node.inputs.size(); ++i)
        if (node.inputs[i] != ir::kNoValue)
          demands_[node.inputs[i]].push_back({i == 0 ? in_axis : -1, i == 0 && in_axis >= 0 ? region : -1});
    }
    for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g_.values.size()); ++v) {
      if (g_.values[v].kind == ir::ValueKind::Intermediate) continue;
      const int a = resolve(v);
      if (a < 0) continue;
      if (g_.values[v].kind != ir::ValueKind::Parameter) markBad(region_[v]); // localGraph slices parameters only
      else sh_[v] = {a, false};
    }
  }

  void addCopiesAndSums() {
    std::map<ir::ValueId, std::set<ir::NodeId>> copies;
    for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g_.nodes.size()); ++n) {
      if (!split_[n] || f_.param_only[n]) continue;
      const ir::Node &node = g_.nodes[n];
      const auto bias = detail::rowParallelBias(node, !node.outputs.empty() && node.outputs[0] != ir::kNoValue &&
                                                          sh_[node.outputs[0]].partial);
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        const ir::ValueId v = node.inputs[i];
        if (v == ir::kNoValue || sh_[v].axis >= 0 || !f_.needs_grad[v] || (bias && *bias == i)) continue;
        // A summed value read by a split node would need a copy after the sum.
        if (sh_[v].partial) markBad(region_[v]);
        else copies[v].insert(n);
      }
    }
    for (const auto &[v, readers] : copies)
      collectives_.push_back({CollectiveKind::CopyToGroup, v, -1, {readers.begin(), readers.end()}});
    for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g_.values.size()); ++v)
      if (sh_[v].partial && !f_.users[v].empty())
        collectives_.push_back({CollectiveKind::SumOverGroup, v, -1, f_.users[v]});
    for (const auto &[key, readers] : gathers_)
      collectives_.push_back({CollectiveKind::GatherAxis, key.first, key.second, {readers.begin(), readers.end()}});
  }

  const ir::Graph &g_;
  const GraphFacts &f_;
  const std::set<ir::NodeId> &disabled_;
  UnionFind uf_;
  std::vector<ValueSharding> sh_;
  std::vector<int> region_;
  std::vector<int> taint_;
  std::map<ir::ValueId, int> taint_region_;
  std::vector<std::vector<std::pair<int, int>>> demands_; ///< per weight value: (axis or -1, region)
  std::vector<bool> split_;
  std::vector<bool> bad_; ///< per region root (a seed node)
  std::vector<ir::NodeId> seeds_;
  std::map<std::pair<ir::ValueId, int>, std::set<ir::NodeId>> gathers_;
  std::vector<Collective> collectives_;
};

} // namespace

std::optional<int64_t> cutSize(const ir::Dim &d) {
  if (!d.known) return std::nullopt;
  if (d.isFixed()) return d.offset;
  if (d.offset == 0 && d.batch_coeff >= 2) return d.batch_coeff;
  return std::nullopt;
}

std::string_view collectiveName(CollectiveKind k) {
  switch (k) {
  case CollectiveKind::CopyToGroup: return "copy";
  case CollectiveKind::SumOverGroup: return "sum";
  case CollectiveKind::GatherAxis: return "gather";
  }
  return "copy";
}

bool Analysis::validDegree(int t) const {
  if (t < 1) return false;
  return std::all_of(cut_sizes.begin(), cut_sizes.end(), [&](int64_t s) { return s % t == 0; });
}

std::vector<int> Analysis::degrees(int max_degree) const {
  std::vector<int> out;
  for (int t = 1; t <= max_degree; ++t)
    if (validDegree(t)) out.push_back(t);
  return out;
}

Expected<Analysis> analyze(const ir::Graph &g) {
  if (std::string err = g.verify(); !err.empty()) return Error{"tensor-parallel analysis: " + err};
  const GraphFacts facts(g);
  std::set<ir::NodeId> disabled;
  while (true) {
    Pass pass(g, facts, disabled);
    pass.run();
    std::vector<ir::NodeId> bad = pass.badSeeds();
    if (bad.empty()) return pass.result();
    disabled.insert(bad.begin(), bad.end());
  }
}

} // namespace rannc::sharding
