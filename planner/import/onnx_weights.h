// The contents of a model's initializers, external data included (Note
// [weightless models] in onnx_weights.cpp); loadModelWeights (onnx_import.h)
// is the public entry.
#pragma once

#include <filesystem>
#include <string>

#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace onnx {
class TensorProto;
} // namespace onnx

namespace rannc::import {

/// Reads `t`'s external data from its file in the model's folder `dir`; `where` prefixes errors.
Expected<ir::Tensor> readExternal(const onnx::TensorProto &t, const std::filesystem::path &dir,
                                  const std::string &where);

} // namespace rannc::import
