// The reference for rannc-exec's interpreter overhead: the same model as a
// TorchScript module (traced by models/make_model.py --torchscript), trained
// with LibTorch directly — forward, backward, optimizer step — with the same
// data, batch, thread count and optimizer. Prints the median step time.
//
//   torchscript_step MODEL.pt DATA_DIR --batch-size B --steps K [--threads T] [--optimizer sgd|adam]
#include <torch/script.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>

#include "executor/data/npy.h"
#include "executor/runtime/ops.h"

int main(int argc, char **argv) {
  CLI::App app{"Trains a TorchScript module (whose forward returns the loss) with LibTorch and prints the median "
               "step time",
               "torchscript_step"};
  std::string model, data_dir, optimizer = "sgd";
  std::vector<std::string> inputs;
  int64_t batch = 8, steps = 10;
  int threads = 1;
  app.add_option("model", model, "TorchScript file")->required();
  app.add_option("data", data_dir, "folder with <input>.npy files")->required();
  app.add_option("--inputs", inputs, "graph input names, in forward's order")->required()->delimiter(',');
  app.add_option("--batch-size", batch)->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--optimizer", optimizer)->check(CLI::IsMember({"sgd", "adam"}));
  CLI11_PARSE(app, argc, argv);

  torch::set_num_threads(threads);
  torch::jit::Module m = torch::jit::load(model);
  m.train();
  std::vector<torch::Tensor> params;
  for (const auto &p : m.parameters()) params.push_back(p);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (optimizer == "adam") opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
  else opt = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.01));

  std::vector<rannc::data::NpyArray> arrays;
  for (const auto &name : inputs) {
    auto a = rannc::data::NpyArray::open(data_dir + "/" + name + ".npy");
    if (!a) {
      std::cerr << "torchscript_step: " << a.error().message << "\n";
      return 1;
    }
    arrays.push_back(std::move(*a));
  }
  std::vector<double> times;
  for (int64_t step = 0; step < steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<torch::jit::IValue> args;
    for (const auto &a : arrays) {
      std::vector<int64_t> dims = a.shape();
      dims[0] = batch;
      torch::Tensor t = torch::empty(dims, torch::TensorOptions().dtype(rannc::runtime::toScalarType(a.dtype())));
      for (int64_t i = 0; i < batch; ++i)
        (void)a.readSample((step * batch + i) % a.samples(), static_cast<char *>(t.data_ptr()) + i * a.sampleBytes());
      args.emplace_back(t);
    }
    torch::Tensor loss = m.forward(args).toTensor();
    opt->zero_grad();
    loss.backward();
    opt->step();
    (void)loss.item<double>();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<double> tail(times.begin() + std::min<int64_t>(2, steps - 1), times.end());
  std::sort(tail.begin(), tail.end());
  std::cout << tail[tail.size() / 2] << "\n";
  return 0;
}
