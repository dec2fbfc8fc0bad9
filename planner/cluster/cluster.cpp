#include "planner/cluster/cluster.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "planner/cluster/detail.h"
#include "planner/support/format.h"

namespace rannc::cluster {
namespace {

constexpr double kGB = 1e9;
constexpr int64_t kGiB = int64_t{1} << 30;

struct Preset {
  const char *name;
  int64_t memory_bytes;
  double fp32, tf32, fp16, bf16; // dense FLOP/s; 0: no such arithmetic
  double memory_bandwidth;       // HBM, bytes/s
  LinkSpec intra;                // NVLink, per direction
  LinkSpec inter;                // InfiniBand share of one GPU
  int64_t runtime_reserve;       // Note [runtime reserve]
  double compute_efficiency;     // Note [GPU calibration]
};

constexpr int64_t kMiB = int64_t{1} << 20;

// Note [runtime reserve]
// A rank on a GPU cannot give all of the device's memory to tensors: some is
// held by the runtime itself and never shows in the caching allocator's
// allocated bytes (which is what the planner's stage total and rannc-exec's
// peak_memory_bytes count). The planner takes a fixed figure per device off
// the capacity, the sum of:
//  - the CUDA context with LibTorch's kernels: about 300-400 MiB since CUDA
//    11.7 loads kernels lazily, which PyTorch enables (PyTorch maintainers in
//    pytorch/pytorch#107667 and #109888; more than 1 GiB before lazy loading).
//    We take 400 MiB.
//  - the cuBLAS workspace of the compute stream, allocated from the caching
//    allocator but once per handle and stream, outside any op: PyTorch's
//    default CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8" = 2 x 4 MiB + 8 x 16 KiB
//    = 8519680 bytes (the 8.125 MiB block users find in
//    torch.cuda.memory_snapshot()), 32 MiB on Hopper (pytorch/pytorch#89027).
//  - the cuBLASLt workspace: 1 MiB before Ampere, 4 MiB on Ampere with at
//    least 24 GiB, 32 MiB on Hopper (pytorch/pytorch#120925, following the
//    cuBLAS guide's cublasSetWorkspace recommendation).
//  - the caching allocator's segments the tensors do not fill: requests of
//    at most 1 MiB are carved from 2 MiB segments, larger ones below 10 MiB
//    from 20 MiB segments (PyTorch's CUDA memory management notes, kLargeBuffer
//    in CUDACachingAllocator.cpp); one partly used segment of each, 22 MiB.
// cuDNN's convolution workspaces come from the caching allocator inside the
// op, so the profiler measures them as working memory; NCCL's channel buffers
// depend on the peers and channels and are left to the margin
// (docs/cost-model.md). A cluster file overrides the figure (runtime_reserve).
constexpr int64_t kContext = 400 * kMiB, kAllocatorSegments = 22 * kMiB;
constexpr int64_t kCublasDefault = 8519680, kHopperWorkspace = 32 * kMiB;
constexpr int64_t kVoltaReserve = kContext + kCublasDefault + 1 * kMiB + kAllocatorSegments;  // 431.125 MiB
constexpr int64_t kAmpereReserve = kContext + kCublasDefault + 4 * kMiB + kAllocatorSegments; // 434.125 MiB
constexpr int64_t kHopperReserve = kContext + 2 * kHopperWorkspace + kAllocatorSegments;      // 486 MiB

// Note [preset figures]
// Datasheet figures for the SXM parts, dense (the datasheets' "with sparsity"
// tensor numbers halved):
//  - "NVIDIA Tesla V100 GPU Accelerator" datasheet (SXM2): FP32 15.7 TFLOP/s,
//    Tensor (FP16) 125 TFLOP/s, no TF32 or BF16; HBM2 900 GB/s; NVLink 300 GB/s
//    = 6 links x 25 GB/s per direction.
//  - "NVIDIA A100 Tensor Core GPU" datasheet (SXM4): FP32 19.5, TF32 156,
//    BF16 312, FP16 312 TFLOP/s; HBM 1,555 GB/s (40GB) and 2,039 GB/s (80GB);
//    NVLink 600 GB/s = 12 links x 25 GB/s per direction.
//  - "NVIDIA H100 Tensor Core GPU" datasheet (SXM5): FP32 67, TF32 989*,
//    BF16 1,979*, FP16 1,979* TFLOP/s (* with sparsity); HBM3 3.35 TB/s;
//    NVLink 900 GB/s = 18 links x 25 GB/s per direction.
// HBM capacities are powers of two, so "40GB" is 40 GiB (nvidia-smi shows
// 40960 MiB; CUDA itself keeps a few hundred MiB, see --device-memory).
// Inter-node bandwidth is one GPU's share of the reference DGX system's
// compute fabric: DGX-1 4x EDR 100 Gb/s for 8 V100 (6.25 GB/s), DGX A100 8x
// HDR 200 Gb/s (25 GB/s), DGX H100 8x NDR 400 Gb/s (50 GB/s). Latencies are
// the order of an NCCL small-message transfer, not a datasheet figure.
// Note [GPU calibration]
// The analytic cost model (Note [roofline efficiency] in planner/cost/cost.cpp)
// runs matrix work at peak x compute_efficiency. On the GPU presets that
// fraction is the largest share of the dense bf16 peak that cuBLAS matrix
// products have been measured to reach (Bekman, "Machine Learning
// Engineering", compute/accelerator, "Maximum Achievable Matmul FLOPS",
// mamf-finder.py, PyTorch 2.6 / CUDA 12.6): A100 SXM 271.2 of 312 TFLOP/s
// (0.869 to three digits), H100 SXM 794.5 of 989 TFLOP/s (0.803). No such measurement of a
// V100 is published there, so the V100 presets keep the default 0.5. Smaller
// products fall below it through the roofline: their bytes, at
// memory_bandwidth x memory_efficiency, outweigh their arithmetic. The
// bandwidth fraction (0.8) and the 5 us per kernel stay the defaults
// (docs/cost-model.md, "Calibration against Megatron-LM").
// clang-format off
const Preset kPresets[] = {
    //           memory     fp32     tf32      fp16      bf16      HBM         NVLink             InfiniBand          reserve         compute efficiency
    {"v100-16g", 16 * kGiB, 15.7e12, 0,        125e12,   0,        900 * kGB,  {150 * kGB, 5e-6}, {6.25 * kGB, 5e-6}, kVoltaReserve,  0.5},
    {"v100-32g", 32 * kGiB, 15.7e12, 0,        125e12,   0,        900 * kGB,  {150 * kGB, 5e-6}, {6.25 * kGB, 5e-6}, kVoltaReserve,  0.5},
    {"a100-40g", 40 * kGiB, 19.5e12, 156e12,   312e12,   312e12,   1555 * kGB, {300 * kGB, 5e-6}, {25 * kGB, 5e-6},   kAmpereReserve, 0.869},
    {"a100-80g", 80 * kGiB, 19.5e12, 156e12,   312e12,   312e12,   2039 * kGB, {300 * kGB, 5e-6}, {25 * kGB, 5e-6},   kAmpereReserve, 0.869},
    {"h100-80g", 80 * kGiB, 67e12,   494.5e12, 989.5e12, 989.5e12, 3350 * kGB, {450 * kGB, 5e-6}, {50 * kGB, 5e-6},   kHopperReserve, 0.803},
};
// clang-format on

/// The local machine, shared equally by `ranks` ranks: memory and cores from
/// the OS, a rough FMA-vector peak per core, a typical DRAM bandwidth.
DeviceSpec localCpu(int ranks) {
  ranks = std::max(1, ranks);
  long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  int64_t mem = pages > 0 && page > 0 ? int64_t(pages) * page : 8 * kGiB;
  DeviceSpec d;
  d.type = "cpu";
  d.name = "cpu";
  d.memory_bytes = mem / ranks;
  // 2.5 GHz x 32 fp32 FLOP/cycle (two AVX2 FMA units) per online CPU.
  d.peak_flops = double(cores) * 2.5e9 * 32 / ranks;
  d.memory_bandwidth = 20 * kGB / ranks;
  return d;
}

struct Unit {
  const char *name;
  int exp10;    // decimal scale, applied exactly by shifting the exponent
  double scale; // binary scale (a power of two), or 1/8 for bits
};

const Unit kByteUnits[] = {{"", 0, 1},         {"B", 0, 1},        {"KB", 3, 1},       {"MB", 6, 1},
                           {"GB", 9, 1},       {"TB", 12, 1},      {"KiB", 0, 0x1p10}, {"MiB", 0, 0x1p20},
                           {"GiB", 0, 0x1p30}, {"TiB", 0, 0x1p40}, {"K", 0, 0x1p10},   {"M", 0, 0x1p20},
                           {"G", 0, 0x1p30},   {"T", 0, 0x1p40}};
const Unit kFlopUnits[] = {{"", 0, 1}, {"k", 3, 1}, {"K", 3, 1}, {"M", 6, 1}, {"G", 9, 1}, {"T", 12, 1}, {"P", 15, 1}};
const Unit kRateUnits[] = {{"B", 0, 1},        {"KB", 3, 1},       {"MB", 6, 1},       {"GB", 9, 1},
                           {"TB", 12, 1},      {"KiB", 0, 0x1p10}, {"MiB", 0, 0x1p20}, {"GiB", 0, 0x1p30},
                           {"TiB", 0, 0x1p40}, {"b", 0, 0.125},    {"Kb", 3, 0.125},   {"Mb", 6, 0.125},
                           {"Gb", 9, 0.125},   {"Tb", 12, 0.125}};
const Unit kTimeUnits[] = {{"s", 0, 1}, {"ms", -3, 1}, {"us", -6, 1}, {"\u00b5s", -6, 1}, {"ns", -9, 1}};

struct Kind {
  const char *noun;     // "'x' is not NOUN"
  const char *examples; // "(expected e.g. EXAMPLES)"
  const char *unit_noun;
  const char *unit_list;
  const Unit *units;
  size_t num_units;
};

const Kind &kindOf(detail::Quantity q) {
  static const Kind kinds[] = {
      {"a size", "16GiB, 512MB, 1000000", "size", "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB", kByteUnits,
       std::size(kByteUnits)},
      {"a FLOP/s figure", "19.5T, 312TFLOP/s, 1.5e13", "FLOP/s", "k, M, G, T, P, optionally followed by FLOP/s",
       kFlopUnits, std::size(kFlopUnits)},
      {"a bandwidth", "300GB/s, 25GiB/s, 200Gb/s", "bandwidth",
       "B/s, KB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s, or bits: Kb/s, Mb/s, Gb/s, Tb/s", kRateUnits,
       std::size(kRateUnits)},
      {"a duration", "5us, 1.5ms, 0s", "time", "s, ms, us, ns", kTimeUnits, std::size(kTimeUnits)},
  };
  return kinds[static_cast<int>(q)];
}

std::string trim(const std::string &s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool isDigit(char c) { return c >= '0' && c <= '9'; }

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void printPeak(std::ostream &os, double flops) {
  if (flops > 0)
    os << formatFlops(flops);
  else
    os << "-";
}

void printLink(std::ostream &os, const char *what, const LinkSpec &l) {
  os << what << " ";
  if (l.bandwidth > 0)
    os << formatBandwidth(l.bandwidth) << " " << formatDuration(l.latency_s);
  else
    os << "unused";
}

} // namespace

namespace detail {

Expected<double> parseQuantity(const std::string &text, Quantity q) {
  const Kind &k = kindOf(q);
  const std::string s = trim(text);
  // A decimal number: [+-]digits[.digits][e[+-]digits], then the unit.
  size_t i = 0;
  std::string mantissa;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    if (s[i] == '-') mantissa += '-';
    ++i;
  }
  size_t digits = 0;
  for (; i < s.size() && isDigit(s[i]); ++i, ++digits) mantissa += s[i];
  if (i < s.size() && s[i] == '.') {
    mantissa += s[i++];
    for (; i < s.size() && isDigit(s[i]); ++i, ++digits) mantissa += s[i];
  }
  if (digits == 0) return Error{"'" + text + "' is not " + k.noun + " (expected e.g. " + k.examples + ")"};
  long exp = 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    bool negative = j < s.size() && s[j] == '-';
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    if (j < s.size() && isDigit(s[j])) {
      long e = 0;
      for (; j < s.size() && isDigit(s[j]); ++j) e = std::min(e * 10 + (s[j] - '0'), 100000L);
      exp = negative ? -e : e;
      i = j;
    }
  }
  std::string unit = trim(s.substr(i));

  if (q == Quantity::kFlops && endsWith(unit, "FLOP/s")) unit = trim(unit.substr(0, unit.size() - 6));
  if (q == Quantity::kBandwidth) {
    if (!endsWith(unit, "/s")) return Error{"'" + text + "' needs a unit per second (e.g. " + k.examples + ")"};
    unit = trim(unit.substr(0, unit.size() - 2));
  }
  if (q == Quantity::kDuration && unit.empty()) return Error{"'" + text + "' needs a unit (" + k.unit_list + ")"};
  const Unit *u = nullptr;
  for (size_t n = 0; n < k.num_units; ++n)
    if (unit == k.units[n].name) u = &k.units[n];
  if (!u) {
    std::string shown = trim(s.substr(i));
    return Error{"'" + text + "': unknown " + k.unit_noun + " unit '" + shown + "' (use " + k.unit_list + ")"};
  }
  // Shifting the decimal exponent keeps "15.7T" the double nearest 15.7e12.
  std::string number = mantissa + "e" + std::to_string(exp + u->exp10);
  double value = 0;
  auto r = std::from_chars(number.data(), number.data() + number.size(), value);
  if (r.ec == std::errc::result_out_of_range) {
    // Underflow is a zero in any unit a cluster needs; overflow is an error.
    if (exp + u->exp10 > 0) return Error{"'" + text + "' is out of range"};
    value = 0;
  } else if (r.ec != std::errc() || r.ptr != number.data() + number.size()) {
    return Error{"'" + text + "' is not " + k.noun + " (expected e.g. " + k.examples + ")"};
  }
  value *= u->scale;
  if (!std::isfinite(value)) return Error{"'" + text + "' is out of range"};
  return value;
}

bool applyPreset(const std::string &name, int devices_per_node, ClusterSpec &c) {
  if (name == "cpu") {
    c.device = localCpu(devices_per_node);
    // MPI over shared memory inside a machine; between machines, assume
    // 10 Gb/s Ethernet (cluster files override it).
    c.intra_node = {5 * kGB, 2e-6};
    c.inter_node = {1.25 * kGB, 50e-6};
    return true;
  }
  for (const auto &p : kPresets) {
    if (name != p.name) continue;
    c.device = DeviceSpec{};
    c.device.type = "cuda";
    c.device.name = p.name;
    c.device.memory_bytes = p.memory_bytes;
    c.device.peak_flops = p.fp32;
    c.device.peak_flops_tf32 = p.tf32;
    c.device.peak_flops_fp16 = p.fp16;
    c.device.peak_flops_bf16 = p.bf16;
    c.device.memory_bandwidth = p.memory_bandwidth;
    c.intra_node = p.intra;
    c.inter_node = p.inter;
    c.device.runtime_reserve_bytes = p.runtime_reserve;
    c.device.compute_efficiency = p.compute_efficiency;
    return true;
  }
  return false;
}

int64_t defaultRuntimeReserve(const std::string &type) {
  // A GPU we know nothing more of: the largest preset figure (Hopper's).
  return type == "cuda" ? kHopperReserve : 0;
}

std::string presetList() {
  std::string known;
  for (const auto &n : presetNames()) known += (known.empty() ? "" : ", ") + n;
  return known;
}

} // namespace detail

const char *precisionName(Precision p) {
  switch (p) {
  case Precision::kFP32: return "fp32";
  case Precision::kTF32: return "tf32";
  case Precision::kFP16: return "fp16";
  case Precision::kBF16: return "bf16";
  }
  return "?";
}

double DeviceSpec::peakFlops(Precision p) const {
  double v = 0;
  switch (p) {
  case Precision::kFP32: v = peak_flops; break;
  case Precision::kTF32: v = peak_flops_tf32; break;
  case Precision::kFP16: v = peak_flops_fp16; break;
  case Precision::kBF16: v = peak_flops_bf16; break;
  }
  return v > 0 ? v : peak_flops;
}

bool DeviceSpec::operator==(const DeviceSpec &o) const {
  return type == o.type && name == o.name && memory_bytes == o.memory_bytes && peak_flops == o.peak_flops &&
         memory_bandwidth == o.memory_bandwidth && peak_flops_tf32 == o.peak_flops_tf32 &&
         peak_flops_fp16 == o.peak_flops_fp16 && peak_flops_bf16 == o.peak_flops_bf16 &&
         compute_efficiency == o.compute_efficiency && memory_efficiency == o.memory_efficiency &&
         op_overhead_s == o.op_overhead_s && runtime_reserve_bytes == o.runtime_reserve_bytes;
}

bool ClusterSpec::operator==(const ClusterSpec &o) const {
  return num_nodes == o.num_nodes && devices_per_node == o.devices_per_node && device == o.device &&
         intra_node == o.intra_node && inter_node == o.inter_node;
}

void ClusterSpec::print(std::ostream &os) const {
  os << "cluster  " << num_nodes << (num_nodes == 1 ? " node" : " nodes") << " x " << devices_per_node
     << (devices_per_node == 1 ? " device" : " devices") << " = " << worldSize()
     << (worldSize() == 1 ? " rank\n" : " ranks\n");
  os << "device   " << device.name << " (" << device.type << "), memory "
     << formatBytes(double(device.memory_bytes), ByteStyle::Compact) << ", memory bandwidth "
     << formatBandwidth(device.memory_bandwidth) << "\n";
  os << "peak     FLOP/s fp32 ";
  printPeak(os, device.peak_flops);
  os << ", tf32 ";
  printPeak(os, device.peak_flops_tf32);
  os << ", fp16 ";
  printPeak(os, device.peak_flops_fp16);
  os << ", bf16 ";
  printPeak(os, device.peak_flops_bf16);
  os << "\nanalytic " << device.compute_efficiency << " of peak compute, " << device.memory_efficiency
     << " of memory bandwidth, " << formatDuration(device.op_overhead_s) << " per op";
  if (device.runtime_reserve_bytes > 0)
    os << "\nreserve  " << formatByteSize(device.runtime_reserve_bytes)
       << " of device memory for the CUDA context, library workspaces and allocator segments";
  os << "\nlinks    ";
  printLink(os, "intra-node", intra_node);
  os << ", ";
  printLink(os, "inter-node", inter_node);
  os << "\n";
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
  // CPU ranks share this one machine; GPUs come 8 to a node (DGX-style).
  c.devices_per_node = device_type == "cpu" ? num_devices : std::min(num_devices, 8);
  if (!detail::applyPreset(device_type, c.devices_per_node, c))
    return Error{"unknown --device-type '" + device_type + "' (known: " + detail::presetList() + ")"};
  if (num_devices % c.devices_per_node != 0) {
    int per_node = 8;
    while (num_devices % per_node != 0) --per_node;
    return Error{"--gpus " + std::to_string(num_devices) + " does not fill whole nodes of 8 " + device_type +
                 " devices: use 1 to 8 or a multiple of 8, or a cluster file (--cluster FILE.yaml, see "
                 "docs/cluster.md) with e.g. nodes: " +
                 std::to_string(num_devices / per_node) + ", devices_per_node: " + std::to_string(per_node)};
  }
  c.num_nodes = num_devices / c.devices_per_node;
  if (memory_bytes) {
    if (*memory_bytes <= 0) return Error{"--device-memory must be positive"};
    c.device.memory_bytes = *memory_bytes;
  }
  return c;
}

Expected<int64_t> parseByteSize(const std::string &text) {
  auto v = detail::parseQuantity(text, detail::Quantity::kBytes);
  if (!v) return v.error();
  if (*v < 0) return Error{"'" + text + "' is negative"};
  if (*v >= 0x1p63) return Error{"'" + text + "' is out of range"};
  return static_cast<int64_t>(std::llround(*v));
}

Expected<double> parseFlops(const std::string &text) {
  auto v = detail::parseQuantity(text, detail::Quantity::kFlops);
  if (v && *v < 0) return Error{"'" + text + "' is negative"};
  return v;
}

Expected<double> parseBandwidth(const std::string &text) {
  auto v = detail::parseQuantity(text, detail::Quantity::kBandwidth);
  if (v && *v < 0) return Error{"'" + text + "' is negative"};
  return v;
}

Expected<double> parseDuration(const std::string &text) {
  auto v = detail::parseQuantity(text, detail::Quantity::kDuration);
  if (v && *v < 0) return Error{"'" + text + "' is negative"};
  return v;
}

std::string formatByteSize(int64_t bytes) { return formatBytes(double(bytes), ByteStyle::Exact); }

std::string formatFlops(double flops) {
  static const DecimalSuffix s[] = {{0, ""}, {3, "k"}, {6, "M"}, {9, "G"}, {12, "T"}, {15, "P"}};
  return formatDecimal(flops, s, std::size(s));
}

std::string formatBandwidth(double bytes_per_s) {
  static const DecimalSuffix s[] = {{0, "B/s"}, {3, "KB/s"}, {6, "MB/s"}, {9, "GB/s"}, {12, "TB/s"}};
  return formatDecimal(bytes_per_s, s, std::size(s));
}

std::string formatDuration(double seconds) {
  static const DecimalSuffix s[] = {{-9, "ns"}, {-6, "us"}, {-3, "ms"}, {0, "s"}};
  return formatDecimal(seconds, s, std::size(s));
}

} // namespace rannc::cluster
