#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "planner/partition/linear.h"

namespace rannc::partition {
namespace {

double bottleneck(const std::vector<double> &c, const std::vector<int> &b) {
  double worst = 0;
  for (size_t s = 0; s + 1 < b.size(); ++s) {
    double sum = 0;
    for (int i = b[s]; i < b[s + 1]; ++i) sum += c[i];
    worst = std::max(worst, sum);
  }
  return worst;
}

/// Every way to place k-1 cuts among n-1 gaps.
double bruteForce(const std::vector<double> &c, int k) {
  const int n = static_cast<int>(c.size());
  double best = 1e300;
  std::vector<int> b{0};
  std::function<void(int)> rec = [&](int start) {
    if (static_cast<int>(b.size()) == k) {
      b.push_back(n);
      best = std::min(best, bottleneck(c, b));
      b.pop_back();
      return;
    }
    for (int cut = start + 1; cut <= n - (k - static_cast<int>(b.size())); ++cut) {
      b.push_back(cut);
      rec(cut);
      b.pop_back();
    }
  };
  rec(0);
  return best;
}

TEST(BalancedSplit, HandExample) {
  // 3,1,1,3,2,2,2,4 (sum 18) in 3 ranges: 3+1+1 | 3+2+2 | 2+4 = 5 | 7 | 6.
  // Nothing does better: a last range of [4] leaves 14 for two ranges (>= 7),
  // and [2,4] leaves 3,1,1,3,2,2 where no cut keeps both sides <= 6.
  auto b = balancedSplit({3, 1, 1, 3, 2, 2, 2, 4}, 3);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<int>{0, 3, 6, 8}));
}

TEST(BalancedSplit, MatchesExhaustiveSearchOnRandomInstances) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    int n = 1 + int(rng() % 10), k = 1 + int(rng() % n);
    std::vector<double> c(n);
    for (double &x : c) x = double(rng() % 20); // zeros included on purpose
    auto b = balancedSplit(c, k);
    ASSERT_TRUE(b.ok());
    ASSERT_EQ(b->size(), size_t(k + 1));
    for (int s = 0; s < k; ++s) EXPECT_LT((*b)[s], (*b)[s + 1]) << "stage " << s << " is empty";
    EXPECT_DOUBLE_EQ(bottleneck(c, *b), bruteForce(c, k)) << "trial " << trial;
  }
}

TEST(BalancedSplit, RejectsMoreStagesThanItems) {
  auto b = balancedSplit({1, 2}, 3);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("3 non-empty stages from 2 ops"), std::string::npos);
}

} // namespace
} // namespace rannc::partition
