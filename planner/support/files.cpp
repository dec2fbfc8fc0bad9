#include "planner/support/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "planner/support/sha256.h"

namespace rannc {
namespace fs = std::filesystem;
namespace {

std::string kindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

int64_t mtimeNs(const struct stat &st) { return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec; }

} // namespace

InputFile::InputFile(InputFile &&o) noexcept { *this = std::move(o); }

InputFile &InputFile::operator=(InputFile &&o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
    path_ = std::move(o.path_);
    size_ = o.size_;
    dev_ = o.dev_;
    ino_ = o.ino_;
    mtime_ns_ = o.mtime_ns_;
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

Expected<InputFile> openInput(const std::string &path) {
  // O_NONBLOCK: opening a FIFO with no writer would block here (Note [hostile inputs]).
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Error{path + ": cannot open: " + std::strerror(errno)};
  InputFile f;
  f.fd_ = fd;
  f.path_ = path;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Error{path + ": cannot stat: " + std::strerror(errno)};
  if (!S_ISREG(st.st_mode)) return Error{path + ": is " + kindOf(st.st_mode) + ", not a regular file"};
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  f.size_ = uint64_t(st.st_size);
  f.dev_ = uint64_t(st.st_dev);
  f.ino_ = uint64_t(st.st_ino);
  f.mtime_ns_ = mtimeNs(st);
  return f;
}

Status InputFile::readAt(uint64_t offset, uint64_t n, char *out) const {
  uint64_t done = 0;
  while (done < n) {
    ssize_t got = ::pread(fd_, out + done, size_t(n - done), off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return Error{path_ + ": read failed: " + std::strerror(errno)};
    if (got == 0)
      return Error{path_ + ": file ended at byte " + std::to_string(offset + done) + ", expected " +
                   std::to_string(offset + n) + " (truncated while in use?)"};
    done += uint64_t(got);
  }
  return Status::success();
}

Status InputFile::checkUnchanged() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return Error{path_ + ": cannot stat: " + std::strerror(errno)};
  if (uint64_t(st.st_size) != size_)
    return Error{path_ + ": changed size while in use (" + std::to_string(size_) + " bytes at opening, now " +
                 std::to_string(st.st_size) + ")"};
  if (mtimeNs(st) != mtime_ns_) return Error{path_ + ": was modified while in use"};
  struct stat now {};
  if (::stat(path_.c_str(), &now) != 0 || uint64_t(now.st_dev) != dev_ || uint64_t(now.st_ino) != ino_)
    return Error{path_ + ": was replaced or removed while in use"};
  return Status::success();
}

Expected<std::string> readFile(const std::string &path, uint64_t limit) {
  auto f = openInput(path);
  if (!f) return f.error();
  if (f->size() > limit)
    return Error{path + ": " + std::to_string(f->size()) + " bytes, more than the " + std::to_string(limit) +
                 " this input may have"};
  std::string out(size_t(f->size()), '\0');
  if (Status st = f->readAt(0, f->size(), out.data()); !st) return Error{st.message()};
  return out;
}

Expected<std::string> hashFile(const std::string &path) {
  auto f = openInput(path);
  if (!f) return f.error();
  uint64_t pos = 0;
  bool failed = false;
  // Reads at most the size at opening: a file that grows is not followed.
  std::string hex = sha256Hex([&](char *buf, size_t n) -> size_t {
    const uint64_t want = std::min<uint64_t>(n, f->size() - pos);
    if (want == 0) return 0;
    if (!f->readAt(pos, want, buf)) {
      failed = true;
      return 0;
    }
    pos += want;
    return size_t(want);
  });
  if (failed) return Error{path + ": read failed while hashing (changed while in use?)"};
  return hex;
}

Expected<std::string> insideFolder(const std::string &dir, const std::string &rel, const std::string &what) {
  const fs::path p(rel);
  if (rel.empty()) return Error{what + " is empty"};
  if (p.is_absolute()) return Error{what + " '" + rel + "' must be relative to " + (dir.empty() ? "." : dir)};
  const fs::path normal = p.lexically_normal();
  if (!normal.empty() && *normal.begin() == "..")
    return Error{what + " '" + rel + "' leaves " + (dir.empty() ? "." : dir) + " (..)"};
  const fs::path base = dir.empty() ? fs::path(".") : fs::path(dir);
  const fs::path joined = dir.empty() ? normal : base / normal;
  // Symlinks: the real path must still lie under the folder's real path.
  std::error_code ec;
  const fs::path real_dir = fs::weakly_canonical(base, ec);
  const fs::path real = ec ? fs::path() : fs::weakly_canonical(joined, ec);
  if (!ec) {
    auto d = real_dir.begin(), r = real.begin();
    for (; d != real_dir.end() && r != real.end() && *d == *r; ++d, ++r) {
    }
    if (d != real_dir.end() && !(d->empty() && std::next(d) == real_dir.end()))
      return Error{what + " '" + rel + "' leaves " + base.string() + " through a symlink (to " + real.string() + ")"};
  }
  return joined.string();
}

Status writeFileAtomic(const std::string &path, const std::string &data) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Error{path + ": cannot write: " + std::strerror(errno)};
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.flush();
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return Error{path + ": write failed"};
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return Error{path + ": cannot replace: " + why};
  }
  return Status::success();
}

std::string extensionOf(const std::string &path) {
  auto slash = path.find_last_of('/');
  auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string ext = path.substr(dot);
  for (char &c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

} // namespace rannc
