// The kernels of the import's fused nodes (fused.cpp, Note [pattern fusion]
// in planner/import/fuse.cpp), a family of the one kernel table.
#pragma once

#include <vector>

#include "executor/runtime/kernels/registry.h"

namespace rannc::runtime::kernels {

/// The fused kernels, domain "rannc.fused" (fused.cpp).
std::vector<KernelDef> fusedKernels();

} // namespace rannc::runtime::kernels
