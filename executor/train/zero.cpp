#include "executor/train/zero.h"

#include <stdexcept>
#include <utility>

#include "executor/train/transport.h"

namespace rannc::train {
namespace {

namespace optim = torch::optim;

void *stateKey(const torch::Tensor &p) { return p.unsafeGetTensorImpl(); }

/// One parameter's optimizer state as tensors in a fixed order (undefined
/// where the optimizer keeps none) and a step count.
struct Fields {
  std::vector<torch::Tensor> tensors;
  int64_t step = 0;
};

template <typename AdamState> Fields adamFields(const AdamState &s) {
  return {{s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()}, s.step()};
}

template <typename AdamState> std::unique_ptr<optim::OptimizerParamState> makeAdam(const Fields &f) {
  auto s = std::make_unique<AdamState>();
  s->step(f.step);
  s->exp_avg(f.tensors[0]);
  s->exp_avg_sq(f.tensors[1]);
  s->max_exp_avg_sq(f.tensors[2]);
  return s;
}

Fields fieldsOf(const optim::OptimizerParamState &s) {
  if (auto *a = dynamic_cast<const optim::AdamParamState *>(&s)) return adamFields(*a);
  if (auto *a = dynamic_cast<const optim::AdamWParamState *>(&s)) return adamFields(*a);
  if (auto *g = dynamic_cast<const optim::SGDParamState *>(&s)) return {{g->momentum_buffer()}, 0};
  throw std::runtime_error("sharded optimizer state supports SGD, Adam and AdamW only");
}

/// A state of the same kind as `like` holding `f`.
std::unique_ptr<optim::OptimizerParamState> makeLike(const optim::OptimizerParamState &like, const Fields &f) {
  if (dynamic_cast<const optim::AdamParamState *>(&like)) return makeAdam<optim::AdamParamState>(f);
  if (dynamic_cast<const optim::AdamWParamState *>(&like)) return makeAdam<optim::AdamWParamState>(f);
  auto s = std::make_unique<optim::SGDParamState>();
  s->momentum_buffer(f.tensors[0]);
  return s;
}

} // namespace

std::unique_ptr<optim::OptimizerParamState>
mapOptimizerState(const optim::OptimizerParamState &s, const std::function<torch::Tensor(const torch::Tensor &)> &f) {
  Fields fields = fieldsOf(s);
  for (torch::Tensor &t : fields.tensors)
    if (t.defined()) t = f(t);
  return makeLike(s, fields);
}

ShardedOptimizer::ShardedOptimizer(GradientBuckets &buckets, const Factory &make)
    : buckets_(buckets) {
  if (!buckets.sharded()) throw std::logic_error("ShardedOptimizer needs sharded gradient buckets");
  shards_ = buckets.shards();
  for (GradientBuckets::Shard &s : shards_) {
    s.param.mutable_grad() = s.grad; // the optimizer reads its gradient block there
    params_.push_back(s.param);
  }
  inner_ = make(params_);
}

void ShardedOptimizer::step() {
  inner_->step();
  buckets_.gatherParameters();
}

void ShardedOptimizer::gatherState(optim::Optimizer &dense) const {
  comm::Communicator &group = buckets_.group();
  const int64_t r = group.size(), j = group.rank();
  for (size_t i = 0; i < shards_.size(); ++i) {
    // Every replica has taken the same steps, so all have a state or none.
    auto it = inner_->state().find(stateKey(shards_[i].param));
    if (it == inner_->state().end()) continue;
    const Fields mine = fieldsOf(*it->second);
    const int64_t block = shards_[i].param.numel();
    std::vector<torch::Tensor> whole(mine.tensors.size());
    for (size_t k = 0; k < whole.size(); ++k) {
      if (!mine.tensors[k].defined()) continue;
      whole[k] = torch::empty({block * r}, mine.tensors[k].options());
      whole[k].narrow(0, j * block, block).copy_(mine.tensors[k]);
      group.startAllGather(floatBuffer(group, whole[k]))->wait();
    }
    int64_t offset = 0;
    for (const torch::Tensor &p : buckets_.bucketParams(i)) {
      Fields f{std::vector<torch::Tensor>(whole.size()), mine.step};
      for (size_t k = 0; k < whole.size(); ++k)
        if (whole[k].defined()) f.tensors[k] = whole[k].narrow(0, offset, p.numel()).view(p.sizes()).clone();
      dense.state()[stateKey(p)] = makeLike(*it->second, f);
      offset += p.numel();
    }
  }
}

void ShardedOptimizer::scatterState(optim::Optimizer &dense) {
  const int64_t r = buckets_.group().size(), j = buckets_.group().rank();
  for (size_t i = 0; i < shards_.size(); ++i) {
    const auto &params = buckets_.bucketParams(i);
    const optim::OptimizerParamState *like = nullptr;
    for (const torch::Tensor &p : params)
      if (auto it = dense.state().find(stateKey(p)); it != dense.state().end()) like = it->second.get();
    if (!like) continue; // no step taken yet
    const Fields first = fieldsOf(*like);
    const int64_t block = shards_[i].param.numel();
    Fields mine{std::vector<torch::Tensor>(first.tensors.size()), first.step};
    for (size_t k = 0; k < first.tensors.size(); ++k) {
      if (!first.tensors[k].defined()) continue;
      torch::Tensor whole = torch::zeros({block * r}, first.tensors[k].options());
      int64_t offset = 0;
      for (const torch::Tensor &p : params) {
        if (auto it = dense.state().find(stateKey(p)); it != dense.state().end()) {
          const torch::Tensor t = fieldsOf(*it->second).tensors[k];
          if (t.defined()) whole.narrow(0, offset, p.numel()).copy_(t.reshape({-1}));
        }
        offset += p.numel();
      }
      mine.tensors[k] = whole.narrow(0, j * block, block).clone();
    }
    inner_->state()[stateKey(shards_[i].param)] = makeLike(*like, mine);
  }
  dense.state().clear();
}

} // namespace rannc::train
