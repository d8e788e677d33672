#include "worker/state_keys.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace psrt {

namespace {

constexpr int kFirstChunkLog2 = 14;    // 48 KiB of state
constexpr int kMaxChunks = 36;         // 3 * 2^50 bytes: any state
constexpr int kHeaderValues = 3;       // the size: bits 0-23, 24-47, 48-63
constexpr float kLimit = 16777216.0f;  // 2^24

int64_t ChunkValues(int i) { return int64_t{1} << (kFirstChunkLog2 + i); }
// The values of chunks [0, n).
int64_t Capacity(int n) { return (int64_t{1} << kFirstChunkLog2) * ((int64_t{1} << n) - 1); }

// The chunks that hold `values` (one past kMaxChunks where none do).
int ChunksFor(int64_t values) {
  int n = 0;
  while (n <= kMaxChunks && Capacity(n) < values) ++n;
  return n;
}

std::string ChunkName(const std::string& name, int i) { return absl::StrCat(name, "@state/", i); }

bool Whole(float v) {
  return v >= 0.0f && v < kLimit && static_cast<float>(static_cast<int64_t>(v)) == v;
}

}  // namespace

absl::Status StateKeys::Register(const std::string& key, int64_t size, float* data) {
  return client_->RegisterVariable(key, {size}, data, DefaultOptimizer(OptimizerKind::kHold, 0.0),
                                   Compression::kNone, Compression::kNone);
}

absl::Status StateKeys::Grow(const std::string& name, Keys* keys, int n) {
  if (n > kMaxChunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("state '", name, "' needs ", n, " chunks; at most ", kMaxChunks));
  }
  for (int i = keys->chunks; i < n; ++i) {
    keys->values.resize(Capacity(i + 1), 0.0f);
    if (absl::Status s =
            Register(ChunkName(name, i), ChunkValues(i), keys->values.data() + Capacity(i));
        !s.ok()) {
      return s;
    }
    keys->chunks = i + 1;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> StateKeys::Load(const std::string& name) {
  if (name.empty() || name.find('@') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("a state's name is not empty and has no '@' (got '", name, "')"));
  }
  absl::MutexLock lock(&mu_);
  if (keys_.contains(name)) {
    return absl::FailedPreconditionError(absl::StrCat("state '", name, "' was loaded already"));
  }
  Keys keys;
  keys.header.assign(kHeaderValues, 0.0f);
  if (absl::Status s = Register(name + "@state", kHeaderValues, keys.header.data()); !s.ok())
    return s;
  uint64_t bytes = 0;
  for (int i = 0; i < kHeaderValues; ++i) {
    if (!Whole(keys.header[i])) {
      return absl::DataLossError(
          absl::StrCat("state '", name, "': its size is not one psrt wrote"));
    }
    bytes |= static_cast<uint64_t>(keys.header[i]) << (24 * i);
  }
  if (bytes == 0 && client_->restored_step() > 0) {
    // Its job saved none: the workers would start over from what the
    // servers hold, silently.
    return absl::FailedPreconditionError(absl::StrCat(
        "the job restored step ", client_->restored_step(), ", but its checkpoint holds no state '",
        name, "' of an optimizer on the workers"));
  }
  if (absl::Status s = Grow(name, &keys, ChunksFor((static_cast<int64_t>(bytes) + 2) / 3)); !s.ok())
    return s;
  std::string out(bytes, '\0');
  for (uint64_t j = 0; j < bytes; j += 3) {
    const float v = keys.values[j / 3];
    if (!Whole(v)) {
      return absl::DataLossError(
          absl::StrCat("state '", name, "': value ", j / 3, " is not one psrt wrote"));
    }
    const uint32_t word = static_cast<uint32_t>(v);
    for (uint64_t b = 0; b < 3 && j + b < bytes; ++b)
      out[j + b] = static_cast<char>(word >> (8 * b));
  }
  keys_.emplace(name, std::move(keys));
  return out;
}

absl::Status StateKeys::Save(const std::string& name, absl::string_view bytes, int64_t step) {
  if (client_->rank() != 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(name);
  if (it == keys_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("state '", name, "' is saved after it is loaded (every worker, at start)"));
  }
  Keys& keys = it->second;
  // Grows only: a state that shrank keeps its chunks (pushed as zeros).
  if (absl::Status s = Grow(name, &keys, ChunksFor((static_cast<int64_t>(bytes.size()) + 2) / 3));
      !s.ok())
    return s;
  for (int64_t i = 0; i < Capacity(keys.chunks); ++i) {
    uint32_t word = 0;
    for (int64_t b = 0; b < 3 && 3 * i + b < static_cast<int64_t>(bytes.size()); ++b)
      word |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[3 * i + b])) << (8 * b);
    keys.values[i] = static_cast<float>(word);
  }
  const uint64_t size = bytes.size();
  for (int i = 0; i < kHeaderValues; ++i)
    keys.header[i] = static_cast<float>((size >> (24 * i)) & 0xffffff);
  // Every chunk, the unused ones too, reaches the step with the size.
  std::vector<TensorRef> refs;
  for (int i = 0; i < keys.chunks; ++i)
    refs.push_back({ChunkName(name, i), keys.values.data() + Capacity(i), nullptr});
  refs.push_back({name + "@state", keys.header.data(), nullptr});
  return client_->Wait(client_->Push(std::move(refs), step));
}

}  // namespace psrt
