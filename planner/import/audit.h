// The import audit: what an importer found in a model file that would make
// rannc train something other than what PyTorch trains, and what it did about
// it (Note [import audit]). Torch-free; every front end fills one.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace rannc::import {

// Note [import audit]
// Exporters write the model they were asked to write, which is not always the
// model the user trains: the dynamo ONNX exporter writes BatchNorm in
// inference mode and folds weights into new constants, torch.export lifts
// buffers and constants beside the parameters. An importer that took such a
// file at its word would train a different model silently. Each front end
// therefore records, per kind of problem, what it found and what it did:
// refused (the import fails with the finding's one-line reason), fixed (the
// model now trains as PyTorch trains it; the user is told), or a warning
// (training may differ; the user decides). `rannc-plan import` prints the
// audit; planning and training print its fixes and warnings.

/// What the importer did about one finding.
enum class AuditAction { Refused, Fixed, Warning };

/// One kind of problem, with the names of what it concerns.
struct AuditFinding {
  AuditAction action;
  std::string kind;               ///< short, stable: "inference-mode BatchNorm", "folded constant"
  std::string reason;             ///< one line: what it means and what to do about it
  std::vector<std::string> names; ///< the values or nodes concerned, in model order
};

/// Everything an import found; empty when the file is taken at its word.
struct ImportAudit {
  std::vector<AuditFinding> findings;

  /// Records a finding; names are appended to an existing finding of the same action and kind.
  void add(AuditAction action, const std::string &kind, const std::string &reason,
           std::vector<std::string> names = {});
  /// The first refusal, or nullptr.
  const AuditFinding *refusal() const;
};

/// "refused", "fixed" or "warning".
const char *auditActionName(AuditAction a);

/// One line per finding ("audit: fixed: kind (N): reason: a, b, c ..."), or
/// "audit: nothing found" for an empty audit.
void printAudit(const ImportAudit &audit, std::ostream &out);

/// The fixes and warnings only, each line prefixed with `prefix` (for a tool's log).
void logAudit(const ImportAudit &audit, const std::string &prefix, std::ostream &log);

} // namespace rannc::import
