// Tensor (intra-layer) parallelism found in any imported graph, from the ops'
// semantics (sharding propagation, as XLA and Alpa do), not from names.
//
// Note [tensor parallel sharding]
// A t-way tensor-parallel group runs one stage on t devices. Every device
// runs the same local graph (SPMD); they differ only in which slice of each
// sharded parameter they hold (slice i on the group's i-th device). The
// analysis is independent of t: it says which axis of each value is cut, and
// which sizes are cut (attention heads, key/value heads, the feed-forward
// width, the vocabulary); a degree is valid when it divides every cut size.
// Megatron-LM's pairing is what propagation finds on a transformer:
//   - a matrix product whose weight is cut by output columns makes a
//     column-cut value; element-wise ops, reshapes that keep whole heads and
//     per-head attention keep it cut; a product with a row-cut weight turns it
//     into a partial sum, which one all-reduce (SumOverGroup, Megatron's g)
//     makes whole again. Its input, replicated, enters through CopyToGroup
//     (Megatron's f: identity forward, gradient all-reduce backward);
//   - an embedding gathered from a vocabulary-cut table is a partial sum,
//     and a cross-entropy loss over class-cut logits is computed on the
//     slices (Note [vocabulary parallelism] in vocab.cpp);
//   - everything else (norms, the residual stream) stays replicated.
//
// Note [batch-folded cuts]
// Exporters often fold the heads into the batch around attention: the
// dynamo ONNX exporter writes scaled_dot_product_attention's key transpose
// as [B,H,S,D] -> [B*H,S,D] -> transpose -> [B,H,D,S]. A cut of the heads
// then lies inside every batch row of the folded axis: each device holds,
// for every b, its H/t heads (rows b*H + i*H/t .. b*H + (i+1)*H/t), not one
// contiguous slice of the axis. A cut axis whose size depends on the batch
// (c*B, Dim::batch(c)) means exactly that: B consecutive groups of c, each
// cut into t contiguous slices; the batch alone (c = 1) is never cut. Its
// cut size is c (cutSize()), the local graph holds (c/t)*B, and reshapes
// (reshapeAxis) move such cuts in and out of the batch like any other. An
// all-gather along such an axis would concatenate the wrong rows, so a
// region that would need one is given up instead, and stage boundaries
// carry only whole values.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::sharding {

/// How one value lies over the devices of a group.
struct ValueSharding {
  int axis = -1;        ///< -1: every device holds all of it; else the axis cut into t equal slices
  bool partial = false; ///< every device holds a partial sum of it (before a SumOverGroup)

  bool replicated() const { return axis < 0 && !partial; }
  bool operator==(const ValueSharding &o) const { return axis == o.axis && partial == o.partial; }
};

/// The size a cut of `d` divides t ways: a fixed size, or c for a batch-folded
/// axis of size c*B (Note [batch-folded cuts]); nullopt where `d` cannot be cut.
std::optional<int64_t> cutSize(const ir::Dim &d);

/// The collectives a tensor-parallel local graph needs.
enum class CollectiveKind : uint8_t {
  CopyToGroup, ///< identity forward; all-reduce (sum) of the gradient backward (Megatron's f)
  SumOverGroup, ///< all-reduce (sum) forward; identity backward (Megatron's g)
  GatherAxis,  ///< all-gather along `axis` forward; this device's slice of the gradient backward
};

/// "copy", "sum", "gather".
std::string_view collectiveName(CollectiveKind k);

/// One collective, applied to `value` (its result replaces it for the readers listed).
struct Collective {
  CollectiveKind kind = CollectiveKind::SumOverGroup;
  ir::ValueId value = ir::kNoValue;
  int axis = -1;                  ///< GatherAxis only
  std::vector<ir::NodeId> readers; ///< the nodes that read the collective's result instead of `value`
};

/// The result of analyze(): per value, per node, the collectives, and the cut sizes.
struct Analysis {
  std::vector<ValueSharding> values; ///< per ValueId; parameters' entries are how they are sharded
  std::vector<bool> node_split;      ///< per NodeId: the node runs on slices (its work divides by t)
  std::vector<Collective> collectives;
  std::vector<int64_t> cut_sizes;    ///< every size cut t ways; a degree must divide each

  /// Whether anything is cut at all.
  bool any() const { return !cut_sizes.empty(); }
  /// Whether degree t divides every cut size (t = 1 always does).
  bool validDegree(int t) const;
  /// The valid degrees in [1, max_degree], ascending (1 first).
  std::vector<int> degrees(int max_degree) const;
  /// One line per node that is split or has a collective, for `rannc-plan import`.
  void print(const ir::Graph &g, std::ostream &os) const;
};

/// How node `n` runs under `a`: "column-parallel" (a product with a weight
/// cut by output columns), "row-parallel" (a product giving a partial sum),
/// "vocab-parallel embedding", "vocab-parallel loss", "partial", "split"
/// (runs on slices) or "whole".
std::string_view nodeRole(const ir::Graph &g, const Analysis &a, ir::NodeId n);

/// Finds the sharding of `g` (Note [tensor parallel sharding]); an all-replicated
/// Analysis (any() false) when nothing can be cut.
Expected<Analysis> analyze(const ir::Graph &g);

/// The graph each device of a `degree`-way group runs: parameters and values
/// with cut axes at 1/degree of their size, shape constants that name a cut
/// size rewritten, and one node of domain "rannc" per collective
/// ("TensorParallelCopy", "TensorParallelSum", "TensorParallelGather" with an
/// `axis` attribute) inserted before its readers; vocabulary-parallel lookups
/// and losses become "rannc" kernels of the same name (TensorParallelEmbedding,
/// TensorParallelCrossEntropy). degree 1 returns `g`.
Expected<ir::Graph> localGraph(const ir::Graph &g, const Analysis &a, int degree);

} // namespace rannc::sharding
