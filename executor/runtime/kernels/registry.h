// The kernel registry: each op family's file lists its kernels, and
// registry.cpp merges them into the one table runOp looks ops up in.
#pragma once

#include <string_view>
#include <vector>

#include "executor/runtime/kernels/op_context.h"

namespace rannc::runtime::kernels {

/// A kernel: the node's outputs from its inputs (Note [kernel conventions]).
using Kernel = Outputs (*)(const OpCtx &);
/// KernelDef::max_inputs of an op with any number of inputs.
constexpr int kVariadic = -1;

/// One ONNX op type's kernel and the number of inputs it accepts.
struct KernelDef {
  std::string_view type;
  int min_inputs;
  int max_inputs; ///< kVariadic: no limit
  Kernel fn;
};

// The families, one file each (as ONNX Runtime groups its CPU kernels).
/// Element-wise arithmetic, comparisons, logic, activations, casts (elementwise.cpp).
std::vector<KernelDef> elementwiseKernels();
/// Reduce*, ArgMax/ArgMin, CumSum (reduce.cpp).
std::vector<KernelDef> reduceKernels();
/// Softmax, LogSoftmax, Hardmax (softmax.cpp).
std::vector<KernelDef> softmaxKernels();
/// MatMul, Gemm, Einsum, Det (linalg.cpp).
std::vector<KernelDef> linalgKernels();
/// Batch, instance, layer, local response and mean-variance normalisation (normalization.cpp).
std::vector<KernelDef> normalizationKernels();
/// Shape, reshaping and rearranging ops (tensor_shape.cpp).
std::vector<KernelDef> tensorShapeKernels();
/// Constant, ConstantOfShape, Range, EyeLike (creation.cpp).
std::vector<KernelDef> creationKernels();
/// Gathers, scatters and selection (indexing.cpp).
std::vector<KernelDef> indexingKernels();
/// Convolutions and pooling (conv_pool.cpp).
std::vector<KernelDef> convPoolKernels();
/// Losses and Dropout (loss_dropout.cpp).
std::vector<KernelDef> lossDropoutKernels();
/// Random ops (random.cpp).
std::vector<KernelDef> randomKernels();
/// Resize, Upsample, GridSample (resize.cpp).
std::vector<KernelDef> resizeKernels();
/// DFT, STFT, window functions (signal.cpp).
std::vector<KernelDef> signalKernels();
/// RNN, GRU, LSTM (recurrent.cpp).
std::vector<KernelDef> recurrentKernels();
/// The tensor-parallel collectives, domain "rannc" (tensor_parallel.cpp).
std::vector<KernelDef> tensorParallelKernels();

/// Every family's kernels in one table, sorted by type.
const std::vector<KernelDef> &kernelTable();
/// The kernel of ONNX op `type`, or nullptr.
const KernelDef *findKernel(std::string_view type);

} // namespace rannc::runtime::kernels
