#include "executor/runtime/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace rannc::runtime {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::mutex g_mu;
std::unordered_map<void *, size_t> g_sizes; // live allocations

void raisePeak(int64_t now) {
  int64_t seen = g_peak.load();
  while (now > seen && !g_peak.compare_exchange_weak(seen, now)) {
  }
}

// Data and context are the same pointer, as LibTorch's raw_allocate requires;
// the size lives in a table instead.
void countedFree(void *p) {
  if (!p) return;
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_sizes.find(p);
    if (it != g_sizes.end()) {
      n = it->second;
      g_sizes.erase(it);
    }
  }
  g_current -= static_cast<int64_t>(n);
  c10::free_cpu(p);
}

class CountingAllocator final : public c10::Allocator {
public:
  c10::DataPtr allocate(size_t n) override {
    void *p = c10::alloc_cpu(n);
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_sizes[p] = n;
    }
    raisePeak(g_current += static_cast<int64_t>(n));
    return {p, p, &countedFree, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &countedFree; }

  void copy_data(void *dest, const void *src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

} // namespace

void installCountingAllocator() {
  static CountingAllocator *installed = [] {
    auto *a = new CountingAllocator();
    // Priority above the default registration so LibTorch's own allocations
    // (every CPU tensor) go through it.
    c10::SetAllocator(c10::DeviceType::CPU, a, /*priority=*/10);
    return a;
  }();
  (void)installed;
}

int64_t currentTensorBytes() { return g_current.load(); }
int64_t peakTensorBytes() { return g_peak.load(); }
void resetPeakTensorBytes() { g_peak.store(g_current.load()); }

} // namespace rannc::runtime
