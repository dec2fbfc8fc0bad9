#include "executor/frontend/torch_import.h"

#include "executor/frontend/torch_export_import.h"
#include "executor/frontend/torchscript_import.h"

namespace rannc::import {

TorchImporters torchImporters() {
  return {importTorchScript, importTorchExport};
}

} // namespace rannc::import
