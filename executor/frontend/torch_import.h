// The entry point of the LibTorch front ends: the TorchScript and
// torch.export importers, handed to import::importModel by the tools that
// link LibTorch (Note [import layering] in planner/import/model_format.h).
#pragma once

#include "planner/import/model_format.h"

namespace rannc::import {

/// importTorchScript and importTorchExport, for import::importModel.
TorchImporters torchImporters();

} // namespace rannc::import
