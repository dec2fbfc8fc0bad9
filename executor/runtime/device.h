// Where a rank's tensors live: the choice of CUDA device (Note [choosing a
// GPU]) and the caching allocator's memory statistics. Every function works
// in a build without CUDA (there is then no device to choose and no memory to
// count), so callers need no #ifdef.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace rannc::runtime {

// Note [choosing a GPU]
// Each rank drives one GPU. Launchers say which ranks share a node: Open
// MPI's mpirun sets OMPI_COMM_WORLD_LOCAL_RANK, Slurm's srun SLURM_LOCALID,
// MPICH/Intel MPI's Hydra MPI_LOCALRANKID, torchrun LOCAL_RANK (read in that
// order). The rank takes device (local rank mod visible devices): with one
// GPU per rank, as a cluster file describes, every rank gets its own. Without
// a launcher's local rank, the plan's own placement decides: rank r is device
// r mod devices_per_node of its node (ranks fill nodes in order), again mod
// the visible devices. When CUDA_VISIBLE_DEVICES gives each rank a single
// GPU, both rules pick device 0, which is that GPU.

/// The launcher's local rank of this process, or -1 when no launcher set one.
/// `env` reads a variable (std::getenv by default; tests pass their own).
int launcherLocalRank(const std::function<const char *(const char *)> &env = {});

/// The variable launcherLocalRank read its value from ("SLURM_LOCALID"), or "".
std::string launcherLocalRankSource(const std::function<const char *(const char *)> &env = {});

struct GpuChoice {
  int device = 0;    ///< CUDA device index
  std::string why;   ///< "OMPI_COMM_WORLD_LOCAL_RANK=3 mod 4 visible", for the log
};

/// The device rank `rank` of a plan with `devices_per_node` devices per node
/// drives when `visible` (> 0) devices are visible (Note [choosing a GPU]).
GpuChoice chooseGpu(int rank, int devices_per_node, int visible,
                    const std::function<const char *(const char *)> &env = {});

/// Makes CUDA device `device` this thread's current one (LibTorch's and the
/// CUDA runtime's), before anything is allocated on it.
void useGpu(int device);

/// Why CUDA device `device` cannot be used ("" when it can): a LibTorch
/// without CUDA, no GPU visible, or an index past the visible ones. The
/// trainer and the profiler both say this.
std::string gpuUnavailableReason(int device);

/// Number of CUDA devices this process sees (0 in a build without CUDA or on
/// a machine without a driver).
int visibleGpus();

/// What identifies GPU `device` across processes and hosts (its UUID, hex),
/// and its name ("NVIDIA H100 80GB HBM3"); empty without CUDA.
std::string gpuUuid(int device);
std::string gpuName(int device);

/// Tensor memory of CUDA device `device` through LibTorch's caching
/// allocator: bytes allocated to live tensors now, their peak since the last
/// resetGpuPeak(), and what the allocator holds from the driver (allocated
/// plus its cached free blocks). All 0 without CUDA.
int64_t gpuAllocatedBytes(int device);
int64_t gpuPeakAllocatedBytes(int device);
int64_t gpuReservedBytes(int device);
void resetGpuPeak(int device);
/// Waits until every kernel queued on `device` has finished (no-op without CUDA).
void synchronizeGpu(int device);
/// LibTorch's current stream on `device` (a cudaStream_t; nullptr without
/// CUDA): where kernels run, so communication on other streams can wait for it.
void *currentGpuStream(int device);

} // namespace rannc::runtime
