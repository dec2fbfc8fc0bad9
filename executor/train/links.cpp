#include "executor/train/links.h"

#include <utility>

namespace rannc::train {

void sendValue(Transport &transport, const torch::Tensor &t, const BatchLayout &layout, const Link &link, int tag,
               const std::string &what) {
  std::vector<std::pair<torch::Tensor, int>> pieces;
  if (layout.axis < 0) {
    for (size_t k : link.batchFreePeers()) pieces.emplace_back(t, link.peer_ranks[k]);
  } else {
    for (size_t k = 0; k < link.peer_ranks.size(); ++k) {
      schedule::SampleRange part = schedule::intersect(link.mine, link.peer_ranges[k]);
      if (part.size() <= 0) continue;
      pieces.emplace_back(t.numel() == 0 ? t : sliceSamples(t, layout, link.mine, part, what), link.peer_ranks[k]);
    }
  }
  transport.send(pieces, tag);
}

torch::Tensor recvValue(Transport &transport, const BatchLayout &layout, const Link &link, int tag) {
  std::vector<int> srcs;
  if (layout.axis < 0) {
    for (size_t k : link.batchFreePeers()) srcs.push_back(link.peer_ranks[k]);
    torch::Tensor sum;
    for (const torch::Tensor &t : transport.recv(srcs, tag)) {
      if (t.numel() == 0 && t.dim() == 1) continue; // "no gradient"
      sum = sum.defined() ? sum + t : t;
    }
    return sum.defined() ? sum : torch::empty({0});
  }
  std::vector<int64_t> counts;
  for (size_t k = 0; k < link.peer_ranks.size(); ++k)
    if (const int64_t n = schedule::intersect(link.mine, link.peer_ranges[k]).size(); n > 0) {
      srcs.push_back(link.peer_ranks[k]);
      counts.push_back(n);
    }
  return joinSamples(transport.recv(srcs, tag), counts, layout);
}

} // namespace rannc::train
