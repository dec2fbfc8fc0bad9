// Tensor memory accounting on CPU: a c10 allocator that wraps the default one
// and counts live and peak bytes, so the profiler measures (not guesses) what
// a unit keeps for backward and rannc-exec reports the tensors' peak rather
// than the process's resident set (which is mostly LibTorch's own code).
#pragma once

#include <cstdint>

namespace rannc::runtime {

/// Installs the counting allocator for CPU tensors (idempotent). Tensors
/// allocated before the call are not counted.
void installCountingAllocator();
/// Bytes of CPU tensor memory allocated through it and not yet freed.
int64_t currentTensorBytes();
/// The highest currentTensorBytes() since the last resetPeakTensorBytes().
int64_t peakTensorBytes();
/// Starts a new peak window at the current level.
void resetPeakTensorBytes();

} // namespace rannc::runtime
