// Which sample each step reads (SPEC: with --shuffle off, step k reads
// samples [k*B, (k+1)*B) mod N), without MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "executor/train/sample_order.h"

namespace rannc::train {
namespace {

/// The samples at positions [first, first + count).
std::vector<int64_t> read(SampleOrder &order, int64_t first, int64_t count) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(order.at(first + i));
  return out;
}

TEST(SampleOrder, ShuffleOffReadsConsecutiveBatchesModuloTheSampleCount) {
  const int64_t N = 10, B = 4; // 10 is no multiple of 4: batches wrap mid-batch
  SampleOrder order(N, /*shuffle=*/false, /*seed=*/7);
  for (int64_t k = 0; k < 8; ++k)
    for (int64_t i = 0; i < B; ++i) EXPECT_EQ(order.at(k * B + i), (k * B + i) % N) << "step " << k;
  // Step 2 reads samples 8, 9, 0, 1.
  EXPECT_EQ(read(order, 2 * B, B), (std::vector<int64_t>{8, 9, 0, 1}));
}

TEST(SampleOrder, ShuffleOnIsAPermutationPerEpoch) {
  const int64_t N = 50;
  SampleOrder order(N, /*shuffle=*/true, /*seed=*/3);
  std::vector<int64_t> identity(N);
  std::iota(identity.begin(), identity.end(), 0);
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t e = 0; e < 3; ++e) {
    std::vector<int64_t> got = read(order, e * N, N);
    epochs.push_back(got);
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, identity) << "epoch " << e << " is not a permutation of the samples";
  }
  EXPECT_NE(epochs[0], identity); // shuffled at all (50! orders: identity is no accident)
  EXPECT_NE(epochs[0], epochs[1]); // a fresh permutation per epoch
  EXPECT_NE(epochs[1], epochs[2]);
}

TEST(SampleOrder, ShuffleIsDeterministicBySeedWhateverTheOrderOfReads) {
  const int64_t N = 40;
  SampleOrder a(N, true, 11), b(N, true, 11), other(N, true, 12);
  // b reads epoch 1 before epoch 0 (a resumed run starts mid-stream).
  const std::vector<int64_t> b1 = read(b, N, N), b0 = read(b, 0, N);
  EXPECT_EQ(read(a, 0, N), b0);
  EXPECT_EQ(read(a, N, N), b1);
  EXPECT_NE(read(other, 0, N), b0); // another seed, another order
}

} // namespace
} // namespace rannc::train
