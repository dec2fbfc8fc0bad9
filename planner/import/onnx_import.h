// Front ends: a model file becomes an ir::Graph. Weights stay in the model
// file; the executor loads the ones its stage needs with loadModelWeights.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::import {

/// Imports a model by extension (.onnx; TorchScript .pt is not supported yet).
Expected<ir::Graph> importModel(const std::string &path);

/// Imports a serialized ONNX ModelProto; `where` names it in error messages.
Expected<ir::Graph> importOnnxBytes(const std::string &bytes, const std::string &where);

/// Reads the named initializers (parameters and constants) from a model file.
/// A name that is not an initializer of the model is an error.
Expected<std::map<std::string, ir::Tensor>> loadModelWeights(const std::string &path,
                                                             const std::vector<std::string> &names);

} // namespace rannc::import
