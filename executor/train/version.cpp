#include "executor/train/version.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <sstream>

#include "executor/comm/comm.h"
#include "executor/comm/device_comm.h"

namespace rannc::train {

std::string versionReport() {
  std::ostringstream os;
  os << "rannc: " << RANNC_VERSION << "\n";
  os << "LibTorch: " << TORCH_VERSION << "\n";
#ifdef RANNC_CUDA_VERSION
  os << "CUDA: compiled (" << RANNC_CUDA_VERSION << ")\n";
#else
  os << "CUDA: not compiled\n";
#endif
  os << "NCCL: " << comm::ncclVersion() << "\n";
  // A CUDA build on a machine without a driver sees no devices (and says so once).
  os << "GPUs visible: " << (torch::cuda::is_available() ? torch::cuda::device_count() : 0) << "\n";
  os << "MPI: " << comm::mpiLibraryVersion() << "\n";
  return os.str();
}

} // namespace rannc::train
