#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "planner/cluster/cluster.h"

namespace rannc::cluster {
namespace {

const std::string kClusters = std::string(RANNC_SOURCE_DIR) + "/docs/clusters/";

/// The error parsing `yaml` as "cluster.yaml" gives, or "ok".
std::string errorOf(const std::string &yaml) {
  auto c = parseClusterYaml(yaml, "cluster.yaml");
  return c ? "ok" : c.error().message;
}

ClusterSpec parseOk(const std::string &yaml) {
  auto c = parseClusterYaml(yaml, "cluster.yaml");
  EXPECT_TRUE(c.ok()) << (c ? "" : c.error().message);
  return c ? *c : ClusterSpec{};
}

// A complete description without a preset; tests below break one line of it.
const char *const kExplicit = R"(nodes: 2
devices_per_node: 4
device:
  type: cuda
  name: my-gpu
  memory: 24GiB
  peak_flops: {fp32: 30T, bf16: 120T}
  memory_bandwidth: 900GB/s
links:
  intra_node: {bandwidth: 64GB/s, latency: 2us}
  inter_node: {bandwidth: 100Gb/s, latency: 10us}
)";

std::string replace(std::string text, const std::string &from, const std::string &to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(ClusterExamples, DgxA100IsThePresetWrittenOut) {
  auto c = loadClusterFile(kClusters + "dgx-a100-4nodes.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto preset = clusterFromPreset("a100-40g", 32);
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(c->worldSize(), 32);
  EXPECT_EQ(c->num_nodes, 4);
  // 200Gb/s is 25GB/s: every field, the links included, equals the preset.
  EXPECT_EQ(*c, *preset);
}

TEST(ClusterExamples, V100OverridesThePreset) {
  auto c = loadClusterFile(kClusters + "v100-32.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->num_nodes, 8);
  EXPECT_EQ(c->devices_per_node, 4);
  EXPECT_EQ(c->device.name, "v100-32g");
  EXPECT_EQ(c->device.memory_bytes, 31 * (int64_t{1} << 30));
  EXPECT_EQ(c->device.peak_flops, 15.7e12);     // from the preset
  EXPECT_EQ(c->device.peak_flops_fp16, 125e12); // from the preset
  EXPECT_EQ(c->device.peak_flops_bf16, 0);      // V100 has no bf16 arithmetic
  EXPECT_EQ(c->device.peakFlops(Precision::kBF16), 15.7e12);
  EXPECT_EQ(c->intra_node, (LinkSpec{100e9, 5e-6}));  // latency from the preset
  EXPECT_EQ(c->inter_node, (LinkSpec{6.25e9, 3e-6})); // 50Gb/s / 8
}

TEST(ClusterExamples, CpuSharesThisMachine) {
  auto c = loadClusterFile(kClusters + "cpu-4ranks.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto preset = clusterFromPreset("cpu", 4, int64_t{2} << 30);
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(*c, *preset);
  EXPECT_EQ(c->device.type, "cpu");
  // Four ranks get a quarter of the machine each.
  auto one = clusterFromPreset("cpu", 1);
  ASSERT_TRUE(one.ok());
  EXPECT_DOUBLE_EQ(c->device.peak_flops * 4, one->device.peak_flops);
  EXPECT_NEAR(double(one->device.memory_bytes) / 4, double(clusterFromPreset("cpu", 4)->device.memory_bytes), 4);
}

TEST(ClusterYaml, ExplicitDescription) {
  ClusterSpec c = parseOk(kExplicit);
  EXPECT_EQ(c.worldSize(), 8);
  EXPECT_EQ(c.device.type, "cuda");
  EXPECT_EQ(c.device.name, "my-gpu");
  EXPECT_EQ(c.device.memory_bytes, 24 * (int64_t{1} << 30));
  EXPECT_EQ(c.device.peak_flops, 30e12);
  EXPECT_EQ(c.device.peak_flops_tf32, 0); // not given: no such arithmetic
  EXPECT_EQ(c.device.peak_flops_bf16, 120e12);
  EXPECT_EQ(c.device.peakFlops(Precision::kTF32), 30e12);
  EXPECT_EQ(c.device.peakFlops(Precision::kBF16), 120e12);
  EXPECT_EQ(c.device.memory_bandwidth, 900e9);
  EXPECT_EQ(c.intra_node, (LinkSpec{64e9, 2e-6}));
  EXPECT_EQ(c.inter_node, (LinkSpec{12.5e9, 10e-6}));
}

TEST(ClusterYaml, PresetOverride) {
  ClusterSpec c = parseOk(R"(
nodes: 2
devices_per_node: 8
device:
  preset: h100-80g
  name: h100-pcie-ish
  memory: 78GiB
  peak_flops: {bf16: 756T}
  memory_bandwidth: 2TB/s
links:
  inter_node: {latency: 8us}
)");
  auto preset = clusterFromPreset("h100-80g", 16);
  ASSERT_TRUE(preset.ok());
  ClusterSpec want = *preset;
  want.device.name = "h100-pcie-ish";
  want.device.memory_bytes = 78 * (int64_t{1} << 30);
  want.device.peak_flops_bf16 = 756e12;
  want.device.memory_bandwidth = 2e12;
  want.inter_node.latency_s = 8e-6;
  EXPECT_EQ(c, want);
  // A plain peak_flops is the fp32 peak; the preset keeps the others.
  c = parseOk("nodes: 1\ndevices_per_node: 2\ndevice: {preset: a100-80g, peak_flops: 20T}\n");
  EXPECT_EQ(c.device.peak_flops, 20e12);
  EXPECT_EQ(c.device.peak_flops_tf32, 156e12);
  EXPECT_EQ(c.device.memory_bandwidth, 2039e9);
}

TEST(ClusterYaml, AnalyticFactors) {
  // Optional, with or without a preset; the defaults otherwise.
  ClusterSpec c = parseOk("nodes: 1\ndevices_per_node: 1\n"
                          "device: {preset: a100-40g, compute_efficiency: 0.62, memory_efficiency: 1,\n"
                          "         op_overhead: 0us}\n");
  EXPECT_EQ(c.device.compute_efficiency, 0.62);
  EXPECT_EQ(c.device.memory_efficiency, 1.0);
  EXPECT_EQ(c.device.op_overhead_s, 0.0);
  c = parseOk("nodes: 1\ndevices_per_node: 1\n"
              "device: {type: cpu, memory: 1GiB, peak_flops: 1e11, memory_bandwidth: 10GB/s}\n");
  EXPECT_EQ(c.device.compute_efficiency, DeviceSpec{}.compute_efficiency);
  EXPECT_EQ(c.device.op_overhead_s, DeviceSpec{}.op_overhead_s);
  const std::string head = "nodes: 1\ndevices_per_node: 1\ndevice:\n  preset: a100-40g\n";
  EXPECT_EQ(errorOf(head + "  compute_efficiency: 1.5\n"),
            "cluster.yaml:5: device.compute_efficiency must be a fraction in (0, 1], got '1.5'");
  EXPECT_EQ(errorOf(head + "  memory_efficiency: half\n"),
            "cluster.yaml:5: device.memory_efficiency must be a fraction in (0, 1], got 'half'");
  EXPECT_EQ(errorOf(head + "  op_overhead: -1us\n"),
            "cluster.yaml:5: device.op_overhead must be zero or positive, got '-1us'");
}

TEST(ClusterYaml, UnusedLinksMayBeLeftOut) {
  ClusterSpec c = parseOk("nodes: 1\ndevices_per_node: 1\n"
                          "device: {type: cpu, memory: 1GiB, peak_flops: 1e11, memory_bandwidth: 10GB/s}\n");
  EXPECT_EQ(c.device.name, "cpu"); // defaults to the type
  EXPECT_EQ(c.intra_node, LinkSpec{});
  EXPECT_EQ(c.inter_node, LinkSpec{});
  c = parseOk("nodes: 1\ndevices_per_node: 2\n"
              "device: {type: cpu, memory: 1GiB, peak_flops: 1e11, memory_bandwidth: 10GB/s}\n"
              "links: {intra_node: {bandwidth: 5GB/s, latency: 1us}}\n");
  EXPECT_EQ(c.intra_node, (LinkSpec{5e9, 1e-6}));
}

TEST(ClusterYaml, ToYamlRoundTrips) {
  for (const auto &name : presetNames()) {
    for (int n : {1, 8, 16}) {
      auto c = clusterFromPreset(name, n);
      ASSERT_TRUE(c.ok()) << c.error().message;
      std::string text = toYaml(*c);
      auto back = parseClusterYaml(text, name + ".yaml");
      ASSERT_TRUE(back.ok()) << back.error().message << "\n" << text;
      EXPECT_EQ(*back, *c) << text;
    }
  }
  auto a100 = clusterFromPreset("a100-40g", 32);
  ASSERT_TRUE(a100.ok());
  EXPECT_EQ(toYaml(*a100), R"(nodes: 4
devices_per_node: 8
device:
  type: cuda
  name: a100-40g
  memory: 40GiB
  peak_flops: {fp32: 19.5T, tf32: 156T, fp16: 312T, bf16: 312T}
  memory_bandwidth: 1.555TB/s
  compute_efficiency: 0.869
  memory_efficiency: 0.8
  op_overhead: 5us
  runtime_reserve: 444544KiB
links:
  intra_node: {bandwidth: 300GB/s, latency: 5us}
  inter_node: {bandwidth: 25GB/s, latency: 5us}
)");
}

TEST(ClusterYaml, Print) {
  auto v100 = clusterFromPreset("v100-16g", 8);
  ASSERT_TRUE(v100.ok());
  std::ostringstream os;
  v100->print(os);
  EXPECT_EQ(os.str(), "cluster  1 node x 8 devices = 8 ranks\n"
                      "device   v100-16g (cuda), memory 16GiB, memory bandwidth 900GB/s\n"
                      "peak     FLOP/s fp32 15.7T, tf32 -, fp16 125T, bf16 -\n"
                      "analytic 0.5 of peak compute, 0.8 of memory bandwidth, 5us per op\n"
                      "reserve  441472KiB of device memory for the CUDA context, library workspaces and allocator "
                      "segments\n"
                      "links    intra-node 150GB/s 5us, inter-node 6.25GB/s 5us\n");
  // A CPU rank's share of this machine is rounded for reading; an unused link says so.
  ClusterSpec cpu = parseOk("nodes: 1\ndevices_per_node: 1\n"
                            "device: {type: cpu, memory: 6171021KiB, peak_flops: 40G, memory_bandwidth: 5GB/s}\n");
  os.str("");
  cpu.print(os);
  EXPECT_EQ(os.str(), "cluster  1 node x 1 device = 1 rank\n"
                      "device   cpu (cpu), memory 5.89GiB, memory bandwidth 5GB/s\n"
                      "peak     FLOP/s fp32 40G, tf32 -, fp16 -, bf16 -\n"
                      "analytic 0.5 of peak compute, 0.8 of memory bandwidth, 5us per op\n"
                      "links    intra-node unused, inter-node unused\n");
}

TEST(ClusterPreset, RuntimeReserve) {
  // Note [runtime reserve] in cluster.cpp: 400 MiB context + cuBLAS workspace
  // + cuBLASLt workspace + 2 MiB and 20 MiB allocator segments.
  constexpr int64_t MiB = int64_t{1} << 20;
  auto reserve = [](const char *preset) { return clusterFromPreset(preset, 1)->device.runtime_reserve_bytes; };
  EXPECT_EQ(reserve("v100-32g"), 400 * MiB + 8519680 + 1 * MiB + 22 * MiB); // 431.125 MiB
  EXPECT_EQ(reserve("a100-40g"), 400 * MiB + 8519680 + 4 * MiB + 22 * MiB); // 434.125 MiB
  EXPECT_EQ(reserve("h100-80g"), 400 * MiB + 32 * MiB + 32 * MiB + 22 * MiB); // 486 MiB
  EXPECT_EQ(reserve("cpu"), 0);
  // A cluster file overrides it; a cuda device without a preset gets the
  // largest preset figure; cpu reserves nothing; a changed type takes its own.
  const std::string head = "nodes: 1\ndevices_per_node: 1\ndevice:\n";
  EXPECT_EQ(parseOk(head + "  preset: a100-80g\n  runtime_reserve: 1GiB\n").device.runtime_reserve_bytes,
            int64_t{1} << 30);
  EXPECT_EQ(parseOk(head + "  preset: a100-80g\n  runtime_reserve: 0\n").device.runtime_reserve_bytes, 0);
  EXPECT_EQ(parseOk(head + "  {type: cuda, memory: 24GiB, peak_flops: 80T, memory_bandwidth: 1TB/s}\n")
                .device.runtime_reserve_bytes,
            reserve("h100-80g"));
  EXPECT_EQ(parseOk(head + "  {type: cpu, memory: 24GiB, peak_flops: 1T, memory_bandwidth: 10GB/s}\n")
                .device.runtime_reserve_bytes,
            0);
  EXPECT_EQ(parseOk(head + "  {preset: a100-40g, type: cpu}\n").device.runtime_reserve_bytes, 0);
  EXPECT_EQ(errorOf(head + "  preset: v100-16g\n  runtime_reserve: 16GiB\n"),
            "cluster.yaml:5: device.runtime_reserve (16GiB) leaves nothing of device.memory (16GiB)");
  EXPECT_EQ(errorOf(head + "  preset: v100-16g\n  runtime_reserve: -1MiB\n").substr(0, 33),
            "cluster.yaml:5: device.runtime_re");
  // It survives the YAML and plan round trips (toYaml above, plan_test for the proto).
  ClusterSpec c = parseOk(head + "  preset: h100-80g\n  runtime_reserve: 700MiB\n");
  auto back = parseClusterYaml(toYaml(c), "again.yaml");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->device.runtime_reserve_bytes, 700 * MiB);
  EXPECT_EQ(*back, c);
}

TEST(ClusterPreset, Figures) {
  // Note [preset figures] in cluster.cpp gives the datasheets.
  auto h100 = clusterFromPreset("h100-80g", 8);
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->device.peak_flops, 67e12);
  EXPECT_EQ(h100->device.peak_flops_tf32, 494.5e12); // 989 with sparsity / 2
  EXPECT_EQ(h100->device.peak_flops_bf16, 989.5e12);
  EXPECT_EQ(h100->device.memory_bandwidth, 3.35e12);
  EXPECT_EQ(h100->intra_node.bandwidth, 450e9); // 900 GB/s NVLink, both directions
  auto a100 = clusterFromPreset("a100-80g", 8, int64_t{70} << 30);
  ASSERT_TRUE(a100.ok());
  EXPECT_EQ(a100->device.memory_bytes, int64_t{70} << 30);
  EXPECT_EQ(a100->device.memory_bandwidth, 2039e9);
}

TEST(ClusterPreset, WholeNodesOnly) {
  auto c = clusterFromPreset("a100-40g", 4);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_nodes, 1);
  EXPECT_EQ(c->devices_per_node, 4);
  c = clusterFromPreset("a100-40g", 24);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->num_nodes, 3);
  c = clusterFromPreset("cpu", 12); // CPU ranks share one machine
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->devices_per_node, 12);

  c = clusterFromPreset("v100-32g", 12);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message,
            "--gpus 12 does not fill whole nodes of 8 v100-32g devices: use 1 to 8 or a multiple of 8, or a "
            "cluster file (--cluster FILE.yaml, see docs/cluster.md) with e.g. nodes: 2, devices_per_node: 6");
  c = clusterFromPreset("tpu", 8);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message,
            "unknown --device-type 'tpu' (known: cpu, v100-16g, v100-32g, a100-40g, a100-80g, h100-80g)");
}

TEST(ClusterUnits, Sizes) {
  EXPECT_EQ(*parseByteSize("40GiB"), int64_t{40} << 30);
  EXPECT_EQ(*parseByteSize("1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(*parseByteSize("512MB"), 512000000);
  EXPECT_EQ(*parseByteSize("2G"), int64_t{2} << 30); // bare letters are binary, as for --device-memory
  EXPECT_EQ(*parseByteSize("1000000"), 1000000);
  EXPECT_EQ(*parseByteSize(" 16 GiB "), int64_t{16} << 30);
  EXPECT_EQ(*parseByteSize("4e9B"), 4000000000);
  EXPECT_EQ(parseByteSize("40GX").error().message,
            "'40GX': unknown size unit 'GX' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  EXPECT_EQ(parseByteSize("lots").error().message, "'lots' is not a size (expected e.g. 16GiB, 512MB, 1000000)");
  EXPECT_EQ(parseByteSize("-1GiB").error().message, "'-1GiB' is negative");
  EXPECT_EQ(parseByteSize("1e30TiB").error().message, "'1e30TiB' is out of range");
  EXPECT_FALSE(parseByteSize("inf").ok());
  EXPECT_FALSE(parseByteSize("0x10").ok());
}

TEST(ClusterUnits, RatesAndTimes) {
  // Decimal suffixes move the exponent, so "15.7T" is exactly the double 15.7e12.
  EXPECT_EQ(*parseFlops("15.7T"), 15.7e12);
  EXPECT_EQ(*parseFlops("19.5 TFLOP/s"), 19.5e12);
  EXPECT_EQ(*parseFlops("1.5e13"), 1.5e13);
  EXPECT_EQ(*parseFlops("500k"), 5e5);
  EXPECT_EQ(*parseFlops("2P"), 2e15);
  EXPECT_EQ(*parseBandwidth("1555GB/s"), 1555e9);
  EXPECT_EQ(*parseBandwidth("16GiB/s"), 16.0 * (1 << 30));
  EXPECT_EQ(*parseBandwidth("400Gb/s"), 50e9);
  EXPECT_EQ(*parseDuration("5us"), 5e-6);
  EXPECT_EQ(*parseDuration("5\u00b5s"), 5e-6);
  EXPECT_EQ(*parseDuration("1.5ms"), 1.5e-3);
  EXPECT_EQ(*parseDuration("100ns"), 100e-9);
  EXPECT_EQ(*parseDuration("0s"), 0);
  EXPECT_EQ(parseFlops("19.5X").error().message,
            "'19.5X': unknown FLOP/s unit 'X' (use k, M, G, T, P, optionally followed by FLOP/s)");
  EXPECT_EQ(parseBandwidth("300GB").error().message,
            "'300GB' needs a unit per second (e.g. 300GB/s, 25GiB/s, 200Gb/s)");
  EXPECT_EQ(parseBandwidth("300G/s").error().message,
            "'300G/s': unknown bandwidth unit 'G/s' (use B/s, KB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s, "
            "or bits: Kb/s, Mb/s, Gb/s, Tb/s)");
  EXPECT_EQ(parseDuration("5").error().message, "'5' needs a unit (s, ms, us, ns)");
  EXPECT_EQ(parseDuration("-5us").error().message, "'-5us' is negative");
}

TEST(ClusterUnits, FormatsReadBack) {
  EXPECT_EQ(formatByteSize(int64_t{40} << 30), "40GiB");
  EXPECT_EQ(formatByteSize(int64_t{3} << 29), "1536MiB");
  EXPECT_EQ(formatByteSize(33752120768), "33.752120768GB");
  EXPECT_EQ(formatByteSize(1000), "1KB");
  EXPECT_EQ(formatByteSize(7), "7B");
  EXPECT_EQ(formatFlops(15.7e12), "15.7T");
  EXPECT_EQ(formatFlops(494.5e12), "494.5T");
  EXPECT_EQ(formatFlops(0), "0");
  EXPECT_EQ(formatFlops(1.25e9 / 3), "416.6666666666667M");
  EXPECT_EQ(formatBandwidth(25e9), "25GB/s");
  EXPECT_EQ(formatBandwidth(3.35e12), "3.35TB/s");
  EXPECT_EQ(formatDuration(5e-6), "5us");
  EXPECT_EQ(formatDuration(2.5), "2.5s");
  EXPECT_EQ(formatDuration(1e-10), "0.1ns");
  EXPECT_EQ(formatDuration(0), "0s");
  for (double v : {1.0 / 3, 2.0 / 7 * 1e12, 123456789.123, 9.87654321e-7}) {
    EXPECT_EQ(*parseFlops(formatFlops(v)), v);
    EXPECT_EQ(*parseBandwidth(formatBandwidth(v)), v);
    EXPECT_EQ(*parseDuration(formatDuration(v)), v);
  }
}

TEST(ClusterYamlErrors, UnknownKey) {
  EXPECT_EQ(errorOf(replace(kExplicit, "  memory: 24GiB", "  memroy: 24GiB")),
            "cluster.yaml:6: unknown key 'memroy' in device (known: preset, type, name, memory, peak_flops, "
            "memory_bandwidth, compute_efficiency, memory_efficiency, op_overhead, runtime_reserve)");
  EXPECT_EQ(errorOf(std::string(kExplicit) + "gpus: 8\n"),
            "cluster.yaml:12: unknown key 'gpus' at top level (known: nodes, devices_per_node, device, links)");
  EXPECT_EQ(errorOf(replace(kExplicit, "bf16: 120T", "fp64: 15T")),
            "cluster.yaml:7: unknown key 'fp64' in device.peak_flops (known: fp32, tf32, fp16, bf16)");
  EXPECT_EQ(errorOf(replace(kExplicit, "latency: 10us", "latncy: 10us")),
            "cluster.yaml:11: unknown key 'latncy' in links.inter_node (known: bandwidth, latency)");
}

TEST(ClusterYamlErrors, BadUnit) {
  EXPECT_EQ(errorOf(replace(kExplicit, "24GiB", "24GX")),
            "cluster.yaml:6: device.memory: '24GX': unknown size unit 'GX' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, "
            "TB)");
  EXPECT_EQ(errorOf(replace(kExplicit, "latency: 2us", "latency: 2")),
            "cluster.yaml:10: links.intra_node.latency: '2' needs a unit (s, ms, us, ns)");
  EXPECT_EQ(errorOf(replace(kExplicit, "memory_bandwidth: 900GB/s", "memory_bandwidth: 900GB")),
            "cluster.yaml:8: device.memory_bandwidth: '900GB' needs a unit per second (e.g. 300GB/s, 25GiB/s, "
            "200Gb/s)");
  EXPECT_EQ(errorOf(replace(kExplicit, "fp32: 30T", "fp32: fast")),
            "cluster.yaml:7: device.peak_flops.fp32: 'fast' is not a FLOP/s figure (expected e.g. 19.5T, "
            "312TFLOP/s, 1.5e13)");
}

TEST(ClusterYamlErrors, OutOfRange) {
  EXPECT_EQ(errorOf(replace(kExplicit, "24GiB", "-4GiB")),
            "cluster.yaml:6: device.memory must be positive, got '-4GiB'");
  EXPECT_EQ(errorOf(replace(kExplicit, "24GiB", "0")), "cluster.yaml:6: device.memory must be positive, got '0'");
  EXPECT_EQ(errorOf(replace(kExplicit, "latency: 2us", "latency: -2us")),
            "cluster.yaml:10: links.intra_node.latency must be zero or positive, got '-2us'");
  EXPECT_EQ(errorOf(replace(kExplicit, "bf16: 120T", "bf16: 0")), "ok"); // 0: no bf16 arithmetic
  EXPECT_EQ(errorOf(replace(kExplicit, "fp32: 30T", "fp32: 0")),
            "cluster.yaml:7: device.peak_flops.fp32 must be positive, got '0'");
  EXPECT_EQ(errorOf(replace(kExplicit, "nodes: 2", "nodes: 0")),
            "cluster.yaml:1: nodes must be a positive integer, got '0'");
  EXPECT_EQ(errorOf(replace(kExplicit, "devices_per_node: 4", "devices_per_node: 2.5")),
            "cluster.yaml:2: devices_per_node must be a positive integer, got '2.5'");
  EXPECT_EQ(errorOf(replace(kExplicit, "type: cuda", "type: tpu")),
            "cluster.yaml:4: device.type must be cpu or cuda, got 'tpu'");
  EXPECT_EQ(errorOf(replace(kExplicit, "nodes: 2\ndevices_per_node: 4", "nodes: 100000\ndevices_per_node: 100000")),
            "cluster.yaml:1: nodes x devices_per_node is too large (10000000000)");
}

TEST(ClusterYamlErrors, WrongType) {
  EXPECT_EQ(errorOf(replace(kExplicit, "memory: 24GiB", "memory: [24GiB]")),
            "cluster.yaml:6: device.memory must be a size (e.g. 40GiB), got a sequence");
  EXPECT_EQ(errorOf(replace(kExplicit, "memory: 24GiB", "memory:")),
            "cluster.yaml:6: device.memory must be a size (e.g. 40GiB), got nothing");
  EXPECT_EQ(errorOf("nodes: 1\ndevices_per_node: 1\ndevice: a100-40g\n"),
            "cluster.yaml:3: device must be a mapping, got 'a100-40g'");
  EXPECT_EQ(errorOf(replace(kExplicit, "nodes: 2", "nodes: {count: 2}")),
            "cluster.yaml:1: nodes must be a positive integer, got a mapping");
  EXPECT_EQ(errorOf("- nodes: 1\n"), "cluster.yaml:1: a cluster description must be a mapping, got a sequence");
  EXPECT_EQ(errorOf(replace(kExplicit, "peak_flops: {fp32: 30T, bf16: 120T}", "peak_flops: [30T]")),
            "cluster.yaml:7: device.peak_flops must be a mapping, got a sequence");
}

TEST(ClusterYamlErrors, MissingKey) {
  EXPECT_EQ(errorOf(replace(kExplicit, "  memory: 24GiB\n", "")),
            "cluster.yaml:3: missing key 'memory' in device (required without a preset)");
  EXPECT_EQ(errorOf(replace(kExplicit, "nodes: 2\n", "")), "cluster.yaml:1: missing key 'nodes' at top level");
  EXPECT_EQ(errorOf(replace(kExplicit, "fp32: 30T, ", "")),
            "cluster.yaml:7: missing key 'fp32' in device.peak_flops (required without a preset)");
  EXPECT_EQ(errorOf(replace(kExplicit, "  inter_node: {bandwidth: 100Gb/s, latency: 10us}\n", "")),
            "cluster.yaml:9: missing key 'inter_node' in links (required for nodes > 1 without a preset)");
  EXPECT_EQ(errorOf(replace(kExplicit, "bandwidth: 64GB/s, ", "")),
            "cluster.yaml:10: missing key 'bandwidth' in links.intra_node (required without a preset)");
  EXPECT_EQ(errorOf("nodes: 1\ndevices_per_node: 2\n"
                    "device: {type: cpu, memory: 1GiB, peak_flops: 1e11, memory_bandwidth: 10GB/s}\n"),
            "cluster.yaml:1: missing key 'links' at top level (required for more than one device without a preset)");
}

TEST(ClusterYamlErrors, Syntax) {
  EXPECT_EQ(errorOf(replace(kExplicit, "{fp32: 30T, bf16: 120T}", "{fp32: 30T, bf16: 120T")),
            "cluster.yaml:8: YAML syntax error: end of map flow not found");
  EXPECT_EQ(errorOf("nodes: 1\n  devices_per_node: 2\n"), "cluster.yaml:2: YAML syntax error: illegal map value");
  EXPECT_EQ(errorOf(std::string(kExplicit) + "nodes: 3\n"),
            "cluster.yaml:12: duplicate key 'nodes' at top level (first on line 1)");
  EXPECT_EQ(errorOf(std::string(kExplicit) + "---\nnodes: 3\n"),
            "cluster.yaml:12: expected one YAML document, found a second one");
  EXPECT_EQ(errorOf(""), "cluster.yaml: empty cluster description (expected nodes, devices_per_node, device, links; "
                         "see docs/cluster.md)");
  EXPECT_EQ(errorOf("# nothing\n"), errorOf(""));
  EXPECT_EQ(errorOf(replace(kExplicit, "type: cuda", "type: *gpu")),
            "cluster.yaml:4: YAML syntax error: the referenced anchor is not defined");
  // yaml-cpp 0.7 would report empty documents here forever (jbeder/yaml-cpp#1040).
  EXPECT_EQ(errorOf(",nodes: 1\n"), "cluster.yaml:1: YAML syntax error: unexpected ','");
  EXPECT_EQ(errorOf("- nodes: 1\n,\n"), "cluster.yaml:2: YAML syntax error: unexpected ','");
  EXPECT_EQ(errorOf("--- ,\n"), "cluster.yaml:1: YAML syntax error: unexpected ','");
  // Nesting deep enough to exhaust a recursive parser is an error, not a crash.
  std::string deep = "nodes: " + std::string(100000, '[') + std::string(100000, ']') + "\n";
  EXPECT_NE(errorOf(deep).rfind("cluster.yaml:1: ", 0), std::string::npos) << errorOf(deep);
}

TEST(ClusterYamlErrors, PresetAndFile) {
  EXPECT_EQ(errorOf("nodes: 1\ndevices_per_node: 8\ndevice:\n  preset: a100\n"),
            "cluster.yaml:4: device.preset: unknown preset 'a100' (known: cpu, v100-16g, v100-32g, a100-40g, "
            "a100-80g, h100-80g)");
  auto c = loadClusterFile("/nonexistent/cluster.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message, "/nonexistent/cluster.yaml: cannot open: No such file or directory");
}

} // namespace
} // namespace rannc::cluster
