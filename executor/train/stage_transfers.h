// The schedule's four transfer actions (RecvActivations, SendActivations,
// RecvGradients, SendGradients) for one rank, over a Transport.
#pragma once

#include <torch/torch.h>

#include <unordered_map>
#include <vector>

#include "executor/runtime/stage.h"
#include "executor/schedule/schedule.h"
#include "executor/train/links.h"
#include "executor/train/scatter_gather.h"
#include "executor/train/setup.h"
#include "executor/train/transport.h"

namespace rannc::train {

/// The schedule's four transfer actions for one rank: its stage's received
/// values and sent values, each split, sent and joined by samples along its
/// own batch axis between the replicas of the two stages (Note [batch-free
/// values]), and their gradients the other way.
class StageTransfers {
public:
  /// `group`: a tensor-parallel stage's group, whose leader alone exchanges
  /// values with other stages and shares them (Note [tensor parallel ranks]),
  /// or whose every rank exchanges slices (Note [scatter/gather in the executor]).
  StageTransfers(Transport &transport, const Setup &s, const schedule::StageProgram &prog,
                 std::vector<std::vector<schedule::SampleRange>> shards, comm::Communicator *group = nullptr)
      : transport_(transport), s_(s), prog_(prog), shards_(std::move(shards)), group_(group),
        scatter_(transport, s, group) {}

  /// RecvActivations: the values the stage receives for micro-batch `mb`.
  std::unordered_map<ir::ValueId, torch::Tensor> recvActivations(int mb);
  /// SendActivations: the values the stage computed for later stages.
  void sendActivations(const runtime::StageRunner &runner, int mb);
  /// RecvGradients: the gradients of the sent values, in prog.sends order
  /// (undefined where a value has none: an empty message).
  std::vector<torch::Tensor> recvGradients(int mb);
  /// SendGradients: the gradients of the received values, back to their producers.
  void sendGradients(const runtime::StageRunner &runner, int mb);
  /// Waits until the gradients sent for micro-batch `mb` have left (Note
  /// [awaited gradient sends] in planner/pipeline/gradient_waits.h).
  void awaitGradientSends(int mb);

private:
  Link link(int peer_stage, bool producer, bool scattered) const;
  /// The message tag of micro-batch `mb`'s value (`kind` 0) or gradient (1) from stage `producer` to `consumer`.
  int tagFor(int mb, int kind, int producer, int consumer) const;
  /// Receives `v` or its gradient from `peer_stage`, or (neither the leader
  /// nor scattered) leaves it for shareWhole: sets `scattered_values[i]`.
  torch::Tensor recv(ir::ValueId v, int peer_stage, bool producer, int tag, std::vector<bool> &scattered_values,
                     size_t i);
  void send(const torch::Tensor &t, ir::ValueId v, int peer_stage, bool producer, int tag);

  Transport &transport_;
  const Setup &s_;
  const schedule::StageProgram &prog_;
  std::vector<std::vector<schedule::SampleRange>> shards_; ///< every stage's replicas' samples of a micro-batch
  comm::Communicator *group_;                             ///< the tensor-parallel group, or null
  ScatterGather scatter_;
  bool leader() const { return !group_ || group_->rank() == 0; }
  /// Whether what this rank sends to (`sending`) or receives from `peer_stage` goes scattered.
  bool scattered(int peer_stage, bool sending) const {
    return sending ? scatter_.scatters(s_.stage, peer_stage) : scatter_.scatters(peer_stage, s_.stage);
  }
  /// shareFromLeader for the entries of `values` that did not come scattered.
  void shareWhole(std::vector<torch::Tensor> &values, const std::vector<bool> &scattered_values);
};

} // namespace rannc::train
