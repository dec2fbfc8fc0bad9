// A torch.export program archive (`.pt2`, written by torch.export.save): the
// serialized ExportedProgram (JSON) and its weights. The importer
// (executor/frontend) reads the program, the runtime each stage's weights.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>

#include "planner/support/status.h"

namespace rannc::runtime {

struct Pt2Archive {
  nlohmann::json program; ///< models/<name>.json: graph_module, range_constraints, ...
  /// Parameters, buffers and constant tensors by state_dict name. A tensor
  /// stored once under several names (tied weights) is listed under each.
  std::map<std::string, torch::Tensor> tensors;
  /// For each name, the archive file holding its bytes (equal for tied names).
  std::map<std::string, std::string> storage_of;
};

/// Reads `path` and its tensors: those named in `only`, or every one when it is
/// null (a rank reads just its stage's). Errors name the file and the entry.
Expected<Pt2Archive> readPt2Archive(const std::string &path, const std::set<std::string> *only = nullptr);

/// The state_dict names of the program's non-persistent buffers
/// (register_buffer(..., persistent=False): a rotary inv_freq, BERT's
/// position_ids). The module's own state_dict leaves them out, and so must a
/// state dict that load_state_dict(strict=True) is to accept.
std::set<std::string> nonPersistentBuffers(const nlohmann::json &program);

/// c10's ScalarType for torch.export's serialized dtype code (schema.py's ScalarType).
Expected<c10::ScalarType> scalarTypeFromExport(int64_t code);

} // namespace rannc::runtime
