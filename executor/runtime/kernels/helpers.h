// Helpers shared by the kernel families (Note [kernel conventions] in
// op_context.h): integer values read back from tensors, axes, element types.
#pragma once

#include <cstdint>
#include <vector>

#include "executor/runtime/kernels/op_context.h"

namespace rannc::runtime::kernels {

/// True for integer (not bool, not floating-point) tensors.
bool isIntegral(const torch::Tensor &t);
/// The values of an integer tensor (shapes, axes, indices given as data).
std::vector<int64_t> intValues(const OpCtx &c, const torch::Tensor &t, const char *what);
/// The value of a one-element integer tensor.
int64_t intScalar(const OpCtx &c, const torch::Tensor &t, const char *what);
/// Maps an axis in [-rank, rank) to [0, rank).
int64_t normAxis(const OpCtx &c, int64_t axis, int64_t rank);
/// Maps a boundary between dimensions in [-rank, rank] to [0, rank] (Flatten,
/// and pre-13 Softmax, split the dimensions into [0, axis) and [axis, rank)).
int64_t normBoundary(const OpCtx &c, int64_t axis, int64_t rank);
/// Normalises and sorts a list of axes; a repeated axis is an error.
std::vector<int64_t> normAxes(const OpCtx &c, std::vector<int64_t> axes, int64_t rank);
/// The product of `sizes` (1 for none).
int64_t product(c10::IntArrayRef sizes);
/// A float attribute as the double the exporting program held (Note [float32 epsilon]).
double exportedDouble(double float_attr);
/// An int64 tensor holding `v` on `device`.
torch::Tensor longTensor(const std::vector<int64_t> &v, const torch::Device &device);
/// ONNX TensorProto.DataType code -> ScalarType (Cast's `to`).
torch::ScalarType onnxScalarType(const OpCtx &c, int64_t code);
/// ONNX per-dimension (begin, end) pads -> torch's constant_pad_nd order (last dim first).
std::vector<int64_t> torchPads(const std::vector<int64_t> &begin, const std::vector<int64_t> &end);

} // namespace rannc::runtime::kernels
