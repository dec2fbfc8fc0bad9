// What cluster.cpp (presets, units) shares with cluster_yaml.cpp (the YAML
// adapter). Internal to rannc_cluster: other libraries use cluster.h.
#pragma once

#include <string>

#include "planner/cluster/cluster.h"

namespace rannc::cluster::detail {

enum class Quantity { kBytes, kFlops, kBandwidth, kDuration };

/// A number with a unit of kind `q` ("40GiB", "-3us"), of any sign: callers
/// check the range so that they can name the field in the message.
Expected<double> parseQuantity(const std::string &text, Quantity q);

/// Sets c.device, c.intra_node and c.inter_node from preset `name` for nodes of
/// `devices_per_node` devices (the CPU preset shares this machine among them).
/// False if there is no such preset.
bool applyPreset(const std::string &name, int devices_per_node, ClusterSpec &c);

/// "cpu, v100-16g, ...", for messages.
std::string presetList();

/// The runtime reserve of a device of `type` without a preset
/// (Note [runtime reserve] in cluster.cpp): 0 for cpu.
int64_t defaultRuntimeReserve(const std::string &type);

} // namespace rannc::cluster::detail
