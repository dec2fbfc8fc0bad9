#include "executor/runtime/memory.h"

#include <c10/core/Allocator.h>

#include <atomic>

namespace rannc::runtime {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};

void raisePeak(int64_t now) {
  int64_t seen = g_peak.load();
  while (now > seen && !g_peak.compare_exchange_weak(seen, now)) {
  }
}

/// Owns the wrapped allocator's DataPtr and remembers its size.
struct Counted {
  c10::DataPtr inner;
  int64_t bytes;
};

void deleteCounted(void *ctx) {
  auto *c = static_cast<Counted *>(ctx);
  g_current -= c->bytes;
  delete c; // frees through the wrapped allocator's deleter
}

class CountingAllocator final : public c10::Allocator {
public:
  explicit CountingAllocator(c10::Allocator *inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr p = inner_->allocate(n);
    void *data = p.get();
    c10::Device device = p.device();
    auto *ctx = new Counted{std::move(p), static_cast<int64_t>(n)};
    raisePeak(g_current += ctx->bytes);
    return {data, ctx, &deleteCounted, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

private:
  c10::Allocator *inner_;
};

} // namespace

void installCountingAllocator() {
  static CountingAllocator *installed = [] {
    auto *a = new CountingAllocator(c10::GetAllocator(c10::DeviceType::CPU));
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
