#include "planner/import/audit.h"

namespace rannc::import {

void ImportAudit::add(AuditAction action, const std::string &kind, const std::string &reason,
                      std::vector<std::string> names) {
  for (auto &f : findings)
    if (f.action == action && f.kind == kind) {
      f.names.insert(f.names.end(), names.begin(), names.end());
      return;
    }
  findings.push_back({action, kind, reason, std::move(names)});
}

const AuditFinding *ImportAudit::refusal() const {
  for (const auto &f : findings)
    if (f.action == AuditAction::Refused) return &f;
  return nullptr;
}

const char *auditActionName(AuditAction a) {
  switch (a) {
  case AuditAction::Refused: return "refused";
  case AuditAction::Fixed: return "fixed";
  case AuditAction::Warning: return "warning";
  }
  return "?";
}

namespace {

/// "kind (N): reason: a, b, c and N more".
std::string findingLine(const AuditFinding &f) {
  constexpr size_t kShown = 4;
  std::string line = f.kind;
  if (!f.names.empty()) line += " (" + std::to_string(f.names.size()) + ")";
  line += ": " + f.reason;
  if (f.names.empty()) return line;
  line += ": ";
  for (size_t i = 0; i < f.names.size() && i < kShown; ++i) line += (i ? ", " : "") + f.names[i];
  if (f.names.size() > kShown) line += " and " + std::to_string(f.names.size() - kShown) + " more";
  return line;
}

} // namespace

void printAudit(const ImportAudit &audit, std::ostream &out) {
  if (audit.findings.empty()) out << "audit: nothing found\n";
  for (const auto &f : audit.findings) out << "audit: " << auditActionName(f.action) << ": " << findingLine(f) << "\n";
}

void logAudit(const ImportAudit &audit, const std::string &prefix, std::ostream &log) {
  for (const auto &f : audit.findings)
    if (f.action != AuditAction::Refused)
      log << prefix << auditActionName(f.action) << ": " << findingLine(f) << "\n";
}

} // namespace rannc::import
