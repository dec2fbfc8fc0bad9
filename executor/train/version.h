// `--version` of both tools: what this binary was built with and what it sees.
#pragma once

#include <string>

namespace rannc::train {

/// "key: value" lines (SPEC.md): rannc, LibTorch, CUDA, NCCL, GPUs visible, MPI.
std::string versionReport();

} // namespace rannc::train
