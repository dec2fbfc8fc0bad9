// ONNX's own shape inference, made safe on damaged models (Note [robust shape
// inference]) and run at two batch sizes, so every dimension of the imported
// graph is an affine function of the batch (Note [symbolic batch]).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "planner/ir/ir.h"

namespace onnx {
class ModelProto;
} // namespace onnx

namespace rannc::import {

/// The shapes ONNX inference gives a model's values, as a*B+c dims.
class BatchShapes {
public:
  /// Runs inference with every data input's first dimension at two batch sizes.
  BatchShapes(const onnx::ModelProto &model, const std::set<std::string> &data_inputs);
  /// Sets `v`'s dtype (when undefined) and its shape from the values inferred for its name.
  void apply(ir::Value &v) const;

  /// Concrete shapes of one inference run.
  struct Inferred {
    ir::DType dtype = ir::DType::Undefined;
    bool has_shape = false;
    std::vector<int64_t> dims; // -1 = unknown dim
  };
  using ShapeMap = std::unordered_map<std::string, Inferred>;

private:
  ShapeMap at1_, at2_;
};

} // namespace rannc::import
