#include "executor/train/sample_order.h"

#include <cstring>
#include <numeric>
#include <stdexcept>
#include <random>

#include "executor/runtime/ops.h"

namespace rannc::train {

int64_t SampleOrder::at(int64_t position) {
  if (position < 0) throw std::runtime_error("data position " + std::to_string(position) + " is negative (overflow?)");
  int64_t epoch = position / n_, offset = position % n_;
  if (!shuffle_) return offset;
  if (epoch != epoch_) {
    perm_.resize(n_);
    std::iota(perm_.begin(), perm_.end(), 0);
    std::mt19937_64 rng(seed_ + static_cast<uint64_t>(epoch));
    for (int64_t i = n_ - 1; i > 0; --i) std::swap(perm_[i], perm_[std::uniform_int_distribution<int64_t>(0, i)(rng)]);
    epoch_ = epoch;
  }
  return perm_[offset];
}

torch::Tensor gatherSamples(const data::NpyArray &a, SampleOrder &order, int64_t first, int64_t count,
                            const torch::Device &device) {
  std::vector<int64_t> dims = a.shape();
  dims[0] = count;
  auto opts = torch::TensorOptions().dtype(runtime::toScalarType(a.dtype())).pinned_memory(device.is_cuda());
  torch::Tensor t = torch::empty(dims, opts);
  char *dst = static_cast<char *>(t.data_ptr());
  // Each step re-checks the file: data that changes under a run is an error
  // naming it, not silently different samples (Note [hostile inputs]).
  Status st = a.checkUnchanged();
  for (int64_t i = 0; st && i < count; ++i) st = a.readSample(order.at(first + i), dst + i * a.sampleBytes());
  if (!st) throw std::runtime_error(st.message());
  return device.is_cuda() ? t.to(device, /*non_blocking=*/true) : t;
}

} // namespace rannc::train
