// Builds without the CUDA toolkit: device communication is unavailable and
// says so; the CPU/MPI path, and the rehearsal of the GPU path's logic
// (rehearsal.h), are complete without it.
#include <stdexcept>

#include "executor/comm/device_comm.h"

namespace rannc::comm {

bool ncclCompiled() { return false; }
std::string ncclVersion() { return "not compiled"; }
int visibleCudaDevices() { return 0; }

std::shared_ptr<DeviceApi> cudaDevice(int) {
  throw std::runtime_error("this rannc was built without the CUDA toolkit, so it has no NCCL communicator");
}

std::unique_ptr<Communicator> createDeviceCommunicator(std::unique_ptr<Communicator>, int, void *, bool) {
  throw std::runtime_error("this rannc was built without the CUDA toolkit, so it has no NCCL communicator");
}

} // namespace rannc::comm
