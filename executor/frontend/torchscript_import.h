// The TorchScript front end: a torch.jit.trace'd or scripted module whose
// forward returns the scalar training loss, lowered to the IR with its ops kept
// as ATen operators (Note [torchscript lowering]).
//
// Unlike the ONNX importer this library needs LibTorch (to read the archive)
// and the runtime (shapes are found by running the graph), so it is a library
// of its own that only rannc-plan links; the rest of the planner stays torch-free.
#pragma once

#include <string>

#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::import {

/// Name of the archive entry describing the data inputs (torch.jit.save's
/// `_extra_files`): {"<input>": {"dtype": "int64", "shape": [16]}, ...}, shapes
/// without the batch dimension, in forward's argument order.
inline constexpr const char *kTorchScriptInputsFile = "rannc_inputs.json";

/// Imports a TorchScript archive (`.pt`). Its inputs are described by the
/// archive's kTorchScriptInputsFile or, when `data_dir` is not empty, by the
/// training data there (one <input>.npy each, first dimension samples).
/// Errors name the file and, for an unsupported construct, the node.
Expected<ir::Graph> importTorchScript(const std::string &path, const std::string &data_dir = "");

} // namespace rannc::import
