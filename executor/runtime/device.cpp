#include "executor/runtime/device.h"

#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <utility>

#ifdef RANNC_WITH_CUDA
#include <cuda_runtime.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace rannc::runtime {

namespace {

/// The first launcher variable holding a local rank, and that rank; {"", -1} when none does.
std::pair<std::string, int> localRankVariable(const std::function<const char *(const char *)> &env) {
  auto get = [&](const char *name) -> const char * { return env ? env(name) : std::getenv(name); };
  for (const char *name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"}) {
    const char *v = get(name);
    if (!v || !*v) continue;
    char *end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n >= 0) return {name, int(n)};
  }
  return {"", -1};
}

} // namespace

int launcherLocalRank(const std::function<const char *(const char *)> &env) { return localRankVariable(env).second; }

std::string launcherLocalRankSource(const std::function<const char *(const char *)> &env) {
  return localRankVariable(env).first;
}

GpuChoice chooseGpu(int rank, int devices_per_node, int visible,
                    const std::function<const char *(const char *)> &env) {
  GpuChoice c;
  if (visible <= 0) return c;
  const int local = launcherLocalRank(env);
  const std::string mod = " mod " + std::to_string(visible) + " visible";
  if (local >= 0) {
    c.device = local % visible;
    c.why = "local rank " + std::to_string(local) + mod;
  } else {
    const int index = rank % std::max(devices_per_node, 1);
    c.device = index % visible;
    c.why = "the plan's device " + std::to_string(index) + " of its node" + mod;
  }
  return c;
}

int visibleGpus() { return torch::cuda::is_available() ? int(torch::cuda::device_count()) : 0; }

std::string gpuUnavailableReason(int device) {
#ifndef RANNC_WITH_CUDA
  (void)device;
  return "this rannc was built on a LibTorch without CUDA";
#else
  const int visible = visibleGpus();
  if (visible == 0)
    return "no GPU is visible to this process (LibTorch has CUDA, but finds no device: check nvidia-smi, the "
           "driver and CUDA_VISIBLE_DEVICES)";
  if (device < 0 || device >= visible)
    return "GPU " + std::to_string(device) + " is not visible (" + std::to_string(visible) + " visible)";
  return "";
#endif
}

#ifdef RANNC_WITH_CUDA
namespace {
bool usable(int device) { return device >= 0 && device < visibleGpus(); }

/// The aggregate (all pools) of one of the allocator's statistics.
c10::CachingAllocator::Stat stat(int device, bool reserved) {
  if (!usable(device)) return {};
  auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::DeviceIndex(device));
  return (reserved ? s.reserved_bytes : s.allocated_bytes)[size_t(c10::CachingAllocator::StatType::AGGREGATE)];
}
} // namespace

void useGpu(int device) { c10::cuda::set_device(c10::DeviceIndex(device)); }

std::string gpuUuid(int device) {
  if (!usable(device)) return {};
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return {};
  static const char *const hex = "0123456789abcdef";
  std::string out;
  for (char c : p.uuid.bytes) {
    out += hex[(static_cast<unsigned char>(c) >> 4) & 15];
    out += hex[static_cast<unsigned char>(c) & 15];
  }
  return out;
}

std::string gpuName(int device) {
  cudaDeviceProp p{};
  return usable(device) && cudaGetDeviceProperties(&p, device) == cudaSuccess ? std::string(p.name) : std::string();
}
int64_t gpuAllocatedBytes(int device) { return stat(device, false).current; }
int64_t gpuPeakAllocatedBytes(int device) { return stat(device, false).peak; }
int64_t gpuReservedBytes(int device) { return stat(device, true).current; }
void resetGpuPeak(int device) {
  if (usable(device)) c10::cuda::CUDACachingAllocator::resetPeakStats(c10::DeviceIndex(device));
}
void synchronizeGpu(int device) {
  if (!usable(device)) return;
  c10::cuda::CUDAGuard guard{c10::DeviceIndex(device)};
  c10::cuda::device_synchronize();
}
void *currentGpuStream(int device) {
  return usable(device) ? c10::cuda::getCurrentCUDAStream(c10::DeviceIndex(device)).stream() : nullptr;
}
#else
void useGpu(int) { throw std::runtime_error("this rannc was built on a LibTorch without CUDA"); }
std::string gpuUuid(int) { return {}; }
std::string gpuName(int) { return {}; }
int64_t gpuAllocatedBytes(int) { return 0; }
int64_t gpuPeakAllocatedBytes(int) { return 0; }
int64_t gpuReservedBytes(int) { return 0; }
void resetGpuPeak(int) {}
void synchronizeGpu(int) {}
void *currentGpuStream(int) { return nullptr; }
#endif

} // namespace rannc::runtime
