// One pipeline stage on LibTorch: runs its ops for a micro-batch with
// autograd recording, then back-propagates the gradients that later stages
// return. Communication and scheduling live elsewhere; this class only
// computes.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/schedule/schedule.h"
#include "planner/ir/ir.h"

namespace rannc::runtime {

class StageRunner {
public:
  /// `params` must hold every parameter of the program (leaf tensors that
  /// require grad); `constants` every constant it reads; `buffers` every
  /// buffer (no grad), which forward updates in place (Note [buffers] in ir.h).
  StageRunner(const ir::Graph &g, schedule::StageProgram program, std::map<ir::ValueId, torch::Tensor> params,
              std::map<ir::ValueId, torch::Tensor> constants, std::map<ir::ValueId, torch::Tensor> buffers = {});

  const schedule::StageProgram &program() const { return program_; }
  /// The stage's trainable tensors, in value-id order.
  std::vector<torch::Tensor> parameters() const;
  /// Parameter `id` of the stage (it must read it).
  const torch::Tensor &parameter(ir::ValueId id) const { return params_.at(id); }
  /// The stage's buffers (BatchNorm running statistics) by value id: not
  /// trained, updated by every training-mode forward.
  const std::map<ir::ValueId, torch::Tensor> &buffers() const { return buffers_; }

  /// Runs the stage's ops for micro-batch `mb`. `feeds` holds the data inputs
  /// and the received values; received floating-point values become leaves
  /// whose gradients backward() computes.
  void forward(int mb, std::unordered_map<ir::ValueId, torch::Tensor> feeds);
  /// A value computed (or received) for micro-batch `mb`.
  const torch::Tensor &value(int mb, ir::ValueId v) const;
  /// The loss of micro-batch `mb` (only on the stage that computes it).
  const torch::Tensor &loss(int mb) const { return value(mb, loss_); }

  /// Back-propagates micro-batch `mb`: `send_grads[i]` is the gradient of
  /// program().sends[i] returned by its consumer (undefined: no gradient), and
  /// the loss, if computed here, is scaled by `loss_weight`. Parameter
  /// gradients accumulate across micro-batches. Move the gradients in: each
  /// is freed once consumed (Note [handing gradients over] in stage.cpp).
  void backward(int mb, std::vector<torch::Tensor> send_grads, double loss_weight);
  /// The gradient of received value `v` after backward (zeros when the value
  /// does not influence the loss; undefined for non-floating values and
  /// those that carry none here, Note [shape-only receives]).
  torch::Tensor inputGrad(int mb, ir::ValueId v) const;
  /// Drops the micro-batch's saved values (under a split backward, what its
  /// W needs stays, in the W queue, until backwardWeights).
  void release(int mb) {
    envs_.erase(mb);
    stash_.erase(mb);
    input_grads_.erase(mb);
    root_edges_.erase(mb);
  }

  /// Split backward (ZB-H1; Note [split backward] in stage.cpp): backward()
  /// computes only the received values' gradients and keeps what the weight
  /// gradients need for backwardWeights(). Refused (std::runtime_error) where
  /// one parameter reaches several weight-gradient roots of the stage.
  void setSplitBackward(bool on);
  bool splitsBackward() const { return split_; }
  /// W of micro-batch `mb`, whose backward() ran: accumulates its weight
  /// gradients into the parameters' .grad (their hooks fire as in backward())
  /// and lets go of what B kept for it.
  void backwardWeights(int mb);

  /// Note [recomputation]
  /// A recomputing stage runs forward without recording autograd and keeps,
  /// per micro-batch, only its inputs (received values, data), the values it
  /// sends and the loss. Just before the micro-batch's backward it re-runs
  /// forward from those inputs with autograd on, the random generator set
  /// back to its state before the first run (dropout draws the same masks),
  /// and buffers left alone (BatchNorm's running statistics move once per
  /// micro-batch). The planner counts b*act of activations and a stash of
  /// k*b*cut_in for it (evaluate.cpp) instead of k*b*(cut_in + act): one
  /// micro-batch's full set at a time, its sent values included (Note
  /// [recomputing stage's peak] in planner/partition/evaluate.cpp).
  void setRecompute(bool on) { recompute_ = on; }
  /// A recomputing stage's sent values, once sent: backward recomputes them.
  void dropSent(int mb);
  bool recomputes() const { return recompute_; }

  /// Note [last use]
  /// Forward drops each value from the micro-batch's environment once the
  /// last op of the stage that reads it has run, as PyTorch's eager mode
  /// does: what backward needs, autograd has saved itself (a dropped tensor
  /// it saved stays alive through that reference), and the rest is freed at
  /// once (a GPT's attention scores before the softmax, for one). Kept to the
  /// end: the received values (their gradients go back), the values the
  /// stage sends (backward starts from them) and the loss. So a unit's kept
  /// bytes, measured by the profiler with the same runner, are what autograd
  /// saves plus the unit's outputs for later units; the planner takes off
  /// those that autograd saves nowhere where a stage also holds their last
  /// reader (Note [values autograd keeps] in executor/profile/profiler.cpp,
  /// Note [unsaved values] in planner/partition/evaluate.cpp).
  /// setKeepAll(true) keeps every value (the profiler's whole-graph run, which
  /// feeds each unit from it).
  void setKeepAll(bool on) { keep_all_ = on; }
  /// Whether forward keeps each sent view as its dense copy (Note [dense
  /// sent values]; on by default). The profiler turns it off: a unit's sent
  /// view is, inside a stage, a view the next unit reads.
  void setDenseSends(bool on) { dense_sends_ = on; }
  /// Called with each value forward drops, just before it goes (the
  /// profiler watches which of them autograd keeps alive).
  void onDrop(std::function<void(ir::ValueId, const torch::Tensor &)> f) { on_drop_ = std::move(f); }

  /// Mixed precision (Note [autocast dtypes] in planner/cost/precision.cpp):
  /// run every forward, the recomputed one too, under LibTorch's autocast at
  /// `dtype` (kBFloat16 or kHalf); kFloat turns it off. Backward runs outside
  /// autocast, as in PyTorch.
  void setAutocast(torch::ScalarType dtype) { autocast_ = dtype; }
  torch::ScalarType autocastDType() const { return autocast_; }
  /// Starts a training step: drops autocast's cached low-precision weight
  /// copies, which all micro-batches of the last step shared (the optimizer
  /// has changed the weights since).
  void newStep();

  /// The device the stage computes on: its random generator (dropout, the
  /// state recomputation replays) is that device's default one. CPU unless set.
  void setDevice(torch::Device d) { device_ = d; }
  torch::Device device() const { return device_; }

  /// A tensor-parallel stage's group, over which its collectives run (Note
  /// [tensor parallel collectives] in kernels/tensor_parallel.cpp); it must
  /// outlive the runner. Null (the default): the stage is not tensor-parallel.
  void setTensorParallel(comm::Communicator *group) { group_ = group; }

private:
  /// Runs the program's ops on `env` (inputs in, every value out) with
  /// runNodes (Note [one interpreter] in interpreter.h).
  void run(std::unordered_map<ir::ValueId, torch::Tensor> &env, bool update_buffers);
  /// Replaces each sent value that is not contiguous by its dense copy (Note [dense sent values]).
  void densifySent(std::unordered_map<ir::ValueId, torch::Tensor> &env) const;
  /// Received value `v` of `mb` as the leaf whose gradient goes back.
  const torch::Tensor &receivedLeaf(int mb, ir::ValueId v) const;
  /// The recomputing forward of `mb` from its stash.
  void recomputeForward(int mb);

  struct Stash {
    std::unordered_map<ir::ValueId, torch::Tensor> inputs;
    torch::Tensor rng_state; ///< the device's generator state before the first forward
  };

  const ir::Graph &g_;
  schedule::StageProgram program_;
  std::map<ir::ValueId, torch::Tensor> params_;
  std::map<ir::ValueId, torch::Tensor> constants_;
  std::map<ir::ValueId, torch::Tensor> buffers_;
  std::map<ir::NodeId, std::vector<ir::BufferUpdate>> updates_; ///< buffer updates by the node that makes them
  ir::ValueId loss_;
  std::map<int, std::unordered_map<ir::ValueId, torch::Tensor>> envs_;
  bool recompute_ = false;
  bool keep_all_ = false;
  bool dense_sends_ = true;
  std::function<void(ir::ValueId, const torch::Tensor &)> on_drop_;
  /// Note [last use]: dying_[i], the values the node at program_.nodes[i] reads
  /// for the last time or makes for nobody, dropped after it runs.
  std::vector<std::vector<ir::ValueId>> dying_;
  bool in_place_ = false; ///< the program has in-place ATen ops
  torch::ScalarType autocast_ = torch::kFloat; ///< kFloat: no autocast
  torch::Device device_ = torch::kCPU;
  comm::Communicator *group_ = nullptr; ///< the tensor-parallel group
  std::map<int, Stash> stash_; ///< recomputing stages: what forward keeps (Note [recomputation])
  // Note [split backward]
  bool split_ = false;
  std::unordered_map<ir::NodeId, std::vector<ir::ValueId>> root_params_; ///< per root node, its parameters
  std::vector<ir::ValueId> b_params_; ///< those whose gradients B computes (Note [weight gradients in B])
  std::map<int, std::vector<std::pair<ir::NodeId, std::vector<torch::autograd::Edge>>>> root_edges_; ///< forward -> B
  std::vector<std::pair<ir::NodeId, std::vector<torch::autograd::Edge>>> *recording_ = nullptr;
  std::map<int, std::unordered_map<ir::ValueId, torch::Tensor>> input_grads_; ///< B's results
  /// One engine pass of W: from `edges`, given `grads`, to `params` (the
  /// gradient edges of parameters) only.
  struct WeightPass {
    torch::autograd::edge_list edges;
    std::vector<torch::Tensor> grads;
    torch::autograd::edge_list params;
  };
  /// The W queue: per micro-batch whose B ran, its passes (Note [one W pass]).
  std::map<int, std::vector<WeightPass>> wqueue_;
};

/// Random data of `v`'s shape at `samples` samples: normal floats, zero
/// indices (valid for every lookup and label), drawn from `seed`.
torch::Tensor syntheticInput(const ir::Value &v, int64_t samples, uint64_t seed);

/// A tensor's dtype and shape, for the message ahead of its bytes
/// (executor/train/transport.h), and an uninitialised tensor of them on `device`.
std::string packTensorHeader(const torch::Tensor &t);
torch::Tensor emptyFromHeader(const std::string &header, const torch::Device &device);

} // namespace rannc::runtime
