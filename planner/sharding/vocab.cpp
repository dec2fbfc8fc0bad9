// Vocabulary parallelism: an embedding lookup in a table cut by rows, and a
// cross-entropy loss over logits cut by classes (Megatron-LM's
// VocabParallelEmbedding and vocab-parallel cross entropy).
//
// Note [vocabulary parallelism]
// Device i of a t-way group holds rows [i*V/t, (i+1)*V/t) of a table cut by
// rows. A lookup (ONNX Gather along axis 0, aten::embedding) of ids that are
// the same on every device becomes TensorParallelEmbedding on each: it looks
// up the ids its slice holds, zeroes the rows of the others, and gives a
// partial sum, which one SumOverGroup makes whole (every row comes from
// exactly one device, so the sum is exact). A loss over logits cut by
// classes (ONNX SoftmaxCrossEntropyLoss, aten::cross_entropy_loss, or a
// LogSoftmax over the classes read only by a NegativeLogLikelihoodLoss /
// aten::nll_loss, which then passes the logits on unchanged) becomes
// TensorParallelCrossEntropy: the local maximum and the local sum of
// exponentials are combined over the group, the target's logit is picked by
// the device that holds it, and every device ends with the whole loss; its
// gradient is local (softmax minus one-hot, on the device's slice). The
// local graph is the same on every device, so neither node names its
// device's first row: the kernels read it from their group at run time (the
// device's position in the group times the local row or class count).
// A table read by a lookup and by the output layer (tied embeddings) is cut
// by rows for both, which is what the column-parallel output layer wants
// too; resolveWeights() joins the two regions.
//
// Note [which tables are cut]
// Cutting a table saves (1 - 1/t) of its rows on each device, and costs one
// all-reduce of the lookup's result, as large as a row-parallel product's.
// Only tables of at least as many rows as columns are cut: a vocabulary is
// (Megatron cuts the word embedding only), position and token-type tables
// are not; their row counts would also limit the degrees (a BERT's two
// token types would allow only t = 2).
#include <cstdint>
#include <variant>

#include "planner/ir/aten_args.h"
#include "planner/ir/op_set.h"
#include "planner/sharding/propagate.h"

namespace rannc::sharding::detail {

namespace {

namespace aa = ir::aten_args;

int64_t onnxInt(const ir::Node &n, const char *name, int64_t dflt) {
  auto it = n.attrs.find(name);
  if (it == n.attrs.end()) return dflt;
  if (const auto *v = std::get_if<int64_t>(&it->second)) return *v;
  return dflt;
}

/// A constant ATen argument that is false, 0 or 0.0.
bool isZero(const ir::AttrValue *c) {
  if (!c) return false;
  if (const auto *i = std::get_if<int64_t>(c)) return *i == 0;
  if (const auto *d = std::get_if<double>(c)) return *d == 0.0;
  return false;
}

bool isInteger(ir::DType t) { return t == ir::DType::I64 || t == ir::DType::I32; }

/// The (table, ids) node inputs of a lookup along the table's rows; nullopt for other nodes.
std::optional<std::pair<int, int>> lookupInputs(const ir::Graph &g, const ir::Node &n) {
  // A padding row's gradient stays zero (Note [embedding padding row] in
  // planner/import/onnx_signature.cpp; aten::embedding's padding_idx below):
  // the local graph would have to name its device's row.
  if (n.domain.empty() && n.op_type == "Gather" && n.inputs.size() == 2 && onnxInt(n, "axis", 0) == 0)
    return onnxInt(n, "padding_idx", -1) < 0 ? std::optional<std::pair<int, int>>{{0, 1}} : std::nullopt;
  if (atenName(n) != "embedding") return std::nullopt;
  const std::vector<AtenArg> args = atenArgs(n);
  if (args.size() < 2 || args[0].inputs.size() != 1 || args[1].inputs.size() != 1) return std::nullopt;
  if (auto pad = atenInt(g, n, args, 2); args.size() > 2 && (!pad || *pad >= 0)) return std::nullopt;
  for (size_t flag : {3, 4}) // scale_grad_by_freq, sparse
    if (args.size() > flag && !isZero(args[flag].constant)) return std::nullopt;
  return {{args[0].inputs[0], args[1].inputs[0]}};
}

/// A loss over class axis 1: (logits, target) node inputs, ignore_index and reduction.
struct LossForm {
  int logits = -1, target = -1;
  int64_t ignore_index = -100;
  std::string reduction = "mean";
  bool log_probs = false; ///< a negative-log-likelihood loss: `logits` is a log-softmax's output
};

std::optional<LossForm> lossForm(const ir::Graph &g, const ir::Node &n) {
  LossForm f;
  if (n.domain.empty() && n.op_type == "SoftmaxCrossEntropyLoss") {
    if (n.inputs.size() > 2 && n.inputs[2] != ir::kNoValue) return std::nullopt; // class weights
    if (n.outputs.size() > 1 && n.outputs[1] != ir::kNoValue) return std::nullopt; // log-probabilities
    f.logits = 0, f.target = 1;
    f.ignore_index = onnxInt(n, "ignore_index", -100);
    if (auto it = n.attrs.find("reduction"); it != n.attrs.end()) {
      const auto *s = std::get_if<std::string>(&it->second);
      if (!s) return std::nullopt;
      f.reduction = *s;
    }
    if (f.reduction != "mean" && f.reduction != "sum" && f.reduction != "none") return std::nullopt;
    if (n.attrs.count("ignore_index") == 0) f.ignore_index = INT64_MIN; // none ignored
    return f;
  }
  if (n.domain.empty() && n.op_type == "NegativeLogLikelihoodLoss") {
    if (n.inputs.size() > 2 && n.inputs[2] != ir::kNoValue) return std::nullopt; // class weights
    f.logits = 0, f.target = 1;
    f.ignore_index = n.attrs.count("ignore_index") ? onnxInt(n, "ignore_index", -100) : INT64_MIN;
    if (auto it = n.attrs.find("reduction"); it != n.attrs.end()) {
      const auto *s = std::get_if<std::string>(&it->second);
      if (!s) return std::nullopt;
      f.reduction = *s;
    }
    if (f.reduction != "mean" && f.reduction != "sum" && f.reduction != "none") return std::nullopt;
    f.log_probs = true;
    return f;
  }
  const std::string_view op = atenName(n);
  const bool nll = op == "nll_loss" || op == "nll_loss_nd" || op == "nll_loss2d";
  if (op != "cross_entropy_loss" && !nll) return std::nullopt;
  // cross_entropy_loss(self, target, weight, reduction, ignore_index, label_smoothing);
  // nll_loss(self, target, weight, reduction, ignore_index)
  const std::vector<AtenArg> args = atenArgs(n);
  if (args.size() < 2 || args[0].inputs.size() != 1 || args[1].inputs.size() != 1) return std::nullopt;
  if (args.size() > 2 && args[2].kind != aa::kConstNone) return std::nullopt;
  if (args.size() > 5 && args[5].kind != aa::kConstNone && !isZero(args[5].constant)) return std::nullopt; // smoothing
  static const char *kReductions[] = {"none", "mean", "sum"};
  const auto red = args.size() > 3 ? atenInt(g, n, args, 3) : std::optional<int64_t>(1);
  const auto ign = args.size() > 4 ? atenInt(g, n, args, 4) : std::optional<int64_t>(-100);
  if (!red || *red < 0 || *red > 2 || !ign) return std::nullopt;
  f.logits = args[0].inputs[0], f.target = args[1].inputs[0];
  f.reduction = kReductions[*red];
  f.ignore_index = *ign;
  f.log_probs = nll;
  return f;
}

/// The axis a log-softmax normalizes over, and its input; nullopt for other nodes.
std::optional<std::pair<int, int>> logSoftmaxAxis(const ir::Graph &g, const ir::Node &n) {
  if (n.inputs.empty() || n.inputs[0] == ir::kNoValue || !g.values[n.inputs[0]].shape_known) return std::nullopt;
  const int r = static_cast<int>(g.values[n.inputs[0]].shape.size());
  if (n.domain.empty() && n.op_type == "LogSoftmax") {
    const int axis = normAxis(onnxInt(n, "axis", g.opset >= 13 ? -1 : 1), r);
    if (g.opset < 13 && axis != r - 1) return std::nullopt; // before 13: every axis from `axis` on
    return {{axis, 0}};
  }
  if (atenName(n) != "log_softmax") return std::nullopt;
  const std::vector<AtenArg> args = atenArgs(n);
  if (args.size() < 2 || args[0].inputs.size() != 1) return std::nullopt;
  if (args.size() > 2 && args[2].kind != aa::kConstNone) return std::nullopt; // a dtype
  auto d = atenInt(g, n, args, 1);
  if (!d) return std::nullopt;
  return {{normAxis(*d, r), args[0].inputs[0]}};
}

/// Whether `n` is a log-softmax over axis 1 whose one reader is a
/// negative-log-likelihood loss reading it as its log-probabilities: the two
/// together are a cross entropy of the log-softmax's input.
bool logSoftmaxOfLoss(const ir::Graph &g, const ir::Node &n) {
  auto ax = logSoftmaxAxis(g, n);
  if (!ax || ax->first != 1 || n.outputs.size() != 1 || n.outputs[0] == ir::kNoValue || n.outputs[0] == g.loss)
    return false;
  const ir::ValueId out = n.outputs[0];
  const ir::Node *reader = nullptr;
  for (const ir::Node &m : g.nodes)
    for (ir::ValueId in : m.inputs)
      if (in == out) {
        if (reader && reader != &m) return false;
        reader = &m;
      }
  if (!reader) return false;
  auto f = lossForm(g, *reader);
  return f && f->log_probs && reader->inputs[f->logits] == out && reader->inputs[f->target] != out;
}

} // namespace

std::optional<OpResult> vocabLookupSeed(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in) {
  auto io = lookupInputs(g, n);
  if (!io || n.outputs.size() != 1 || n.outputs[0] == ir::kNoValue) return std::nullopt;
  const OpInput &table = in[io->first], &ids = in[io->second];
  // Only a parameter itself: a cut buffer would mark the region bad, and
  // through its readers (rotary tables) the attention joined to it.
  if (!table.value || !ids.value || table.value->kind != ir::ValueKind::Parameter || ids.weight ||
      rankOf(table) != 2 || !ir::isFloating(table.value->dtype) || !isInteger(ids.value->dtype) ||
      table.sh.axis >= 0 || ids.sh.axis >= 0)
    return std::nullopt;
  // A table of fewer rows than columns (positions, token types) is not
  // worth cutting (Note [which tables are cut]).
  const ir::Dim &rows = table.value->shape[0], &cols = table.value->shape[1];
  if (!rows.isFixed() || !cols.isFixed() || rows.offset < 2 || rows.offset < cols.offset) return std::nullopt;
  OpResult r = allOutputs(n, ValueSharding{-1, true});
  r.cut_weights.push_back({static_cast<size_t>(io->first), 0});
  r.seed = true;
  return r;
}

std::optional<OpResult> vocabLoss(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in) {
  if (auto ax = logSoftmaxAxis(g, n)) { // its loss takes the cut logits: the log-softmax passes them on
    const OpInput &x = in[ax->second];
    if (x.sh.axis != 1 || !logSoftmaxOfLoss(g, n)) return std::nullopt;
    for (size_t i = 0; i < in.size(); ++i)
      if (static_cast<int>(i) != ax->second && in[i].sh.axis >= 0) return std::nullopt;
    OpResult r = allOutputs(n, ValueSharding{1, false});
    return r;
  }
  auto f = lossForm(g, n);
  if (!f || n.outputs.empty() || n.outputs[0] == ir::kNoValue) return std::nullopt;
  const OpInput &x = in[f->logits], &y = in[f->target];
  if (!x.value || !y.value || rankOf(x) < 2 || x.sh.axis != 1 || y.sh.axis >= 0 || !isInteger(y.value->dtype))
    return std::nullopt;
  if (f->log_probs) { // only the log-softmax of the pattern above passes cut logits on
    const ir::NodeId p = x.value->producer;
    if (p < 0 || !logSoftmaxOfLoss(g, g.nodes[p])) return std::nullopt;
  }
  for (size_t i = 0; i < in.size(); ++i)
    if (static_cast<int>(i) != f->logits && in[i].sh.axis >= 0) return std::nullopt;
  OpResult r = allOutputs(n, {});
  r.runs_split = true;
  return r;
}

VocabRole vocabRole(const ir::Graph &g, const std::vector<ValueSharding> &values, ir::NodeId id) {
  const ir::Node &n = g.nodes[id];
  if (auto io = lookupInputs(g, n))
    if (n.outputs.size() == 1 && n.outputs[0] != ir::kNoValue && values[n.outputs[0]].partial &&
        values[n.inputs[io->first]].axis == 0)
      return VocabRole::Lookup;
  if (auto f = lossForm(g, n))
    if (values[n.inputs[f->logits]].axis == 1) return VocabRole::Loss;
  if (auto ax = logSoftmaxAxis(g, n))
    if (values[n.inputs[ax->second]].axis == 1 && logSoftmaxOfLoss(g, n)) return VocabRole::LossLogSoftmax;
  return VocabRole::None;
}

Status rewriteVocabOp(ir::Graph &g, ir::NodeId id, const std::vector<ValueSharding> &values) {
  ir::Node &n = g.nodes[id];
  switch (vocabRole(g, values, id)) {
  case VocabRole::None: return Status::success();
  case VocabRole::LossLogSoftmax: { // its loss reads the logits themselves
    n.inputs = {n.inputs[logSoftmaxAxis(g, n)->second]};
    n.op_type = "Identity";
    n.domain.clear();
    n.attrs.clear();
    return Status::success();
  }
  case VocabRole::Lookup: {
    const auto io = *lookupInputs(g, n);
    n.inputs = {n.inputs[io.first], n.inputs[io.second]};
    n.op_type = std::string(ir::kTensorParallelEmbedding);
    n.attrs.clear();
    break;
  }
  case VocabRole::Loss: {
    const LossForm f = *lossForm(g, n);
    n.inputs = {n.inputs[f.logits], n.inputs[f.target]};
    n.outputs.resize(1);
    n.op_type = std::string(ir::kTensorParallelCrossEntropy);
    n.attrs.clear();
    if (f.ignore_index != INT64_MIN) n.attrs["ignore_index"] = f.ignore_index;
    n.attrs["reduction"] = f.reduction;
    break;
  }
  }
  n.domain = std::string(ir::kRanncDomain);
  return Status::success();
}

} // namespace rannc::sharding::detail
