#include "executor/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>

#include "executor/checkpoint/tensor_file.h"
#include "planner/support/files.h"
#include "planner/support/sha256.h"

namespace rannc::checkpoint {
namespace fs = std::filesystem;

std::string stepFolderName(int64_t step) { return "step-" + std::to_string(step); }

std::string manifestToJson(const Manifest &m) {
  nlohmann::ordered_json j;
  j["format"] = "rannc-checkpoint";
  j["version"] = kFormatVersion;
  j["step"] = m.step;
  j["samples_consumed"] = m.samples_consumed;
  j["epoch"] = m.epoch;
  j["dataset_samples"] = m.dataset_samples;
  j["samples_per_step"] = m.samples_per_step;
  j["synthetic"] = m.synthetic;
  j["shuffle"] = m.shuffle;
  j["seed"] = m.seed;
  j["optimizer"] = m.optimizer;
  j["lr"] = m.lr;
  j["model"] = {{"path", m.model_path}, {"sha256", m.model_sha256}};
  j["world_size"] = m.world_size;
  j["stages"] = nlohmann::ordered_json::array();
  for (const auto &s : m.stages)
    j["stages"].push_back({{"op_begin", s.op_begin}, {"op_end", s.op_end}, {"ranks", s.ranks}});
  j["files"] = nlohmann::ordered_json::array();
  for (const auto &f : m.files) j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
  j["parameters"] = m.parameters;
  j["buffers"] = m.buffers;
  j["optimizer_state"] = m.optimizer_state;
  j["rng"] = m.rng_file;
  if (const auto &ls = m.loss_scale) // GradScaler.state_dict's keys
    j["loss_scale"] = {{"scale", ls->scale},
                       {"growth_factor", ls->growth_factor},
                       {"backoff_factor", ls->backoff_factor},
                       {"growth_interval", ls->growth_interval},
                       {"growth_tracker", ls->growth_tracker}};
  if (!m.data.empty()) {
    j["data"] = nlohmann::ordered_json::array();
    for (const auto &f : m.data) j["data"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
  }
  return j.dump(1) + "\n";
}

Expected<Manifest> parseManifest(const std::string &text, const std::string &where) {
  Manifest m;
  try {
    auto j = nlohmann::json::parse(text);
    if (j.value("format", "") != "rannc-checkpoint") return Error{where + ": not a rannc checkpoint manifest"};
    const int version = j.at("version").get<int>();
    if (version != kFormatVersion)
      return Error{where + ": checkpoint format version " + std::to_string(version) + ", this rannc-exec reads " +
                   std::to_string(kFormatVersion)};
    m.step = j.at("step").get<int64_t>();
    m.samples_consumed = j.at("samples_consumed").get<int64_t>();
    m.epoch = j.at("epoch").get<int64_t>();
    m.dataset_samples = j.at("dataset_samples").get<int64_t>();
    m.samples_per_step = j.at("samples_per_step").get<int64_t>();
    m.synthetic = j.at("synthetic").get<bool>();
    m.shuffle = j.at("shuffle").get<std::string>();
    m.seed = j.at("seed").get<uint64_t>();
    m.optimizer = j.at("optimizer").get<std::string>();
    m.lr = j.at("lr").get<double>();
    m.model_path = j.at("model").at("path").get<std::string>();
    m.model_sha256 = j.at("model").at("sha256").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    for (const auto &s : j.at("stages"))
      m.stages.push_back({s.at("op_begin").get<int64_t>(), s.at("op_end").get<int64_t>(),
                          s.at("ranks").get<std::vector<int>>()});
    for (const auto &f : j.at("files"))
      m.files.push_back({f.at("name").get<std::string>(), f.at("bytes").get<int64_t>(),
                         f.at("sha256").get<std::string>()});
    m.parameters = j.at("parameters").get<std::map<std::string, std::string>>();
    m.buffers = j.at("buffers").get<std::map<std::string, std::string>>();
    m.optimizer_state = j.at("optimizer_state").get<std::map<std::string, std::string>>();
    m.rng_file = j.at("rng").get<std::string>();
    if (j.contains("loss_scale")) {
      const auto &ls = j.at("loss_scale");
      m.loss_scale = LossScaleState{ls.at("scale").get<double>(), ls.at("growth_factor").get<double>(),
                                    ls.at("backoff_factor").get<double>(), ls.at("growth_interval").get<int64_t>(),
                                    ls.at("growth_tracker").get<int64_t>()};
    }
    if (j.contains("data"))
      for (const auto &f : j.at("data"))
        m.data.push_back({f.at("name").get<std::string>(), f.at("bytes").get<int64_t>(),
                          f.at("sha256").get<std::string>()});
  } catch (const nlohmann::json::exception &e) {
    return Error{where + ": corrupt manifest: " + e.what()};
  }
  if (m.step < 0 || m.samples_consumed < 0 || m.samples_per_step < 0)
    return Error{where + ": corrupt manifest: negative step or data position"};
  // Note [hostile inputs]: positions a resume does arithmetic with stay far from overflow.
  if (m.step > kMaxSteps || m.samples_per_step > kMaxSamples / kMaxSteps || m.samples_consumed > kMaxSamples ||
      m.dataset_samples < 0 || m.dataset_samples > kMaxSamples)
    return Error{where + ": corrupt manifest: implausible step " + std::to_string(m.step) + " or data position " +
                 std::to_string(m.samples_consumed)};
  if (m.dataset_samples > 0 && m.epoch != m.samples_consumed / m.dataset_samples)
    return Error{where + ": corrupt manifest: epoch " + std::to_string(m.epoch) + " does not match " +
                 std::to_string(m.samples_consumed) + " samples consumed of " + std::to_string(m.dataset_samples)};
  if (const auto &ls = m.loss_scale;
      ls && !(std::isfinite(ls->scale) && ls->scale > 0 && ls->growth_factor > 0 && ls->backoff_factor > 0 &&
              ls->growth_interval >= 1 && ls->growth_tracker >= 0 && ls->growth_tracker < ls->growth_interval))
    return Error{where + ": corrupt manifest: loss_scale needs a finite scale > 0, factors > 0 and "
                         "0 <= growth_tracker < growth_interval"};
  std::set<std::string> files;
  for (const auto &f : m.files) {
    // Names stay inside the checkpoint folder.
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name[0] == '.')
      return Error{where + ": corrupt manifest: bad file name '" + f.name + "'"};
    files.insert(f.name);
  }
  auto listed = [&](const std::string &file, const std::string &what) -> Status {
    if (!files.count(file)) return Error{where + ": corrupt manifest: " + what + " is in '" + file + "', which is not in files"};
    return Status::success();
  };
  for (const auto &[p, f] : m.parameters)
    if (Status st = listed(f, "parameter '" + p + "'"); !st) return Error{st.message()};
  for (const auto &[b, f] : m.buffers)
    if (Status st = listed(f, "buffer '" + b + "'"); !st) return Error{st.message()};
  for (const auto &[p, f] : m.optimizer_state)
    if (Status st = listed(f, "the optimizer state of '" + p + "'"); !st) return Error{st.message()};
  if (!m.rng_file.empty())
    if (Status st = listed(m.rng_file, "the RNG state"); !st) return Error{st.message()};
  return m;
}

Expected<std::optional<Found>> findLatest(const std::string &root, std::vector<std::string> *skipped) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    return Error{root + ": no such checkpoint folder" + (fs::exists(root, ec) ? " (it is a file)" : "")};
  static const std::regex kStep("step-([0-9]{1,18})");
  std::vector<std::pair<int64_t, std::string>> steps;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch match;
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, match, kStep) && it->is_directory(ec)) steps.emplace_back(std::stoll(match[1]), name);
  }
  if (ec) return Error{root + ": cannot list the checkpoint folder: " + ec.message()};
  std::sort(steps.rbegin(), steps.rend());
  for (const auto &[step, name] : steps) {
    const std::string dir = root + "/" + name, path = dir + "/manifest.json";
    if (!fs::exists(path, ec)) {
      if (skipped) skipped->push_back(dir);
      continue;
    }
    auto text = readFile(path, kMaxManifestBytes);
    if (!text) return text.error();
    auto m = parseManifest(*text, path);
    if (!m) return m.error();
    if (m->step != step)
      return Error{path + ": corrupt manifest: it is for step " + std::to_string(m->step) + ", the folder says " +
                   std::to_string(step)};
    return std::optional<Found>(Found{dir, std::move(*m)});
  }
  return std::optional<Found>();
}

Expected<Found> openCheckpoint(const std::string &path) {
  std::error_code ec;
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (fs::exists(dir + "/manifest.json", ec)) {
    auto text = readFile(dir + "/manifest.json", kMaxManifestBytes);
    if (!text) return text.error();
    auto m = parseManifest(*text, dir + "/manifest.json");
    if (!m) return m.error();
    return Found{dir, std::move(*m)};
  }
  auto latest = findLatest(dir);
  if (!latest) return latest.error();
  if (!*latest) return Error{dir + ": holds no complete checkpoint (no step-<N>/manifest.json)"};
  return std::move(**latest);
}

Expected<std::string> readVerified(const Found &c, const std::string &name) {
  const std::string path = c.dir + "/" + name;
  auto entry = std::find_if(c.manifest.files.begin(), c.manifest.files.end(),
                            [&](const FileEntry &f) { return f.name == name; });
  if (entry == c.manifest.files.end()) return Error{path + ": not listed in the checkpoint's manifest"};
  // No more than the manifest says: a FIFO, a device or a grown file is refused before reading.
  auto bytes = readFile(path, uint64_t(std::max<int64_t>(entry->bytes, 0)));
  if (!bytes) return Error{bytes.error().message + " (a file of the checkpoint is missing or damaged)"};
  if (int64_t(bytes->size()) != entry->bytes)
    return Error{path + ": " + std::to_string(bytes->size()) + " bytes, the manifest says " +
                 std::to_string(entry->bytes) + " (damaged checkpoint)"};
  if (sha256Hex(*bytes) != entry->sha256) return Error{path + ": SHA-256 differs from the manifest's (damaged checkpoint)"};
  return bytes;
}

Expected<std::map<std::string, ir::Tensor>> readWeights(const Found &c) {
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto &[p, f] : c.manifest.parameters) by_file[f].insert(p);
  for (const auto &[b, f] : c.manifest.buffers) by_file[f].insert(b);
  std::map<std::string, ir::Tensor> out;
  for (const auto &[file, names] : by_file) {
    auto bytes = readVerified(c, file);
    if (!bytes) return bytes.error();
    auto decoded = decodeTensors(*bytes, c.dir + "/" + file);
    if (!decoded) return decoded.error();
    for (const auto &n : names) {
      auto it = decoded->tensors.find(n);
      if (it == decoded->tensors.end()) return Error{c.dir + "/" + file + ": has no tensor '" + n + "' (the manifest says it does)"};
      out.emplace(n, std::move(it->second));
    }
  }
  return out;
}

Status writeDurable(const std::string &path, const std::string &data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Error{path + ": cannot write: " + std::strerror(errno)};
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string why = std::strerror(errno);
      ::close(fd);
      return Error{path + ": write failed: " + why};
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) return Error{path + ": cannot flush to disk: " + std::strerror(errno)};
  return Status::success();
}

Status syncFolder(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error{dir + ": cannot open: " + std::strerror(errno)};
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Error{dir + ": cannot flush to disk: " + std::strerror(errno)};
  return Status::success();
}

Status publish(const std::string &tmp, const std::string &final) {
  std::error_code ec;
  const std::string parent = fs::path(final).parent_path().string();
  // An older checkpoint of the same step (a run resumed from before it): move
  // it out of the way first, so step-<N> is always one complete checkpoint.
  std::string old;
  if (fs::exists(final, ec)) {
    old = final + ".old." + std::to_string(::getpid());
    fs::rename(final, old, ec);
    if (ec) return Error{final + ": cannot replace the older checkpoint: " + ec.message()};
  }
  fs::rename(tmp, final, ec);
  if (ec) return Error{final + ": cannot publish the checkpoint: " + ec.message()};
  if (Status st = syncFolder(parent.empty() ? "." : parent); !st) return st;
  if (!old.empty()) fs::remove_all(old, ec);
  return Status::success();
}

Expected<std::vector<std::string>> prune(const std::string &root, int keep) {
  std::vector<std::string> deleted;
  if (keep <= 0) return deleted;
  std::error_code ec;
  static const std::regex kName("step-([0-9]{1,18})(\\.tmp)?");
  std::vector<std::pair<int64_t, std::string>> complete, partial;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch match;
    const std::string name = it->path().filename().string();
    if (!std::regex_match(name, match, kName) || !it->is_directory(ec)) continue;
    const int64_t step = std::stoll(match[1]);
    if (match[2].matched) partial.emplace_back(step, name);
    else if (fs::exists(it->path() / "manifest.json", ec)) complete.emplace_back(step, name);
  }
  if (ec) return Error{root + ": cannot list the checkpoint folder: " + ec.message()};
  std::sort(complete.rbegin(), complete.rend());
  const int64_t newest = complete.empty() ? -1 : complete.front().first;
  std::vector<std::string> doomed;
  for (size_t i = size_t(keep); i < complete.size(); ++i) doomed.push_back(complete[i].second);
  for (const auto &[step, name] : partial)
    if (step < newest) doomed.push_back(name);
  for (const auto &name : doomed) {
    // Renamed first: a half-deleted folder must not look like a checkpoint.
    const std::string from = root + "/" + name, to = root + "/" + name + ".deleting";
    fs::rename(from, to, ec);
    if (ec) return Error{from + ": cannot delete an old checkpoint: " + ec.message()};
    fs::remove_all(to, ec);
    if (ec) return Error{to + ": cannot delete an old checkpoint: " + ec.message()};
    deleted.push_back(from);
  }
  return deleted;
}

} // namespace rannc::checkpoint
