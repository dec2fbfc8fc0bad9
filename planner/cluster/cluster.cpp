#include "planner/cluster/cluster.h"

#include <cmath>
#include <unistd.h>

namespace rannc::cluster {
namespace {

constexpr double kGB = 1e9;
constexpr int64_t kGiB = int64_t{1} << 30;

struct Preset {
  const char *name;
  const char *type;
  int64_t memory_bytes;
  double peak_flops;   // fp32, published
  double bandwidth;    // HBM, published
  LinkSpec intra;      // NVLink (per direction)
  LinkSpec inter;      // InfiniBand generation of the era
};

// Published figures: NVIDIA V100 (SXM2), A100 and H100 (SXM5) datasheets;
// inter-node links are EDR/HDR/NDR InfiniBand of the same generation.
const Preset kPresets[] = {
    {"v100-16g", "cuda", 16 * kGiB, 15.7e12, 900 * kGB, {150 * kGB, 5e-6}, {12.5 * kGB, 5e-6}},
    {"v100-32g", "cuda", 32 * kGiB, 15.7e12, 900 * kGB, {150 * kGB, 5e-6}, {12.5 * kGB, 5e-6}},
    {"a100-40g", "cuda", 40 * kGiB, 19.5e12, 1555 * kGB, {300 * kGB, 5e-6}, {25 * kGB, 5e-6}},
    {"a100-80g", "cuda", 80 * kGiB, 19.5e12, 2039 * kGB, {300 * kGB, 5e-6}, {25 * kGB, 5e-6}},
    {"h100-80g", "cuda", 80 * kGiB, 67e12, 3350 * kGB, {450 * kGB, 5e-6}, {50 * kGB, 5e-6}},
};

/// The local CPU: memory from the OS, a rough FMA-vector peak per core. Ranks
/// of a CPU "cluster" share this machine, so each gets an equal share.
DeviceSpec localCpu(int num_devices) {
  long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  int64_t mem = pages > 0 && page > 0 ? int64_t(pages) * page : 8 * kGiB;
  DeviceSpec d;
  d.type = "cpu";
  d.name = "cpu";
  d.memory_bytes = mem / std::max(1, num_devices);
  // 2.5 GHz x 32 fp32 FLOP/cycle (two AVX2 FMA units), shared among the ranks.
  d.peak_flops = double(cores) * 2.5e9 * 32 / std::max(1, num_devices);
  d.memory_bandwidth = 20 * kGB;
  return d;
}

} // namespace

void ClusterSpec::print(std::ostream &os) const {
  os << num_nodes << " node(s) x " << devices_per_node << " " << device.name << " ("
     << device.type << ", " << device.memory_bytes / double(kGiB) << " GiB, "
     << device.peak_flops / 1e12 << " TFLOP/s fp32)";
}

std::vector<std::string> presetNames() {
  std::vector<std::string> names{"cpu"};
  for (const auto &p : kPresets) names.push_back(p.name);
  return names;
}

Expected<ClusterSpec> clusterFromPreset(const std::string &device_type, int num_devices,
                                        std::optional<int64_t> memory_bytes) {
  if (num_devices < 1) return Error{"--gpus must be at least 1 (got " + std::to_string(num_devices) + ")"};
  ClusterSpec c;
  if (device_type == "cpu") {
    c.device = localCpu(num_devices);
    c.num_nodes = 1;
    c.devices_per_node = num_devices;
    // MPI over shared memory on one machine.
    c.intra_node = {5 * kGB, 2e-6};
    c.inter_node = c.intra_node;
  } else {
    const Preset *p = nullptr;
    for (const auto &q : kPresets)
      if (device_type == q.name) p = &q;
    if (!p) {
      std::string known;
      for (const auto &n : presetNames()) known += (known.empty() ? "" : ", ") + n;
      return Error{"unknown --device-type '" + device_type + "' (known: " + known + ")"};
    }
    c.device = {p->type, p->name, p->memory_bytes, p->peak_flops, p->bandwidth};
    c.intra_node = p->intra;
    c.inter_node = p->inter;
    c.devices_per_node = std::min(num_devices, 8);
    if (num_devices % c.devices_per_node != 0)
      return Error{"--gpus " + std::to_string(num_devices) +
                   " does not fill whole nodes of 8 devices; use a cluster file for uneven nodes"};
    c.num_nodes = num_devices / c.devices_per_node;
  }
  if (memory_bytes) {
    if (*memory_bytes <= 0) return Error{"--device-memory must be positive"};
    c.device.memory_bytes = *memory_bytes;
  }
  return c;
}

Expected<int64_t> parseByteSize(const std::string &text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception &) {
    return Error{"'" + text + "' is not a size (expected e.g. 16GiB, 512MB, 1000000)"};
  }
  std::string unit = text.substr(pos);
  struct U { const char *s; double f; };
  const U units[] = {{"", 1},       {"B", 1},       {"K", 1024},   {"KB", 1e3},
                     {"KiB", 1024}, {"M", 1 << 20}, {"MB", 1e6},   {"MiB", 1 << 20},
                     {"G", double(kGiB)}, {"GB", 1e9}, {"GiB", double(kGiB)},
                     {"T", double(kGiB) * 1024}, {"TB", 1e12}, {"TiB", double(kGiB) * 1024}};
  for (const auto &u : units)
    if (unit == u.s) {
      if (value < 0 || !std::isfinite(value)) return Error{"'" + text + "' is not a valid size"};
      return static_cast<int64_t>(value * u.f);
    }
  return Error{"'" + text + "': unknown size unit '" + unit + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"};
}

} // namespace rannc::cluster
