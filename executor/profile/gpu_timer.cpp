#include "executor/profile/gpu_timer.h"

#include <stdexcept>
#include <vector>

#ifdef RANNC_WITH_CUDA
// c10's CUDA headers only: ATen's CUDAContext.h wants cuSPARSE's headers,
// which neither the toolkit here nor the wheel ships.
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace rannc::profile {

#ifdef RANNC_WITH_CUDA
struct GpuTimeline::Impl {
  int device;
  std::vector<c10::cuda::CUDAEvent> events;
};

GpuTimeline::GpuTimeline(int device, int points) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  // cudaEventDefault: timing on (LibTorch's default events have it off).
  for (int i = 0; i < points; ++i) impl_->events.emplace_back(cudaEventDefault);
}

void GpuTimeline::mark(int i) {
  impl_->events.at(size_t(i)).record(c10::cuda::getCurrentCUDAStream(c10::DeviceIndex(impl_->device)));
}

double GpuTimeline::seconds(int i, int j) {
  c10::cuda::CUDAEvent &end = impl_->events.at(size_t(j));
  end.synchronize(); // cudaEventElapsedTime needs both events complete
  return double(impl_->events.at(size_t(i)).elapsed_time(end)) * 1e-3;
}
#else
struct GpuTimeline::Impl {};

GpuTimeline::GpuTimeline(int, int) { throw std::runtime_error("GpuTimeline: built without CUDA"); }
void GpuTimeline::mark(int) {}
double GpuTimeline::seconds(int, int) { return 0; }
#endif

GpuTimeline::~GpuTimeline() = default;

} // namespace rannc::profile
