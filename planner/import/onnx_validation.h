// What the importer checks before it builds a graph: the opset, every node's
// op against rannc's op set and its ONNX schema, and the graph's structure,
// which ONNX shape inference trusts. Each problem is refused with the file,
// node and op named.
#pragma once

#include <cstdint>
#include <string>

#include "planner/support/status.h"

namespace onnx {
class GraphProto;
class ModelProto;
} // namespace onnx

namespace rannc::import {

/// The model's default-domain opset; refused when it imports none or one newer than rannc supports.
Expected<int64_t> defaultOpset(const onnx::ModelProto &model, const std::string &where);

/// Checks the op vocabulary (every node's op supported at `opset` and matching
/// its ONNX schema), then the structure shape inference assumes.
Status validateGraph(const onnx::GraphProto &mg, int64_t opset, const std::string &where);

} // namespace rannc::import
