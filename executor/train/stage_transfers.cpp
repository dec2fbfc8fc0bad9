#include "executor/train/stage_transfers.h"

#include <string>

namespace rannc::train {
namespace {

// A value and its gradient travel with different tags per micro-batch.
constexpr int kActTag = 0, kGradTag = 1;
int tagFor(int mb, int kind) { return 2 * mb + kind; }

} // namespace

std::unordered_map<ir::ValueId, torch::Tensor> StageTransfers::recvActivations(int mb) {
  std::vector<torch::Tensor> values(prog_.recvs.size());
  if (exchanges())
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = recv(prog_.recvs[i].value, prog_.recvs[i].peer_stage, false, tagFor(mb, kActTag));
  if (group_) shareFromLeader(*group_, values, s_.device); // Note [tensor parallel ranks]
  std::unordered_map<ir::ValueId, torch::Tensor> feeds;
  for (size_t i = 0; i < values.size(); ++i) feeds[prog_.recvs[i].value] = std::move(values[i]);
  return feeds;
}

void StageTransfers::sendActivations(const runtime::StageRunner &runner, int mb) {
  if (!exchanges()) return;
  for (const auto &snd : prog_.sends)
    send(runner.value(mb, snd.value), snd.value, snd.peer_stage, true, tagFor(mb, kActTag));
}

std::vector<torch::Tensor> StageTransfers::recvGradients(int mb) {
  std::vector<torch::Tensor> grads(prog_.sends.size());
  if (exchanges())
    for (size_t i = 0; i < grads.size(); ++i) {
      torch::Tensor g = recv(prog_.sends[i].value, prog_.sends[i].peer_stage, true, tagFor(mb, kGradTag));
      grads[i] = g.numel() == 0 ? torch::Tensor() : g;
    }
  if (group_) shareFromLeader(*group_, grads, s_.device);
  return grads;
}

void StageTransfers::sendGradients(const runtime::StageRunner &runner, int mb) {
  if (!exchanges()) return;
  for (const auto &r : prog_.recvs) {
    torch::Tensor g = runner.inputGrad(mb, r.value);
    send(g.defined() ? g : torch::empty({0}), r.value, r.peer_stage, false, tagFor(mb, kGradTag));
  }
}

Link StageTransfers::link(int peer_stage, bool producer) const {
  return Link{s_.stage_ranks[size_t(peer_stage)], shards_[size_t(peer_stage)], shards_[s_.stage][s_.replica],
              s_.replica, int(s_.stage_ranks[size_t(s_.stage)].size()), producer};
}

torch::Tensor StageTransfers::recv(ir::ValueId v, int peer_stage, bool producer, int tag) {
  return recvValue(transport_, batchLayout(s_.graph.values[v]), link(peer_stage, producer), tag);
}

void StageTransfers::send(const torch::Tensor &t, ir::ValueId v, int peer_stage, bool producer, int tag) {
  sendValue(transport_, t, batchLayout(s_.graph.values[v]), link(peer_stage, producer), tag,
            "value '" + s_.graph.values[v].name + "'");
}

} // namespace rannc::train
