// The hardware a plan is made for, as a typed struct. It comes from a device
// preset (`--gpus N --device-type NAME`) or from a YAML cluster description
// (docs/cluster.md); nothing below this library reads YAML or flags.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "planner/support/status.h"

namespace rannc::cluster {

/// The arithmetic a peak FLOP/s figure is for.
enum class Precision { kFP32, kTF32, kFP16, kBF16 };

/// "fp32", "tf32", "fp16" or "bf16".
const char *precisionName(Precision p);

struct DeviceSpec {
  std::string type; ///< "cpu" or "cuda"
  std::string name; ///< preset or user-chosen name, e.g. "a100-40g"
  int64_t memory_bytes = 0;
  double peak_flops = 0;       ///< fp32 FLOP/s (CUDA cores, not tensor cores)
  double memory_bandwidth = 0; ///< bytes/s
  // Dense tensor-core peaks; 0 where the device has no such arithmetic.
  double peak_flops_tf32 = 0; ///< FLOP/s
  double peak_flops_fp16 = 0; ///< FLOP/s
  double peak_flops_bf16 = 0; ///< FLOP/s
  // The analytic cost model's realism (Note [roofline efficiency], cost.cpp):
  // the fraction of peak compute and of memory bandwidth real kernels reach,
  // and the fixed cost of issuing one op (a kernel launch, a dispatch).
  double compute_efficiency = 0.5;
  double memory_efficiency = 0.8;
  double op_overhead_s = 5e-6;
  /// Device memory the runtime holds outside tensors, taken off the capacity
  /// (Note [runtime reserve] in cluster.cpp): 0 on cpu.
  int64_t runtime_reserve_bytes = 0;

  /// The peak for `p`, or the fp32 peak where the device has none for `p`.
  double peakFlops(Precision p) const;
  bool operator==(const DeviceSpec &o) const;
  bool operator!=(const DeviceSpec &o) const { return !(*this == o); }
};

struct LinkSpec {
  double bandwidth = 0; ///< bytes/s one device can use, one direction; 0: the link is unused
  double latency_s = 0;

  bool operator==(const LinkSpec &o) const { return bandwidth == o.bandwidth && latency_s == o.latency_s; }
  bool operator!=(const LinkSpec &o) const { return !(*this == o); }
};

/// A homogeneous cluster: num_nodes nodes of devices_per_node identical devices.
struct ClusterSpec {
  int num_nodes = 1;
  int devices_per_node = 1;
  DeviceSpec device;
  LinkSpec intra_node; ///< between two devices of one node
  LinkSpec inter_node; ///< between devices of different nodes

  int worldSize() const { return num_nodes * devices_per_node; }
  /// A few lines of text, every field with its unit.
  void print(std::ostream &os) const;
  bool operator==(const ClusterSpec &o) const;
  bool operator!=(const ClusterSpec &o) const { return !(*this == o); }
};

/// The preset names, in a stable order: "cpu" first, then the GPUs.
std::vector<std::string> presetNames();

/// `num_devices` devices of preset `device_type`, 8 per node (CPU: one node of
/// ranks sharing this machine), with the preset's memory unless `memory_bytes`
/// overrides it. A GPU count above 8 must be a multiple of 8.
Expected<ClusterSpec> clusterFromPreset(const std::string &device_type, int num_devices,
                                        std::optional<int64_t> memory_bytes = std::nullopt);

/// Parses a YAML cluster description (docs/cluster.md). `where` names the
/// text in errors, which read "WHERE:LINE: what is wrong".
Expected<ClusterSpec> parseClusterYaml(const std::string &text, const std::string &where);

/// Reads and parses the YAML cluster description at `path`.
Expected<ClusterSpec> loadClusterFile(const std::string &path);

/// `c` as a YAML cluster description with every field explicit (no preset);
/// parseClusterYaml gives `c` back exactly.
std::string toYaml(const ClusterSpec &c);

/// Parses "2GiB", "512MB", "1.5G", "1000000" into bytes (binary and decimal units).
Expected<int64_t> parseByteSize(const std::string &text);
/// Parses "19.5T", "312TFLOP/s", "1.5e13" into FLOP/s.
Expected<double> parseFlops(const std::string &text);
/// Parses "300GB/s", "25GiB/s", "200Gb/s" (bits) into bytes/s.
Expected<double> parseBandwidth(const std::string &text);
/// Parses "5us", "1.5ms", "0s" into seconds.
Expected<double> parseDuration(const std::string &text);

/// Exact short forms that the parsers above read back to the same number:
/// "40GiB", "19.5T", "1.555TB/s", "5us".
std::string formatByteSize(int64_t bytes);
std::string formatFlops(double flops);
std::string formatBandwidth(double bytes_per_s);
std::string formatDuration(double seconds);

} // namespace rannc::cluster
