// How a tensor computed on one rank reaches another: the pipeline's values
// and their gradients. Two ways: through host memory over MPI (any device;
// the only way on CPU and for ranks that share a GPU), or device to device
// over NCCL with only a small header over MPI.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/runtime/collectives.h"

namespace rannc::train {

using runtime::floatBuffer; // executor/runtime/collectives.h

class Transport {
public:
  virtual ~Transport() = default;
  /// Sends each tensor to the rank paired with it, with `tag`; returns at once.
  virtual void send(const std::vector<std::pair<torch::Tensor, int>> &pieces, int tag) = 0;
  /// Receives one tensor from each rank of `srcs`, sent with `tag`, in order,
  /// on this rank's device.
  virtual std::vector<torch::Tensor> recv(const std::vector<int> &srcs, int tag) = 0;
  /// Waits until every send has completed.
  virtual void waitSends() = 0;
  /// Waits until every send with `tag` has completed (over NCCL: every send
  /// on that tag's channel).
  virtual void waitSendsTagged(int tag) = 0;
};

/// Messages over `comm` from and into host tensors (a device's tensor is
/// copied to the host first and onto `device` after): Note [send buffers].
std::unique_ptr<Transport> hostTransport(comm::Communicator &comm, torch::Device device);

/// Note [NCCL transport]
/// A tensor's dtype and shape go over `comm` (MPI), so the receiver can
/// allocate it, and its bytes as device messages over a channel (NCCL:
/// createDeviceCommunicator). Each action's messages for one value form one
/// group. Tag t uses channels[t % channels.size()]: the trainer's
/// tags alternate activations and gradients, so each direction has its own
/// communicator and stream. A channel's operations run in issue order, so one
/// shared by both directions could deadlock 1F1B: stage s's receive of a
/// gradient queued behind its send of a later activation, which waits for
/// stage s+1, whose send of that gradient waits the same way. Per direction,
/// a rank issues its receives and sends in the schedule's order, and values
/// flow one way only, so no cycle forms. The sent tensors stay referenced
/// until their channel's work is done (Note [device streams]).
std::unique_ptr<Transport> ncclTransport(comm::Communicator &comm, torch::Device device,
                                         std::vector<std::unique_ptr<comm::Communicator>> channels);

} // namespace rannc::train
