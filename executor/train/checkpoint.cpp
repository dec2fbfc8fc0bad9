#include "executor/train/checkpoint.h"

#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "executor/checkpoint/checkpoint_dir.h"
#include "executor/checkpoint/onnx_export.h"
#include "executor/checkpoint/tensor_file.h"
#include "executor/runtime/collectives.h"
#include "executor/runtime/ops.h"
#include "executor/runtime/pt2_archive.h"
#include "executor/train/setup.h"
#include "executor/train/zero.h"
#include "planner/import/model_format.h"
#include "planner/plan/plan.h"
#include "planner/support/files.h"
#include "planner/support/sha256.h"

namespace rannc::train {
namespace fs = std::filesystem;
using checkpoint::Found;
using checkpoint::Manifest;

namespace {

// Tags of the checkpoint messages to rank 0; the pipeline's are 2*mb+kind.
constexpr int kFilesTag = 30001, kRngTag = 30002, kExportTag = 30003;

/// The start-up rule of the trainer: all ranks fail together, the first
/// failing rank's message is the one printed.
Status agree(comm::Communicator &comm, const Status &st) {
  double failed = st.ok() ? 0 : double(comm.size() - comm.rank());
  comm.allReduce(&failed, 1, comm::ReduceOp::Max);
  if (failed == 0) return Status::success();
  const int first = comm.size() - int(failed);
  return Error{comm.rank() == first ? st.message() : ""};
}

/// torch::optim's key of a parameter in Optimizer::state() (its TensorImpl).
void *stateKey(const torch::Tensor &p) { return p.unsafeGetTensorImpl(); }

/// The state of the generator random ops on `device` draw from (dropout).
std::string generatorState(const torch::Device &device) {
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  torch::Tensor s = gen.get_state();
  return std::string(static_cast<const char *>(s.data_ptr()), s.nbytes());
}

void setGeneratorState(const torch::Device &device, const std::string &bytes) {
  torch::Tensor s = torch::empty({int64_t(bytes.size())}, torch::kUInt8);
  std::memcpy(s.data_ptr(), bytes.data(), bytes.size());
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(s);
}

ir::Tensor bytesTensor(std::string blob) {
  ir::Tensor t;
  t.dtype = ir::DType::U8;
  t.dims = {int64_t(blob.size())};
  t.data = std::move(blob);
  return t;
}

std::vector<checkpoint::StageLayout> layoutOf(const proto::Plan &plan) {
  std::vector<checkpoint::StageLayout> out;
  for (const auto &s : plan.stages())
    out.push_back({s.op_begin(), s.op_end(), std::vector<int>(s.ranks().begin(), s.ranks().end())});
  return out;
}

std::string describe(const torch::Tensor &t) { return std::string(c10::toString(t.scalar_type())) + c10::str(t.sizes()); }

} // namespace

// torch::pickle_save would tag the dict with its TorchScript type (a global
// torch.load refuses since PyTorch 2.6 made weights_only=True the default),
// so the pickle is written untagged, as Python's torch.save writes it.
Status writeStateDict(const std::string &model, std::map<std::string, ir::Tensor> weights, const std::string &path) {
  if (import::isTorchExportPath(model)) {
    const std::set<std::string> none;
    auto archive = runtime::readPt2Archive(model, &none); // the program only
    if (!archive) return Error{archive.error().message};
    try {
      for (const std::string &name : runtime::nonPersistentBuffers(archive->program)) weights.erase(name);
    } catch (const std::exception &e) {
      return Error{model + ": malformed torch.export signature: " + firstLine(e.what())};
    }
  }
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto &[name, t] : weights) dict.insert(name, runtime::toTorch(t));
  std::vector<char> pickled, bytes;
  torch::jit::Pickler pickler([&](const char *buf, size_t n) { pickled.insert(pickled.end(), buf, buf + n); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void *data, size_t n) {
      bytes.insert(bytes.end(), static_cast<const char *>(data), static_cast<const char *>(data) + n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  }
  const std::string tmp = path + ".tmp";
  if (Status st = checkpoint::writeDurable(tmp, std::string(bytes.begin(), bytes.end())); !st) return st;
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Error{path + ": " + ec.message()};
  return Status::success();
}

// Note [interleaved checkpoints]
// A rank of an interleaved plan runs v stages (chunks, Note [interleaved
// 1F1B]), each with its own optimizer. Its checkpoint file holds all of them
// by name, exactly as v ranks of a plan without chunks would hold them
// together, so the format stays plan-independent: any plan, interleaved or
// not, loads it by name, and the manifest lists each rank's files once (the
// rank leads v stages). Each parameter's optimizer state is taken from, and
// put back into, the optimizer of its own chunk (optimizers_).
void Checkpointer::addStage(const runtime::StageRunner &runner, const ir::Graph &graph,
                            torch::optim::Optimizer &optimizer) {
  // runner.parameters() is in value-id order; so are the sorted ids.
  std::vector<ir::ValueId> ids = runner.program().parameters;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const std::vector<torch::Tensor> tensors = runner.parameters();
  if (ids.size() != tensors.size()) throw std::logic_error("checkpoint: the stage's parameters do not match its program");
  for (size_t i = 0; i < ids.size(); ++i) {
    params_.emplace_back(graph.values[ids[i]].name, tensors[i]);
    optimizers_.push_back(&optimizer);
  }
  for (const auto &[id, t] : runner.buffers()) buffers_.emplace_back(graph.values[id].name, t);
}

Checkpointer::Checkpointer(CheckpointContext ctx) : ctx_(std::move(ctx)) {
  addStage(ctx_.runner, ctx_.graph, ctx_.optimizer);
  model_path_ = trainModelPath(ctx_.opts, ctx_.plan).value(); // setup resolved it before
}


int Checkpointer::axisOf(const std::string &name) const {
  auto it = ctx_.axes.find(name);
  return it == ctx_.axes.end() ? -1 : it->second;
}

torch::Tensor Checkpointer::whole(const torch::Tensor &t, int axis) const {
  return axis < 0 || !ctx_.tp_group ? t : runtime::allGather(*ctx_.tp_group, t, axis);
}

Expected<int64_t> Checkpointer::start(std::ostream &log) {
  const TrainOptions &o = ctx_.opts;
  Status st;
  std::error_code ec;
  if ((o.checkpoint_every > 0 || o.keep > 0 || o.resume) && o.checkpoint_dir.empty()) {
    st = Error{"--checkpoint-every, --keep and --resume need --checkpoint-dir"};
  } else if (!o.export_onnx.empty() && (import::isTorchScriptPath(model_path_) || import::isTorchExportPath(model_path_))) {
    st = Error{"--export-onnx needs an ONNX model; " + model_path_ +
               " is a LibTorch archive: use --export-state OUT.pt (a state dict torch.load reads)"};
  } else if (ctx_.comm.rank() == 0) {
    for (const auto &[out, flag] : {std::pair{o.export_onnx, "--export-onnx"}, std::pair{o.export_state, "--export-state"}}) {
      const fs::path parent = fs::path(out).parent_path();
      if (!out.empty() && !parent.empty() && !fs::is_directory(parent, ec))
        st = Error{out + ": folder " + parent.string() + " does not exist (" + flag + ")"};
    }
    // A mistyped --drop-keys now, not after the last step: the state dict's
    // keys are the graph's parameters and buffers.
    std::set<std::string> keys;
    for (const auto *ids : {&ctx_.graph.parameters, &ctx_.graph.buffers})
      for (ir::ValueId id : *ids) keys.insert(ctx_.graph.values[size_t(id)].name);
    for (const std::string &k : o.drop_keys)
      if (!keys.count(k)) st = Error{"--drop-keys: the model has no parameter or buffer '" + k + "'"};
  }
  if (st.ok() && ctx_.comm.rank() == 0 && !o.checkpoint_dir.empty() && !o.resume) {
    // A fresh run must not mix its checkpoints with another run's: a later
    // --resume would pick whichever is newest.
    if (fs::exists(o.checkpoint_dir, ec)) {
      auto latest = checkpoint::findLatest(o.checkpoint_dir);
      if (!latest) st = Error{latest.error().message};
      else if (*latest)
        st = Error{o.checkpoint_dir + ": already holds checkpoints (newest: " + (*latest)->dir +
                   "); pass --resume to continue from it, or use another --checkpoint-dir"};
    } else if (!fs::create_directories(o.checkpoint_dir, ec) && ec) {
      st = Error{o.checkpoint_dir + ": cannot create the checkpoint folder: " + ec.message()};
    }
  }
  if (st.ok() && ctx_.comm.rank() == 0 && !o.checkpoint_dir.empty() && !o.synthetic) {
    // The identity of the data (Note [hostile inputs]): a resume continues only on the same bytes.
    for (ir::ValueId in : ctx_.graph.inputs) {
      const std::string name = ctx_.graph.values[in].name + ".npy";
      auto file = openInput(o.data_dir + "/" + name);
      auto sha = hashFile(o.data_dir + "/" + name);
      if (!file || !sha) {
        st = Error{(file ? sha.error() : file.error()).message};
        break;
      }
      data_files_.push_back({name, int64_t(file->size()), *sha});
    }
  }
  if (st = agree(ctx_.comm, st); !st) return Error{st.message()};
  if (o.resume)
    if (st = load(log); !st) return Error{st.message()};
  return start_step_;
}

bool Checkpointer::due(int64_t completed, int64_t total) const {
  const TrainOptions &o = ctx_.opts;
  if (o.checkpoint_dir.empty() || completed <= start_step_) return false;
  return completed == total || (o.checkpoint_every > 0 && completed % o.checkpoint_every == 0);
}

Status Checkpointer::load(std::ostream &log) {
  const TrainOptions &o = ctx_.opts;
  comm::Communicator &comm = ctx_.comm;
  const int rank = comm.rank();

  // 1. Every rank finds the newest complete checkpoint; they must agree.
  std::vector<std::string> skipped;
  auto latest = checkpoint::findLatest(o.checkpoint_dir, &skipped);
  Status st = latest ? Status::success() : Status(Error{latest.error().message + " (--resume)"});
  if (st = agree(comm, st); !st) return st;
  const std::optional<Found> &found = *latest;
  double seen[2] = {found ? double(found->manifest.step) : -1.0, found ? -double(found->manifest.step) : 1.0};
  comm.allReduce(seen, 2, comm::ReduceOp::Max);
  if (seen[0] != -seen[1])
    return Error{rank == 0 ? o.checkpoint_dir + ": ranks see different newest checkpoints (step " +
                                 std::to_string(int64_t(-seen[1])) + " and " + std::to_string(int64_t(seen[0])) +
                                 "); the folder must be on a file system all ranks share"
                           : ""};
  if (rank == 0)
    for (const auto &dir : skipped) log << "rannc-exec: ignoring " << dir << ": no manifest.json (incomplete)\n";
  if (!found) {
    if (rank == 0) log << "rannc-exec: " << o.checkpoint_dir << " holds no complete checkpoint; starting at step 0\n";
    return Status::success();
  }

  // 2. Each rank checks the checkpoint fits this run and loads what its stage needs.
  const Manifest &m = found->manifest;
  const std::string &where = found->dir;
  auto check = [&]() -> Status {
    if (m.model_sha256 != ctx_.plan.model().sha256())
      return Error{where + ": checkpoint of another model (SHA-256 " + m.model_sha256.substr(0, 12) +
                   "..., the plan's model " + ctx_.plan.model().sha256().substr(0, 12) + "...)"};
    if (m.optimizer != optimizerName(o.optimizer))
      return Error{where + ": checkpoint was trained with --optimizer " + m.optimizer + ", this run has --optimizer " +
                   optimizerName(o.optimizer)};
    if (m.synthetic != o.synthetic)
      return Error{where + ": checkpoint was trained on " + (m.synthetic ? "--synthetic data" : "--data") +
                   ", this run uses " + (o.synthetic ? "--synthetic data" : "--data")};
    if (!o.synthetic && m.dataset_samples != ctx_.dataset_samples)
      return Error{where + ": checkpoint was trained on " + std::to_string(m.dataset_samples) +
                   " samples, --data holds " + std::to_string(ctx_.dataset_samples) + " (the data order would not continue)"};
    if (rank == 0 && !o.resume_other_data && !m.data.empty())
      for (const checkpoint::FileEntry &was : m.data) {
        auto now = std::find_if(data_files_.begin(), data_files_.end(),
                                [&](const checkpoint::FileEntry &f) { return f.name == was.name; });
        if (now == data_files_.end() || now->bytes != was.bytes || now->sha256 != was.sha256)
          return Error{where + ": checkpoint was trained on other data: " + o.data_dir + "/" + was.name + " was " +
                       std::to_string(was.bytes) + " bytes (SHA-256 " + was.sha256.substr(0, 12) + "...), now " +
                       (now == data_files_.end() ? std::string("absent")
                                                 : std::to_string(now->bytes) + " bytes (SHA-256 " +
                                                       now->sha256.substr(0, 12) + "...)") +
                       "; pass --resume-other-data to continue on it anyway"};
      }
    const bool seeded = o.synthetic || o.shuffle == Shuffle::On;
    if (m.shuffle != shuffleName(o.shuffle) || (seeded && m.seed != o.seed))
      return Error{where + ": checkpoint was trained with --shuffle " + m.shuffle + " --seed " + std::to_string(m.seed) +
                   ", this run has --shuffle " + shuffleName(o.shuffle) + " --seed " + std::to_string(o.seed) +
                   " (the data order would not continue)"};

    // Parameters, buffers and optimizer state, by name, from whichever files hold them.
    enum Kind { kParameter, kBuffer, kOptimizerState };
    for (const Kind kind : {kParameter, kBuffer, kOptimizerState}) {
      const auto &index = kind == kParameter ? m.parameters : kind == kBuffer ? m.buffers : m.optimizer_state;
      const auto &tensors = kind == kBuffer ? buffers_ : params_;
      const char *what = kind == kParameter ? "parameter" : kind == kBuffer ? "buffer" : "optimizer state of";
      std::map<std::string, std::vector<size_t>> by_file;
      for (size_t i = 0; i < tensors.size(); ++i) {
        auto it = index.find(tensors[i].first);
        if (it == index.end())
          return Error{where + ": has no " + what + " '" + tensors[i].first + "', which stage " +
                       std::to_string(ctx_.stage) + " of this plan needs"};
        by_file[it->second].push_back(i);
      }
      for (const auto &[file, indices] : by_file) {
        auto bytes = checkpoint::readVerified(*found, file);
        if (!bytes) return Error{bytes.error().message};
        auto decoded = checkpoint::decodeTensors(*bytes, where + "/" + file);
        if (!decoded) return Error{decoded.error().message};
        for (size_t i : indices) {
          const auto &[name, p] = tensors[i];
          auto it = decoded->tensors.find(name);
          if (it == decoded->tensors.end())
            return Error{where + "/" + file + ": has no tensor '" + name + "' (the manifest says it does)"};
          try {
            // Whole in the file; a tensor-parallel stage keeps its slice.
            const int axis = kind == kParameter || kind == kOptimizerState ? axisOf(name) : -1;
            auto slice = [&](const torch::Tensor &t) {
              return axis < 0 || !ctx_.tp_group ? t : runtime::shardOf(t, axis, ctx_.tp.position, ctx_.tp.degree);
            };
            if (kind != kOptimizerState) {
              torch::Tensor t = slice(runtime::toTorch(it->second));
              if (t.scalar_type() != p.scalar_type() || t.sizes() != p.sizes())
                return Error{where + "/" + file + ": " + what + " '" + name + "' is " + describe(t) +
                             ", the model's is " + describe(p)};
              torch::NoGradGuard no_grad;
              p.copy_(t);
            } else {
              // The state as torch::optim saved it for a one-parameter optimizer
              // of this kind; moved over to the run's optimizer by tensor key.
              auto one = ctx_.make_optimizer({p});
              torch::serialize::InputArchive archive;
              archive.load_from(it->second.data.data(), it->second.data.size(), p.device());
              one->load(archive);
              auto state = one->state().find(stateKey(p));
              if (state != one->state().end()) {
                auto mine = axis < 0 ? std::move(state->second) : mapOptimizerState(*state->second, slice);
                // Checked now, not inside the first optimizer step (a LibTorch error there).
                std::string wrong;
                mapOptimizerState(*mine, [&](const torch::Tensor &t) {
                  if (wrong.empty() && t.dim() > 0 && t.sizes() != p.sizes()) wrong = describe(t);
                  return t;
                });
                if (!wrong.empty())
                  return Error{where + "/" + file + ": the optimizer state of '" + name + "' holds a tensor of " +
                               wrong + ", the parameter is " + describe(p)};
                optimizers_[i]->state()[stateKey(p)] = std::move(mine);
              }
            }
          } catch (const std::exception &e) {
            return Error{where + "/" + file + ": cannot load the " + what + " '" + name + "': " + firstLine(e.what())};
          }
        }
      }
    }

    // The generator streams continue only where the rank does the same work.
    if (!m.rng_file.empty() && m.world_size == comm.size() && m.stages == layoutOf(ctx_.plan)) {
      auto bytes = checkpoint::readVerified(*found, m.rng_file);
      if (!bytes) return Error{bytes.error().message};
      auto decoded = checkpoint::decodeTensors(*bytes, where + "/" + m.rng_file);
      if (!decoded) return Error{decoded.error().message};
      auto it = decoded->tensors.find("rank-" + std::to_string(rank));
      if (it == decoded->tensors.end()) return Error{where + "/" + m.rng_file + ": no state for rank " + std::to_string(rank)};
      try {
        setGeneratorState(ctx_.runner.device(), it->second.data);
      } catch (const std::exception &e) {
        // A CPU generator's state does not fit a CUDA one (and back).
        log << "rannc-exec: rank " << rank << ": " << where << "/" << m.rng_file << ": the generator state does not "
            << "fit this rank's " << ctx_.runner.device().str() << " generator (written on another kind of device?): "
            << "not restored (this matters only to random ops such as dropout)\n";
      }
    } else if (rank == 0) {
      log << "rannc-exec: " << where << " was written with another plan: its generator states are not "
          << "restored (this matters only to random ops such as dropout)\n";
    }
    return Status::success();
  };
  if (st = agree(comm, check()); !st) return st;
  restoreLossScale(m, log);

  start_step_ = m.step;
  data_offset_ = m.samples_consumed - m.step * ctx_.samples_per_step;
  if (rank == 0) {
    if (!o.log.empty())
      if (Status t = trimLog(o.log, m.step); !t) throw std::runtime_error(t.message());
    log << "rannc-exec: resuming from " << where << ": step " << m.step << ", " << m.samples_consumed
        << " samples consumed (epoch " << m.epoch << ")\n";
  }
  return Status::success();
}

void Checkpointer::restoreLossScale(const Manifest &m, std::ostream &log) {
  const bool speak = ctx_.comm.rank() == 0;
  if (m.loss_scale && ctx_.loss_scaler) {
    const checkpoint::LossScaleState &ls = *m.loss_scale;
    LossScaler::Options options{ctx_.loss_scaler->state().options.init_scale, ls.growth_factor, ls.backoff_factor,
                                int(ls.growth_interval)};
    ctx_.loss_scaler->restore({options, ls.scale, int(ls.growth_tracker)});
    if (speak)
      log << "rannc-exec: fp16 loss scale " << ls.scale << " restored (" << ls.growth_tracker
          << " good step(s) towards growth)\n";
  } else if (m.loss_scale && speak) {
    log << "rannc-exec: the checkpoint's fp16 loss scale is not used: this plan's precision is "
        << (ctx_.plan.precision().empty() ? "fp32" : ctx_.plan.precision()) << "\n";
  } else if (ctx_.loss_scaler && speak) {
    log << "rannc-exec: the checkpoint holds no fp16 loss scale (an fp32/bf16 run's or an older one): starting at "
        << ctx_.loss_scaler->scale() << "\n";
  }
}

void Checkpointer::save(int64_t completed, std::ostream &log) {
  const auto t0 = std::chrono::steady_clock::now();
  const TrainOptions &o = ctx_.opts;
  comm::Communicator &comm = ctx_.comm;
  const int rank = comm.rank();
  const std::string final_dir = o.checkpoint_dir + "/" + checkpoint::stepFolderName(completed);
  const std::string tmp = final_dir + ".tmp";
  auto fail = [&](const std::string &msg) {
    // A failed write (a full disk) must not leave its partial folder to fill the disk further.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw std::runtime_error("cannot write the checkpoint of step " + std::to_string(completed) + ": " + msg);
  };
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec); // left by a run killed while writing this step
    fs::create_directories(tmp, ec);
    if (ec) fail(tmp + ": " + ec.message());
  }
  comm.barrier();

  // The first replica of each stage writes its parameters and optimizer state.
  nlohmann::json files = nlohmann::json::array();
  auto write = [&](const std::string &name, const std::string &blob, nlohmann::json index) {
    if (Status st = checkpoint::writeDurable(tmp + "/" + name, blob); !st) fail(st.message());
    files.push_back({{"name", name}, {"bytes", blob.size()}, {"sha256", sha256Hex(blob)}, {"index", index}});
  };
  if (ctx_.replica == 0) {
    checkpoint::NamedTensors weights, states;
    std::vector<std::string> names, buffer_names;
    for (const auto &[name, b] : buffers_) {
      buffer_names.push_back(name);
      weights.emplace_back(name, runtime::fromTorch(b));
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto &[name, p] = params_[i];
      const torch::optim::Optimizer &optimizer = *optimizers_[i]; // its chunk's
      names.push_back(name);
      // Whole tensors (Note [tensor parallel ranks]): every rank of the
      // first group gathers, its leader writes.
      const int axis = axisOf(name);
      const torch::Tensor w = whole(p, axis);
      weights.emplace_back(name, runtime::fromTorch(w));
      // torch::optim's own format, for a one-parameter optimizer of the run's
      // kind and options holding this parameter's state: loadable by any plan.
      auto one = ctx_.make_optimizer({w});
      const auto &state = optimizer.state();
      if (auto it = state.find(stateKey(p)); it != state.end())
        one->state()[stateKey(w)] = axis < 0 ? it->second->clone()
                                             : mapOptimizerState(*it->second, [&](const torch::Tensor &t) {
                                                 return whole(t, axis);
                                               });
      for (const auto &group : optimizer.param_groups())
        for (const auto &q : group.params())
          if (q.is_same(p)) one->param_groups()[0].set_options(group.options().clone());
      torch::serialize::OutputArchive archive;
      one->save(archive);
      std::ostringstream os;
      archive.save_to(os);
      states.emplace_back(name, bytesTensor(os.str()));
    }
    const std::string stage = std::to_string(ctx_.stage);
    const std::map<std::string, std::string> meta = {{"stage", stage}, {"step", std::to_string(completed)}};
    if (ctx_.tp.leader()) write("stage-" + stage + ".safetensors", checkpoint::encodeTensors(weights, meta),
          {{"parameters", names}, {"buffers", buffer_names}});
    auto optim_meta = meta;
    optim_meta["format"] =
        "per parameter: torch::optim::Optimizer::save of a one-parameter " + optimizerName(o.optimizer);
    if (ctx_.tp.leader())
      write("stage-" + stage + ".optim.safetensors", checkpoint::encodeTensors(states, optim_meta),
            {{"optimizer_state", names}});
  }
  std::string rng = generatorState(ctx_.runner.device());
  if (rank != 0) {
    comm.send(std::make_shared<std::string>(files.dump()), 0, kFilesTag);
    comm.send(std::make_shared<std::string>(std::move(rng)), 0, kRngTag);
    comm.waitSends();
    return;
  }

  // Rank 0 gathers what was written, then writes the manifest last.
  const int world = comm.size();
  std::vector<nlohmann::json> written(static_cast<size_t>(world));
  checkpoint::NamedTensors rngs;
  written[0] = files;
  rngs.emplace_back("rank-0", bytesTensor(std::move(rng)));
  for (int r = 1; r < world; ++r) {
    written[size_t(r)] = nlohmann::json::parse(comm.recv(r, kFilesTag));
    rngs.emplace_back("rank-" + std::to_string(r), bytesTensor(comm.recv(r, kRngTag)));
  }
  Manifest m;
  m.step = completed;
  m.samples_consumed = samplesBefore(completed);
  m.dataset_samples = o.synthetic ? 0 : ctx_.dataset_samples;
  m.epoch = m.dataset_samples > 0 ? m.samples_consumed / m.dataset_samples : 0;
  m.samples_per_step = ctx_.samples_per_step;
  m.synthetic = o.synthetic;
  m.shuffle = shuffleName(o.shuffle);
  m.seed = o.seed;
  m.optimizer = optimizerName(o.optimizer);
  m.lr = o.lr;
  m.model_path = fs::absolute(model_path_).lexically_normal().string();
  m.model_sha256 = ctx_.plan.model().sha256();
  m.world_size = world;
  m.stages = layoutOf(ctx_.plan);
  m.data = data_files_;
  int64_t total = 0;
  std::set<int> listed; // an interleaved rank leads several stages: its files once
  for (const auto &stage : ctx_.plan.stages()) {
    if (!listed.insert(stage.ranks(0)).second) continue;
    for (const auto &f : written[size_t(stage.ranks(0))]) {
      const std::string name = f.at("name");
      m.files.push_back({name, f.at("bytes").get<int64_t>(), f.at("sha256").get<std::string>()});
      total += m.files.back().bytes;
      for (const auto &[kind, names] : f.at("index").items()) {
        auto &index = kind == "parameters" ? m.parameters : kind == "buffers" ? m.buffers : m.optimizer_state;
        for (const auto &t : names) index.emplace(t.get<std::string>(), name); // first stage wins
      }
    }
  }
  const std::string rng_blob = checkpoint::encodeTensors(rngs);
  if (Status st = checkpoint::writeDurable(tmp + "/rng.safetensors", rng_blob); !st) fail(st.message());
  m.files.push_back({"rng.safetensors", int64_t(rng_blob.size()), sha256Hex(rng_blob)});
  m.rng_file = "rng.safetensors";
  if (ctx_.loss_scaler) { // the same on every rank: they agree on each overflow
    const LossScaler::State s = ctx_.loss_scaler->state();
    m.loss_scale = checkpoint::LossScaleState{s.scale, s.options.growth_factor, s.options.backoff_factor,
                                              s.options.growth_interval, s.growth_tracker};
  }
  if (Status st = checkpoint::writeDurable(tmp + "/manifest.json", checkpoint::manifestToJson(m)); !st)
    fail(st.message());
  if (Status st = checkpoint::syncFolder(tmp); !st) fail(st.message());
  if (Status st = checkpoint::publish(tmp, final_dir); !st) fail(st.message());
  auto deleted = checkpoint::prune(o.checkpoint_dir, o.keep);
  if (!deleted) fail(deleted.error().message);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log << "rannc-exec: checkpoint " << final_dir << " (" << total << " bytes, " << secs << " s";
  for (const auto &d : *deleted) log << "; deleted " << d;
  log << ")\n";
}

Status Checkpointer::exportTrained(std::ostream &log) {
  const TrainOptions &o = ctx_.opts;
  if (o.export_onnx.empty() && o.export_state.empty()) return Status::success();
  comm::Communicator &comm = ctx_.comm;
  std::string mine;
  if (ctx_.replica == 0) { // whole tensors: the first group gathers, its leader sends
    checkpoint::NamedTensors weights;
    for (const auto &[name, p] : params_) weights.emplace_back(name, runtime::fromTorch(whole(p, axisOf(name))));
    for (const auto &[name, b] : buffers_) weights.emplace_back(name, runtime::fromTorch(b));
    if (ctx_.tp.leader()) mine = checkpoint::encodeTensors(weights);
    if (ctx_.tp.leader() && comm.rank() != 0) comm.send(std::make_shared<std::string>(std::move(mine)), 0, kExportTag);
  }
  Status st;
  if (comm.rank() == 0) {
    std::vector<std::string> parts;
    // One part per pipeline rank: an interleaved rank sends all its chunks' (addStage).
    for (int s = 0; s < plan::pipelineRanks(ctx_.plan); ++s) {
      const int from = ctx_.plan.stages(s).ranks(0);
      parts.push_back(from == 0 ? mine : comm.recv(from, kExportTag));
    }
    std::map<std::string, ir::Tensor> weights;
    for (size_t s = 0; s < parts.size() && st.ok(); ++s) {
      auto decoded = checkpoint::decodeTensors(parts[s], "the weights of stage " + std::to_string(s));
      if (!decoded) st = Error{decoded.error().message};
      else
        for (auto &[name, t] : decoded->tensors) weights.emplace(name, std::move(t)); // first stage wins
    }
    if (st.ok() && !o.export_onnx.empty()) {
      auto n = checkpoint::writeOnnxWithWeights(model_path_, weights, o.export_onnx);
      if (!n) st = Error{n.error().message};
      else log << "rannc-exec: wrote " << o.export_onnx << " with " << *n << " trained initializer(s)\n";
    }
    if (st.ok() && !o.export_state.empty()) {
      st = checkpoint::dropKeys(weights, o.drop_keys); // Note [TorchScript buffers]
      if (st.ok()) st = writeStateDict(model_path_, weights, o.export_state);
      if (st.ok()) log << "rannc-exec: wrote " << o.export_state << " (" << weights.size() << " tensors, torch.load)\n";
      if (st.ok() && import::isTorchScriptPath(model_path_) && o.drop_keys.empty())
        log << checkpoint::torchScriptBuffersNote();
    }
  }
  comm.waitSends();
  return agree(comm, st);
}

Status trimLog(const std::string &path, int64_t step) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::success();
  auto text = readFile(path); // a regular file only: not a FIFO, not /dev/full (Note [hostile inputs])
  if (!text) return Error{text.error().message + " (--log)"};
  std::istringstream in(*text);
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.is_object() && j.contains("step") && j["step"].get<int64_t>() < step) kept += line + "\n";
    } catch (const nlohmann::json::exception &) {
      // a record cut short when the run was killed
    }
  }
  return writeFileAtomic(path, kept);
}

} // namespace rannc::train
