// File helpers shared by the tools: reads that open only regular files, and
// atomic writes, so a failed command never leaves a half-written plan or
// profile behind.
//
// Note [hostile inputs]
// Every input a user or a plan names is opened with openInput: O_NONBLOCK, so
// a FIFO does not block the open itself, then fstat on the descriptor (not
// the path, which may be swapped in between) refuses anything but a regular
// file: a FIFO, /dev/zero or a folder would otherwise hang a read or grow
// memory without bound. A regular file's size bounds what is read, and each
// caller passes the most it accepts (a header or manifest says how big a file
// must be, so memory for one input is bounded before anything is read). Paths
// a file names inside itself (ONNX external data) go through insideFolder.
#pragma once

#include <cstdint>
#include <string>

#include "planner/support/status.h"

namespace rannc {

/// No limit on an input's size beyond the file's own.
constexpr uint64_t kAnySize = UINT64_MAX;

/// A regular file open for reading (the descriptor is closed with it).
class InputFile {
public:
  InputFile() = default;
  InputFile(InputFile &&o) noexcept;
  InputFile &operator=(InputFile &&o) noexcept;
  InputFile(const InputFile &) = delete;
  InputFile &operator=(const InputFile &) = delete;
  ~InputFile();

  int fd() const { return fd_; }
  const std::string &path() const { return path_; }
  /// Size at opening.
  uint64_t size() const { return size_; }
  /// Reads exactly `n` bytes at `offset`; a file shorter than that is an error naming it.
  Status readAt(uint64_t offset, uint64_t n, char *out) const;
  /// Whether the file still has the size and modification time it had at
  /// opening and `path` still names it; the error says what changed.
  Status checkUnchanged() const;

private:
  friend Expected<InputFile> openInput(const std::string &path);
  int fd_ = -1;
  std::string path_;
  uint64_t size_ = 0;
  uint64_t dev_ = 0, ino_ = 0;
  int64_t mtime_ns_ = 0;
};

/// Opens `path` for reading if it is a regular file (Note [hostile inputs]).
Expected<InputFile> openInput(const std::string &path);
/// The whole contents of regular file `path`, refused when larger than `limit` bytes.
Expected<std::string> readFile(const std::string &path, uint64_t limit = kAnySize);
/// Lowercase hex SHA-256 of regular file `path`, read in pieces.
Expected<std::string> hashFile(const std::string &path);
/// `dir`/`rel` when `rel` is relative and, normalised and with symlinks
/// followed, stays inside `dir`; otherwise an error that says why (`what`
/// names the path's role, e.g. "external data location").
Expected<std::string> insideFolder(const std::string &dir, const std::string &rel, const std::string &what);
/// Writes `data` to `path` through a temporary file in the same folder and a
/// rename, so readers see either the old file or the complete new one.
Status writeFileAtomic(const std::string &path, const std::string &data);
/// The lowercase extension of `path` including the dot (".pbtxt"), or "".
std::string extensionOf(const std::string &path);

} // namespace rannc
