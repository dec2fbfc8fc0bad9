#include "planner/partition/linear.h"

#include <algorithm>
#include <limits>
#include <string>

namespace rannc::partition {

Expected<std::vector<int>> balancedSplit(const std::vector<double> &costs, int k) {
  const int n = static_cast<int>(costs.size());
  if (k < 1) return Error{"stage count must be at least 1"};
  if (k > n)
    return Error{"cannot make " + std::to_string(k) + " non-empty stages from " + std::to_string(n) + " ops"};
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  auto sum = [&](int a, int b) { return prefix[b] - prefix[a]; };

  // best[j][i]: minimal bottleneck splitting the first i items into j ranges.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(k + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(k + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int j = 1; j <= k; ++j) {
    for (int i = j; i <= n - (k - j); ++i) {
      // Scan the last range's start backwards; once that range alone costs more
      // than the best found, earlier starts only make it worse.
      for (int p = i - 1; p >= j - 1; --p) {
        double last = sum(p, i);
        if (last >= best[j][i] && last > 0) break;
        double cand = std::max(best[j - 1][p], last);
        if (cand < best[j][i]) {
          best[j][i] = cand;
          cut[j][i] = p;
        }
      }
    }
  }
  std::vector<int> bounds(k + 1);
  bounds[k] = n;
  for (int j = k, i = n; j > 0; --j) {
    i = cut[j][i];
    bounds[j - 1] = i;
  }
  return bounds;
}

} // namespace rannc::partition
