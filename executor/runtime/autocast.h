// The torch side of a plan's precision: the one mapping from
// cost::Precision to the dtype StageRunner::setAutocast takes
// (Note [autocast dtypes] in planner/cost/precision.cpp).
#pragma once

#include <c10/core/ScalarType.h>

#include "planner/cost/precision.h"

namespace rannc::runtime {

/// The dtype autocast computes in at `p`: kBFloat16, kHalf, or kFloat (autocast off) for fp32.
inline c10::ScalarType scalarTypeFor(cost::Precision p) {
  switch (p) {
  case cost::Precision::BF16: return c10::kBFloat16;
  case cost::Precision::FP16: return c10::kHalf;
  case cost::Precision::FP32: break;
  }
  return c10::kFloat;
}

} // namespace rannc::runtime
