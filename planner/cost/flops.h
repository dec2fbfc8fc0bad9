// How much arithmetic each op does: one table for both op vocabularies, ONNX
// ("MatMul", "Conv") and ATen ("aten::linear", "aten::_convolution"), so a
// plan's analytic costs mean the same whichever front end made the graph.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "planner/ir/ir.h"

namespace rannc::cost {

/// What kind of arithmetic an op is, which decides the rate it runs at.
enum class OpClass {
  kMatrix,      ///< matrix products, convolutions, attention: tensor-core work
  kElementwise, ///< arithmetic per element (activations, adds, normalisations): bandwidth-bound
  kMovement,    ///< copies and re-indexing (transpose, gather, concat): bytes, no FLOPs
  kHost,        ///< no kernel: constants, shapes, list building
};

/// FLOPs of one op at micro-batch size b; a multiply-add counts as 2.
struct OpFlops {
  double fwd = 0;
  double bwd = 0; ///< computing the input gradients (and weight gradients)
  OpClass cls = OpClass::kElementwise;
  int bwd_kernels = 1; ///< kernels backward launches (a matrix product: one per input gradient)
  bool convolution = false; ///< cuDNN runs fp32 convolutions as TF32 by default (PyTorch's allow_tf32)
  bool pointwise = false;   ///< per element: arithmetic without a rule of its own (Add, Mul, Erf, ...), Dropout, Where
  bool softmax = false;     ///< Softmax / LogSoftmax: a row-wise kernel that can end a fused element-wise chain
  bool view = false;        ///< a reshape that only rewrites the shape (Reshape, Flatten, Squeeze, view, ...)
};

/// An ATen op's name without "aten::" and the in-place "_" (aten::relu_ ->
/// relu); other names as they are.
std::string_view atenBaseName(std::string_view op_type);

/// The ONNX op types with a rule of their own (the others count as
/// element-wise), sorted; checked against the op set (Note [one op table] in
/// planner/ir/op_set.h).
std::vector<std::string> onnxOpsWithFlopRules();

/// The FLOPs of node `n` of `g` at micro-batch size `b` (Note [flop counts]).
OpFlops opFlops(const ir::Graph &g, const ir::Node &n, int64_t b);

/// The whole graph's FLOPs at micro-batch size `b`.
struct GraphFlops {
  double fwd = 0;
  double bwd = 0;
};
GraphFlops graphFlops(const ir::Graph &g, int64_t b);

} // namespace rannc::cost
