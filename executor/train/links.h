// How this rank exchanges one value, or its gradient, with the replicas of a
// peer stage: by the intersection of their sample ranges (SPEC), or whole
// when the value holds no samples (Note [batch-free values]).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "executor/schedule/schedule.h"
#include "executor/train/batch_layout.h"
#include "executor/train/transport.h"

namespace rannc::train {

// Note [batch-free values]
// A value whose shape holds no samples (position ids [1, T], a causal mask
// [T, T], a size) is the same for every sample, so it is never split between
// replicas: receiver replica i gets it whole from producer replica
// i % (producer replicas), and sends its gradient back to that replica alone.
// A producer replica sums the gradients of the receivers it served (none: no
// gradient). Backward is linear in those gradients, and each receiver's is
// already weighted by its share of the batch, so once the producer's
// parameter gradients are all-reduced over its replicas they hold the whole
// batch's, exactly as one device computes them.

/// How this rank exchanges one value with the replicas of a peer stage.
struct Link {
  const std::vector<int> &peer_ranks;
  const std::vector<schedule::SampleRange> &peer_ranges;
  schedule::SampleRange mine;
  int replica = 0;       ///< this rank's replica index in its stage
  int replicas = 1;      ///< its stage's replica count
  bool producer = false; ///< this stage computes the value (sends it, receives its gradient)

  /// The peer replicas a batch-free value goes to or comes from.
  std::vector<size_t> batchFreePeers() const {
    std::vector<size_t> peers;
    if (producer) {
      for (size_t i = 0; i < peer_ranks.size(); ++i)
        if (int(i) % replicas == replica) peers.push_back(i);
    } else {
      peers.push_back(size_t(replica) % peer_ranks.size());
    }
    return peers;
  }
};

/// Sends `t` (a value or its gradient) to the peer replicas: exactly the
/// intersection of sample ranges (SPEC), or whole when the value holds no
/// samples.
void sendValue(Transport &transport, const torch::Tensor &t, const BatchLayout &layout, const Link &link, int tag,
               const std::string &what);

/// Receives what sendValue sent this rank: the overlapping pieces joined in
/// sample order, or a batch-free value whole (its gradients summed; empty
/// when no receiver sent one).
torch::Tensor recvValue(Transport &transport, const BatchLayout &layout, const Link &link, int tag);

} // namespace rannc::train
