#include "common/buffer_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace psrt {

void Buffer::Unref() {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) pool_->Release(this);
}

BufferPool::BufferPool(size_t max_cached_bytes) : max_cached_bytes_(max_cached_bytes) {}

BufferPool::~BufferPool() {
  absl::MutexLock lock(&mu_);
  for (std::vector<Buffer*>& list : free_) {
    for (Buffer* b : list) {
      std::free(b->data());
      delete b;
    }
  }
}

BufferPool* BufferPool::Default() {
  static BufferPool* pool = new BufferPool();
  return pool;
}

BufferRef BufferPool::Get(size_t bytes) {
  int c = 0;
  while ((size_t{1} << (c + kMinShift)) < bytes && c + 1 < kClasses) ++c;
  {
    absl::MutexLock lock(&mu_);
    if (!free_[c].empty()) {
      Buffer* b = free_[c].back();
      free_[c].pop_back();
      cached_bytes_ -= b->capacity();
      return BufferRef(b);
    }
  }
  const size_t capacity = size_t{1} << (c + kMinShift);
  char* data = static_cast<char*>(std::aligned_alloc(64, capacity));
  if (data == nullptr) throw std::bad_alloc();
  // Pre-fault now (and ask for huge pages where the kernel has them), so
  // the hot path never pays the first touch.
  if (capacity >= (size_t{2} << 20)) madvise(data, capacity, MADV_HUGEPAGE);
  for (size_t i = 0; i < capacity; i += 4096) data[i] = 0;
  made_.fetch_add(1, std::memory_order_relaxed);
  return BufferRef(new Buffer(this, data, capacity, c));
}

void BufferPool::Release(Buffer* b) {
  {
    absl::MutexLock lock(&mu_);
    if (cached_bytes_ + b->capacity() <= max_cached_bytes_) {
      cached_bytes_ += b->capacity();
      free_[b->size_class_].push_back(b);
      return;
    }
  }
  std::free(b->data());
  delete b;
}

}  // namespace psrt
