// Trained weights back into the user's ONNX model: the original file with its
// initializers replaced by name. Torch-free (ONNX protobuf only).
#pragma once

#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::checkpoint {

/// Writes the ONNX model at `model_path` to `out`, atomically, with every
/// initializer named in `weights` replaced (its dtype and shape must match).
/// A weight that is no initializer of the model is an error. Returns the
/// number of initializers replaced.
Expected<int> writeOnnxWithWeights(const std::string &model_path, const std::map<std::string, ir::Tensor> &weights,
                                   const std::string &out);

/// Leaves `keys` (--drop-keys) out of a state dict's `weights`; a key it
/// does not hold is an error naming it (Note [TorchScript buffers] in onnx_export.cpp).
Status dropKeys(std::map<std::string, ir::Tensor> &weights, const std::vector<std::string> &keys);
/// The line that says so when a TorchScript model's state dict was written
/// without --drop-keys.
const char *torchScriptBuffersNote();

/// Writes the weights of a model (its path) as a state dict PyTorch's torch.load reads, at a path.
using StateDictWriter =
    std::function<Status(const std::string &, std::map<std::string, ir::Tensor>, const std::string &)>;

/// `rannc-exec export`: the weights of a checkpoint into its model.
struct ExportOptions {
  std::string checkpoint; ///< a checkpoint folder, or a folder of them (the newest complete one)
  std::string model;      ///< the model; empty: the path the checkpoint records
  std::string output;
  /// For a TorchScript or torch.export model, whose export is a state dict
  /// (LibTorch's writer, which this torch-free library cannot call itself).
  StateDictWriter write_state;
  std::vector<std::string> drop_keys; ///< left out of the state dict (--drop-keys)
};

/// Checks that `model` is the model the checkpoint was trained from (SHA-256)
/// and writes `output`: an ONNX model with the trained initializers, or for a
/// TorchScript or torch.export model a state dict; one line to `log`.
Status exportCheckpoint(const ExportOptions &o, std::ostream &log);

} // namespace rannc::checkpoint
