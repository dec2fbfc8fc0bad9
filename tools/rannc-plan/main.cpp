// rannc-plan: the offline partition-planning compiler. Parses flags into the
// planner's option structs and calls one library function per verb.
#include <CLI/CLI.hpp>

#include <iostream>

#include "executor/profile/profiler.h"
#include "planner/cluster/cluster.h"
#include "planner/driver/planner.h"
#include "planner/driver/tooling.h"
#include "executor/frontend/common.h"
#include "executor/frontend/torch_import.h"
#include "executor/train/version.h"

namespace {

/// The LibTorch profiler as the driver's measured cost source, with this
/// tool's thread count, optimizer and repetitions.
rannc::planner::MeasureFn measurer(int threads, const std::string &optimizer, int repetitions = 3,
                                   const std::string &precision = "fp32") {
  return [=](const rannc::ir::Graph &g, const std::vector<rannc::cost::Unit> &units, const std::vector<int64_t> &sizes,
             const std::string &device) -> rannc::Expected<rannc::cost::CostTable> {
    rannc::profile::ProfileOptions po;
    po.batch_sizes = sizes;
    po.device = device; // cuda: device 0 of what CUDA_VISIBLE_DEVICES shows
    po.threads = threads;
    po.optimizer = optimizer;
    po.repetitions = repetitions;
    po.precision = precision;
    return rannc::profile::measureUnits(g, units, po, std::cerr);
  };
}

/// TorchScript and torch.export import, and ONNX shapes completed by running
/// the graph for models whose weights take at most 2 GiB (a few seconds).
rannc::planner::FrontEnds libtorchFrontEnds() {
  return {rannc::import::torchImporters(), [](rannc::ir::Graph &g, const std::string &model) {
            return rannc::import::completeShapesByRunning(g, model, int64_t(2) << 30);
          }};
}

int fail(const std::string &message) {
  std::cerr << "rannc-plan: error: " << message << "\n";
  return 1;
}

constexpr const char *kDataHelp =
    "a TorchScript archive's inputs (dtype, per-sample shape) from DIR/<input>.npy, the training data; "
    "needed when the archive does not describe them";

int finish(const rannc::Status &st) { return st.ok() ? 0 : fail(st.message()); }

int planCommand(int argc, char **argv) {
  CLI::App app{"Plans pipeline-parallel training of MODEL (.onnx) for a cluster and writes the plan.\n"
               "Other verbs: show, check, convert, simulate, dot, diff, profile, import (rannc-plan VERB --help);\n"
               "rannc-plan --version prints the versions this build uses",
               "rannc-plan"};
  rannc::planner::PlanOptions o;
  std::string memory;
  app.add_option("model", o.model, "model file (.onnx, TorchScript .pt, torch.export .pt2) whose output is the training loss")
      ->required();
  app.add_option("--data", o.data_dir, kDataHelp);
  app.add_option("-o,--output", o.output, "plan file to write (.pb, .pbtxt or .json)")->required();
  auto *gpus = app.add_option("--gpus", o.gpus, "number of devices")->capture_default_str();
  auto *type = app.add_option("--device-type", o.device_type,
                              "device preset: cpu, v100-16g, v100-32g, a100-40g, a100-80g, h100-80g")
                   ->capture_default_str();
  auto *cluster = app.add_option("--cluster", o.cluster_file, "cluster description (YAML, docs/cluster.md)");
  app.add_option("--device-memory", memory, "override the device memory of the preset or cluster file, e.g. 2GiB");
  app.add_option("--batch-size", o.batch_size, "global batch size (samples per step)")->capture_default_str();
  app.add_option("--microbatches", o.microbatches,
                 "micro-batches per step, a divisor of the batch size (default: the partitioner chooses)");
  app.add_option("--optimizer", o.optimizer, "optimizer the memory estimate assumes: sgd, momentum, adam, adamw")
      ->check(CLI::IsMember({"sgd", "momentum", "adam", "adamw"}))
      ->capture_default_str();
  app.add_option("--stages", o.stages, "number of pipeline stages (default: the partitioner chooses)");
  app.add_option("--replicas", o.replicas,
                 "data-parallel replicas: one count for every stage, or one per stage, e.g. 2,1,1 "
                 "(default: the partitioner chooses)")
      ->delimiter(',');
  app.add_flag("--power-of-two-replicas", o.power_of_two_replicas, "only search replica counts that are powers of two");
  app.add_option("--recompute", o.recompute,
                 "activation recomputation per stage: auto (where activations would not fit), on (every stage), off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--zero", o.zero,
                 "optimizer state sharded over a stage's replicas (ZeRO-1): auto (where memory needs it), 1 (every "
                 "replicated stage), 0 (never)")
      ->check(CLI::IsMember({"auto", "0", "1"}))
      ->capture_default_str();
  app.add_option("--precision", o.precision,
                 "compute precision: fp32, or bf16/fp16 under LibTorch's autocast with fp32 weights, gradients and "
                 "optimizer state")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--schedule", o.schedule, "pipeline schedule: gpipe or 1f1b (default: the partitioner chooses)")
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_option("--strategy", o.strategy,
                 "auto: the memory-aware DP; uniform: equal op counts; parameters: balance parameter bytes "
                 "(DeepSpeed); time: balance time (torchgpipe)")
      ->check(CLI::IsMember({"auto", "uniform", "parameters", "time"}))
      ->capture_default_str();
  app.add_option("--memory-margin", o.memory_margin, "fraction of each device's memory to keep free")
      ->check(CLI::Range(0.0, 0.95))
      ->capture_default_str();
  app.add_option("--profile", o.profile,
                 "op costs: measure (on this machine), analytic (roofline), or a file from rannc-plan profile; "
                 "default: measure for --device-type cpu, else analytic");
  app.add_option("--threads", o.threads, "intra-op threads per rank that measured costs assume")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  if (cluster->count() && (gpus->count() || type->count()))
    return fail("--cluster describes the devices; do not combine it with --gpus or --device-type");
  o.measure = measurer(o.threads, o.optimizer, 3, o.precision);
  o.front_ends = libtorchFrontEnds();
  if (!memory.empty()) {
    auto bytes = rannc::cluster::parseByteSize(memory);
    if (!bytes) return fail("--device-memory: " + bytes.error().message);
    o.device_memory = *bytes;
  }
  return finish(rannc::planner::runPlan(o, std::cout, std::cerr));
}

int showCommand(int argc, char **argv) {
  CLI::App app{"Prints a plan: a per-stage table, or with --json the machine summary", "rannc-plan show"};
  std::string plan;
  bool json = false;
  app.add_option("plan", plan, "plan file (.pb, .pbtxt or .json)")->required();
  app.add_flag("--json", json, "print one JSON object instead of the table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  return finish(rannc::planner::runShow(plan, json, std::cout));
}

int profileCommand(int argc, char **argv) {
  CLI::App app{"Measures the forward/backward time and memory of every unit of MODEL on this machine and writes a "
               "profile that `rannc-plan MODEL --profile PROFILE` reuses anywhere",
               "rannc-plan profile"};
  rannc::planner::ProfileCommandOptions o;
  std::string optimizer = "adam";
  app.add_option("model", o.model, "model file (.onnx, TorchScript .pt, torch.export .pt2)")->required();
  app.add_option("--data", o.data_dir, kDataHelp);
  app.add_option("-o,--output", o.output, "profile file to write")->required();
  app.add_option("--device", o.device,
                 "where to measure: cpu, or cuda (this machine's first visible GPU, timed with CUDA events)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--device-type", o.device_type,
                 "the device plans made from this profile are for: a preset (h100-80g) or a cluster file's "
                 "device name; required with --device cuda, cpu otherwise");
  app.add_option("--batch-sizes", o.batch_sizes, "micro-batch sizes to measure at")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--threads", o.threads, "intra-op threads (as each rannc-exec rank will use)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer, "optimizer whose step time to measure: sgd or adam")
      ->check(CLI::IsMember({"sgd", "adam"}))
      ->capture_default_str();
  app.add_option("--precision", o.precision, "measure under autocast at bf16/fp16, for plans of that --precision")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  int repetitions = 3;
  app.add_option("--repetitions", repetitions, "timed runs per unit and size after one warm-up; the median is kept")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  for (int64_t b : o.batch_sizes)
    if (b < 1) return fail("--batch-sizes: sizes must be at least 1");
  o.front_ends = libtorchFrontEnds();
  return finish(rannc::planner::runProfile(o, measurer(o.threads, optimizer, repetitions, o.precision), std::cerr));
}

int importCommand(int argc, char **argv) {
  CLI::App app{"Imports a model and prints its graph IR as text", "rannc-plan import"};
  std::string model, data_dir;
  app.add_option("model", model, "model file (.onnx, TorchScript .pt, torch.export .pt2)")->required();
  app.add_option("--data", data_dir, kDataHelp);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  return finish(rannc::planner::runImport(model, data_dir, libtorchFrontEnds(), std::cout, std::cerr));
}

/// Adds the options every re-estimating verb shares.
void addReestimateOptions(CLI::App &app, rannc::planner::ReestimateOptions &o, std::string &memory, double &margin) {
  app.add_option("--cluster", o.cluster_file,
                 "re-estimate for this cluster (YAML, docs/cluster.md) instead of the plan's own");
  app.add_option("--device-memory", memory, "override the device memory, e.g. 2GiB");
  app.add_option("--memory-margin", margin,
                 "fraction of each device's memory to keep free (default: the plan's own margin)")
      ->check(CLI::Range(0.0, 0.95));
}

/// Turns the shared options' strings into the typed struct; "" when fine.
std::string finishReestimateOptions(rannc::planner::ReestimateOptions &o, const std::string &memory, double margin) {
  if (!memory.empty()) {
    auto bytes = rannc::cluster::parseByteSize(memory);
    if (!bytes) return "--device-memory: " + bytes.error().message;
    o.device_memory = *bytes;
  }
  if (margin >= 0) o.memory_margin = margin;
  return "";
}

int convertCommand(int argc, char **argv) {
  CLI::App app{"Converts a plan between encodings, chosen by extension: .pb (binary), .pbtxt (protobuf text, "
               "for hand edits) and .json",
               "rannc-plan convert"};
  std::string input, output;
  app.add_option("plan", input, "plan to read (.pb, .pbtxt or .json)")->required();
  app.add_option("-o,--output", output, "plan to write (.pb, .pbtxt or .json)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  return finish(rannc::planner::runConvert(input, output, std::cerr));
}

int checkCommand(int argc, char **argv) {
  CLI::App app{"Validates a (hand-edited) plan: every op in exactly one stage, stages in dependency order, ranks, "
               "micro-batches, memory re-estimated against capacity, format version and model hash. Lists every "
               "problem and exits 1 if there is one; on a valid plan prints the re-estimated times and memory",
               "rannc-plan check"};
  rannc::planner::CheckOptions o;
  std::string memory;
  double margin = -1;
  app.add_option("plan", o.plan, "plan file (.pb, .pbtxt or .json)")->required();
  app.add_option("--model", o.model, "model file to check the plan's SHA-256 against (default: the path it names)");
  addReestimateOptions(app, o.reestimate, memory, margin);
  app.add_flag("--update", o.update, "write the plan with the re-estimated figures to -o");
  app.add_option("-o,--output", o.output, "where --update writes the plan (.pb, .pbtxt or .json)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  if (auto why = finishReestimateOptions(o.reestimate, memory, margin); !why.empty()) return fail(why);
  return finish(rannc::planner::runCheck(o, std::cout, std::cerr));
}

int simulateCommand(int argc, char **argv) {
  CLI::App app{"Replays one training step of a plan event by event: predicted step time, a per-rank summary, "
               "and optionally a Chrome-trace / Perfetto timeline",
               "rannc-plan simulate"};
  rannc::planner::SimulateCommandOptions o;
  std::string memory;
  double margin = -1;
  app.add_option("plan", o.plan, "plan file (.pb, .pbtxt or .json)")->required();
  app.add_option("--trace", o.trace, "write the timeline as Chrome-trace JSON (chrome://tracing, ui.perfetto.dev)");
  app.add_flag("--overlap-allreduce", o.overlap_allreduce,
               "start each stage's all-reduce after its own last backward instead of after the whole pipeline");
  addReestimateOptions(app, o.reestimate, memory, margin);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  if (auto why = finishReestimateOptions(o.reestimate, memory, margin); !why.empty()) return fail(why);
  return finish(rannc::planner::runSimulate(o, std::cout, std::cerr));
}

int dotCommand(int argc, char **argv) {
  CLI::App app{"Writes a plan as a graphviz graph: ops grouped by stage, cut edges labelled with the bytes they "
               "carry per micro-batch (render with dot -Tsvg)",
               "rannc-plan dot"};
  rannc::planner::DotCommandOptions o;
  app.add_option("plan", o.plan, "plan file (.pb, .pbtxt or .json)")->required();
  app.add_option("-o,--output", o.output, "DOT file to write (default: stdout)");
  app.add_option("--max-ops", o.max_ops, "draw one node per unit instead of per op above this many ops")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  return finish(rannc::planner::runDot(o, std::cout, std::cerr));
}

int diffCommand(int argc, char **argv) {
  CLI::App app{"Shows what changed between two plans: op ranges, replicas, micro-batches, schedule and estimates "
               "(exit 0 unless a plan cannot be read)",
               "rannc-plan diff"};
  std::string a, b;
  app.add_option("a", a, "the old plan (.pb, .pbtxt or .json)")->required();
  app.add_option("b", b, "the new plan")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  return finish(rannc::planner::runDiff(a, b, std::cout));
}

} // namespace

int main(int argc, char **argv) {
  // Verbs are reserved words; anything else in first place is a model to plan.
  std::string first = argc > 1 ? argv[1] : "";
  if (first == "--version") {
    std::cout << rannc::train::versionReport();
    return 0;
  }
  if (first == "show") return showCommand(argc - 1, argv + 1);
  if (first == "import") return importCommand(argc - 1, argv + 1);
  if (first == "profile") return profileCommand(argc - 1, argv + 1);
  if (first == "convert") return convertCommand(argc - 1, argv + 1);
  if (first == "check") return checkCommand(argc - 1, argv + 1);
  if (first == "simulate") return simulateCommand(argc - 1, argv + 1);
  if (first == "dot") return dotCommand(argc - 1, argv + 1);
  if (first == "diff") return diffCommand(argc - 1, argv + 1);
  return planCommand(argc, argv);
}
