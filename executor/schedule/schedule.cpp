#include "executor/schedule/schedule.h"

#include <algorithm>
#include <set>

namespace rannc::schedule {

std::string toString(const Action &a) {
  const char *name = "?";
  switch (a.kind) {
  case ActionKind::RecvActivations: name = "recv-act"; break;
  case ActionKind::Forward: name = "forward"; break;
  case ActionKind::SendActivations: name = "send-act"; break;
  case ActionKind::RecvGradients: name = "recv-grad"; break;
  case ActionKind::Backward: name = "backward"; break;
  case ActionKind::SendGradients: name = "send-grad"; break;
  case ActionKind::OptimizerStep: name = "optimizer-step"; break;
  }
  return a.microbatch < 0 ? name : std::string(name) + "(" + std::to_string(a.microbatch) + ")";
}

void print(const std::vector<Action> &actions, std::ostream &os) {
  for (size_t i = 0; i < actions.size(); ++i) os << (i ? " " : "") << toString(actions[i]);
  os << "\n";
}

std::vector<Action> gpipe(int stage, int num_stages, int microbatches) {
  std::vector<Action> a;
  const bool first = stage == 0, last = stage == num_stages - 1;
  for (int m = 0; m < microbatches; ++m) {
    if (!first) a.push_back({ActionKind::RecvActivations, m});
    a.push_back({ActionKind::Forward, m});
    if (!last) a.push_back({ActionKind::SendActivations, m});
  }
  for (int m = microbatches - 1; m >= 0; --m) {
    if (!last) a.push_back({ActionKind::RecvGradients, m});
    a.push_back({ActionKind::Backward, m});
    if (!first) a.push_back({ActionKind::SendGradients, m});
  }
  a.push_back({ActionKind::OptimizerStep, -1});
  return a;
}

StageProgram buildStageProgram(const ir::Graph &g, const std::vector<std::pair<int, int>> &ranges, int stage) {
  std::vector<int> stage_of(g.nodes.size(), -1);
  for (int s = 0; s < static_cast<int>(ranges.size()); ++s)
    for (int n = ranges[s].first; n < ranges[s].second; ++n) stage_of[n] = s;
  auto isConstantOp = [&](ir::NodeId n) { return g.nodes[n].inputs.empty(); };

  StageProgram p;
  p.stage = stage;
  std::set<ir::NodeId> nodes;
  std::set<ir::ValueId> data, params, consts;
  std::set<std::pair<int, ir::ValueId>> recvs, sends;
  for (ir::NodeId n = ranges[stage].first; n < ranges[stage].second; ++n) {
    nodes.insert(n);
    for (ir::ValueId in : g.nodes[n].inputs) {
      if (in == ir::kNoValue) continue;
      const ir::Value &v = g.values[in];
      switch (v.kind) {
      case ir::ValueKind::Input: data.insert(in); break;
      case ir::ValueKind::Parameter: params.insert(in); break;
      case ir::ValueKind::Constant: consts.insert(in); break;
      case ir::ValueKind::Intermediate: {
        int producer_stage = stage_of[v.producer];
        if (producer_stage == stage) break;
        if (isConstantOp(v.producer)) nodes.insert(v.producer);
        else recvs.insert({producer_stage, in});
        break;
      }
      }
    }
  }
  // Sends: values made here that a later stage reads (and does not recompute).
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g.nodes.size()); ++n) {
    if (stage_of[n] <= stage) continue;
    for (ir::ValueId in : g.nodes[n].inputs) {
      if (in == ir::kNoValue || g.values[in].kind != ir::ValueKind::Intermediate) continue;
      ir::NodeId producer = g.values[in].producer;
      if (stage_of[producer] == stage && !isConstantOp(producer)) sends.insert({stage_of[n], in});
    }
  }
  p.nodes.assign(nodes.begin(), nodes.end());
  p.data_inputs.assign(data.begin(), data.end());
  p.parameters.assign(params.begin(), params.end());
  p.constants.assign(consts.begin(), consts.end());
  for (auto [s, v] : recvs) p.recvs.push_back({v, s});
  for (auto [s, v] : sends) p.sends.push_back({v, s});
  p.computes_loss = g.loss != ir::kNoValue && g.values[g.loss].producer >= ranges[stage].first &&
                    g.values[g.loss].producer < ranges[stage].second;
  return p;
}

} // namespace rannc::schedule
