// rannc-exec: the runtime. Started by mpirun, one process per rank; parses
// flags, then hands over to rannc::train::train.
#include <CLI/CLI.hpp>

#include <iostream>

#include "executor/comm/comm.h"
#include "executor/train/trainer.h"

int main(int argc, char **argv) {
  CLI::App app{"Trains a model with a rannc plan: mpirun -np N rannc-exec PLAN --data DIR", "rannc-exec"};
  rannc::train::TrainOptions o;
  app.add_option("plan", o.plan, "plan file from rannc-plan (.pb, .pbtxt or .json)")->required();
  app.add_option("--model", o.model, "model file, if it is no longer where the plan says");
  auto *data = app.add_option("--data", o.data_dir, "folder with one <input name>.npy per graph input");
  app.add_flag("--synthetic", o.synthetic, "random data of the right shapes instead of --data")->excludes(data);
  app.add_option("--steps", o.steps, "training steps")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--optimizer", o.optimizer, "sgd or adam (PyTorch's defaults otherwise)")
      ->check(CLI::IsMember({"sgd", "adam"}))
      ->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--shuffle", o.shuffle, "on: a seeded permutation per epoch; off: samples in file order")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed for shuffling and synthetic data")->capture_default_str();
  app.add_option("--log", o.log, "JSONL file, one object per step (written by rank 0)");
  app.add_option("--timeout", o.timeout_s, "seconds without progress after which a rank stops the job (0: never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--on-nonfinite", o.on_nonfinite, "stop: end the run; skip: skip the step without updating")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu: run a plan made for GPUs on CPU ranks (default: the plan's device)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }

  auto comm = rannc::comm::createMpiCommunicator(&argc, &argv);
  try {
    rannc::Status st = rannc::train::train(o, *comm, std::cerr);
    if (!st.ok()) {
      if (!st.message().empty()) std::cerr << "rannc-exec: error: " << st.message() << "\n";
      return 1; // every rank returns here: the failure was agreed on
    }
  } catch (const std::exception &e) {
    // A failure on one rank only: stop the whole job now rather than let the
    // others wait forever for this rank's messages.
    std::cerr << "rannc-exec: rank " << comm->rank() << ": error: " << e.what() << std::endl;
    comm->abort(1);
  }
  return 0;
}
