// Which communicators a rank's device tensors travel over: on CPU, MPI; on
// GPUs, NCCL, or host memory over MPI where two ranks share a GPU.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/comm/device_comm.h"
#include "executor/comm/rehearsal.h"
#include "executor/train/setup.h"
#include "executor/train/transport.h"

namespace rannc::train {

/// Whether two ranks of `comm` drive the same GPU, which NCCL refuses
/// (collective): each rank's GPU UUID hashed, the hashes all-gathered as
/// 32-bit halves in doubles (exact).
bool gpuShared(comm::Communicator &comm, int gpu);

/// How a rank's tensors travel: on CPU, everything over MPI as before; on
/// GPUs, the pipeline's values over NCCL (Note [NCCL transport]) and the
/// replica and shared-parameter sums over NCCL too, on streams of their own
/// (Note [device streams]), unless two ranks share a GPU: then everything is
/// staged through host memory over MPI (slower, but it runs, e.g. a 2-stage
/// pipeline on one GPU). With `rehearsal`, on CPU, the GPU path's logic
/// runs against the stand-in of Note [rehearsal] instead.
class GpuComms {
public:
  /// Collective over `comm`.
  GpuComms(comm::Communicator &comm, const Setup &s, bool host_staged,
            const std::optional<comm::RehearsalOptions> &rehearsal = std::nullopt);

  /// `c` (over some ranks of the job) made fit for the device's tensors:
  /// collective over its ranks.
  std::unique_ptr<comm::Communicator> onDevice(std::unique_ptr<comm::Communicator> c) const;

  /// The transport of the pipeline's values (once: it takes the channels).
  std::unique_ptr<Transport> transport();

  /// Rank 0's line about its GPU and the transport ("" on CPU).
  std::string describe() const;

private:
  comm::Communicator &comm_;
  const Setup &s_; ///< the rank's device and why it was chosen
  void *stream_ = nullptr;
  std::shared_ptr<comm::DeviceApi> api_; ///< CUDA's, or the rehearsal's
  bool shared_ = false; ///< two ranks drive one GPU
  bool nccl_ = false;
  std::vector<std::unique_ptr<comm::Communicator>> channels_; ///< NCCL: activations, gradients
};

} // namespace rannc::train
