#ifndef PSRT_COMMON_BUFFER_POOL_H_
#define PSRT_COMMON_BUFFER_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace psrt {

class BufferPool;

// A reference-counted block of memory from a BufferPool; it goes back to the
// pool when the last reference is dropped. gRPC slices hold references, so
// a payload on its way out keeps its block alive without a copy.
class Buffer {
 public:
  char* data() const { return data_; }
  size_t capacity() const { return capacity_; }

  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref();

 private:
  friend class BufferPool;
  Buffer(BufferPool* pool, char* data, size_t capacity, int size_class)
      : pool_(pool), data_(data), capacity_(capacity), size_class_(size_class) {}

  std::atomic<int> refs_{0};
  BufferPool* const pool_;
  char* const data_;
  const size_t capacity_;
  const int size_class_;
};

// An owning handle on a Buffer (copies share the block).
class BufferRef {
 public:
  BufferRef() = default;
  explicit BufferRef(Buffer* b) : b_(b) {
    if (b_ != nullptr) b_->Ref();
  }
  BufferRef(const BufferRef& o) : BufferRef(o.b_) {}
  BufferRef(BufferRef&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
  BufferRef& operator=(BufferRef o) noexcept {
    std::swap(b_, o.b_);
    return *this;
  }
  ~BufferRef() {
    if (b_ != nullptr) b_->Unref();
  }

  char* data() const { return b_->data(); }
  size_t capacity() const { return b_->capacity(); }
  Buffer* get() const { return b_; }
  explicit operator bool() const { return b_ != nullptr; }

 private:
  Buffer* b_ = nullptr;
};

// Blocks of power-of-two sizes (from 4 KiB), reused instead of freed: fresh
// memory costs a page fault per 4 KiB on first touch, a hidden cost several
// times that of the copy it is for. New blocks are pre-faulted when made, and
// at most `max_cached_bytes` of idle blocks are kept. Thread-safe; blocks may
// be returned from any thread (gRPC's, when a slice is released). The pool
// must outlive every block it handed out.
class BufferPool {
 public:
  explicit BufferPool(size_t max_cached_bytes = size_t{1} << 30);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A block of at least `bytes` (contents unspecified).
  BufferRef Get(size_t bytes);

  // Blocks made so far (not reused), for tests and benchmarks.
  int64_t blocks_made() const { return made_.load(std::memory_order_relaxed); }
  // The process's pool, for payloads that have no other owner.
  static BufferPool* Default();

 private:
  friend class Buffer;
  void Release(Buffer* b);

  static constexpr int kMinShift = 12;
  static constexpr int kClasses = 40;
  const size_t max_cached_bytes_;
  absl::Mutex mu_;
  std::vector<Buffer*> free_[kClasses] ABSL_GUARDED_BY(mu_);
  size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> made_{0};
};

}  // namespace psrt

#endif  // PSRT_COMMON_BUFFER_POOL_H_
