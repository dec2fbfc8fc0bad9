// The hardware a plan is made for, as a typed struct. Built from a device
// preset here; the YAML cluster description arrives with the cost-model work.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "planner/support/status.h"

namespace rannc::cluster {

struct DeviceSpec {
  std::string type;            ///< "cpu" or "cuda"
  std::string name;            ///< preset name
  int64_t memory_bytes = 0;
  double peak_flops = 0;       ///< fp32 FLOP/s
  double memory_bandwidth = 0; ///< bytes/s
};

struct LinkSpec {
  double bandwidth = 0; ///< bytes/s, one direction
  double latency_s = 0;
};

/// A homogeneous cluster: num_nodes nodes of devices_per_node devices.
struct ClusterSpec {
  int num_nodes = 1;
  int devices_per_node = 1;
  DeviceSpec device;
  LinkSpec intra_node;
  LinkSpec inter_node;

  int worldSize() const { return num_nodes * devices_per_node; }
  void print(std::ostream &os) const;
};

/// The preset names, in a stable order.
std::vector<std::string> presetNames();

/// `num_devices` devices of preset `device_type`, 8 per node (CPU: one node),
/// with the preset's memory unless `memory_bytes` overrides it.
Expected<ClusterSpec> clusterFromPreset(const std::string &device_type, int num_devices,
                                        std::optional<int64_t> memory_bytes = std::nullopt);

/// Parses "2GiB", "512MB", "1.5G", "1000000" into bytes (binary and decimal units).
Expected<int64_t> parseByteSize(const std::string &text);

} // namespace rannc::cluster
