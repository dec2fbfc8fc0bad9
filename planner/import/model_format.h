// Which front end reads a model file, and the one dispatch to it
// (Note [import layering]).
#pragma once

#include <functional>
#include <string>

#include "planner/import/audit.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::import {

// Note [import layering]
// Import has one concern per file. This file decides a model's format (by its
// name) and dispatches to the front end that reads it; it is torch-free, so
// the planner, the plan tools and the executor ask it too. The ONNX front end
// (onnx_import.h) is torch-free and called directly. The TorchScript and
// torch.export front ends need LibTorch (to read the archive, and to find
// shapes by running the graph), so they live in executor/frontend and reach
// this dispatch as TorchImporters, which the tool that links them passes in
// (executor/frontend/torch_import.h's torchImporters()); planner/ never links
// LibTorch, and a tool without them refuses those formats with a reason.

/// The model formats rannc imports.
enum class ModelFormat { Onnx, TorchScript, TorchExport };

/// The format of `path` by its extension (any case): .pt/.pth/.torchscript, .pt2, else ONNX.
ModelFormat modelFormat(const std::string &path);
/// True for a TorchScript archive's name (.pt, .pth, .torchscript, any case).
bool isTorchScriptPath(const std::string &path);
/// True for a torch.export program archive's name (.pt2, any case).
bool isTorchExportPath(const std::string &path);

/// The front ends that need LibTorch; an empty one refuses its format.
struct TorchImporters {
  /// A TorchScript archive; `data_dir`, when not empty, describes its inputs by their .npy files.
  std::function<Expected<ir::Graph>(const std::string &path, const std::string &data_dir)> torchscript;
  /// A torch.export program, which describes its own inputs; `audit` (may be null) gets its findings.
  std::function<Expected<ir::Graph>(const std::string &path, ImportAudit *audit)> torch_export;
};

/// Imports a model file by its format. `data_dir` (--data), when not empty,
/// describes a TorchScript archive's inputs and is refused for the formats
/// that declare their own. Without `torch` (the ONNX-only callers) LibTorch
/// archives are refused as such; a format `torch` has no importer for, as
/// not available in this tool.
Expected<ir::Graph> importModel(const std::string &path, const std::string &data_dir = "",
                                const TorchImporters *torch = nullptr);
/// importModel, with what the import found and fixed in `audit` (Note [import audit]).
Expected<ir::Graph> importModel(const std::string &path, const std::string &data_dir, const TorchImporters *torch,
                                ImportAudit &audit);

} // namespace rannc::import
