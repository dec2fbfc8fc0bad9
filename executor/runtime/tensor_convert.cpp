// Copies between the IR's raw tensors (initializers, constants, checkpoints)
// and LibTorch tensors.
#include "executor/runtime/tensor_convert.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace rannc::runtime {

torch::ScalarType toScalarType(ir::DType t) {
  switch (t) {
  case ir::DType::F32: return torch::kFloat;
  case ir::DType::F64: return torch::kDouble;
  case ir::DType::F16: return torch::kHalf;
  case ir::DType::BF16: return torch::kBFloat16;
  case ir::DType::I64: return torch::kLong;
  case ir::DType::I32: return torch::kInt;
  case ir::DType::I16: return torch::kShort;
  case ir::DType::I8: return torch::kChar;
  case ir::DType::U8: return torch::kByte;
  case ir::DType::Bool: return torch::kBool;
  case ir::DType::C64: return torch::kComplexFloat;
  case ir::DType::C128: return torch::kComplexDouble;
  case ir::DType::Undefined: break;
  }
  throw std::runtime_error("toScalarType: undefined element type");
}

ir::DType fromScalarType(torch::ScalarType t) {
  switch (t) {
  case torch::kFloat: return ir::DType::F32;
  case torch::kDouble: return ir::DType::F64;
  case torch::kHalf: return ir::DType::F16;
  case torch::kBFloat16: return ir::DType::BF16;
  case torch::kLong: return ir::DType::I64;
  case torch::kInt: return ir::DType::I32;
  case torch::kShort: return ir::DType::I16;
  case torch::kChar: return ir::DType::I8;
  case torch::kByte: return ir::DType::U8;
  case torch::kBool: return ir::DType::Bool;
  case torch::kComplexFloat: return ir::DType::C64;
  case torch::kComplexDouble: return ir::DType::C128;
  default: return ir::DType::Undefined; // complex32, quantized, ...: no IR name
  }
}

torch::Tensor toTorch(const ir::Tensor &t) {
  torch::Tensor out = torch::empty(t.dims, torch::TensorOptions(toScalarType(t.dtype)));
  size_t bytes = size_t(t.numel() * ir::dtypeSize(t.dtype));
  if (t.data.size() != bytes)
    throw std::runtime_error("toTorch: tensor has " + std::to_string(t.data.size()) +
                             " bytes of data, its shape needs " + std::to_string(bytes));
  if (bytes) std::memcpy(out.data_ptr(), t.data.data(), bytes); // little-endian host
  return out;
}

ir::Tensor fromTorch(const torch::Tensor &t) {
  torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
  ir::Tensor out;
  out.dtype = fromScalarType(c.scalar_type());
  if (out.dtype == ir::DType::Undefined)
    throw std::runtime_error(std::string("fromTorch: unsupported element type ") +
                             c10::toString(c.scalar_type()));
  out.dims.assign(c.sizes().begin(), c.sizes().end());
  out.data.assign(static_cast<const char *>(c.data_ptr()), c.nbytes());
  return out;
}

} // namespace rannc::runtime
