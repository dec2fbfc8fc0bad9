// The torch.export front end: a program saved by torch.export.save (`.pt2`)
// whose forward returns the scalar training loss, lowered to the IR with its
// ops kept as ATen operators (Note [torch.export lowering]).
#pragma once

#include <string>

#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::import {

/// Imports a `.pt2` archive: graph, parameters, and the inputs described by
/// the program's signature (the batch is its dynamic dimension 0).
Expected<ir::Graph> importTorchExport(const std::string &path);

} // namespace rannc::import
