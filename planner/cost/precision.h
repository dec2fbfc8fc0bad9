// Mixed precision in the planner: which values autocast makes bf16/fp16, and
// the low-precision weight copies it keeps (Note [autocast dtypes]).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "plan.pb.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::cost {

/// A plan's compute precision: fp32, or bf16/fp16 under autocast (Note [autocast dtypes]).
enum class Precision { FP32, BF16, FP16 };

/// Parses "fp32", "bf16" or "fp16" (--precision, a plan's precision); an error names the choices.
Expected<Precision> parsePrecision(std::string_view text);
/// The spelling parsePrecision reads: "fp32", "bf16" or "fp16".
std::string precisionName(Precision p);
/// Every precision's word, in enum order (what --help lists).
std::vector<std::string> precisionNames();
/// A plan's precision: fp32 where the field is unset (plans before it existed).
Expected<Precision> planPrecision(const proto::Plan &plan);
/// The low-precision dtype of `precision` (BF16, F16), Undefined for fp32.
ir::DType lowPrecisionDType(Precision precision);

/// Whether autocast runs `n` in the lower precision (a matrix product,
/// convolution or attention on the policy's list).
bool runsInLowPrecision(const ir::Node &n);

/// Sets every floating value's compute_dtype to its run-time dtype under
/// LibTorch's autocast at `precision` on `device_type` ("cpu" or "cuda"); for
/// fp32 clears them. Values keep their declared dtype.
void assignComputeDTypes(ir::Graph &g, Precision precision, std::string_view device_type);

/// Bytes of the low-precision copies autocast makes of the fp32 parameters
/// that the low-precision ops among nodes [op_begin, op_end) read, each once.
int64_t lowPrecisionWeightBytes(const ir::Graph &g, int op_begin, int op_end);

/// The ONNX op types autocast's lists name, sorted (checked against the op
/// set: Note [one op table] in planner/ir/op_set.h).
std::vector<std::string> onnxOpsWithAutocastClass();

} // namespace rannc::cost
