// The operator vocabulary rannc understands: ONNX default-domain ops, each
// with the opset range whose semantics the executor implements. The importer
// rejects anything outside it; the executor's kernel table must cover exactly
// this set (a unit test checks both directions).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace rannc::ir {

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
