// rannc-plan: the offline partition-planning compiler. Parses flags into the
// planner's option structs and calls one library function per verb.
#include <CLI/CLI.hpp>

#include <iostream>

#include "planner/cluster/cluster.h"
#include "planner/driver/planner.h"

namespace {

int fail(const std::string &message) {
  std::cerr << "rannc-plan: error: " << message << "\n";
  return 1;
}

int finish(const rannc::Status &st) { return st.ok() ? 0 : fail(st.message()); }

int planCommand(int argc, char **argv) {
  CLI::App app{"Plans pipeline-parallel training of MODEL (.onnx) for a cluster and writes the plan.\n"
               "Other verbs: show, import (rannc-plan VERB --help)",
               "rannc-plan"};
  rannc::planner::PlanOptions o;
  std::string memory;
  app.add_option("model", o.model, "model file (.onnx) whose graph output is the training loss")->required();
  app.add_option("-o,--output", o.output, "plan file to write (.pb, .pbtxt or .json)")->required();
  app.add_option("--gpus", o.gpus, "number of devices (one pipeline stage each)")->capture_default_str();
  app.add_option("--device-type", o.device_type, "device preset: cpu, v100-16g, v100-32g, a100-40g, a100-80g, h100-80g")
      ->capture_default_str();
  app.add_option("--device-memory", memory, "override the preset's memory per device, e.g. 2GiB");
  app.add_option("--batch-size", o.batch_size, "global batch size (samples per step)")->capture_default_str();
  app.add_option("--microbatches", o.microbatches, "micro-batches per step (must divide the batch size)")
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "optimizer the memory estimate assumes: sgd, momentum, adam, adamw")
      ->check(CLI::IsMember({"sgd", "momentum", "adam", "adamw"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
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

int importCommand(int argc, char **argv) {
  CLI::App app{"Imports a model and prints its graph IR as text", "rannc-plan import"};
  std::string model;
  app.add_option("model", model, "model file (.onnx)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  return finish(rannc::planner::runImport(model, std::cout));
}

} // namespace

int main(int argc, char **argv) {
  // Verbs are reserved words; anything else in first place is a model to plan.
  std::string first = argc > 1 ? argv[1] : "";
  if (first == "show") return showCommand(argc - 1, argv + 1);
  if (first == "import") return importCommand(argc - 1, argv + 1);
  return planCommand(argc, argv);
}
