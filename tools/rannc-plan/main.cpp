// rannc-plan: the offline partition-planning compiler. Declares each verb's
// flags (CLI11 subcommands; no verb plans), fills the planner's option
// structs, and calls one library function per verb.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include "executor/profile/profiler.h"
#include "planner/cluster/cluster.h"
#include "planner/driver/options.h"
#include "planner/driver/planner.h"
#include "planner/driver/tooling.h"
#include "executor/frontend/common.h"
#include "executor/frontend/torch_import.h"
#include "executor/train/version.h"
#include "planner/support/trace.h"
#include "tools/cli_errors.h"
#include "tools/rannc-plan/view_verbs.h"

namespace {

/// The LibTorch profiler as the driver's measured cost source, with this
/// tool's thread count, optimizer and repetitions.
rannc::planner::MeasureFn measurer(int threads, rannc::cost::Optimizer optimizer, int repetitions,
                                   rannc::cost::Precision precision) {
  return [=](const rannc::ir::Graph &g, const std::vector<rannc::cost::Unit> &units, const std::vector<int64_t> &sizes,
             rannc::cluster::DeviceKind device) -> rannc::Expected<rannc::cost::CostTable> {
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
/// the graph for models whose weights take at most 2 GiB (a few seconds);
/// `fuse`: an ONNX graph's decomposed kernels fused (Note [pattern fusion]).
rannc::planner::FrontEnds libtorchFrontEnds(bool fuse) {
  return {rannc::import::torchImporters(),
          [](rannc::ir::Graph &g, const std::string &model) {
            return rannc::import::completeShapesByRunning(g, model, int64_t(2) << 30);
          },
          fuse};
}

constexpr const char *kNoFuseHelp =
    "keep an ONNX graph's decomposed attention, norms and activations as the exporter wrote them (for comparison)";

int fail(const std::string &message) {
  std::cerr << "rannc-plan: error: " << rannc::withoutTrace(message) << "\n";
  return rannc::cli::kFailed;
}

/// A flag's value refused after parsing (Note [exit codes]).
int usage(const std::string &message) {
  std::cerr << "rannc-plan: error: " << message << "\n";
  return rannc::cli::kUsage;
}

int finish(const rannc::Status &st) { return st.ok() ? 0 : fail(st.message()); }

constexpr const char *kDataHelp =
    "a TorchScript archive's inputs (dtype, per-sample shape) from DIR/<input>.npy, the training data; "
    "needed when the archive does not describe them";

/// A verb: its subcommand, and what runs when it was given.
struct Verb {
  CLI::App *cmd;
  std::function<int()> run;
};

/// rannc-plan MODEL ... (no verb): declared on the tool itself; MODEL and -o
/// are required only when `planning` (CLI11 checks the tool's required flags
/// under a verb too).
Verb addPlan(CLI::App &app, bool planning) {
  auto o = std::make_shared<rannc::planner::PlanOptions>();
  auto flags = std::make_shared<rannc::planner::PlanFlags>();
  app.add_option("model", o->model,
                 "model file (.onnx, TorchScript .pt, torch.export .pt2) whose output is the training loss")
      ->required(planning);
  app.add_option("--data", o->data_dir, kDataHelp);
  app.add_option("-o,--output", o->output, "plan file to write (.pb, .pbtxt or .json)")->required(planning);
  auto *gpus = app.add_option("--gpus", o->gpus, "number of devices")->capture_default_str();
  auto *type = app.add_option("--device-type", o->device_type,
                              "device preset: cpu, v100-16g, v100-32g, a100-40g, a100-80g, h100-80g")
                   ->capture_default_str();
  app.add_option("--cluster", o->cluster_file, "cluster description (YAML, docs/cluster.md)");
  app.add_option("--device-memory", flags->device_memory,
                 "override the device memory of the preset or cluster file, e.g. 2GiB");
  app.add_option("--batch-size", o->batch_size, "global batch size (samples per step)")->capture_default_str();
  app.add_option("--microbatches", o->microbatches,
                 "micro-batches per step, a divisor of the batch size (default: the partitioner chooses)");
  app.add_option("--optimizer", flags->optimizer, "optimizer the memory estimate assumes: sgd, momentum, adam, adamw")
      ->check(CLI::IsMember(rannc::cost::optimizerNames()))
      ->capture_default_str();
  app.add_option("--stages", o->stages, "number of pipeline stages (default: the partitioner chooses); with "
                 "--virtual-stages, of pipeline ranks");
  app.add_option("--virtual-stages", o->virtual_stages,
                 "chunks (stages) per pipeline rank under --schedule interleaved-1f1b (Megatron-LM's v)")
      ->capture_default_str();
  app.add_option("--replicas", o->replicas,
                 "data-parallel replicas: one count for every stage, or one per stage, e.g. 2,1,1 "
                 "(default: the partitioner chooses)")
      ->delimiter(',');
  app.add_option("--tensor-parallel,--tp", flags->tensor_parallel,
                 "tensor-parallel degree, splitting each stage's layers over devices of one node: auto (the degrees "
                 "the model allows, chosen per stage), one degree for every stage, or one per stage, e.g. 8,8,4")
      ->capture_default_str();
  app.add_flag("--power-of-two-replicas", o->power_of_two_replicas,
               "only search replica counts that are powers of two");
  app.add_option("--recompute", flags->recompute,
                 "activation recomputation per stage: auto (where activations would not fit), on (every stage), off")
      ->check(CLI::IsMember(rannc::planner::recomputeNames()))
      ->capture_default_str();
  app.add_option("--zero", flags->zero,
                 "optimizer state sharded over a stage's replicas (ZeRO-1): auto (where memory needs it), 1 (every "
                 "replicated stage), 0 (never)")
      ->check(CLI::IsMember(rannc::planner::zeroNames()))
      ->capture_default_str();
  app.add_option("--batchnorm", flags->batchnorm,
                 "BatchNorm's batch statistics: local (each micro-batch and replica its own samples) or exact (as on "
                 "one device: one micro-batch, statistics synchronised over a stage's replicas)")
      ->check(CLI::IsMember(rannc::planner::batchNormNames()))
      ->capture_default_str();
  app.add_option("--precision", flags->precision,
                 "compute precision: fp32, or bf16/fp16 under LibTorch's autocast with fp32 weights, gradients and "
                 "optimizer state")
      ->check(CLI::IsMember(rannc::cost::precisionNames()))
      ->capture_default_str();
  app.add_option("--schedule", flags->schedule, "pipeline schedule: auto (the default: the partitioner weighs every one), " + rannc::pipeline::scheduleChoices())
      ->check(CLI::IsMember(rannc::planner::scheduleNames()));
  app.add_option("--strategy", o->strategy,
                 "auto: the memory-aware DP; uniform: equal op counts; parameters: balance parameter bytes "
                 "(DeepSpeed); time: balance time (torchgpipe)")
      ->check(CLI::IsMember({"auto", "uniform", "parameters", "time"}))
      ->capture_default_str();
  app.add_option("--memory-margin", o->memory_margin, "fraction of each device's memory to keep free")
      ->check(CLI::Range(0.0, 0.95))
      ->capture_default_str();
  app.add_option("--profile", o->profile,
                 "op costs: measure (on this machine), analytic (roofline), or a file from rannc-plan profile; "
                 "default: measure for --device-type cpu, else analytic");
  app.add_option("--threads", o->threads, "intra-op threads per rank that measured costs assume")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  o->progress_interval_s = 2; // Note [progress lines]
  auto *every = app.add_option("--progress-every", o->progress_interval_s,
                               "seconds: while planning, say what it is doing at least this often")
                    ->capture_default_str()
                    ->check(CLI::PositiveNumber);
  app.add_flag_callback("--quiet", [o] { o->progress_interval_s = 0; }, "no progress lines while planning")
      ->excludes(every);
  auto no_fuse = std::make_shared<bool>(false);
  app.add_flag("--no-fuse", *no_fuse, kNoFuseHelp);
  return {&app, [=] {
            flags->devices_given = gpus->count() || type->count();
            if (auto st = rannc::planner::finishPlanOptions(*flags, *o); !st) return usage(st.message());
            o->measure = measurer(o->threads, o->optimizer, 3, o->precision);
            o->front_ends = libtorchFrontEnds(!*no_fuse);
            return finish(rannc::planner::runPlan(*o, std::cout, std::cerr));
          }};
}

Verb addShow(CLI::App &app) {
  auto *cmd = app.add_subcommand("show", "Prints a plan: a per-stage table, or with --json the machine summary");
  auto plan = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("plan", *plan, "plan file (.pb, .pbtxt or .json)")->required();
  cmd->add_flag("--json", *json, "print one JSON object instead of the table");
  return {cmd, [=] { return finish(rannc::planner::runShow(*plan, *json, std::cout)); }};
}

Verb addProfile(CLI::App &app) {
  auto *cmd = app.add_subcommand("profile",
                                 "Measures the forward/backward time and memory of every unit of MODEL on this machine "
                                 "and writes a profile that `rannc-plan MODEL --profile PROFILE` reuses anywhere");
  auto o = std::make_shared<rannc::planner::ProfileCommandOptions>();
  auto flags = std::make_shared<rannc::planner::ProfileFlags>();
  auto repetitions = std::make_shared<int>(3);
  cmd->add_option("model", o->model, "model file (.onnx, TorchScript .pt, torch.export .pt2)")->required();
  cmd->add_option("--data", o->data_dir, kDataHelp);
  cmd->add_option("-o,--output", o->output, "profile file to write")->required();
  cmd->add_option("--device", flags->device,
                  "where to measure: cpu, or cuda (this machine's first visible GPU, timed with CUDA events)")
      ->check(CLI::IsMember(rannc::cluster::deviceKindNames()))
      ->capture_default_str();
  cmd->add_option("--device-type", o->device_type,
                  "the device plans made from this profile are for: a preset (h100-80g) or a cluster file's "
                  "device name; required with --device cuda, cpu otherwise");
  cmd->add_option("--batch-sizes", o->batch_sizes, "micro-batch sizes to measure at")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "intra-op threads (as each rannc-exec rank will use)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--optimizer", flags->optimizer, "optimizer whose step time to measure: sgd or adam")
      ->check(CLI::IsMember({"sgd", "adam"}))
      ->capture_default_str();
  cmd->add_option("--precision", flags->precision, "measure under autocast at bf16/fp16, for plans of that --precision")
      ->check(CLI::IsMember(rannc::cost::precisionNames()))
      ->capture_default_str();
  cmd->add_option("--repetitions", *repetitions, "timed runs per unit and size after one warm-up; the median is kept")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  auto no_fuse = std::make_shared<bool>(false);
  cmd->add_flag("--no-fuse", *no_fuse, kNoFuseHelp);
  return {cmd, [=] {
            if (auto st = rannc::planner::finishProfileOptions(*flags, *o); !st) return usage(st.message());
            o->front_ends = libtorchFrontEnds(!*no_fuse);
            auto measure = measurer(o->threads, o->optimizer, *repetitions, o->precision);
            return finish(rannc::planner::runProfile(*o, measure, std::cerr));
          }};
}

Verb addImport(CLI::App &app) {
  auto *cmd = app.add_subcommand("import", "Imports a model and prints its graph IR as text");
  auto model = std::make_shared<std::string>(), data_dir = std::make_shared<std::string>();
  auto tp = std::make_shared<int>(0);
  cmd->add_option("model", *model, "model file (.onnx, TorchScript .pt, torch.export .pt2)")->required();
  cmd->add_option("--data", *data_dir, kDataHelp);
  cmd->add_option("--tensor-parallel,--tp", *tp,
                  "also print the tensor parallelism found per op and the valid degrees up to N")
      ->check(CLI::PositiveNumber);
  auto no_fuse = std::make_shared<bool>(false);
  cmd->add_flag("--no-fuse", *no_fuse, kNoFuseHelp);
  return {cmd, [=] {
            return finish(rannc::planner::runImport(*model, *data_dir, libtorchFrontEnds(!*no_fuse), std::cout,
                                                    std::cerr, *tp));
          }};
}

/// The flags every re-estimating verb shares, as typed.
struct ReestimateFlags {
  std::string memory;
  double margin = -1; ///< negative: the plan's own
  std::string profile = "analytic";
};

/// finishReestimateOptions, and --profile measure's profiler (Note
/// [re-estimating a plan] in planner/driver/tooling.cpp).
rannc::Status finishReestimate(const ReestimateFlags &flags, rannc::planner::ReestimateOptions &o) {
  if (flags.profile == "measure")
    o.measure = [](const rannc::ir::Graph &g, const std::vector<rannc::cost::Unit> &units,
                   const std::vector<int64_t> &sizes, rannc::cluster::DeviceKind device,
                   rannc::cost::Optimizer optimizer, rannc::cost::Precision precision) {
      return measurer(1, optimizer, 3, precision)(g, units, sizes, device);
    };
  return rannc::planner::finishReestimateOptions(flags.memory, flags.margin, o);
}

/// Adds the options every re-estimating verb shares.
void addReestimateOptions(CLI::App &cmd, rannc::planner::ReestimateOptions &o, ReestimateFlags &flags) {
  cmd.add_option("--cluster", o.cluster_file,
                 "re-estimate for this cluster (YAML, docs/cluster.md) instead of the plan's own");
  cmd.add_option("--device-memory", flags.memory, "override the device memory, e.g. 2GiB");
  cmd.add_option("--memory-margin", flags.margin,
                 "fraction of each device's memory to keep free (default: the plan's own margin)")
      ->check(CLI::Range(0.0, 0.95));
  cmd.add_option("--profile", flags.profile,
                 "op costs to re-estimate with: analytic (roofline), or measure (the plan's own units, on this "
                 "machine, one thread)")
      ->check(CLI::IsMember({"analytic", "measure"}))
      ->capture_default_str();
}

Verb addConvert(CLI::App &app) {
  auto *cmd = app.add_subcommand("convert", "Converts a plan between encodings, chosen by extension: .pb (binary), "
                                            ".pbtxt (protobuf text, for hand edits) and .json");
  auto input = std::make_shared<std::string>(), output = std::make_shared<std::string>();
  cmd->add_option("plan", *input, "plan to read (.pb, .pbtxt or .json)")->required();
  cmd->add_option("-o,--output", *output, "plan to write (.pb, .pbtxt or .json)")->required();
  return {cmd, [=] { return finish(rannc::planner::runConvert(*input, *output, std::cerr)); }};
}

Verb addCheck(CLI::App &app) {
  auto *cmd = app.add_subcommand(
      "check", "Validates a (hand-edited) plan: every op in exactly one stage, stages in dependency order, ranks, "
               "micro-batches, memory re-estimated against capacity, format version and model hash. Lists every "
               "problem and exits 1 if there is one; on a valid plan prints the re-estimated times and memory");
  auto o = std::make_shared<rannc::planner::CheckOptions>();
  auto flags = std::make_shared<ReestimateFlags>();
  cmd->add_option("plan", o->plan, "plan file (.pb, .pbtxt or .json)")->required();
  cmd->add_option("--model", o->model, "model file to check the plan's SHA-256 against (default: the path it names)");
  cmd->add_flag("--allow-model-outside-plan", o->allow_model_outside_plan,
                "trust the plan's model.path though it leaves the plan's folder (docs/robustness.md)");
  addReestimateOptions(*cmd, o->reestimate, *flags);
  cmd->add_flag("--update", o->update, "write the plan with the re-estimated figures to -o");
  cmd->add_option("-o,--output", o->output, "where --update writes the plan (.pb, .pbtxt or .json)");
  return {cmd, [=] {
            auto st = finishReestimate(*flags, o->reestimate);
            return st ? finish(rannc::planner::runCheck(*o, std::cout, std::cerr)) : usage(st.message());
          }};
}

Verb addSimulate(CLI::App &app) {
  auto *cmd = app.add_subcommand("simulate",
                                 "Replays one training step of a plan event by event: predicted step time, a per-rank "
                                 "summary, and optionally a Chrome-trace / Perfetto timeline");
  auto o = std::make_shared<rannc::planner::SimulateCommandOptions>();
  auto flags = std::make_shared<ReestimateFlags>();
  cmd->add_option("plan", o->plan, "plan file (.pb, .pbtxt or .json)")->required();
  cmd->add_option("--trace", o->trace, "write the timeline as Chrome-trace JSON (chrome://tracing, ui.perfetto.dev)");
  cmd->add_flag("--overlap-allreduce", o->overlap_allreduce,
                "start each stage's all-reduce after its own last backward instead of after the whole pipeline");
  addReestimateOptions(*cmd, o->reestimate, *flags);
  return {cmd, [=] {
            auto st = finishReestimate(*flags, o->reestimate);
            return st ? finish(rannc::planner::runSimulate(*o, std::cout, std::cerr)) : usage(st.message());
          }};
}

Verb addDot(CLI::App &app) {
  auto *cmd = app.add_subcommand("dot", "Writes a plan as a graphviz graph: ops grouped by stage, cut edges labelled "
                                        "with the bytes they carry per micro-batch (render with dot -Tsvg)");
  auto o = std::make_shared<rannc::planner::DotCommandOptions>();
  cmd->add_option("plan", o->plan, "plan file (.pb, .pbtxt or .json)")->required();
  cmd->add_option("-o,--output", o->output, "DOT file to write (default: stdout)");
  cmd->add_option("--max-ops", o->max_ops, "draw one node per unit instead of per op above this many ops")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return {cmd, [=] { return finish(rannc::planner::runDot(*o, std::cout, std::cerr)); }};
}

Verb addDiff(CLI::App &app) {
  auto *cmd = app.add_subcommand("diff", "Shows what changed between two plans: op ranges, replicas, micro-batches, "
                                         "schedule and estimates (exit 0 unless a plan cannot be read)");
  auto a = std::make_shared<std::string>(), b = std::make_shared<std::string>();
  cmd->add_option("a", *a, "the old plan (.pb, .pbtxt or .json)")->required();
  cmd->add_option("b", *b, "the new plan")->required();
  return {cmd, [=] { return finish(rannc::planner::runDiff(*a, *b, std::cout)); }};
}

/// compare and report (view_verbs.h), as main's verbs.
Verb viewVerb(rannc::tools::StatusVerb v) {
  return {v.cmd, [run = v.run] { return finish(run()); }};
}

} // namespace

int main(int argc, char **argv) {
  CLI::App app{"Plans pipeline-parallel training of MODEL (.onnx) for a cluster and writes the plan.\n"
               "Other verbs: show, check, convert, simulate, compare, report, dot, diff, profile, import\n"
               "(rannc-plan VERB --help);\n"
               "rannc-plan --version prints the versions this build uses",
               "rannc-plan"};
  app.footer(rannc::cli::exitCodesHelp());
  app.add_flag_callback(
      "--version",
      [] {
        std::cout << rannc::train::versionReport();
        throw CLI::Success();
      },
      "print the versions this build uses");
  std::vector<Verb> verbs = {addShow(app),     addCheck(app), addConvert(app), addSimulate(app),
                             addDot(app),      addDiff(app),  addProfile(app), addImport(app),
                             viewVerb(rannc::tools::addCompare(app)), viewVerb(rannc::tools::addReport(app))};
  std::vector<std::string> verb_names; // for "did you mean" (the verbs are removed when planning)
  for (const Verb &v : verbs) verb_names.push_back(v.cmd->get_name());
  // Verbs are reserved words in first place only; anything else there is a
  // model to plan, and then no word is a verb (a model may be named "show").
  const std::string first = argc > 1 ? argv[1] : "";
  const bool planning =
      std::none_of(verbs.begin(), verbs.end(), [&](const Verb &v) { return v.cmd->get_name() == first; });
  if (planning) {
    for (const Verb &v : verbs) app.remove_subcommand(v.cmd);
    verbs.clear();
  }
  const Verb plan = addPlan(app, planning);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return rannc::cli::usageError(app, e, argc, argv, verb_names);
  }
  try {
    for (const Verb &v : verbs)
      if (v.cmd->parsed()) return v.run();
    return plan.run();
  } catch (const std::exception &e) {
    // One line: LibTorch's errors (a .pt model, profiling) carry a backtrace ("frame #") after it.
    return fail(rannc::firstLine(e.what()));
  }
}
