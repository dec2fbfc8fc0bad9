// The profiler's timeline of CUDA events (whether a GPU can be used, its name
// and memory are in runtime/device.h).
// Only gpu_timer.cpp sees CUDA headers (compiled with RANNC_WITH_CUDA, as
// runtime/device.cpp); without CUDA every function still links, and
// GpuTimeline refuses to be made.
#pragma once

#include <memory>
#include <string>

namespace rannc::profile {

/// Points on the current CUDA stream of a device, timed with CUDA events
/// (cudaEventRecord / cudaEventElapsedTime): kernels run asynchronously, so
/// the host clock would time their launches, not their execution.
class GpuTimeline {
public:
  /// `points` events on `device`'s current stream.
  GpuTimeline(int device, int points);
  ~GpuTimeline();
  GpuTimeline(const GpuTimeline &) = delete;
  GpuTimeline &operator=(const GpuTimeline &) = delete;

  /// Records event `i` on the stream, after everything queued so far.
  void mark(int i);
  /// Waits until event `j` has happened, then the seconds from event `i` to it.
  double seconds(int i, int j);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace rannc::profile
