// rannc-exec: the runtime. Started by mpirun, one process per rank; parses
// flags, then hands over to rannc::train::train.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "executor/checkpoint/onnx_export.h"
#include "executor/comm/comm.h"
#include "executor/train/checkpoint.h"
#include "executor/train/options.h"
#include "executor/train/trainer.h"
#include "executor/train/version.h"
#include "executor/train/watchdog.h"
#include "planner/support/trace.h"
#include "tools/cli_errors.h"

namespace {

/// `rannc-exec export`: a checkpoint's weights into the model; no mpirun.
std::function<int()> addExport(CLI::App &app) {
  auto *cmd = app.add_subcommand("export", "Writes the trained weights of a checkpoint: an ONNX model with them, or "
                                           "for a TorchScript or torch.export model a state dict (torch.load)");
  auto o = std::make_shared<rannc::checkpoint::ExportOptions>();
  cmd->add_option("checkpoint", o->checkpoint,
                  "a checkpoint (D/step-<N>), or a --checkpoint-dir D (its newest complete checkpoint)")
      ->required();
  cmd->add_option("--model", o->model, "the model it was trained from (default: the path the checkpoint records)");
  cmd->add_option("-o,--output", o->output, "the file to write (atomically): OUT.onnx, or OUT.pt for a LibTorch model")
      ->required();
  cmd->add_option("--drop-keys", o->drop_keys,
                  "NAME,...: keys to leave out of a state dict (a TorchScript model's buffers that the module "
                  "registers with persistent=False: the archive does not record it)")
      ->delimiter(',');
  o->write_state = rannc::train::writeStateDict;
  return [o] {
    rannc::Status st;
    try {
      st = rannc::checkpoint::exportCheckpoint(*o, std::cerr);
    } catch (const std::exception &e) {
      st = rannc::Error{rannc::firstLine(e.what())};
    }
    if (st.ok()) return 0;
    std::cerr << "rannc-exec export: error: " << rannc::withoutTrace(st.message()) << "\n";
    return int(rannc::cli::kFailed);
  };
}

/// rannc-exec PLAN ... (no verb): training, declared on the tool itself.
std::function<int()> addTrain(CLI::App &app, int &argc, char **&argv) {
  auto o_ptr = std::make_shared<rannc::train::TrainOptions>();
  auto flags_ptr = std::make_shared<rannc::train::ExecFlags>(); // what finishTrainOptions turns into `o`
  rannc::train::TrainOptions &o = *o_ptr;
  rannc::train::ExecFlags &flags = *flags_ptr;
  app.add_option("plan", o.plan, "plan file from rannc-plan (.pb, .pbtxt or .json)")->required();
  app.add_option("--model", o.model, "model file, if it is no longer where the plan says");
  app.add_flag("--allow-model-outside-plan", o.allow_model_outside_plan,
               "trust the plan's model.path though it leaves the plan's folder (docs/robustness.md)");
  auto *data = app.add_option("--data", o.data_dir, "folder with one <input name>.npy per graph input");
  app.add_flag("--synthetic", o.synthetic, "random data of the right shapes instead of --data")->excludes(data);
  auto *steps = app.add_option("--steps", o.steps, "optimizer steps (each takes --accumulation-steps batches)")
                    ->capture_default_str()
                    ->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", o.epochs, "passes over --data instead of --steps: ceil(E*samples/(B*K)) steps")
      ->check(CLI::PositiveNumber)
      ->excludes(steps);
  // Optimization (docs/training.md); what is not given is PyTorch's default.
  app.add_option("--optimizer", flags.optimizer,
                 "sgd, adam or adamw (torch.optim's); default: the one the plan's memory estimate assumed "
                 "(rannc-plan --optimizer; its momentum is sgd)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--lr", o.lr, "learning rate (the peak, with a schedule)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  auto set = [](std::optional<double> &field) { return [&field](const double &v) { field = v; }; };
  app.add_option_function<double>("--momentum", set(o.momentum), "sgd: momentum factor (default 0)");
  app.add_option_function<double>("--dampening", set(o.dampening), "sgd: dampening for momentum (default 0)");
  app.add_flag("--nesterov", o.nesterov, "sgd: Nesterov momentum (needs --momentum > 0)");
  app.add_option_function<double>("--weight-decay", set(o.weight_decay),
                                  "sgd, adam: L2 penalty in the gradient; adamw: decoupled decay "
                                  "(defaults 0, 0, 0.01)");
  app.add_option_function<std::string>(
      "--betas", [&flags](const std::string &v) { flags.betas = v; }, "adam, adamw: B1,B2 (default 0.9,0.999)");
  app.add_option_function<double>("--eps", set(o.eps), "adam, adamw: term added to the denominator (default 1e-8)");
  app.add_option("--lr-schedule", o.lr_schedule, "constant, cosine or linear decay to --min-lr at the last step")
      ->check(CLI::IsMember({"constant", "cosine", "linear"}))
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "steps of linear warm-up from lr 0 (any schedule)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option_function<double>("--min-lr", set(o.min_lr),
                                  "cosine, linear: the learning rate decay ends at (default 0)");
  app.add_option("--clip-grad-norm", o.clip_grad_norm,
                 "clip the gradient norm over all stages to MAX, as torch.nn.utils.clip_grad_norm_ (0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--accumulation-steps", o.accumulation_steps,
                 "K: global batches whose gradients (mean) one optimizer step applies")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--bucket-size", flags.bucket_mib,
                 "MiB per gradient all-reduce bucket; buckets start while backward still runs (as PyTorch DDP's)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--shuffle", flags.shuffle, "on: a seeded permutation per epoch; off: samples in file order")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_flag("--wrap-data", o.wrap_data,
               "let one step read samples twice when --data holds fewer than a step reads (default: an error)");
  app.add_option("--seed", o.seed, "seed for shuffling and synthetic data")->capture_default_str();
  app.add_option("--log", o.log, "JSONL file, one object per step (written by rank 0)");
  app.add_option("--trace", o.trace,
                 "FILE.json: every rank's actions, measured, as a Chrome trace (ui.perfetto.dev; written by rank 0); "
                 "rannc-plan compare PLAN FILE.json holds it beside the prediction");
  app.add_option("--timeout", o.timeout_s, "seconds without progress after which a rank stops the job (0: never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--on-nonfinite", o.on_nonfinite, "stop: end the run; skip: skip the step without updating")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  app.add_option("--loss-scale", o.loss_scale,
                 "fp16 plans: the initial dynamic loss scale (torch.amp.GradScaler's init_scale; default 65536)")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", flags.device,
                 "where each rank computes: cpu, or cuda (one GPU per rank, chosen from the launcher's local rank; "
                 "docs/gpu.md); default: the plan's device")
      ->check(CLI::IsMember(rannc::cluster::deviceKindNames()));
  app.add_option("--gpu-transport", flags.gpu_transport,
                 "on GPUs, how tensors move between ranks: nccl, or host (staged through host memory over MPI, "
                 "as when ranks share a GPU; to tell an NCCL problem from others), or rehearsal (on CPU: the GPU "
                 "path's logic against a stand-in for NCCL that keeps its rules; docs/gpu.md)")
      ->check(CLI::IsMember({"nccl", "host", "rehearsal"}))
      ->capture_default_str();
  app.add_option_function<uint64_t>(
      "--init-weights", [&o](const uint64_t &seed) { o.init_weights = seed; },
      "SEED: give the parameters and buffers the model file has no contents for "
      "(a weightless model) deterministic initial values (docs/front-ends.md)");
  // Checkpoints and export (docs/training.md "Checkpoints, resume and export").
  auto *ckpt_dir = app.add_option("--checkpoint-dir", o.checkpoint_dir,
                                  "D: write checkpoints to D/step-<N>/ after the last step (and every "
                                  "--checkpoint-every steps); a shared file system for several machines");
  app.add_option("--checkpoint-every", o.checkpoint_every, "K: also a checkpoint every K steps")
      ->check(CLI::PositiveNumber)
      ->needs(ckpt_dir);
  app.add_option("--keep", o.keep, "N: delete all but the newest N checkpoints in --checkpoint-dir")
      ->check(CLI::PositiveNumber)
      ->needs(ckpt_dir);
  app.add_flag("--resume", o.resume,
               "continue from the newest complete checkpoint in --checkpoint-dir, with any plan of the same model; "
               "the log is kept up to that step and appended")
      ->needs(ckpt_dir);
  app.add_flag("--resume-other-data", o.resume_other_data,
               "with --resume: continue though the --data files differ (size or SHA-256) from those the checkpoint "
               "was trained on");
  app.add_option("--export-onnx", o.export_onnx, "OUT.onnx: at the end, write the model with the trained weights");
  auto *export_state = app.add_option("--export-state", o.export_state,
                 "OUT.pt: at the end, write the trained parameters and buffers as a state dict PyTorch's torch.load "
                 "reads (any model; TorchScript models' export)");
  app.add_option("--drop-keys", o.drop_keys,
                 "NAME,...: keys to leave out of --export-state's state dict (a TorchScript model's buffers that the "
                 "module registers with persistent=False: the archive does not record it)")
      ->delimiter(',')
      ->needs(export_state);
  return [o_ptr, flags_ptr, &app, &argc, &argv] {
    rannc::train::TrainOptions &o = *o_ptr;
    if (const char *r = std::getenv("RANNC_REHEARSAL")) flags_ptr->rehearsal = r; // test hooks (docs/gpu.md)
    // A usage error, as those CLI11 finds (Note [exit codes]).
    if (rannc::Status st = rannc::train::finishTrainOptions(*flags_ptr, o); !st)
      return rannc::cli::usageError(app, st.message());
    auto comm = rannc::comm::createMpiCommunicator(&argc, &argv);
    rannc::train::installStopHandlers(); // Note [graceful stop]
    try {
      rannc::Status st = rannc::train::train(o, *comm, std::cerr);
      if (!st.ok()) {
        if (!st.message().empty()) std::cerr << "rannc-exec: error: " << rannc::withoutTrace(st.message()) << "\n";
        return int(rannc::cli::kFailed); // every rank returns here: the failure was agreed on
      }
    } catch (const std::exception &e) {
      // A failure on one rank only: stop the whole job now rather than let the
      // others wait forever for this rank's messages.
      // One line: LibTorch's errors carry a C++ backtrace ("frame #") after it.
      std::cerr << "rannc-exec: rank " << comm->rank() << ": error: " << rannc::firstLine(e.what()) << std::endl;
      comm->abort(rannc::cli::kFailed);
    }
    return 0;
  };
}

} // namespace

int main(int argc, char **argv) {
  CLI::App app{"Trains a model with a rannc plan: mpirun -np N rannc-exec PLAN --data DIR\n"
               "Other verbs: export (rannc-exec export --help); rannc-exec --version prints the versions this "
               "build uses",
               "rannc-exec"};
  app.footer(rannc::cli::exitCodesHelp());
  app.add_flag_callback(
      "--version",
      [] {
        std::cout << rannc::train::versionReport();
        throw CLI::Success();
      },
      "print the versions this build uses");
  // Verbs are reserved words in first place only; anything else there is a plan.
  const bool exporting = argc > 1 && std::string(argv[1]) == "export";
  const std::function<int()> run = exporting ? addExport(app) : addTrain(app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return rannc::cli::usageError(app, e, argc, argv, {"export"});
  }
  return run();
}
