// File helpers shared by the tools: whole-file reads and atomic writes, so a
// failed command never leaves a half-written plan or profile behind.
#pragma once

#include <string>

#include "planner/support/status.h"

namespace rannc {

/// The whole contents of `path`, or an error naming it.
Expected<std::string> readFile(const std::string &path);
/// Writes `data` to `path` through a temporary file in the same folder and a
/// rename, so readers see either the old file or the complete new one.
Status writeFileAtomic(const std::string &path, const std::string &data);
/// The lowercase extension of `path` including the dot (".pbtxt"), or "".
std::string extensionOf(const std::string &path);

} // namespace rannc
