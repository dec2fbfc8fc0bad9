// The torch.export front end: a program saved by torch.export.save (`.pt2`)
// whose forward returns the scalar training loss, lowered to the IR with its
// ops kept as ATen operators (Note [torch.export lowering]).
#pragma once

#include <string>

#include "planner/import/audit.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::import {

/// Imports a `.pt2` archive: graph, parameters, and the inputs described by
/// the program's signature (the batch is its dynamic dimension 0). `audit`,
/// when given, records what the lowering found and did (Note [import audit]).
Expected<ir::Graph> importTorchExport(const std::string &path, ImportAudit *audit = nullptr);

} // namespace rannc::import
