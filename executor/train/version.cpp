#include "executor/train/version.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <sstream>

#include "executor/comm/comm.h"
#include "executor/comm/device_comm.h"
#include "executor/runtime/device.h"

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
  // Note [choosing a GPU]: what this process's launcher says (srun: SLURM_LOCALID), as a rank uses it.
  const int local = runtime::launcherLocalRank();
  os << "Local rank: "
     << (local < 0 ? std::string("none (the plan's placement picks a rank's GPU)")
                   : std::to_string(local) + " from " + runtime::launcherLocalRankSource() + " (--device cuda drives GPU " +
                         std::to_string(local) + " mod the visible ones)")
     << "\n";
  return os.str();
}

} // namespace rannc::train
