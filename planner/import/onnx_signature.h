// What a dynamo ONNX export says about the PyTorch model it came from: the
// export's graph signature (which inputs were parameters and buffers) and each
// node's FX node, and the rewrites that make the initializers the model's own
// parameters again (Note [export signature]).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "planner/import/audit.h"
#include "planner/support/status.h"

namespace onnx {
class ModelProto;
} // namespace onnx

namespace rannc::import {

/// The trainable names of a dynamo export, after restoreSignature.
struct ExportSignature {
  bool present = false;             ///< false: not a dynamo export (no signature); nothing was changed
  std::set<std::string> parameters; ///< PyTorch parameters that are initializers of the rewritten graph
  std::set<std::string> buffers;    ///< PyTorch buffers (persistent or not)
  /// Gathers that were `aten.embedding` with a `padding_idx`, by their output:
  /// that row of the table is not trained (Note [embedding padding row]).
  std::map<std::string, int64_t> embedding_padding;
};

/// Reads the export signature of `model` and rewrites the graph so that every
/// PyTorch parameter is an initializer of its own name read where PyTorch
/// reads it: merged parameters split, transposed copies re-tied. Refuses
/// (an Error with a one-line reason) what cannot be restored: parameters
/// folded into other weights, BatchNorm exported for inference. Deterministic,
/// so the weight loader applies it too. `dir` is the model's folder (external
/// data); `audit`, when given, receives the findings.
Expected<ExportSignature> restoreSignature(onnx::ModelProto &model, const std::string &dir, const std::string &where,
                                           ImportAudit *audit);

} // namespace rannc::import
