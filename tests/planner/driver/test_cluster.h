// The driver tests' machine: fixed numbers, because the "cpu" preset depends
// on this machine's cores and memory, which golden files must not.
#pragma once

#include "planner/cluster/cluster.h"

namespace rannc::planner {

/// One node of `devices` CPU devices of 64 MiB.
inline cluster::ClusterSpec testCluster(int devices = 2) {
  cluster::ClusterSpec c;
  c.num_nodes = 1;
  c.devices_per_node = devices;
  c.device.type = "cpu";
  c.device.name = "test-cpu";
  c.device.memory_bytes = int64_t(64) << 20;
  c.device.peak_flops = 1e11;
  c.device.memory_bandwidth = 1e10;
  c.intra_node = {5e9, 2e-6};
  c.inter_node = {1.25e9, 50e-6};
  return c;
}

} // namespace rannc::planner
