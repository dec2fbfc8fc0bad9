// The operator vocabulary rannc understands: ONNX default-domain ops, each
// with the opset range whose semantics the executor implements, and ATen
// nodes (isAten) from the TorchScript and torch.export front ends.
//
// Note [one op table]
// This table is the one list of ONNX ops. The importer rejects anything
// outside it; the executor's kernel registry, the FLOP rules
// (planner/cost/flops.cpp) and the autocast classes
// (planner/cost/precision.cpp) name ops from it only, and
// tests/executor/runtime/op_table_test.cpp fails when one of them drifts
// (a kernel, FLOP rule or autocast class for an op not here, or an op here
// without a kernel).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "planner/ir/ir.h"

namespace rannc::ir {

/// The domain the front ends give ATen and prim nodes (op types "aten::<name>", "prim::<name>").
inline constexpr std::string_view kAtenDomain = "aten";
/// True for an ATen or prim node (TorchScript, torch.export); false for ONNX nodes.
inline bool isAten(const Node &n) { return n.domain == kAtenDomain; }
/// True for an in-place ATen op (`add_`, `zero_`; not `__and__`): it writes its first input.
inline bool isInPlace(const Node &n) {
  const std::string &op = n.op_type;
  return isAten(n) && op.size() > 2 && op.back() == '_' && op[op.size() - 2] != '_';
}

/// The domain of the nodes rannc itself inserts (tensor-parallel collectives).
inline constexpr std::string_view kRanncDomain = "rannc";
/// The tensor-parallel collectives (Note [tensor parallel sharding] in
/// planner/sharding/sharding.h): identity forward / all-reduce backward, all-reduce
/// forward / identity backward, all-gather along attribute `axis` forward / slice backward.
inline constexpr std::string_view kTensorParallelCopy = "TensorParallelCopy", kTensorParallelSum = "TensorParallelSum",
                                  kTensorParallelGather = "TensorParallelGather";
/// Vocabulary parallelism's kernels (Note [vocabulary parallelism] in planner/sharding/vocab.cpp).
inline constexpr std::string_view kTensorParallelEmbedding = "TensorParallelEmbedding",
                                  kTensorParallelCrossEntropy = "TensorParallelCrossEntropy";
/// True for a node of the "rannc" domain (a collective: communication, no arithmetic).
inline bool isRannc(const Node &n) { return n.domain == kRanncDomain; }

struct OpInfo {
  std::string_view type;
  int64_t min_opset; ///< first opset whose semantics are implemented
  int64_t max_opset; ///< last opset checked (later ones are refused)
};

/// All supported ops, sorted by type.
const std::vector<OpInfo> &supportedOps();
/// The entry for `type` in the default domain, or nullptr.
const OpInfo *findOp(std::string_view type);

} // namespace rannc::ir
