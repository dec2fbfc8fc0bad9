// The checkpoint folder (docs/training.md "Checkpoints"), torch-free so that
// `rannc-exec export` and tests read it without LibTorch.
//
// Note [checkpoint atomicity]
// A checkpoint of N completed steps is the folder D/step-<N>/. Its files are
// written into D/step-<N>.tmp/ (each fsynced), then manifest.json is written
// last, the folder renamed to D/step-<N>/ and D fsynced. So a folder named
// step-<N> exists only once every file and the manifest are on disk; a job
// killed mid-write leaves only a .tmp folder, which readers never look at; and
// a step-<N> folder without a manifest (possible only by hand) is skipped.
// Deleting an old checkpoint (--keep) first renames it away from step-<N>,
// so a crash mid-delete never leaves a half-deleted folder that looks complete.
// The manifest records every file's size and SHA-256, checked on reading.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::checkpoint {

constexpr int kFormatVersion = 1;

/// One file of a checkpoint and what it holds.
struct FileEntry {
  std::string name; ///< relative to the checkpoint folder
  int64_t bytes = 0;
  std::string sha256;
};

/// A stage of the plan that wrote the checkpoint.
struct StageLayout {
  int64_t op_begin = 0, op_end = 0;
  std::vector<int> ranks;
  bool operator==(const StageLayout &o) const {
    return op_begin == o.op_begin && op_end == o.op_end && ranks == o.ranks;
  }
};

/// The fp16 dynamic loss scaler at the checkpoint (Note [loss scaling] in
/// executor/train/loss_scale.h), what torch.amp.GradScaler.state_dict holds.
struct LossScaleState {
  double scale = 0, growth_factor = 0, backoff_factor = 0;
  int64_t growth_interval = 0;
  int64_t growth_tracker = 0; ///< good steps since the scale last changed
};

/// manifest.json: written last, it makes a checkpoint complete.
struct Manifest {
  int64_t step = 0;             ///< optimizer steps completed: a resumed run starts at this step
  int64_t samples_consumed = 0; ///< data position: samples read by those steps
  int64_t epoch = 0;            ///< samples_consumed / dataset_samples (0 with synthetic data)
  int64_t dataset_samples = 0;  ///< samples in --data; 0 with --synthetic
  int64_t samples_per_step = 0; ///< global batch x accumulation steps
  bool synthetic = false;
  std::string shuffle; ///< on | off
  uint64_t seed = 0;   ///< shuffle and synthetic-data seed
  std::string optimizer;
  double lr = 0;
  std::string model_sha256, model_path;
  int world_size = 0;
  std::vector<StageLayout> stages;
  std::vector<FileEntry> files;
  std::map<std::string, std::string> parameters;      ///< parameter name -> file holding it
  std::map<std::string, std::string> buffers;         ///< buffer (BatchNorm statistics) name -> file holding it
  std::map<std::string, std::string> optimizer_state; ///< parameter name -> file holding its optimizer state
  std::string rng_file; ///< each rank's torch generator state ("rank-<r>"); empty: none
  /// fp16 runs only; absent from fp32/bf16 checkpoints and from those written
  /// before it was saved (a resumed fp16 run then starts at its initial scale).
  std::optional<LossScaleState> loss_scale;
  /// The --data files trained on (name in the folder, size, SHA-256): a resume
  /// refuses other data unless told (--resume-other-data). Absent from older
  /// checkpoints and synthetic runs.
  std::vector<FileEntry> data;
};

/// Bounds on a manifest's positions, so a resumed run's arithmetic (step x
/// samples per step + offset) cannot overflow into a negative data position.
constexpr int64_t kMaxSteps = int64_t(1) << 40, kMaxSamples = int64_t(1) << 61;
/// A manifest.json is a few KB per parameter; a bigger one is not read.
constexpr uint64_t kMaxManifestBytes = uint64_t(256) << 20;

std::string manifestToJson(const Manifest &m);
/// Parses and validates a manifest (every file it names listed in `files`).
Expected<Manifest> parseManifest(const std::string &text, const std::string &where);

/// "step-<N>".
std::string stepFolderName(int64_t step);
/// A checkpoint found on disk.
struct Found {
  std::string dir; ///< D/step-<N>
  Manifest manifest;
};
/// The newest complete checkpoint under `root`, or nullopt when there is none.
/// Folders being written (.tmp) are ignored, step folders without a manifest
/// are skipped (named in `skipped`); a missing `root` or a manifest that does
/// not parse is an error.
Expected<std::optional<Found>> findLatest(const std::string &root, std::vector<std::string> *skipped = nullptr);
/// `path` is a checkpoint (it holds manifest.json) or a folder of them (the
/// newest complete one): the checkpoint to read, or an error.
Expected<Found> openCheckpoint(const std::string &path);

/// File `name` of checkpoint `c`, checked against the manifest's size and SHA-256.
Expected<std::string> readVerified(const Found &c, const std::string &name);
/// Every parameter and buffer of checkpoint `c` (the model's trained
/// initializers), by name (files verified).
Expected<std::map<std::string, ir::Tensor>> readWeights(const Found &c);

/// Writes `data` to `path` and fsyncs it (the folder entry: syncFolder).
Status writeDurable(const std::string &path, const std::string &data);
Status syncFolder(const std::string &dir);
/// Renames the finished `tmp` folder to `final` (replacing an older `final`)
/// and fsyncs their parent.
Status publish(const std::string &tmp, const std::string &final);
/// Deletes all but the newest `keep` complete checkpoints under `root`, and
/// abandoned .tmp folders of steps before the newest; returns what it deleted.
Expected<std::vector<std::string>> prune(const std::string &root, int keep);

} // namespace rannc::checkpoint
