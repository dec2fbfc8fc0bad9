#include "planner/import/onnx_tensors.h"

#include <onnx/onnx_pb.h>

#include "planner/import/onnx_import.h"

namespace rannc::import {

using onnx::TensorProto;

std::optional<ir::DType> dtypeFromOnnx(int32_t t) {
  switch (t) {
  case TensorProto::FLOAT: return ir::DType::F32;
  case TensorProto::DOUBLE: return ir::DType::F64;
  case TensorProto::FLOAT16: return ir::DType::F16;
  case TensorProto::BFLOAT16: return ir::DType::BF16;
  case TensorProto::INT64: return ir::DType::I64;
  case TensorProto::INT32: return ir::DType::I32;
  case TensorProto::INT16: return ir::DType::I16;
  case TensorProto::INT8: return ir::DType::I8;
  case TensorProto::UINT8: return ir::DType::U8;
  case TensorProto::BOOL: return ir::DType::Bool;
  default: return std::nullopt;
  }
}

namespace {

template <typename Src, typename Dst> void appendAs(std::string &out, const Src &values) {
  for (auto v : values) {
    Dst d = static_cast<Dst>(v);
    out.append(reinterpret_cast<const char *>(&d), sizeof d);
  }
}

} // namespace

Expected<ir::Tensor> tensorFromOnnx(const TensorProto &p, const std::string &where) {
  auto dt = dtypeFromOnnx(p.data_type());
  if (!dt)
    return Error{where + ": tensor '" + p.name() + "' has unsupported element type " +
                 std::to_string(p.data_type())};
  if (p.data_location() == TensorProto::EXTERNAL)
    return Error{where + ": tensor '" + p.name() +
                 "' stores its data in an external file, which rannc reads only for initializers"};
  ir::Tensor t;
  t.dtype = *dt;
  t.dims.assign(p.dims().begin(), p.dims().end());
  // Check the dims before multiplying them: a damaged file can hold any int64.
  int64_t numel = 1;
  for (int64_t d : t.dims) {
    if (d < 0)
      return Error{where + ": tensor '" + p.name() + "' has a negative dimension " + std::to_string(d)};
    if (d != 0 && numel > (int64_t(1) << 40) / d)
      return Error{where + ": tensor '" + p.name() + "' is implausibly large (over 2^40 elements)"};
    numel *= d;
  }
  const int64_t bytes = numel * ir::dtypeSize(t.dtype);
  if (p.has_raw_data()) {
    t.data = p.raw_data();
  } else {
    switch (t.dtype) {
    case ir::DType::F32: appendAs<decltype(p.float_data()), float>(t.data, p.float_data()); break;
    case ir::DType::F64: appendAs<decltype(p.double_data()), double>(t.data, p.double_data()); break;
    case ir::DType::I64: appendAs<decltype(p.int64_data()), int64_t>(t.data, p.int64_data()); break;
    case ir::DType::I32: appendAs<decltype(p.int32_data()), int32_t>(t.data, p.int32_data()); break;
    case ir::DType::I16: appendAs<decltype(p.int32_data()), int16_t>(t.data, p.int32_data()); break;
    case ir::DType::I8: appendAs<decltype(p.int32_data()), int8_t>(t.data, p.int32_data()); break;
    case ir::DType::U8:
    case ir::DType::Bool: appendAs<decltype(p.int32_data()), uint8_t>(t.data, p.int32_data()); break;
    case ir::DType::F16:
    case ir::DType::BF16: appendAs<decltype(p.int32_data()), uint16_t>(t.data, p.int32_data()); break;
    default: break;
    }
  }
  if (static_cast<int64_t>(t.data.size()) != bytes)
    return Error{where + ": tensor '" + p.name() + "' holds " + std::to_string(t.data.size()) +
                 " bytes, its shape needs " + std::to_string(bytes)};
  return t;
}

Expected<ir::AttrValue> attrFromOnnx(const onnx::AttributeProto &a, const std::string &where) {
  using A = onnx::AttributeProto;
  switch (a.type()) {
  case A::INT: return ir::AttrValue(static_cast<int64_t>(a.i()));
  case A::FLOAT: return ir::AttrValue(static_cast<double>(a.f()));
  case A::STRING: return ir::AttrValue(a.s());
  case A::INTS: return ir::AttrValue(std::vector<int64_t>(a.ints().begin(), a.ints().end()));
  case A::FLOATS: return ir::AttrValue(std::vector<double>(a.floats().begin(), a.floats().end()));
  case A::STRINGS:
    return ir::AttrValue(std::vector<std::string>(a.strings().begin(), a.strings().end()));
  case A::TENSOR: {
    auto t = tensorFromOnnx(a.t(), where);
    if (!t) return t.error();
    return ir::AttrValue(std::move(*t));
  }
  default:
    return Error{where + ": attribute '" + a.name() + "' has a type rannc does not support (" +
                 std::to_string(a.type()) + ")"};
  }
}

ir::DType elemType(const onnx::ValueInfoProto &vi) {
  auto dt = dtypeFromOnnx(vi.type().tensor_type().elem_type());
  return dt ? *dt : ir::DType::Undefined;
}

} // namespace rannc::import
