#include "executor/runtime/interpreter.h"

#include <numeric>
#include <stdexcept>

#include "executor/runtime/ops.h"

namespace rannc::runtime {

void runNodes(const ir::Graph &g, const std::vector<ir::NodeId> &nodes, ValueMap &env, const NodeHooks &hooks,
              comm::Communicator *group) {
  std::vector<torch::Tensor> ins;
  for (size_t index = 0; index < nodes.size(); ++index) {
    const ir::NodeId n = nodes[index];
    const ir::Node &node = g.nodes[n];
    ins.clear();
    for (ir::ValueId in : node.inputs) {
      if (in == ir::kNoValue) {
        ins.emplace_back();
        continue;
      }
      if (auto it = env.find(in); it != env.end()) {
        ins.push_back(it->second);
        continue;
      }
      std::optional<torch::Tensor> t = hooks.missing ? hooks.missing(node, in) : std::nullopt;
      if (!t) throw std::runtime_error("node '" + node.name + "': input '" + g.values[in].name + "' is not available");
      ins.push_back(std::move(*t));
    }
    std::vector<torch::Tensor> outs;
    try {
      outs = runOp(node, ins, g.opset, group);
    } catch (const std::exception &e) {
      if (hooks.failed) hooks.failed(node, e);
      throw;
    }
    if (hooks.ran) hooks.ran(n, ins, outs);
    for (size_t i = 0; i < node.outputs.size() && i < outs.size(); ++i)
      if (node.outputs[i] != ir::kNoValue) env[node.outputs[i]] = std::move(outs[i]);
    if (hooks.placed) hooks.placed(index, env);
  }
}

std::vector<ir::NodeId> allNodes(const ir::Graph &g) {
  std::vector<ir::NodeId> ids(g.nodes.size());
  std::iota(ids.begin(), ids.end(), ir::NodeId(0));
  return ids;
}

} // namespace rannc::runtime
