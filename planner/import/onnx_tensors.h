// ONNX tensors and attributes as IR values: the conversions the importer, the
// weight loader and the conformance runner share. dtypeFromOnnx and
// tensorFromOnnx are public (onnx_import.h); these are the importer's own.
#pragma once

#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace onnx {
class AttributeProto;
class ValueInfoProto;
} // namespace onnx

namespace rannc::import {

/// An ONNX node attribute as an IR attribute; `where` prefixes errors.
Expected<ir::AttrValue> attrFromOnnx(const onnx::AttributeProto &a, const std::string &where);

/// A value's tensor element type; Undefined when rannc lacks it or it is not a tensor.
ir::DType elemType(const onnx::ValueInfoProto &vi);

} // namespace rannc::import
