#include "executor/train/buckets.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <stdexcept>

#include "executor/train/transport.h"

namespace rannc::train {

GradientBuckets::GradientBuckets(comm::Communicator &group, const std::vector<torch::Tensor> &params,
                                 int64_t bucket_bytes, Mode mode)
    : group_(group), mode_(mode) {
  // Reverse model order: roughly the order backward finishes gradients.
  std::vector<int64_t> numel;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const torch::Tensor &p = *it;
    if (p.scalar_type() != torch::kFloat && p.scalar_type() != torch::kDouble) // Note [float64 collectives]
      throw std::runtime_error("gradient all-reduce supports float32 and float64 parameters only, not " +
                               std::string(c10::toString(p.scalar_type())));
    const int64_t n = p.numel();
    // A bucket holds one dtype: a model in double sums in double.
    if (buckets_.empty() || buckets_.back().params.front().scalar_type() != p.scalar_type() ||
        (numel.back() + n) * int64_t(p.element_size()) > bucket_bytes) {
      buckets_.emplace_back();
      numel.push_back(0);
    }
    buckets_.back().params.push_back(p);
    numel.back() += n;
    const size_t index = buckets_.size() - 1;
    c10::intrusive_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(p);
    const uintptr_t key = acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, index](const torch::autograd::variable_list &outputs, const torch::autograd::variable_list &) {
          arrived(index);
          return outputs;
        }));
    hooks_.emplace_back(std::move(acc), key);
  }
  const int64_t r = group_.size();
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket &b = buckets_[i];
    const int64_t size = sharded() ? (numel[i] + r - 1) / r * r : numel[i];
    // On the parameters' device: on a GPU the group sums device memory.
    const auto opts = torch::TensorOptions(b.params.front().scalar_type()).device(b.params.front().device());
    b.flat = torch::zeros({size}, opts);
    adopt(b);
    if (!sharded()) continue;
    // The parameters move into one flat buffer laid out like the gradients;
    // the padding stays zero (its gradient is zero, so no optimizer moves it).
    b.block = size / r;
    b.param_flat = torch::zeros({size}, opts);
    torch::NoGradGuard no_grad;
    int64_t offset = 0;
    for (torch::Tensor &p : b.params) {
      torch::Tensor view = b.param_flat.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
      view.copy_(p);
      p.set_data(view);
    }
  }
}

std::vector<GradientBuckets::Shard> GradientBuckets::shards() const {
  std::vector<Shard> out;
  const int64_t j = group_.rank();
  for (const Bucket &b : buckets_) out.push_back({b.param_flat.narrow(0, j * b.block, b.block),
                                                  b.flat.narrow(0, j * b.block, b.block)});
  return out;
}

void GradientBuckets::gatherParameters() {
  std::vector<std::unique_ptr<comm::Request>> requests;
  for (Bucket &b : buckets_) requests.push_back(group_.startAllGather(floatBuffer(group_, b.param_flat)));
  for (auto &req : requests) req->wait();
}

bool GradientBuckets::adopt(Bucket &b) {
  bool moved = false;
  int64_t offset = 0;
  for (torch::Tensor &p : b.params) {
    torch::Tensor view = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
    if (p.grad().defined() && p.grad().data_ptr() == view.data_ptr()) continue;
    if (p.grad().defined()) view.copy_(p.grad());
    else view.zero_();
    p.mutable_grad() = view;
    moved = true;
  }
  return moved;
}

GradientBuckets::~GradientBuckets() {
  // The hooks refer to this object; the parameters may outlive it.
  for (auto &[acc, key] : hooks_) acc->del_post_hook(key);
}

void GradientBuckets::arm() {
  armed_ = true;
  next_ = 0;
  started_early_ = 0;
  for (Bucket &b : buckets_) {
    b.pending = int(b.params.size());
    b.request.reset();
  }
}

void GradientBuckets::arrived(size_t bucket) {
  if (!armed_) return;
  Bucket &b = buckets_[bucket];
  if (b.pending > 0) --b.pending;
  const size_t before = next_;
  startReady();
  started_early_ += int(next_ - before);
  for (size_t i = 0; i < next_; ++i) // let MPI move the buckets in flight
    if (buckets_[i].request) buckets_[i].request->test();
}

void GradientBuckets::start(Bucket &b) {
  adopt(b); // normally a no-op: the gradients already live in the bucket
  const comm::Buffer flat = floatBuffer(group_, b.flat);
  b.request = mode_ == Mode::ReduceScatter ? group_.startReduceScatter(flat)
                                           : group_.startAllReduce(flat, comm::ReduceOp::Sum);
}

void GradientBuckets::startReady() {
  while (next_ < buckets_.size() && buckets_[next_].pending == 0) start(buckets_[next_++]);
}

void GradientBuckets::finish() {
  armed_ = false;
  while (next_ < buckets_.size()) start(buckets_[next_++]);
  const int64_t j = group_.rank();
  for (Bucket &b : buckets_) { // the sums land in the gradients themselves
    b.request->wait();
    b.request.reset();
    // A reduce-scatter leaves this rank's sums at the front of the buffer.
    if (mode_ == Mode::ReduceScatter && j > 0) b.flat.narrow(0, j * b.block, b.block).copy_(b.flat.narrow(0, 0, b.block));
  }
}

} // namespace rannc::train
