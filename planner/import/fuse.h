// Pattern fusion at import: the ops an ONNX exporter decomposes a PyTorch
// kernel into become that one kernel again (Note [pattern fusion] in fuse.cpp).
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "planner/ir/ir.h"

namespace rannc::import {

/// What fusePatterns rewrote: per pattern, the fused nodes' names in graph order.
struct FusionReport {
  std::map<std::string, std::vector<std::string>> fused; ///< pattern name -> fused nodes
  int removed_ops = 0;                                   ///< ONNX ops the fused nodes replace, net
  /// Number of fused nodes of every pattern.
  int total() const;
};

/// Rewrites the decomposed attention, LayerNorm, RMSNorm, GELU and SiLU of an
/// ONNX graph into one node each (Note [pattern fusion]); the graph stays verified.
FusionReport fusePatterns(ir::Graph &g);

/// "fusion: attention 12 gelu 12 ... (N ops fewer)", then, with `names`, one
/// line per pattern listing its fused nodes.
void printFusion(const FusionReport &report, std::ostream &out, bool names = true);

} // namespace rannc::import
