// Named tensors in one file, in the safetensors layout: an 8-byte
// little-endian header length, a JSON header giving every tensor's dtype,
// shape and byte range, then the bytes. Checkpoints use it so that
// `rannc-exec export`, numpy and the safetensors package all read them
// without LibTorch.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, ir::Tensor>>;

/// A decoded tensor file.
struct TensorFile {
  std::map<std::string, ir::Tensor> tensors;
  std::map<std::string, std::string> metadata; ///< the header's "__metadata__"
};

/// Serializes `tensors` (names unique, stored in the given order) and string
/// `metadata` into one blob. Byte order is the host's (little-endian on every
/// machine rannc runs on, as safetensors requires).
std::string encodeTensors(const NamedTensors &tensors, const std::map<std::string, std::string> &metadata = {});

/// Parses a blob in the safetensors layout; `where` (a file name) prefixes
/// every error. Dtypes rannc lacks, overlapping or out-of-range byte ranges
/// and sizes that do not match the shape are errors.
Expected<TensorFile> decodeTensors(const std::string &bytes, const std::string &where);

/// safetensors' name of an element type ("F32", "I64", "BOOL", ...).
std::string safetensorsDType(ir::DType t);

} // namespace rannc::checkpoint
