#include "executor/runtime/stage.h"

#include <ATen/autocast_mode.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include "executor/runtime/interpreter.h"
#include "executor/runtime/ops.h"
#include "planner/ir/op_set.h"
#include "planner/ir/weight_gradients.h"

namespace rannc::runtime {
namespace {

/// Enables LibTorch's autocast for `device` at `dtype` for one forward, as
/// Python's `with torch.autocast(...)` does, and restores the state after.
/// Its cache of low-precision weight copies is on only while autograd
/// records: a copy cast under no_grad has no history, and a later forward
/// with autograd on (recomputation) must not reuse it. The cache is cleared
/// per step (StageRunner::newStep), not per forward: micro-batches share one
/// copy (Note [autocast dtypes]).
class AutocastGuard {
public:
  AutocastGuard(c10::DeviceType device, torch::ScalarType dtype) : device_(device) {
    if (dtype == torch::kFloat) return;
    active_ = true;
    enabled_ = at::autocast::is_autocast_enabled(device);
    dtype_ = at::autocast::get_autocast_dtype(device);
    cache_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(device, true);
    at::autocast::set_autocast_dtype(device, dtype);
    at::autocast::set_autocast_cache_enabled(at::GradMode::is_enabled());
  }
  ~AutocastGuard() {
    if (!active_) return;
    at::autocast::set_autocast_enabled(device_, enabled_);
    at::autocast::set_autocast_dtype(device_, dtype_);
    at::autocast::set_autocast_cache_enabled(cache_);
  }
  AutocastGuard(const AutocastGuard &) = delete;
  AutocastGuard &operator=(const AutocastGuard &) = delete;

private:
  c10::DeviceType device_;
  bool active_ = false, enabled_ = false, cache_ = true;
  torch::ScalarType dtype_ = torch::kFloat;
};

} // namespace

StageRunner::StageRunner(const ir::Graph &g, schedule::StageProgram program,
                         std::map<ir::ValueId, torch::Tensor> params, std::map<ir::ValueId, torch::Tensor> constants,
                         std::map<ir::ValueId, torch::Tensor> buffers)
    : g_(g), program_(std::move(program)), params_(std::move(params)), constants_(std::move(constants)),
      buffers_(std::move(buffers)), loss_(g.loss) {
  for (ir::ValueId p : program_.parameters)
    if (!params_.count(p)) throw std::runtime_error("parameter '" + g.values[p].name + "' was not loaded");
  for (ir::ValueId c : program_.constants)
    if (!constants_.count(c)) throw std::runtime_error("constant '" + g.values[c].name + "' was not loaded");
  for (ir::ValueId b : program_.buffers)
    if (!buffers_.count(b)) throw std::runtime_error("buffer '" + g.values[b].name + "' was not loaded");
  for (const ir::BufferUpdate &u : ir::bufferUpdates(g)) updates_[u.node].push_back(u);
  for (ir::NodeId n : program_.nodes) in_place_ |= ir::isInPlace(g.nodes[n]);
  // Note [last use]: where each value is read for the last time.
  std::unordered_map<ir::ValueId, size_t> last;
  for (size_t i = 0; i < program_.nodes.size(); ++i) {
    const ir::Node &node = g.nodes[program_.nodes[i]];
    for (ir::ValueId out : node.outputs)
      if (out != ir::kNoValue) last.emplace(out, i); // made here; a reader moves it on
    for (ir::ValueId in : node.inputs)
      if (in != ir::kNoValue) last[in] = i;
  }
  std::unordered_set<ir::ValueId> kept;
  for (const auto &r : program_.recvs)
    if (r.gradient) kept.insert(r.value); // Note [shape-only receives]: the others go at their last use
  for (const auto &snd : program_.sends) kept.insert(snd.value);
  if (program_.computes_loss) kept.insert(loss_);
  dying_.assign(program_.nodes.size(), {});
  for (const auto &[v, i] : last)
    if (!kept.count(v) && g.values[v].kind == ir::ValueKind::Intermediate) dying_[i].push_back(v);
}

std::vector<torch::Tensor> StageRunner::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto &[id, t] : params_) out.push_back(t);
  return out;
}

void StageRunner::forward(int mb, std::unordered_map<ir::ValueId, torch::Tensor> feeds) {
  for (const auto &r : program_.recvs) {
    auto it = feeds.find(r.value);
    if (it == feeds.end()) throw std::runtime_error("value '" + g_.values[r.value].name + "' was not received");
    // Note [gradient-free values]: a leaf that requires a gradient only where PyTorch's could.
    if (it->second.is_floating_point() && r.gradient) it->second.requires_grad_(true);
  }
  auto &env = envs_[mb];
  if (!recompute_) {
    // An in-place ATen op (a traced `out += identity` right after a stage
    // boundary) may write to a received value, which autograd refuses on a
    // leaf: the stage computes on a copy and keeps the leaf, whose gradient
    // inputGrad sends back, in the micro-batch's stash.
    if (in_place_)
      for (const auto &r : program_.recvs)
        if (auto it = feeds.find(r.value); it != feeds.end() && it->second.requires_grad()) {
          stash_[mb].inputs[r.value] = it->second;
          it->second = it->second.clone();
        }
    env = std::move(feeds);
    recording_ = split_ ? &root_edges_[mb] : nullptr;
    run(env, true);
    recording_ = nullptr;
    densifySent(env);
    return;
  }
  // Note [recomputation]: keep the inputs, the sent values and the loss.
  Stash &stash = stash_[mb];
  stash.inputs = feeds;
  if (in_place_) // an in-place op (TorchScript's `out += identity`) may write to an input
    for (auto &[v, t] : stash.inputs) t = t.detach().clone().requires_grad_(t.requires_grad());
  stash.rng_state = at::globalContext().defaultGenerator(device_).get_state();
  env = std::move(feeds);
  {
    torch::NoGradGuard no_grad;
    run(env, true);
  }
  densifySent(env);
  std::unordered_map<ir::ValueId, torch::Tensor> kept = stash.inputs;
  for (const auto &snd : program_.sends) kept[snd.value] = env.at(snd.value);
  if (program_.computes_loss) kept[loss_] = env.at(loss_);
  env = std::move(kept);
}

// Note [dense sent values]
// A value the stage sends may be a view that is not contiguous: a GPT's
// query or key, transposed for the attention after the cut. The transport
// sends dense bytes, so it would copy it, and the copy would live beside the
// view until the send completed; under ZB-H2, whose sends are not all
// awaited, the GPT's first stage held one copy of its q, k and v (12,288 B)
// for every micro-batch the next stage had not taken in yet (1.039-1.086x
// its plan on the 4-stage memory_split case). So the stage keeps the dense
// copy in the view's place, made with autograd (the backward reaches the
// view through it), and sends that: the view's storage goes unless
// something else holds it, which for a projection's output reshaped and
// transposed nothing does, so the stage holds what the plan counts, the
// value's bytes once. Reading the view in place through an MPI derived
// datatype (tried 2026-11-29) needed the sender inside MPI to move the
// bytes, where a dense buffer is pulled by the receiver alone: ZB-H1 fell
// to 0.83x 1F1B's throughput on exec_bench's 2-stage pipeline.
// The profiler's unit runners keep their views (setDenseSends(false)): a
// unit's sent view is, inside a stage, a view the next unit reads, and its
// kept bytes count the view's storage once either way. Densifying there too
// moved the memory_split ranks that send views to 0.957-0.966x their plans
// and the recomputing BERT's first rank to 0.897x (recompute_memory_bert_1f1b
// holds 10%).
void StageRunner::densifySent(std::unordered_map<ir::ValueId, torch::Tensor> &env) const {
  if (!dense_sends_) return;
  for (const auto &snd : program_.sends)
    if (auto it = env.find(snd.value); it != env.end() && it->second.defined() && !it->second.is_contiguous())
      it->second = it->second.contiguous();
}

void StageRunner::dropSent(int mb) {
  auto &env = envs_.at(mb);
  for (const auto &snd : program_.sends)
    if (!stash_.at(mb).inputs.count(snd.value)) env.erase(snd.value);
}

void StageRunner::recomputeForward(int mb) {
  Stash &stash = stash_.at(mb);
  at::Generator gen = at::globalContext().defaultGenerator(device_);
  const torch::Tensor now = gen.get_state();
  gen.set_state(stash.rng_state);
  auto &env = envs_[mb];
  env = std::move(stash.inputs);
  recording_ = split_ ? &root_edges_[mb] : nullptr; // Note [split backward]: W's roots are recorded now
  run(env, false);
  recording_ = nullptr;
  gen.set_state(now);
  stash_.erase(mb);
}

void StageRunner::newStep() {
  if (autocast_ != torch::kFloat) at::autocast::clear_cache();
}

void StageRunner::run(std::unordered_map<ir::ValueId, torch::Tensor> &env, bool update_buffers) {
  const c10::DeviceType device = params_.empty() ? c10::DeviceType::CPU : params_.begin()->second.device().type();
  AutocastGuard autocast(device, autocast_);
  NodeHooks hooks;
  // Weights are never in `env` (it holds data, received and computed values).
  hooks.missing = [&](const ir::Node &, ir::ValueId in) -> std::optional<torch::Tensor> {
    switch (g_.values[in].kind) {
    case ir::ValueKind::Parameter: return params_.at(in);
    case ir::ValueKind::Constant: return constants_.at(in);
    case ir::ValueKind::Buffer: // a recomputation must not move running statistics again
      return update_buffers ? buffers_.at(in) : buffers_.at(in).clone();
    default: return std::nullopt;
    }
  };
  hooks.ran = [&](ir::NodeId n, const std::vector<torch::Tensor> &, std::vector<torch::Tensor> &outs) {
    // Note [split backward]: where W will start from, recorded while autograd records.
    if (recording_ && root_params_.count(n) && at::GradMode::is_enabled()) {
      std::vector<torch::autograd::Edge> edges;
      for (const torch::Tensor &o : outs)
        if (o.defined() && o.requires_grad()) edges.push_back(torch::autograd::impl::gradient_edge(o));
      if (!edges.empty()) recording_->push_back({n, std::move(edges)});
    }
    // Kernels that make a tensor from attributes (Constant) make it on the
    // CPU; on a GPU it joins the others there. A 0-dim one stays: LibTorch
    // mixes CPU scalars with device tensors, and reading it needs no copy.
    if (!device_.is_cpu())
      for (torch::Tensor &o : outs)
        if (o.defined() && o.device().is_cpu() && o.dim() > 0) o = o.to(device_);
    // Note [buffers]: a training-mode BatchNormalization's updated running
    // statistics become the buffers' contents (the kernel returns them
    // detached; in inference mode it returns none and nothing changes).
    const ir::Node &node = g_.nodes[n];
    if (auto u = updates_.find(n); update_buffers && u != updates_.end())
      for (const ir::BufferUpdate &bu : u->second)
        for (size_t i = 0; i < node.outputs.size() && i < outs.size(); ++i)
          if (node.outputs[i] == bu.update && outs[i].defined()) {
            torch::NoGradGuard no_grad;
            buffers_.at(bu.buffer).copy_(outs[i]);
          }
  };
  if (!keep_all_)
    hooks.placed = [this](size_t index, ValueMap &env) {
      for (ir::ValueId v : dying_[index]) {
        auto it = env.find(v);
        if (it == env.end()) continue;
        if (on_drop_) on_drop_(v, it->second);
        env.erase(it);
      }
    };
  runNodes(g_, program_.nodes, env, hooks, group_);
}

const torch::Tensor &StageRunner::value(int mb, ir::ValueId v) const {
  auto e = envs_.find(mb);
  if (e == envs_.end()) throw std::runtime_error("micro-batch " + std::to_string(mb) + " has not run forward");
  auto it = e->second.find(v);
  if (it == e->second.end())
    throw std::runtime_error("value '" + g_.values[v].name + "' was not computed in micro-batch " + std::to_string(mb));
  return it->second;
}

namespace {

/// Note [handing gradients over]
/// torch::autograd::backward(roots, grads) keeps `grads` alive until the
/// whole backward is done (its GraphRoot holds them), so a received gradient
/// would occupy memory through the stage's backward. Instead each root goes
/// through this node: forward returns a scalar that depends on the root,
/// backward returns the gradient it was given and lets go of it, so autograd
/// frees it as soon as the root's producer has consumed it, as it does with
/// the gradients flowing between ops inside the stage. The delivered tensor is
/// the same, so the result is too. The profiler measures a unit's backward
/// this way, so a block's working bytes include its incoming gradients for as
/// long as they live (Note [partition cost model]).
struct HandOver : public torch::autograd::Function<HandOver> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &root, torch::Tensor grad) {
    ctx->saved_data["grad"] = std::move(grad);
    return torch::zeros({}, root.options());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list) {
    torch::Tensor grad = ctx->saved_data.at("grad").toTensor();
    ctx->saved_data.erase("grad");
    return {std::move(grad), torch::Tensor()};
  }
};

// Note [what a queued W keeps] (planner/partition/evaluate.cpp): B has run
// with the graph kept, and W runs, root by root, only the nodes between a
// root's output and its own parameters. Every other node the queue's edges
// keep alive (the data side above the roots, back to the stage's inputs)
// lets go of what autograd saved in it now, not at W: the queued
// micro-batch keeps only what its W reads.
//
// Note [one W pass]
// Asked of the engine alone, a root's W still walks every node below the
// root's output, down to the stage's inputs, to count dependencies (B kept
// the graph whole): per micro-batch, the roots times the graph, and one
// engine start per root. So, right after B, every edge from a node a root's
// W runs to a node that root's W does not run is cut (an empty edge): no W
// ran it, so no W changes. When no node is run by two roots' W, each root's
// nodes are then closed (every edge left leads to the same root's nodes),
// and one engine pass from all the roots' outputs to all their parameters
// runs exactly each root's nodes on the same gradients: the queue becomes
// that one pass. Edges of roots' outputs that lead to none of their own
// parameters are dropped first, as their own W never ran them. Otherwise
// (two roots' W share a node) the roots run one by one, as before, on the
// cut graph. On exec_bench's 2-stage GPT (medians of its traces, each run
// against its own forward, as this machine's speed drifts between runs) W
// fell from 0.99 to 0.88 of a forward, and B + W from 1.12-1.13x the whole
// backward to 1.06-1.08x.
template <typename Pass> void prepareWeights(std::vector<Pass> &queue) {
  using torch::autograd::Node;
  const size_t roots = queue.size(), words = (roots + 63) / 64;
  // Every node the queue's edges keep alive, each after the nodes it leads to.
  std::unordered_map<Node *, size_t> index;
  std::vector<Node *> order;
  std::vector<std::pair<Node *, size_t>> stack; // a node and its next edge to visit
  auto visit = [&](Node *f) {
    if (f && index.emplace(f, SIZE_MAX).second) stack.emplace_back(f, 0);
  };
  for (const Pass &pass : queue)
    for (const auto &e : pass.edges) {
      visit(e.function.get());
      while (!stack.empty()) {
        auto &[f, next] = stack.back();
        if (next < f->next_edges().size()) {
          visit(f->next_edges()[next++].function.get());
          continue;
        }
        index[f] = order.size();
        order.push_back(f);
        stack.pop_back();
      }
    }
  // Bit r of a node: it leads to root r's parameters.
  std::vector<uint64_t> bits(order.size() * words, 0);
  auto leads = [&](size_t k, size_t r) { return (bits[k * words + r / 64] >> (r % 64)) & 1; };
  for (size_t r = 0; r < roots; ++r)
    for (const auto &e : queue[r].params)
      if (auto it = index.find(e.function.get()); it != index.end()) bits[it->second * words + r / 64] |= 1ull << (r % 64);
  for (size_t k = 0; k < order.size(); ++k)
    for (const auto &e : order[k]->next_edges())
      if (e.function)
        for (size_t w = 0, c = index.at(e.function.get()); w < words; ++w) bits[k * words + w] |= bits[c * words + w];
  // Root r's W runs the nodes below its outputs that lead to its parameters.
  std::vector<std::vector<size_t>> run_by(order.size()); // per node, the roots whose W runs it, ascending
  std::vector<size_t> todo;
  for (size_t r = 0; r < roots; ++r) {
    for (const auto &e : queue[r].edges)
      if (e.function) todo.push_back(index.at(e.function.get()));
    while (!todo.empty()) {
      const size_t k = todo.back();
      todo.pop_back();
      if (!leads(k, r) || (!run_by[k].empty() && run_by[k].back() == r)) continue;
      run_by[k].push_back(r);
      for (const auto &e : order[k]->next_edges())
        if (e.function) todo.push_back(index.at(e.function.get()));
    }
  }
  bool shared = false;
  for (size_t k = 0; k < order.size(); ++k) {
    const std::vector<size_t> &by = run_by[k];
    if (by.empty()) {
      order[k]->release_variables(); // Note [what a queued W keeps]
      continue;
    }
    shared = shared || by.size() > 1;
    // Emptied in place: set_next_edge refuses a node with a parent, to keep
    // topological numbers ordered, which dropping a child cannot disorder.
    for (torch::autograd::Edge &e : order[k]->next_edges()) {
      if (!e.function) continue;
      const size_t c = index.at(e.function.get());
      if (std::none_of(by.begin(), by.end(), [&](size_t r) { return leads(c, r); })) e = torch::autograd::Edge();
    }
  }
  if (shared || roots < 2) return;
  Pass one;
  for (size_t r = 0; r < roots; ++r) {
    for (size_t k = 0; k < queue[r].edges.size(); ++k)
      if (queue[r].edges[k].function && leads(index.at(queue[r].edges[k].function.get()), r)) {
        one.edges.push_back(std::move(queue[r].edges[k]));
        one.grads.push_back(std::move(queue[r].grads[k]));
      }
    one.params.insert(one.params.end(), queue[r].params.begin(), queue[r].params.end());
  }
  queue.clear();
  if (!one.edges.empty()) queue.push_back(std::move(one));
}

} // namespace

void StageRunner::backward(int mb, std::vector<torch::Tensor> send_grads, double loss_weight) {
  if (recompute_) recomputeForward(mb);
  // The same value may go to several consumers: sum their gradients first.
  std::map<ir::ValueId, torch::Tensor> grads;
  for (size_t i = 0; i < program_.sends.size() && i < send_grads.size(); ++i) {
    if (!send_grads[i].defined()) continue;
    auto &acc = grads[program_.sends[i].value];
    acc = acc.defined() ? acc + send_grads[i] : std::move(send_grads[i]);
  }
  send_grads.clear();
  // Note [handing gradients over]: only autograd holds them from here.
  torch::Tensor root;
  auto add = [&root](torch::Tensor part) { root = root.defined() ? root + part : std::move(part); };
  for (auto &[v, grad] : grads) {
    const torch::Tensor &t = value(mb, v);
    if (t.requires_grad()) add(HandOver::apply(t, std::move(grad)));
  }
  grads.clear();
  if (program_.computes_loss) {
    const torch::Tensor &l = loss(mb);
    if (l.requires_grad()) add(HandOver::apply(l, torch::full_like(l, loss_weight)));
  }
  if (!root.defined()) return;
  if (!split_) {
    root.backward();
    return;
  }
  // Note [split backward]: B, the received values' gradients and those of
  // the roots' outputs, the graph kept for W.
  torch::autograd::edge_list targets;
  std::vector<ir::ValueId> leaves;
  for (const auto &r : program_.recvs) {
    if (!r.gradient) continue; // gone after its last use (Note [shape-only receives])
    const torch::Tensor &t = receivedLeaf(mb, r.value);
    if (!t.requires_grad()) continue;
    targets.push_back(torch::autograd::impl::gradient_edge(t));
    leaves.push_back(r.value);
  }
  auto found = root_edges_.find(mb);
  std::vector<std::pair<ir::NodeId, std::vector<torch::autograd::Edge>>> roots;
  if (found != root_edges_.end()) roots = std::move(found->second), root_edges_.erase(found);
  for (const auto &[n, edges] : roots) targets.insert(targets.end(), edges.begin(), edges.end());
  for (ir::ValueId p : b_params_) // Note [weight gradients in B] in planner/ir/weight_gradients.h
    targets.push_back(torch::autograd::impl::gradient_edge(params_.at(p)));
  if (targets.empty()) return;
  torch::autograd::variable_list got = torch::autograd::Engine::get_default_engine().execute(
      {torch::autograd::impl::gradient_edge(root)}, {torch::ones_like(root)}, /*keep_graph=*/true,
      /*create_graph=*/false, /*accumulate_grad=*/false, targets);
  root = torch::Tensor();
  size_t i = 0;
  for (ir::ValueId v : leaves) input_grads_[mb][v] = std::move(got[i++]);
  auto &queue = wqueue_[mb];
  for (auto &[n, edges] : roots) {
    WeightPass pass;
    for (auto &e : edges) {
      torch::Tensor &grad = got[i++];
      if (!grad.defined()) continue; // this output does not lead to the loss
      pass.edges.push_back(std::move(e));
      pass.grads.push_back(std::move(grad));
    }
    // Only this root's own parameters: a path through the data side reaches
    // none of them (setSplitBackward refused stages where it could).
    for (ir::ValueId p : root_params_.at(n)) pass.params.push_back(torch::autograd::impl::gradient_edge(params_.at(p)));
    if (!pass.edges.empty() && !pass.params.empty()) queue.push_back(std::move(pass));
  }
  WeightPass from_b; // B's own weight gradients, accumulated at W with the rest
  for (ir::ValueId p : b_params_) {
    torch::Tensor &grad = got[i++];
    if (!grad.defined()) continue;
    from_b.edges.push_back(torch::autograd::impl::gradient_edge(params_.at(p)));
    from_b.grads.push_back(std::move(grad));
    from_b.params.push_back(from_b.edges.back());
  }
  if (!from_b.edges.empty()) queue.push_back(std::move(from_b));
  prepareWeights(queue); // Note [what a queued W keeps]; Note [one W pass]
}

void StageRunner::backwardWeights(int mb) {
  auto found = wqueue_.find(mb);
  if (found == wqueue_.end()) return; // nothing of this micro-batch reached a weight
  auto queue = std::move(found->second);
  wqueue_.erase(found);
  for (auto &pass : queue)
    torch::autograd::Engine::get_default_engine().execute(pass.edges, pass.grads, /*keep_graph=*/false,
                                                          /*create_graph=*/false, /*accumulate_grad=*/true, pass.params);
}

const torch::Tensor &StageRunner::receivedLeaf(int mb, ir::ValueId v) const {
  auto s = stash_.find(mb); // a received value kept apart from an in-place op (forward)
  const bool kept = !recompute_ && s != stash_.end() && s->second.inputs.count(v);
  return kept ? s->second.inputs.at(v) : value(mb, v);
}

// Note [split backward]
// A schedule that splits the backward (ZB-H1 or ZB-H2, Note [zero bubble H1] in
// planner/pipeline/schedule.h) runs B, the gradients of the stage's received
// values, apart from W, its weight gradients. The weight-gradient roots
// (ir::weightGradientRoots: the products and lookups that combine a weight
// with data, a MatMul with its weight, an embedding's Gather) split them: B
// asks autograd's engine for the gradients of the received values and of the
// roots' outputs, with the graph kept, and for those of the parameters that
// elementwise ops and norms read (Note [weight gradients in B] in
// planner/ir/weight_gradients.h); W then runs, in one pass (Note [one W
// pass]), from those output gradients to each root's own parameters only,
// and accumulates B's parameter gradients beside them. Autograd computes in
// each pass only the edges it needs, so a MatMul's backward computes dX in B
// and dW in W, once each. A parameter reached by two roots of one stage
// (a layer applied twice) could be reached again through the data side, so
// such a stage is refused. Memory: from B until its W a micro-batch keeps
// the roots' output gradients and what their W reads, the rest of its graph
// released right after B (the W queue, Block::wgrad_bytes_per_sample; Note
// [what a queued W keeps] in planner/partition/evaluate.cpp); received
// gradients are handed over as in a whole backward.
// A recomputing stage (Note [recomputation]) records the roots while it
// recomputes its forward, just before B, so its B is that forward and the
// input gradients; from then on its queued W is the same. A tensor-parallel
// stage's collectives (Note [tensor parallel collectives]) sit on the data
// side, so B runs them and W, from a root's output gradient to its own
// parameters, runs none; were one there, the group's devices would still run
// it in one order, as they run the same action list.
void StageRunner::setSplitBackward(bool on) {
  split_ = on;
  root_params_.clear();
  b_params_.clear();
  if (!on) return;
  const ir::StageWeightRoots found = ir::stageWeightRoots(g_, program_.nodes);
  if (!found.conflict.empty()) // `check` refuses such plans (Note [split backward])
    throw std::runtime_error("a split backward (zb-h1, zb-h2) needs each parameter read by one op of its stage, but " +
                             found.conflict);
  for (const auto &[n, params] : found.roots) {
    std::vector<ir::ValueId> &mine = root_params_[n];
    for (ir::ValueId v : params)
      if (params_.count(v)) mine.push_back(v);
  }
  for (ir::ValueId v : found.in_b)
    if (params_.count(v)) b_params_.push_back(v);
}

torch::Tensor StageRunner::inputGrad(int mb, ir::ValueId v) const {
  for (const auto &r : program_.recvs) // Note [shape-only receives]: no gradient, and gone
    if (r.value == v && !r.gradient) return {};
  const torch::Tensor &t = receivedLeaf(mb, v);
  if (!t.is_floating_point()) return {};
  torch::Tensor g;
  if (!split_) {
    g = t.grad();
  } else if (auto m = input_grads_.find(mb); m != input_grads_.end()) {
    if (auto it = m->second.find(v); it != m->second.end()) g = it->second;
  }
  return g.defined() ? g : torch::zeros_like(t);
}

torch::Tensor syntheticInput(const ir::Value &v, int64_t samples, uint64_t seed) {
  std::vector<int64_t> dims;
  for (const ir::Dim &d : v.shape) dims.push_back(d.known ? d.at(samples) : 1);
  auto opts = torch::TensorOptions().dtype(toScalarType(v.dtype));
  if (!ir::isFloating(v.dtype)) return torch::zeros(dims, opts);
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randn(dims, gen, opts);
}

namespace {
constexpr uint32_t kTensorMagic = 0x524e4e54; // "RNNT"
}

std::string packTensorHeader(const torch::Tensor &t) {
  int32_t dtype = static_cast<int32_t>(fromScalarType(t.scalar_type()));
  int32_t ndim = static_cast<int32_t>(t.dim());
  std::string out;
  out.reserve(12 + 8 * ndim);
  out.append(reinterpret_cast<const char *>(&kTensorMagic), 4);
  out.append(reinterpret_cast<const char *>(&dtype), 4);
  out.append(reinterpret_cast<const char *>(&ndim), 4);
  for (int64_t d : t.sizes()) out.append(reinterpret_cast<const char *>(&d), 8);
  return out;
}

torch::Tensor emptyFromHeader(const std::string &header, const torch::Device &device) {
  auto fail = [] { return std::runtime_error("received a malformed tensor header"); };
  if (header.size() < 12) throw fail();
  uint32_t magic;
  int32_t dtype, ndim;
  std::memcpy(&magic, header.data(), 4);
  std::memcpy(&dtype, header.data() + 4, 4);
  std::memcpy(&ndim, header.data() + 8, 4);
  if (magic != kTensorMagic || ndim < 0 || header.size() != 12 + 8 * size_t(ndim)) throw fail();
  std::vector<int64_t> dims(ndim);
  std::memcpy(dims.data(), header.data() + 12, 8 * size_t(ndim));
  return torch::empty(dims, torch::TensorOptions().dtype(toScalarType(static_cast<ir::DType>(dtype))).device(device));
}

} // namespace rannc::runtime
