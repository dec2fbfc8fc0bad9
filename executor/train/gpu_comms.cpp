#include "executor/train/gpu_comms.h"

#include <functional>
#include <set>
#include <stdexcept>
#include <utility>

#include "executor/runtime/device.h"

namespace rannc::train {

bool gpuShared(comm::Communicator &comm, int gpu) {
  const uint64_t h = std::hash<std::string>{}(runtime::gpuUuid(gpu));
  std::vector<double> all(2 * size_t(comm.size()), 0.0);
  all[2 * size_t(comm.rank())] = double(h >> 32);
  all[2 * size_t(comm.rank()) + 1] = double(h & 0xffffffffu);
  comm.allReduce(all.data(), int(all.size()), comm::ReduceOp::Sum);
  std::set<std::pair<double, double>> seen;
  for (size_t r = 0; r < all.size(); r += 2)
    if (!seen.insert({all[r], all[r + 1]}).second) return true;
  return false;
}

GpuComms::GpuComms(comm::Communicator &comm, const Setup &s, bool host_staged,
                   const std::optional<comm::RehearsalOptions> &rehearsal)
    : comm_(comm), s_(s) {
  const int gpu = s_.gpu();
  if (rehearsal) {
    if (gpu >= 0) throw std::runtime_error("--gpu-transport rehearsal runs on CPU devices only (--device cpu)");
    api_ = comm::createRehearsalDevice(comm, *rehearsal); // the compute stream (null) is the host
  } else {
    if (gpu < 0) return;
    stream_ = runtime::currentGpuStream(gpu);
    shared_ = gpuShared(comm, gpu);
    api_ = comm::cudaDevice(gpu);
  }
  nccl_ = !shared_ && !host_staged;
  if (nccl_) // two channels over all ranks: activations, gradients (Note [NCCL transport])
    for (int k = 0; k < 2; ++k)
      channels_.push_back(comm::createDeviceCommunicator(comm.split(0, comm.rank()), api_, stream_, true));
}

std::unique_ptr<comm::Communicator> GpuComms::onDevice(std::unique_ptr<comm::Communicator> c) const {
  if (!api_) return c;
  const bool nccl = nccl_ && c->size() > 1; // one rank sums nothing: no NCCL communicator for it
  return comm::createDeviceCommunicator(std::move(c), api_, stream_, nccl);
}

std::unique_ptr<Transport> GpuComms::transport() {
  if (nccl_) return ncclTransport(comm_, s_.device, std::move(channels_));
  return hostTransport(comm_, s_.device);
}

std::string GpuComms::describe() const {
  if (!api_) return "";
  if (s_.gpu() < 0)
    return "rannc-exec: rehearsing the GPU path on the CPU: transfers and sums through the NCCL stand-in over MPI "
           "(docs/gpu.md)\n";
  return "rannc-exec: rank 0 on GPU " + std::to_string(s_.gpu()) + " (" + runtime::gpuName(s_.gpu()) + ", " +
         s_.gpu_why +
         "); transfers and sums " +
         (nccl_ ? "over NCCL " + comm::ncclVersion()
                : std::string("staged through host memory over MPI (") +
                      (shared_ ? "ranks share a GPU" : "--gpu-transport host") + ")") +
         "\n";
}

} // namespace rannc::train
