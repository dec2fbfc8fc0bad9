// partition_bench: planning time and predicted step time of the stage DP
// ("auto") against the baselines on analytically costed large models.
//
//   partition_bench [--quick] [--model bert4.9b|bert100b|resnet|mlp] [--blocks K]
//
// For each model, one markdown table: auto on the units coarsened to K blocks
// (default 32, RaNNC's limit), auto on every unit (a layer, the embeddings,
// the head), and the baselines on every unit; planning time, the predicted
// step time (evaluate()), the replayed step time (simulate()), the ratio to
// the finest auto, peak memory and the plan's shape, all measured in this one
// run. Exits 1 if a baseline beats auto or a plan does not evaluate to its
// claimed step time. --quick runs the two small models (a ctest smoke test).
// The cost figures are documented in docs/partitioner.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "planner/partition/coarsen.h"
#include "planner/partition/evaluate.h"
#include "planner/partition/simulate.h"
#include "planner/partition/solve.h"

using namespace rannc::partition;

namespace {

constexpr double GB = 1e9, GiB = 1024.0 * 1024 * 1024;

/// Hardware of one benchmark: device and links.
struct Hardware {
  const char *name;
  double peak_flops;   // the precision used
  double efficiency;   // achieved fraction of peak
  double memory_bytes; // per device
  int per_node;
  Link nvlink, network;
  double kernel_s; // launch + sync overhead per kernel
};

// V100-SXM2-32GB in a DGX-1 style node: fp16 tensor cores 125 TFLOP/s.
const Hardware kV100{"V100-32GB", 125e12, 0.35, 32 * GiB, 8, {150 * GB, 5e-6}, {12.5 * GB, 10e-6}, 8e-6};
// A100-SXM4 (DGX A100): fp16 312 TFLOP/s, TF32 156 TFLOP/s, NVLink 300 GB/s a direction, one 200 Gb/s HCA a GPU.
const Hardware kA100_80{"A100-80GB", 312e12, 0.40, 80 * GiB, 8, {300 * GB, 5e-6}, {25 * GB, 10e-6}, 6e-6};
const Hardware kA100_40_tf32{"A100-40GB", 156e12, 0.50, 40 * GiB, 8, {300 * GB, 5e-6}, {25 * GB, 10e-6}, 6e-6};

/// A unit whose backward costs twice its forward (dgrad + wgrad).
Block unit(const Hardware &hw, double fwd_flops_per_sample, int kernels, double params, double act, double work) {
  Block b;
  const double rate = hw.peak_flops * hw.efficiency;
  b.fwd = {kernels * hw.kernel_s, fwd_flops_per_sample / rate};
  b.bwd = {2 * kernels * hw.kernel_s, 2 * fwd_flops_per_sample / rate};
  b.param_bytes = params;
  b.activation_bytes_per_sample = act;
  b.working_bytes_per_sample = work;
  return b;
}

Problem cluster(const Hardware &hw, int devices, int64_t batch, double optimizer_factor) {
  Problem p;
  p.batch_size = batch;
  p.devices.count = devices;
  p.devices.per_node = hw.per_node;
  p.devices.memory_bytes = hw.memory_bytes;
  p.devices.memory_margin = 0.1; // CUDA context, allocator fragmentation
  p.devices.intra_node = hw.nvlink;
  p.devices.inter_node = hw.network;
  p.optimizer_bytes_per_param_byte = optimizer_factor;
  return p;
}

/// BERT-large-style encoder, mixed precision (fp16 params and activations,
/// fp32 master weights + Adam moments = 12 B per 2-byte parameter: factor 6).
/// Units: embeddings, L encoder layers, the MLM head (decoder on 80 masked
/// positions, weight counted here, i.e. untied).
Problem bert(const Hardware &hw, int devices, int64_t batch, int layers, double h, double seq, double heads) {
  const double vocab = 30522, predicted = 80, bytes = 2;
  Problem p = cluster(hw, devices, batch, 6);
  // Embedding lookups + layer norm: memory bound, modelled as 10 flops/element.
  p.blocks.push_back(unit(hw, 10 * seq * h, 6, (vocab + seq + 2) * h * bytes, 3 * seq * h * bytes, seq * h * bytes));
  p.cut_bytes_per_sample.push_back(seq * 8); // token ids, segment ids, mask (int64 / fp)
  const double layer_flops = 24 * seq * h * h + 4 * seq * seq * h;
  const double layer_params = 12 * h * h + 13 * h;
  // Megatron's count of activations a layer keeps per sample in fp16: s h (34 + 5 a s / h).
  const double layer_act = seq * h * (34 + 5 * heads * seq / h);
  const double layer_work = 2 * heads * seq * seq * bytes + 4 * seq * h * bytes;
  for (int l = 0; l < layers; ++l) {
    p.cut_bytes_per_sample.push_back(seq * h * bytes + seq * bytes); // hidden states + attention mask
    p.blocks.push_back(unit(hw, layer_flops, 20, layer_params * bytes, layer_act, layer_work));
  }
  p.cut_bytes_per_sample.push_back(seq * h * bytes + predicted * 8); // hidden states + masked positions/labels
  p.blocks.push_back(unit(hw, 2 * predicted * h * h + 2 * predicted * h * vocab, 8, (h * h + h * vocab + vocab) * bytes,
                          predicted * (h + vocab) * 4, predicted * vocab * 4));
  p.cut_bytes_per_sample.push_back(0); // the loss
  return p;
}

/// ResNet-152 with every width multiplied by `widen` (ResNet-152 x4: ~0.93 B
/// parameters), 224x224 images, mixed precision as for BERT.
Problem resnet(const Hardware &hw, int devices, int64_t batch, double widen) {
  const double bytes = 2;
  Problem p = cluster(hw, devices, batch, 6);
  const double stem_c = 64 * widen;
  // Stem: 7x7/2 conv to 112x112, BN, ReLU, max-pool to 56x56.
  p.cut_bytes_per_sample.push_back(3 * 224 * 224 * bytes);
  p.blocks.push_back(unit(hw, 2 * 7 * 7 * 3 * stem_c * 112 * 112, 4, 7 * 7 * 3 * stem_c * bytes,
                          3 * stem_c * 112 * 112 * bytes, 2 * stem_c * 112 * 112 * bytes));
  const int depth[] = {3, 8, 36, 3};
  const double spatial[] = {56, 28, 14, 7};
  double in_c = stem_c;
  for (int stage = 0; stage < 4; ++stage) {
    const double c = 64 * widen * (1 << stage), out_c = 4 * c, hw2 = spatial[stage] * spatial[stage];
    for (int i = 0; i < depth[stage]; ++i) {
      // 1x1 in_c->c, 3x3 c->c, 1x1 c->4c (+ a 1x1 projection in the first block).
      double params = in_c * c + 9 * c * c + c * out_c + (i == 0 ? in_c * out_c : 0);
      p.cut_bytes_per_sample.push_back(in_c * (i == 0 && stage > 0 ? 4 * hw2 : hw2) * bytes);
      // Kept: each conv's output, its BN output and ReLU output, plus the sum.
      const double act = (3 * c + 3 * c + 3 * out_c) * hw2 * bytes;
      p.blocks.push_back(unit(hw, 2 * params * hw2, 10, params * bytes, act, 2 * out_c * hw2 * bytes));
      in_c = out_c;
    }
  }
  // Head: global average pool, 1000-way FC, softmax cross-entropy.
  p.cut_bytes_per_sample.push_back(in_c * 7 * 7 * bytes);
  p.blocks.push_back(
      unit(hw, 2 * in_c * 1000 + in_c * 49, 3, (in_c * 1000 + 1000) * bytes, (in_c + 1000) * 4, 1000 * 4));
  p.cut_bytes_per_sample.push_back(0);
  return p;
}

/// 100 fully connected layers of 5000x5000 (+bias, ReLU): 2.5 B parameters,
/// fp32 (TF32 tensor cores), Adam (factor 2).
Problem mlp(const Hardware &hw, int devices, int64_t batch) {
  const double width = 5000, bytes = 4;
  Problem p = cluster(hw, devices, batch, 2);
  for (int l = 0; l < 100; ++l) {
    p.cut_bytes_per_sample.push_back(width * bytes);
    p.blocks.push_back(unit(hw, 2 * width * width, 3, (width * width + width) * bytes, 2 * width * bytes,
                            width * bytes));
  }
  p.cut_bytes_per_sample.push_back(0);
  return p;
}

struct Model {
  std::string key, title;
  Problem units;
  double bytes_per_param;
  bool quick;
};

std::vector<Model> models() {
  return {
      {"bert4.9b", "BERT 4.9B (hidden 2048, 96 layers, seq 512), 32 x V100-32GB (4 nodes), batch 256",
       bert(kV100, 32, 256, 96, 2048, 512, 32), 2, false},
      {"bert100b", "BERT ~100B (hidden 8192, 128 layers, seq 512), 256 x A100-80GB (32 nodes), batch 1024",
       bert(kA100_80, 256, 1024, 128, 8192, 512, 64), 2, false},
      {"resnet", "ResNet-152 x4 wide (0.93B), 224x224, 16 x V100-32GB (2 nodes), batch 512",
       resnet(kV100, 16, 512, 4), 2, true},
      {"mlp", "MLP 2.5B (100 layers of 5000x5000, fp32), 8 x A100-40GB (1 node), batch 1024",
       mlp(kA100_40_tf32, 8, 1024), 4, true},
  };
}

double paramBytes(const Problem &p) {
  double total = 0;
  for (const Block &b : p.blocks) total += b.param_bytes;
  return total;
}

/// "8 stages x 4" when every stage has 4 replicas, else a run-length list
/// "(2, 4x46, 2, 4x17)"; then micro-batches, schedule and recomputation.
std::string shape(const Solution &s) {
  std::string out = std::to_string(s.numStages()) + " stages x ";
  std::vector<std::pair<int, int>> runs; // (replicas, count)
  for (const Stage &st : s.stages) {
    if (!runs.empty() && runs.back().first == st.replicas) ++runs.back().second;
    else runs.push_back({st.replicas, 1});
  }
  if (runs.size() == 1) {
    out += std::to_string(runs[0].first);
  } else {
    out += "(";
    for (size_t i = 0; i < runs.size(); ++i)
      out += (i ? ", " : "") + std::to_string(runs[i].first) +
             (runs[i].second > 1 ? "x" + std::to_string(runs[i].second) : "");
    out += ")";
  }
  int rec = 0;
  for (const Stage &st : s.stages) rec += st.recompute;
  out += ", M=" + std::to_string(s.microbatches) + ", " + scheduleName(s.schedule);
  if (rec) out += ", recompute " + std::to_string(rec) + "/" + std::to_string(s.numStages());
  return out;
}

bool runModel(const Model &m, int max_blocks) {
  bool ok = true;
  const Problem &units = m.units;
  std::printf("\n### %s\n\n", m.title.c_str());
  std::printf("%d units (embeddings/stem, layers, head); %.2f B parameters\n\n", units.numBlocks(),
              paramBytes(units) / m.bytes_per_param / 1e9);
  std::printf("| strategy | blocks | planning s | predicted step s | simulated step s | vs auto | peak memory | plan |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");

  struct Row {
    std::string name;
    Strategy strategy;
    int max_blocks;   // 0: every unit is a block
    bool auto_shape;  // pin the stage count and replicas to the finest auto plan's
  };
  const std::vector<Row> rows = {{"auto", Strategy::Auto, max_blocks, false},
                                 {"auto", Strategy::Auto, 0, false},
                                 {"uniform", Strategy::Uniform, 0, false},
                                 {"parameters", Strategy::Parameters, 0, false},
                                 {"time", Strategy::Time, 0, false},
                                 {"uniform, auto's shape", Strategy::Uniform, 0, true},
                                 {"parameters, auto's shape", Strategy::Parameters, 0, true},
                                 {"time, auto's shape", Strategy::Time, 0, true}};
  double auto_step = 0; // the finest auto's, which every baseline is compared with
  Solution auto_plan;
  std::string stats;
  for (const Row &row : rows) {
    const auto start = std::chrono::steady_clock::now();
    Problem p = units;
    if (row.auto_shape) {
      if (auto_plan.stages.empty()) continue;
      p.constraints.replicas.clear();
      for (const Stage &st : auto_plan.stages) p.constraints.replicas.push_back(st.replicas);
      if (p.constraints.replicas.size() == 1) p.constraints.stages = 1;
    }
    if (row.max_blocks > 0 && row.max_blocks < units.numBlocks()) {
      CoarsenOptions copts;
      copts.max_blocks = row.max_blocks;
      copts.samples = std::max<double>(1, static_cast<double>(units.batch_size) / units.devices.count);
      auto coarse = coarsen(units, copts);
      if (!coarse) {
        std::printf("coarsen failed: %s\n", coarse.error().message.c_str());
        return false;
      }
      p = coarse->problem;
    }
    auto r = solve(p, row.strategy);
    const double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!r) {
      std::printf("| %s | %d | %.3f | infeasible | - | - | - | %s |\n", row.name.c_str(), p.numBlocks(), plan_s,
                  r.error().message.c_str());
      if (row.strategy == Strategy::Auto) ok = false;
      continue;
    }
    const Evaluation ev = evaluate(p, r->solution);
    auto sim = simulate(p, r->solution);
    if (!ev.feasible() || std::fabs(ev.step_time_s - r->step_time_s) > 1e-9 * r->step_time_s) {
      std::printf("%s's plan evaluates to %.9g s, not the claimed %.9g s\n", row.name.c_str(), ev.step_time_s,
                  r->step_time_s);
      ok = false;
    }
    if (row.strategy == Strategy::Auto && row.max_blocks == 0) auto_step = r->step_time_s, auto_plan = r->solution;
    char ratio[32] = "-";
    if (row.strategy != Strategy::Auto) {
      std::snprintf(ratio, sizeof ratio, "%.2f", r->step_time_s / auto_step);
      if (r->step_time_s < auto_step * (1 - 1e-9)) {
        std::printf("%s beats auto\n", row.name.c_str());
        ok = false;
      }
    }
    std::printf("| %s | %d | %.3f | %.4f | %.4f | %s | %.1f GiB | %s |\n", row.name.c_str(), p.numBlocks(), plan_s,
                r->step_time_s, sim ? sim->step_time_s : NAN, ratio, ev.peak_memory_bytes / GiB,
                shape(r->solution).c_str());
    if (row.strategy == Strategy::Auto) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "auto on %d blocks: %d micro-batch counts (%d skipped by bound), %lld DP passes, %lld states, "
                    "%lld transitions, %lld front points; %.2f s of %.2f s in bound passes\n",
                    p.numBlocks(), r->stats.microbatch_counts, r->stats.microbatch_counts_pruned,
                    static_cast<long long>(r->stats.allreduce_thresholds), static_cast<long long>(r->stats.states),
                    static_cast<long long>(r->stats.transitions), static_cast<long long>(r->stats.points),
                    r->stats.bound_seconds, r->stats.seconds);
      stats += line;
    }
  }
  std::printf("\n%s", stats.c_str());
  return ok;
}

} // namespace

int main(int argc, char **argv) {
  bool quick = false;
  std::string only;
  int max_blocks = 32;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--blocks") && i + 1 < argc) {
      max_blocks = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: partition_bench [--quick] [--model bert4.9b|bert100b|resnet|mlp] [--blocks K]\n");
      return 2;
    }
  }
  bool ok = true, any = false;
  for (const Model &m : models()) {
    if ((!only.empty() && m.key != only) || (quick && !m.quick)) continue;
    any = true;
    ok = runModel(m, max_blocks) && ok;
  }
  if (!any) {
    std::fprintf(stderr, "partition_bench: no model named '%s'\n", only.c_str());
    return 2;
  }
  if (!ok) std::fprintf(stderr, "partition_bench: FAILED (see above)\n");
  return ok ? 0 : 1;
}
