// Where a rank computes: the one enum the --device flags, the measured cost
// source and the profiler share. Cluster files and plans spell it by name.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "planner/support/status.h"

namespace rannc::cluster {

/// The host CPU, or a CUDA GPU.
enum class DeviceKind { Cpu, Cuda };

/// "cpu" or "cuda": the word flags, cluster files and plans use.
const char *deviceKindName(DeviceKind k);
/// Every kind's word, in enum order (what --help lists).
std::vector<std::string> deviceKindNames();
/// The kind called `text`; the error names the choices but not the flag
/// ("must be cpu or cuda (got 'x')"): callers prefix it.
Expected<DeviceKind> parseDeviceKind(std::string_view text);

} // namespace rannc::cluster
