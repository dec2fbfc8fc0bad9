// The file cost source: measured cost tables saved as a protobuf profile
// (proto/profile.proto) and loaded back for planning elsewhere.
#pragma once

#include <string>

#include "planner/cost/cost.h"
#include "planner/support/status.h"

namespace rannc::cost {

struct ProfileKey {
  std::string model_sha256;
  std::string device; ///< device preset name, e.g. "cpu"
  int threads = 1;
  std::string precision = "fp32"; ///< what the ops ran in (Note [autocast dtypes])
};

/// Writes `table` (atomically) with its key.
Status writeProfile(const CostTable &table, const ProfileKey &key, const std::string &path);
/// Reads a profile; a different model hash, device, thread count or precision than
/// `expect` is an error saying which.
Expected<CostTable> readProfile(const std::string &path, const ProfileKey &expect);

} // namespace rannc::cost
