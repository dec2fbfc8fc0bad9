// The op names of the nodes the import's pattern fusion writes (Note
// [pattern fusion] in planner/import/fuse.cpp); they are in the one op table
// (op_set.cpp) like every other op.
#pragma once

#include <string_view>

#include "planner/ir/ir.h"

namespace rannc::ir {

/// The domain of the nodes the import's pattern fusion writes (Note [pattern
/// fusion] in planner/import/fuse.cpp): one PyTorch kernel each, arithmetic
/// like any ONNX op (unlike the "rannc" collectives).
inline constexpr std::string_view kFusedDomain = "rannc.fused";
/// The fused kernels of that domain: scaled_dot_product_attention (q, kT, v,
/// optional additive mask; attributes scale, key_transposed), rms_norm (x, w;
/// epsilon, axis -1) and silu (x).
inline constexpr std::string_view kScaledDotProductAttention = "ScaledDotProductAttention",
                                  kRMSNormalization = "RMSNormalization", kSiLU = "SiLU";
/// True for a node of the fused domain.
inline bool isFused(const Node &n) { return n.domain == kFusedDomain; }

} // namespace rannc::ir
