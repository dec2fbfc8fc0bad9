// ONNX opsets newer than libonnx 1.12 knows, rewritten into opset-17 forms
// (Note [newer opsets] in onnx_opset.cpp).
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>

#include "planner/support/status.h"

namespace rannc::import {

/// The newest default-domain opset the importer reads.
inline constexpr int64_t kNewestOpset = 22;
/// rannc's own domain for ops newer than opset 17 (their schemas registered here).
inline constexpr const char *kNewOpsDomain = "ai.rannc.newer";

/// Rewrites a model of opset 18..kNewestOpset into opset-17 forms in place;
/// returns the opset the model was written in (unchanged models: their opset).
Expected<int64_t> lowerToKnownOpset(onnx::ModelProto &model, const std::string &where);

} // namespace rannc::import
