#include "common/shared_memory.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace psrt {
namespace {

constexpr char kPrefix[] = "/psrt-";

bool ValidName(const std::string& name) {
  if (name.size() <= sizeof(kPrefix) - 1 || name.size() > 64 || name.rfind(kPrefix, 0) != 0)
    return false;
  for (size_t i = 1; i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Create(size_t bytes) {
  if (bytes == 0)
    return absl::InvalidArgumentError("a shared-memory region needs at least one byte");
  std::random_device rd;
  std::string name = absl::StrCat(kPrefix, getpid(), "-");
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) name.push_back(kHex[rd() % 16]);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return Errno(absl::StrCat("cannot create shared memory ", name));
  void* p = ftruncate(fd, static_cast<off_t>(bytes)) == 0
                ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  if (p == MAP_FAILED) {
    absl::Status s = Errno(absl::StrCat("cannot size and map shared memory ", name));
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  return std::unique_ptr<SharedRegion>(
      new SharedRegion(name, static_cast<char*>(p), bytes, true, fd));
}

absl::Status SharedRegion::Reserve() {
  if (fd_ < 0) return absl::FailedPreconditionError("only the region's creator reserves its pages");
  const int err = posix_fallocate(fd_, 0, static_cast<off_t>(size_));
  if (err != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reserve ", size_, " bytes of shared memory in ", name_, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SharedRegion>> SharedRegion::Attach(const std::string& name,
                                                                   size_t bytes) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", name.substr(0, 80), "' is not a psrt shared-memory name (/psrt-, digits, '-' and lowercase hex)"));
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW, 0);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open shared memory ", name, ": ",
                                            std::strerror(errno),
                                            " (the worker is on another host)"));
  }
  struct stat st;
  absl::Status refused;
  if (fstat(fd, &st) != 0) {
    refused = Errno(absl::StrCat("cannot stat shared memory ", name));
  } else if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    refused = absl::PermissionDeniedError(absl::StrCat(
        "shared memory ", name, " is not owner-only memory of this server's user (uid ", st.st_uid,
        ", mode ", absl::Hex(st.st_mode & 0777), ")"));
  } else if (static_cast<uint64_t>(st.st_size) != bytes) {
    refused = absl::InvalidArgumentError(absl::StrCat("shared memory ", name, " has ", st.st_size,
                                                      " bytes, not the ", bytes, " announced"));
  }
  void* p =
      refused.ok() ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (refused.ok() && p == MAP_FAILED)
    refused = Errno(absl::StrCat("cannot map shared memory ", name));
  close(fd);
  if (!refused.ok()) return refused;
  return std::unique_ptr<SharedRegion>(
      new SharedRegion(name, static_cast<char*>(p), bytes, false, -1));
}

SharedRegion::~SharedRegion() {
  Unlink();
  munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

void SharedRegion::Unlink() {
  if (!linked_) return;
  shm_unlink(name_.c_str());
  linked_ = false;
}

int SweepSharedMemory() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  std::vector<std::string> names;
  while (const dirent* e = readdir(dir)) names.push_back(absl::StrCat("/", e->d_name));
  closedir(dir);
  int removed = 0;
  for (const std::string& name : names) {
    // Listed before the check: a pid reused since names a different object.
    int pid = 0;
    const size_t dash = name.find('-', sizeof(kPrefix) - 1);
    if (!ValidName(name) || dash == std::string::npos ||
        !absl::SimpleAtoi(name.substr(sizeof(kPrefix) - 1, dash - sizeof(kPrefix) + 1), &pid) ||
        pid <= 0) {
      continue;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH && shm_unlink(name.c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace psrt
