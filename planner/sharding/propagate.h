// Per-op sharding rules: given how each input of a node lies over a group,
// how its outputs lie (Note [tensor parallel sharding]). Internal to
// rannc_sharding; analyze() drives them over the graph.
//
// Note [sharding rules are conservative]
// A rule says `ok = false` whenever it cannot prove that running the node on
// slices gives the slice of the whole result: an op it does not know, an
// attribute or shape it cannot read, a reduction or a softmax over the cut
// axis, a slice along it. The caller then makes the inputs whole (or gives up
// cutting the region), so an unknown op never yields a wrong local graph.
// Weights (parameters and what is computed from parameters alone) have no
// sharding of their own: a rule asks for the weight cut the way it needs it
// (`cut_weights`), and the analysis later checks that every reader of a
// weight asks for the same.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "planner/ir/aten_arg_list.h"
#include "planner/ir/ir.h"
#include "planner/sharding/sharding.h"
#include "planner/support/status.h"

namespace rannc::sharding::detail {

/// One input of a node as a rule sees it.
struct OpInput {
  ir::ValueId id = ir::kNoValue;
  const ir::Value *value = nullptr; ///< nullptr for an omitted optional input
  ValueSharding sh;                 ///< partial inputs arrive summed, so never partial here
  bool weight = false;              ///< a parameter or computed from parameters/constants alone
};

/// What a rule decided.
struct OpResult {
  bool ok = true;
  std::vector<ValueSharding> outs;                ///< per node output
  std::vector<std::pair<size_t, int>> cut_weights; ///< (input index, axis) of weights to cut
  bool column = false;                             ///< a column-parallel product (the region's seed)
  bool seed = false;      ///< a vocabulary-parallel lookup (a region's seed, Note [vocabulary parallelism])
  bool runs_split = false; ///< runs on slices though its outputs are whole (a vocabulary-parallel loss)
};

/// A rule's answer when it cannot prove the local result.
inline OpResult fail() {
  OpResult r;
  r.ok = false;
  return r;
}
/// Every output of `n` lying as `s`.
inline OpResult allOutputs(const ir::Node &n, ValueSharding s) {
  OpResult r;
  r.outs.assign(n.outputs.size(), s);
  return r;
}
/// The rank of an input; -1 when omitted or unknown.
inline int rankOf(const OpInput &in) {
  return in.value && in.value->shape_known ? static_cast<int>(in.value->shape.size()) : -1;
}
/// A possibly negative axis of a rank-`rank` tensor, made non-negative.
inline int normAxis(int64_t axis, int rank) { return static_cast<int>(axis < 0 ? axis + rank : axis); }
/// No input but the first is cut (ops whose other inputs are scales, sizes or axes).
inline bool onlyFirstCut(const std::vector<OpInput> &in) {
  for (size_t i = 1; i < in.size(); ++i)
    if (in[i].sh.axis >= 0) return false;
  return true;
}

/// The rule for node `n` with inputs `in`; `seed_allowed`: a matrix product
/// of a replicated input and a weight may cut the weight by output columns.
OpResult propagate(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in, bool seed_allowed);

/// Whether `n` could start a column-parallel region (a matrix product of an
/// activation and a 2-D weight), whatever its inputs' shardings.
bool columnCandidate(const ir::Node &n, const std::vector<OpInput> &in);

/// Input `i` of `n` is a shape operand that localGraph rewrites when the
/// output is cut (Reshape's and Expand's target shape).
bool rewrittenShapeInput(const ir::Node &n, size_t i);

/// The output axis a reshape of `in` to `out` moves cut axis `a` to; nullopt
/// when the cut does not stay on whole rows of one output axis (Note
/// [reshapes of a cut axis]; either axis may be batch-folded).
std::optional<int> reshapeAxis(const ir::Shape &in, const ir::Shape &out, int a);

/// Expand's target shape on each device when output axis `axis` is cut
/// (1 where the input's size is kept); nullopt when it cannot be a constant.
std::optional<std::vector<int64_t>> localExpandTarget(const ir::Shape &in, const ir::Shape &out);

/// Reshape's target shape on each device for output `out` (its cut axis
/// already at the local size): every fixed size, -1 for the one batch-dependent
/// dimension; nullopt when more than one dimension is not fixed.
std::optional<std::vector<int64_t>> localReshapeTarget(const ir::Shape &out);

/// Whether an input of `g` has a size other than the batch unknown (the
/// graph's shapes were then found at a stand-in size, Note [target shapes of
/// unknown inputs] in sharding.cpp).
bool inputSizesUnknown(const ir::Graph &g);

/// For a cut ONNX Reshape or Expand (`n`, its output cut under `values`)
/// whose target the model computes at run time: the local size to write at
/// the output's cut axis (nullopt: keep the entry, it is already local or -1),
/// as the run-time target's one patched entry; an Error when the target
/// cannot be followed (Note [target shapes of unknown inputs]).
Expected<std::optional<int64_t>> runTimeTargetPatch(const ir::Graph &g, const std::vector<ValueSharding> &values,
                                                    const ir::Node &n, int degree);

/// The integer contents of a constant value (an initializer or a Constant
/// node's output); nullopt when it is not a known constant.
std::optional<std::vector<int64_t>> constantInts(const ir::Graph &g, ir::ValueId v);

/// ATen arguments (Note [aten argument encoding]), decoded in planner/ir.
using ir::AtenArg;
using ir::atenArgs;
/// Argument i as a known integer (a constant, or a constant input).
std::optional<int64_t> atenInt(const ir::Graph &g, const ir::Node &n, const std::vector<AtenArg> &args, size_t i);
/// Argument i as a known integer list.
std::optional<std::vector<int64_t>> atenInts(const ir::Graph &g, const ir::Node &n, const std::vector<AtenArg> &args,
                                             size_t i);
/// "linear" for "aten::linear"; empty for other domains' names.
std::string_view atenName(const ir::Node &n);
/// The argument holding the target shape of aten::view/reshape/expand, which localGraph rewrites.
std::optional<size_t> atenShapeArg(const ir::Node &n);
/// The bias input of a row-parallel aten::linear (output partial): localGraph
/// moves it after the sum, so it is added once (Note [row-parallel bias]).
std::optional<size_t> rowParallelBias(const ir::Node &n, bool output_partial);
/// A lookup in a weight table that may be cut by rows: the table cut, the
/// output partial (Note [vocabulary parallelism]); nullopt for other nodes.
std::optional<OpResult> vocabLookupSeed(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in);
/// A cross-entropy loss whose logits are cut along the class axis: whole
/// loss, computed on slices (and the log-softmax of a log-softmax +
/// negative-log-likelihood pair, passing the cut logits on); nullopt for
/// other nodes and shardings.
std::optional<OpResult> vocabLoss(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in);

/// What node `id` is under the sharding `values`: a vocabulary-parallel
/// lookup, a vocabulary-parallel loss, or neither.
enum class VocabRole : uint8_t { None, Lookup, Loss, LossLogSoftmax };
VocabRole vocabRole(const ir::Graph &g, const std::vector<ValueSharding> &values, ir::NodeId id);
/// Makes node `id` of local graph `g` (values as in the whole graph: same
/// ids) its "rannc" kernel when it has a VocabRole: TensorParallelEmbedding
/// (table, ids), TensorParallelCrossEntropy (logits, target; attributes
/// `reduction` and `ignore_index`); the log-softmax before a
/// negative-log-likelihood loss becomes an Identity of the logits.
Status rewriteVocabOp(ir::Graph &g, ir::NodeId id, const std::vector<ValueSharding> &values);

/// The rule for ATen node `n` (propagate() for the "aten" domain).
OpResult propagateAten(const ir::Graph &g, const ir::Node &n, const std::vector<OpInput> &in, bool seed_allowed);

} // namespace rannc::sharding::detail
