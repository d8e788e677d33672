#ifndef PSRT_COMMON_SHARED_MEMORY_H_
#define PSRT_COMMON_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace psrt {

// A POSIX shared-memory object mapped into this process: how a worker and a
// server on one host hand tensors to each other without the TCP stack. The
// worker creates it (owner-only, sparse: offering it to a server on another
// host costs nothing), the server attaches by name, the worker unlinks the
// name and, once a server took it, reserves its pages (a full /dev/shm is an
// error then rather than a SIGBUS later). From then on only the two
// mappings hold it, and it goes when both processes have.
class SharedRegion {
 public:
  // A new object "/psrt-<pid>-<random>" of `bytes`, mapped read-write, no
  // page of it allocated yet. The pid lets SweepSharedMemory tell whose it is.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Create(size_t bytes);
  // Maps the object `name` made by another process of this user. Refused
  // unless the name is one Create makes, the object is owned by this
  // process's user with no permission for anyone else, and it has exactly
  // `bytes`.
  static absl::StatusOr<std::unique_ptr<SharedRegion>> Attach(const std::string& name,
                                                              size_t bytes);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  // Removes the name (the mappings stay valid). Idempotent.
  void Unlink();
  // Allocates every page of a region this process created (posix_fallocate):
  // UNAVAILABLE, saying why, when /dev/shm cannot hold it.
  absl::Status Reserve();

  char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // Whether [offset, offset + bytes) lies inside the region.
  bool Contains(int64_t offset, int64_t bytes) const {
    return offset >= 0 && bytes >= 0 && static_cast<uint64_t>(offset) <= size_ &&
           static_cast<uint64_t>(bytes) <= size_ - static_cast<uint64_t>(offset);
  }

 private:
  SharedRegion(std::string name, char* data, size_t size, bool linked, int fd)
      : name_(std::move(name)), data_(data), size_(size), linked_(linked), fd_(fd) {}

  const std::string name_;
  char* const data_;
  const size_t size_;
  bool linked_;  // the name still exists and is ours to remove
  int fd_;       // the creator's descriptor, for Reserve (-1: none)
};

// Removes the names of psrt objects whose creating process has ended: a
// worker killed between creating a region and a server taking it would
// otherwise leave it in /dev/shm until reboot. Mappings stay valid, and a
// living process's objects are not touched. Returns how many it removed.
int SweepSharedMemory();

}  // namespace psrt

#endif  // PSRT_COMMON_SHARED_MEMORY_H_
