// The plan's record of its model: format, inputs, and the identity of the
// model file and of the external data files it reads weights from.
#pragma once

#include <string>

#include "planner/ir/ir.h"
#include "planner/support/status.h"
#include "proto/plan.pb.h"

namespace rannc::plan {

/// "onnx", "torchscript" or "torch.export", by the file's extension.
std::string modelFormat(const std::string &path);

/// The ModelRef of `path` as imported into `g`: format, the per-sample input
/// description (`inputs_from` says where it came from), and the SHA-256 of the
/// model file and of each of g.external_data present next to it.
Expected<proto::ModelRef> describeModel(const std::string &path, const ir::Graph &g, const std::string &inputs_from);

/// Note [model identity]
/// A plan names its model by content: the SHA-256 of the model file and of
/// each external data file next to it that existed at planning (an ONNX
/// model's weights beyond 2 GB must live there). A file that changed or went
/// missing since is a different model: `check` reports it, and rannc-exec
/// stops before any step. Only rank 0 reads and hashes the files; the
/// start-up agreement (docs/architecture.md, "Errors") stops the others.

/// A plan's own model.path (used when no --model is given) names a model
/// file by its extension, also after symlinks: never /dev/zero or /etc/shadow.
Status checkRecordedModelPath(const std::string &path);

/// Note [plan model path]
/// A plan records its model's path relative to the plan file's folder, so a
/// plan and its model move together and run from any working folder. Read
/// back (no --model given), the path is resolved against the plan's folder
/// and must stay inside it (insideFolder: no `..`, no absolute path, no
/// symlink out): a plan from elsewhere cannot make `check` or rannc-exec read
/// and hash a file outside its folder. A user who trusts the plan allows
/// that with --allow-model-outside-plan; --model PATH names the model
/// outright. Plans written before this recorded the path relative to the
/// planning folder; they need one of the two flags, and the error says so.

/// The model.path to record for `model` in a plan written to `plan_file`:
/// relative to the plan's folder (Note [plan model path]).
std::string recordedModelPath(const std::string &model, const std::string &plan_file);

/// A plan read from `from` and written to `to` (convert, check --update)
/// keeps naming the same model: its relative model.path is rebased.
void rebaseModelPath(proto::Plan &plan, const std::string &from, const std::string &to);

/// The model file a plan at `plan_file` names when no --model is given:
/// `recorded` resolved against the plan's folder, refused when it leaves the
/// folder unless `allow_outside`, and checked by checkRecordedModelPath.
Expected<std::string> resolveRecordedModelPath(const std::string &recorded, const std::string &plan_file,
                                               bool allow_outside);

/// Whether `path` (and the external data files `ref` lists, next to it) hold
/// the bytes `ref` was made from; the error says which file changed.
Status verifyModelFiles(const std::string &path, const proto::ModelRef &ref);

} // namespace rannc::plan
