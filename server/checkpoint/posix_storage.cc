// The file:// backend: objects are files under a root directory.
//
// Put is made atomic and durable the classic way: write a temporary file in
// the target's directory, fsync it, rename it over the target (atomic within
// a file system), then fsync the directory so the rename itself survives a
// crash. New directories are fsync'ed into their parents for the same reason.

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "server/checkpoint/storage.h"

namespace psrt {
namespace {

// Marks temporary files: List hides them, and object paths may not contain
// it, so a real object is never hidden or mistaken for a leftover.
constexpr absl::string_view kTmpMarker = ".psrt-tmp.";

absl::Status CheckPath(absl::string_view path) {
  absl::Status s = ValidateObjectPath(path);
  if (!s.ok()) return s;
  if (absl::StrContains(path, kTmpMarker)) {
    return absl::InvalidArgumentError(absl::StrCat("object path '", path, "' contains '",
                                                   kTmpMarker, "', reserved for temporary files"));
  }
  return absl::OkStatus();
}

absl::Status ErrnoError(int err, absl::string_view what, absl::string_view path) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(what, " '", path, "': ", std::strerror(err)));
}

// Closes on scope exit unless released; close errors on the write path are
// checked explicitly instead.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

absl::Status FsyncDir(const std::string& dir) {
  int fd;
  do {
    fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoError(errno, "cannot open directory to fsync", dir);
  Fd closer(fd);
  if (::fsync(fd) != 0) return ErrnoError(errno, "cannot fsync directory", dir);
  return absl::OkStatus();
}

std::string Parent(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// mkdir -p for an absolute `dir`, fsync'ing the parent of every directory it
// creates so a crash cannot lose a directory holding a completed object.
absl::Status MakeDirs(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("'", dir, "' exists and is not a directory"));
  }
  if (errno != ENOENT) return ErrnoError(errno, "cannot stat", dir);
  const std::string parent = Parent(dir);
  if (parent != dir) {
    absl::Status s = MakeDirs(parent);
    if (!s.ok()) return s;
  }
  if (::mkdir(dir.c_str(), 0755) != 0) {
    // Another writer may have created it meanwhile; that is fine.
    if (errno == EEXIST && ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      return absl::OkStatus();
    }
    return ErrnoError(errno, "cannot create directory", dir);
  }
  return FsyncDir(parent);
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    // Large writes are split: some kernels cap one write near 2 GiB.
    ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot write", path);
    }
    if (n == 0) return absl::DataLossError(absl::StrCat("write to '", path, "' made no progress"));
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

class PosixStorage : public Storage {
 public:
  explicit PosixStorage(std::string root) : root_(std::move(root)) {}

  std::string uri() const override { return absl::StrCat("file://", root_); }

  absl::Status Put(absl::string_view path, absl::string_view data) override {
    absl::Status s = CheckPath(path);
    if (!s.ok()) return s;
    const std::string target = Join(path);
    const std::string dir = Parent(target);
    s = MakeDirs(dir);
    if (!s.ok()) return s;
    // Unique per call: pid and counter within a host, plus a random part
    // because hosts sharing a file system (NFS, FSx) can reuse pids. O_EXCL
    // turns any remaining collision into an error rather than a shared file.
    static std::atomic<uint64_t> counter{0};
    thread_local std::mt19937_64 rng{std::random_device{}()};
    const std::string tmp = absl::StrCat(target, kTmpMarker, ::getpid(), ".", counter.fetch_add(1),
                                         ".", absl::Hex(rng()));
    int fd;
    do {
      fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return ErrnoError(errno, "cannot create temporary file", tmp);
    Fd file(fd);
    // Written in two halves so that crash drills can stop in between.
    s = WriteAll(fd, data.substr(0, data.size() / 2), tmp);
    if (s.ok()) {
      Failpoint("storage.half_written");
      s = WriteAll(fd, data.substr(data.size() / 2), tmp);
    }
    if (s.ok() && ::fsync(fd) != 0) s = ErrnoError(errno, "cannot fsync", tmp);
    if (s.ok()) {
      // close can report a deferred write error (e.g. NFS); do not ignore it.
      if (::close(file.release()) != 0) s = ErrnoError(errno, "cannot close", tmp);
    }
    if (s.ok() && ::rename(tmp.c_str(), target.c_str()) != 0) {
      s = ErrnoError(errno, absl::StrCat("cannot rename '", tmp, "' to"), target);
    }
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
    return FsyncDir(dir);
  }

  absl::StatusOr<std::string> Get(absl::string_view path) override {
    absl::Status s = CheckPath(path);
    if (!s.ok()) return s;
    const std::string file = Join(path);
    int fd;
    do {
      fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      // A path through a file ("obj/x") names no object either.
      const int err = errno == ENOTDIR ? ENOENT : errno;
      return ErrnoError(err, "cannot open", file);
    }
    Fd closer(fd);
    struct stat st;
    if (::fstat(fd, &st) != 0) return ErrnoError(errno, "cannot stat", file);
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat("'", file, "' is not a regular file"));
    }
    std::string out;
    out.reserve(static_cast<size_t>(st.st_size));
    char buf[1 << 16];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, "cannot read", file);
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

  absl::StatusOr<std::vector<std::string>> List(absl::string_view prefix) override {
    if (absl::Status s = CheckPrefix(prefix); !s.ok()) return s;
    std::vector<std::string> out;
    absl::Status s = Walk(PrefixDir(prefix), prefix, /*temporaries=*/false, &out);
    if (!s.ok()) return s;
    std::sort(out.begin(), out.end());
    return out;
  }

  absl::Status Delete(absl::string_view path) override {
    absl::Status s = CheckPath(path);
    if (!s.ok()) return s;
    const std::string file = Join(path);
    struct stat st;
    if (::lstat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot delete '", file, "': it is a directory, not an object"));
    }
    return Remove(file);
  }

  absl::Status RemoveUnfinished(absl::string_view prefix) override {
    if (absl::Status s = CheckPrefix(prefix); !s.ok()) return s;
    std::vector<std::string> temporaries;
    if (absl::Status s = Walk(PrefixDir(prefix), prefix, /*temporaries=*/true, &temporaries); !s.ok()) return s;
    for (const std::string& rel : temporaries) {
      if (absl::Status s = Remove(Join(rel)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Exists(absl::string_view path) override {
    absl::Status s = CheckPath(path);
    if (!s.ok()) return s;
    const std::string file = Join(path);
    struct stat st;
    if (::stat(file.c_str(), &st) == 0) return S_ISREG(st.st_mode);
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoError(errno, "cannot stat", file);
  }

 private:
  std::string Join(absl::string_view rel) const {
    if (rel.empty()) return root_;
    return root_ == "/" ? absl::StrCat("/", rel) : absl::StrCat(root_, "/", rel);
  }

  static absl::Status CheckPrefix(absl::string_view prefix) {
    if (prefix.empty()) return absl::OkStatus();
    // A prefix may end mid-component ("ckpt-0001"), so check it as a path
    // with a dummy last part when it ends in '/'.
    return ValidateObjectPath(absl::EndsWith(prefix, "/") ? absl::StrCat(prefix, "x") : std::string(prefix));
  }

  // The directory a prefix names: walk only that, not the whole root.
  static std::string PrefixDir(absl::string_view prefix) {
    const size_t slash = prefix.rfind('/');
    return slash == absl::string_view::npos ? "" : std::string(prefix.substr(0, slash));
  }

  // Unlinks `file`, then the folders this leaves empty: folders exist only
  // for the objects in them (as in S3); best effort (rmdir fails on a
  // non-empty one).
  absl::Status Remove(const std::string& file) {
    if (::unlink(file.c_str()) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return absl::OkStatus();
      return ErrnoError(errno, "cannot delete", file);
    }
    std::string dir = Parent(file);
    for (; dir.size() > root_.size() && ::rmdir(dir.c_str()) == 0; dir = Parent(dir)) {
    }
    return FsyncDir(dir);
  }

  // Appends every regular file under `rel_dir` whose relative path starts
  // with `prefix`: the objects, or with `temporaries` the temporary files of
  // Puts (in flight, or of a writer that died). A missing directory simply
  // holds nothing.
  absl::Status Walk(const std::string& rel_dir, absl::string_view prefix, bool temporaries,
                    std::vector<std::string>* out) {
    const std::string dir = Join(rel_dir);
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (errno == ENOENT || errno == ENOTDIR) return absl::OkStatus();
      return ErrnoError(errno, "cannot list directory", dir);
    }
    std::vector<std::pair<std::string, bool>> entries;  // name, is directory
    for (;;) {
      errno = 0;
      struct dirent* e = ::readdir(d);
      if (e == nullptr) {
        if (errno != 0) {
          int err = errno;
          ::closedir(d);
          return ErrnoError(err, "cannot read directory", dir);
        }
        break;
      }
      absl::string_view name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string rel =
          rel_dir.empty() ? std::string(name) : absl::StrCat(rel_dir, "/", name);
      struct stat st;
      if (::lstat(Join(rel).c_str(), &st) != 0) continue;  // deleted meanwhile
      if (S_ISDIR(st.st_mode)) {
        entries.emplace_back(rel, true);
      } else if (S_ISREG(st.st_mode) && absl::StrContains(name, kTmpMarker) == temporaries) {
        entries.emplace_back(rel, false);
      }
    }
    ::closedir(d);
    for (const auto& [rel, is_dir] : entries) {
      if (is_dir) {
        // Descend only where the prefix can still match below.
        const std::string as_dir = absl::StrCat(rel, "/");
        if (absl::StartsWith(as_dir, prefix) || absl::StartsWith(prefix, as_dir)) {
          absl::Status s = Walk(rel, prefix, temporaries, out);
          if (!s.ok()) return s;
        }
      } else if (absl::StartsWith(rel, prefix)) {
        out->push_back(rel);
      }
    }
    return absl::OkStatus();
  }

  const std::string root_;
};

}  // namespace

std::unique_ptr<Storage> NewPosixStorage(std::string root) {
  return std::make_unique<PosixStorage>(std::move(root));
}

}  // namespace psrt
