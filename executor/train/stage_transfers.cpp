#include "executor/train/stage_transfers.h"

#include <algorithm>
#include <string>

#include "planner/plan/plan.h"

namespace rannc::train {
namespace {

// A value and its gradient travel with different tags per micro-batch.
constexpr int kActTag = 0, kGradTag = 1;

} // namespace

// Under an interleaved plan two ranks exchange the values of several stage
// pairs (stage 0 -> 1 and 2 -> 3 both go from rank 0 to rank 1), and a
// stage's messages to two stages of one rank leave in peer order, not in the
// order that rank receives them: the tag names the pair, (producer, consumer),
// too (Note [interleaved 1F1B] in planner/pipeline/schedule.h).
int StageTransfers::tagFor(int mb, int kind, int producer, int consumer) const {
  const int S = s_.plan.stages_size();
  if (plan::virtualStages(s_.plan) <= 1) return 2 * mb + kind;
  return ((2 * mb + kind) * S + producer) * S + consumer;
}

std::unordered_map<ir::ValueId, torch::Tensor> StageTransfers::recvActivations(int mb) {
  std::vector<torch::Tensor> values(prog_.recvs.size());
  std::vector<bool> scattered_values(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = recv(prog_.recvs[i].value, prog_.recvs[i].peer_stage, false,
                     tagFor(mb, kActTag, prog_.recvs[i].peer_stage, s_.stage), scattered_values, i);
  shareWhole(values, scattered_values); // Note [tensor parallel ranks]
  std::unordered_map<ir::ValueId, torch::Tensor> feeds;
  for (size_t i = 0; i < values.size(); ++i) feeds[prog_.recvs[i].value] = std::move(values[i]);
  return feeds;
}

void StageTransfers::sendActivations(const runtime::StageRunner &runner, int mb) {
  for (const auto &snd : prog_.sends)
    if (leader() || scattered(snd.peer_stage, true))
      send(runner.value(mb, snd.value), snd.value, snd.peer_stage, true, tagFor(mb, kActTag, s_.stage, snd.peer_stage));
}

std::vector<torch::Tensor> StageTransfers::recvGradients(int mb) {
  std::vector<torch::Tensor> grads(prog_.sends.size());
  std::vector<bool> scattered_values(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    torch::Tensor g =
        recv(prog_.sends[i].value, prog_.sends[i].peer_stage, true,
             tagFor(mb, kGradTag, s_.stage, prog_.sends[i].peer_stage), scattered_values, i);
    grads[i] = g.defined() && g.numel() == 0 ? torch::Tensor() : g;
  }
  shareWhole(grads, scattered_values);
  return grads;
}

void StageTransfers::sendGradients(const runtime::StageRunner &runner, int mb) {
  for (const auto &r : prog_.recvs) {
    if (!leader() && !scattered(r.peer_stage, true)) continue;
    torch::Tensor g = runner.inputGrad(mb, r.value);
    const int tag = tagFor(mb, kGradTag, r.peer_stage, s_.stage);
    send(g.defined() ? g : torch::empty({0}), r.value, r.peer_stage, false, tag);
  }
}

void StageTransfers::awaitGradientSends(int mb) {
  for (const auto &r : prog_.recvs) {
    transport_.waitSendsTagged(tagFor(mb, kGradTag, r.peer_stage, s_.stage)); // scattered ones go through it too
  }
}

void StageTransfers::shareWhole(std::vector<torch::Tensor> &values, const std::vector<bool> &scattered_values) {
  if (!group_) return;
  std::vector<torch::Tensor> whole;
  for (size_t i = 0; i < values.size(); ++i)
    if (!scattered_values[i]) whole.push_back(values[i]);
  if (whole.empty()) return;
  shareFromLeader(*group_, whole, s_.device);
  for (size_t i = 0, k = 0; i < values.size(); ++i)
    if (!scattered_values[i]) values[i] = std::move(whole[k++]);
}

Link StageTransfers::link(int peer_stage, bool producer, bool scattered) const {
  return Link{scattered ? scatter_.peers(peer_stage) : s_.stage_ranks[size_t(peer_stage)],
              shards_[size_t(peer_stage)], shards_[s_.stage][s_.replica], s_.replica,
              int(s_.stage_ranks[size_t(s_.stage)].size()), producer};
}

torch::Tensor StageTransfers::recv(ir::ValueId v, int peer_stage, bool producer, int tag,
                                   std::vector<bool> &scattered_values, size_t i) {
  scattered_values[i] = scattered(peer_stage, false);
  if (!leader() && !scattered_values[i]) return torch::Tensor(); // shareWhole fills it
  return recvValue(scattered_values[i] ? scatter_.transport() : transport_, batchLayout(s_.graph.values[v]),
                   link(peer_stage, producer, scattered_values[i]), tag);
}

void StageTransfers::send(const torch::Tensor &t, ir::ValueId v, int peer_stage, bool producer, int tag) {
  const bool sc = scattered(peer_stage, true);
  sendValue(sc ? scatter_.transport() : transport_, t, batchLayout(s_.graph.values[v]),
            link(peer_stage, producer, sc), tag, "value '" + s_.graph.values[v].name + "'");
}

} // namespace rannc::train
