// Batch layout without MPI: where a value's samples lie (Note [batch layout]
// in executor/frontend/common.cpp) and how a tensor is cut into and joined
// from sample ranges between replicas.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <vector>

#include "executor/train/batch_layout.h"

namespace rannc::train {
namespace {

ir::Value valueOf(ir::Shape shape, int64_t blocks = 1) {
  ir::Value v;
  v.dtype = ir::DType::F32;
  v.shape = std::move(shape);
  v.shape_known = true;
  v.batch_blocks = blocks;
  return v;
}

TEST(BatchLayout, TheBatchAxisIsTheFirstDimensionAffineInB) {
  using ir::Dim;
  BatchLayout first = batchLayout(valueOf({Dim::batch(), Dim::fixed(32)}));
  EXPECT_EQ(first.axis, 0);
  EXPECT_EQ(first.blocks, 1);
  // Sequence-first attention: [17, B, 32] has its samples along axis 1.
  EXPECT_EQ(batchLayout(valueOf({Dim::fixed(17), Dim::batch(), Dim::fixed(32)})).axis, 1);
  // [16*B, 100] with each sample's rows interleaved in 16 blocks.
  BatchLayout interleaved = batchLayout(valueOf({Dim::batch(16), Dim::fixed(100)}, 16));
  EXPECT_EQ(interleaved.axis, 0);
  EXPECT_EQ(interleaved.blocks, 16);
  // No dimension holds samples: batch-free (Note [batch-free values]).
  EXPECT_EQ(batchLayout(valueOf({Dim::fixed(17), Dim::fixed(17)})).axis, -1);
  // Unknown shapes are taken to be batch-first.
  ir::Value unknown;
  EXPECT_EQ(batchLayout(unknown).axis, 0);
  EXPECT_EQ(batchLayout(valueOf({Dim::unknown(), Dim::batch()})).axis, 0);
}

TEST(BatchLayout, BlockViewSplitsTheBatchAxisIntoBlocksSamplesAndRows) {
  torch::Tensor t = torch::zeros({5, 3 * 4 * 2, 7}); // axis 1: 3 blocks x 4 samples x 2 rows
  EXPECT_EQ(blockView(t, BatchLayout{1, 3}, 4), (std::vector<int64_t>{5, 3, 4, 2, 7}));
  EXPECT_EQ(blockView(t, BatchLayout{1, 1}, 4), (std::vector<int64_t>{5, 1, 4, 6, 7}));
}

/// [rows, 2] where row r holds (its sample, its row within the sample) for
/// `n` samples [first, first + n) of `per_sample` rows each, laid out in
/// `blocks` blocks: row = block * (n * k) + sample * k + j, k = per_sample / blocks.
torch::Tensor labelled(int64_t first, int64_t n, int64_t per_sample, int64_t blocks) {
  const int64_t k = per_sample / blocks;
  torch::Tensor t = torch::empty({n * per_sample, 2}, torch::kLong);
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int64_t s = 0; s < n; ++s)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = blk * n * k + s * k + j;
        t[row][0] = first + s;
        t[row][1] = blk * k + j;
      }
  return t;
}

TEST(BatchLayout, SlicingKeepsExactlyThePartsSamplesInTheirLayout) {
  for (int64_t blocks : {1, 3}) {
    SCOPED_TRACE(blocks);
    const BatchLayout l{0, blocks};
    // Samples [4, 9) of 6 rows each; the part [5, 8) must equal those samples laid out alone.
    torch::Tensor whole = labelled(4, 5, 6, blocks);
    torch::Tensor part = sliceSamples(whole, l, {4, 9}, {5, 8}, "v");
    EXPECT_TRUE(torch::equal(part, labelled(5, 3, 6, blocks)));
    EXPECT_TRUE(sliceSamples(whole, l, {4, 9}, {4, 9}, "v").is_same(whole)); // whole: no copy
  }
}

TEST(BatchLayout, JoiningSlicesRestoresTheWhole) {
  for (int64_t blocks : {1, 2, 4}) {
    SCOPED_TRACE(blocks);
    const BatchLayout l{0, blocks};
    torch::Tensor whole = labelled(0, 7, 4, blocks);
    std::vector<torch::Tensor> pieces{sliceSamples(whole, l, {0, 7}, {0, 2}, "v"),
                                      sliceSamples(whole, l, {0, 7}, {2, 3}, "v"),
                                      sliceSamples(whole, l, {0, 7}, {3, 7}, "v")};
    EXPECT_TRUE(torch::equal(joinSamples(pieces, {2, 1, 4}, l), whole));
  }
}

TEST(BatchLayout, RefusesWhatCannotBeSplit) {
  torch::Tensor t = torch::zeros({12, 3});
  // Samples mixed (after BatchNorm): no layout fits.
  EXPECT_THROW(sliceSamples(t, BatchLayout{0, 0}, {0, 4}, {0, 2}, "v"), std::runtime_error);
  // 12 rows are no multiple of 5 samples.
  EXPECT_THROW(sliceSamples(t, BatchLayout{0, 1}, {0, 5}, {0, 2}, "v"), std::runtime_error);
  // The axis is beyond the tensor's rank.
  EXPECT_THROW(sliceSamples(t, BatchLayout{2, 1}, {0, 4}, {0, 2}, "v"), std::runtime_error);
}

} // namespace
} // namespace rannc::train
