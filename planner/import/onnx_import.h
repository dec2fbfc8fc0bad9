// The ONNX front end: a model file becomes an ir::Graph. Weights stay in the
// model file; the executor loads the ones its stage needs with
// loadModelWeights. model_format.h picks the front end for a file.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "planner/import/audit.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace onnx {
class TensorProto;
} // namespace onnx

namespace rannc::import {

/// Imports a serialized ONNX ModelProto as a training graph; `where` names it
/// in error messages. The graph must have exactly one output, the scalar loss.
/// `audit`, when given, receives what the import found and fixed (Note [import audit]).
Expected<ir::Graph> importOnnxBytes(const std::string &bytes, const std::string &where,
                                    ImportAudit *audit = nullptr);

/// A model imported for inference (the conformance runner): any outputs.
struct InferenceModel {
  ir::Graph graph;                  ///< graph.loss is set to outputs[0] so verify() holds
  std::vector<ir::ValueId> outputs; ///< every graph output, in model order
  /// Contents of the floating-point initializers (the graph's parameters and buffers).
  std::map<std::string, ir::Tensor> weights;
};

/// Imports a serialized ONNX ModelProto like importOnnxBytes, but accepts any
/// number (at least one) of outputs of any shape, and returns the weights too.
Expected<InferenceModel> importOnnxInference(const std::string &bytes, const std::string &where);

/// ONNX TensorProto.DataType code -> IR element type; nullopt for the types rannc
/// lacks (strings, unsigned 16/32/64-bit, complex).
std::optional<ir::DType> dtypeFromOnnx(int32_t onnx_type);

/// TensorProto -> ir::Tensor (raw_data or the typed fields); `where` prefixes errors.
Expected<ir::Tensor> tensorFromOnnx(const onnx::TensorProto &p, const std::string &where);

/// An initializer whose contents the model file does not hold (Note [weightless models]).
struct MissingWeight {
  std::string name;
  std::string reason; ///< e.g. "its external data file 'w.bin' does not exist"
};

/// Reads the named initializers (parameters, buffers, constants) from a model
/// file, external data included. A name that is not an initializer of the
/// model is an error; so is one without contents (Note [weightless models]),
/// unless `missing` is given: then it is listed there and left out of the result.
Expected<std::map<std::string, ir::Tensor>> loadModelWeights(const std::string &path,
                                                             const std::vector<std::string> &names,
                                                             std::vector<MissingWeight> *missing = nullptr);

} // namespace rannc::import
