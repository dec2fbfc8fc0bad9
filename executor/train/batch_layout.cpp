#include "executor/train/batch_layout.h"

#include <stdexcept>

namespace rannc::train {

BatchLayout batchLayout(const ir::Value &v) {
  if (!v.shape_known) return {0, 1};
  for (size_t i = 0; i < v.shape.size(); ++i) {
    if (!v.shape[i].known) return {0, 1};
    if (v.shape[i].batch_coeff != 0) return {int64_t(i), v.batch_blocks};
  }
  return {-1, 1};
}

std::vector<int64_t> blockView(const torch::Tensor &t, const BatchLayout &l, int64_t n) {
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  const int64_t per_sample = sizes[size_t(l.axis)] / n;
  sizes[size_t(l.axis)] = per_sample / l.blocks;
  sizes.insert(sizes.begin() + l.axis, {l.blocks, n});
  return sizes;
}

torch::Tensor sliceSamples(const torch::Tensor &t, const BatchLayout &l, const schedule::SampleRange &whole,
                           const schedule::SampleRange &part, const std::string &what) {
  if (part.begin == whole.begin && part.end == whole.end) return t;
  if (l.blocks == 0)
    throw std::runtime_error(what + ": its samples are mixed along its batch axis (an op such as BatchNorm "
                             "couples them), so it cannot be split between replicas; cut the model elsewhere");
  if (t.dim() <= l.axis || t.size(l.axis) % (whole.size() * l.blocks) != 0)
    throw std::runtime_error(what + ": dimension " + std::to_string(l.axis) + " of shape " +
                             c10::str(t.sizes()) + " is not a multiple of the " + std::to_string(whole.size()) +
                             " samples it holds, so it cannot be split between replicas");
  const int64_t k = t.size(l.axis) / whole.size();
  if (l.blocks == 1) return t.narrow(l.axis, (part.begin - whole.begin) * k, part.size() * k);
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes[size_t(l.axis)] = part.size() * k;
  return t.reshape(blockView(t, l, whole.size())).narrow(l.axis + 1, part.begin - whole.begin, part.size())
      .reshape(sizes);
}

torch::Tensor joinSamples(const std::vector<torch::Tensor> &pieces, const std::vector<int64_t> &counts,
                          const BatchLayout &l) {
  if (pieces.size() == 1 || pieces[0].numel() == 0) return pieces[0];
  if (l.blocks <= 1) return torch::cat(pieces, l.axis);
  std::vector<torch::Tensor> views;
  int64_t rows = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    views.push_back(pieces[i].reshape(blockView(pieces[i], l, counts[i])));
    rows += pieces[i].size(l.axis);
  }
  std::vector<int64_t> sizes(pieces[0].sizes().begin(), pieces[0].sizes().end());
  sizes[size_t(l.axis)] = rows;
  return torch::cat(views, l.axis + 1).reshape(sizes);
}

} // namespace rannc::train
