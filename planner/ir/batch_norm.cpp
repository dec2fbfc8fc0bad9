#include "planner/ir/batch_norm.h"

#include <optional>
#include <set>
#include <string>
#include <variant>

namespace rannc::ir {

bool computesBatchStatistics(const Node &n) {
  auto intAttr = [&n](const std::string &name) -> std::optional<int64_t> {
    auto it = n.attrs.find(name);
    if (it == n.attrs.end() || !std::holds_alternative<int64_t>(it->second)) return std::nullopt;
    return std::get<int64_t>(it->second);
  };
  // ONNX: training_mode (opset 14+), or the running statistics as outputs (before).
  if (n.op_type == "BatchNormalization" && (n.domain.empty() || n.domain == "ai.onnx"))
    return intAttr("training_mode").value_or(0) != 0 || n.outputs.size() > 1;
  // ATen: (input, weight, bias, running_mean, running_var, training, ...), the
  // training flag argument 5 ("t5"/"v5": Note [aten argument encoding]).
  static const std::set<std::string> kAtenBatchNorms = {"aten::batch_norm", "aten::native_batch_norm",
                                                        "aten::_native_batch_norm_legit",
                                                        "aten::_native_batch_norm_legit_functional"};
  if (n.domain != "aten" || !kAtenBatchNorms.count(n.op_type)) return false;
  auto kind = n.attrs.find("t5");
  const bool constant_false = kind != n.attrs.end() && std::holds_alternative<std::string>(kind->second) &&
                              std::get<std::string>(kind->second) == "c:bool" && intAttr("v5") == int64_t{0};
  return !constant_false;
}

bool hasBatchStatistics(const Graph &g) {
  for (const Node &n : g.nodes)
    if (computesBatchStatistics(n)) return true;
  return false;
}

int64_t batchNormChannels(const Graph &g, const Node &n) {
  if (n.inputs.empty() || n.inputs[0] == kNoValue || n.inputs[0] >= ValueId(g.values.size())) return 0;
  const Value &x = g.values[n.inputs[0]];
  return x.shape_known && x.shape.size() > 1 && x.shape[1].isFixed() ? x.shape[1].offset : 0;
}

} // namespace rannc::ir
