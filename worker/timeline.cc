// Copyright 2024 The psrt Authors.

#include "worker/timeline.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace psrt {
namespace {

// Buffered events are written out once they reach this size.
constexpr size_t kChunkBytes = 1 << 20;

// Timelines still open, closed at exit: a training script rarely destroys its
// client before the interpreter ends. Never freed, so it outlives them all.
struct OpenTimelines {
  absl::Mutex mu;
  absl::flat_hash_set<Timeline*> live ABSL_GUARDED_BY(mu);
};

OpenTimelines& Registry() {
  static OpenTimelines* const registry = [] {
    auto* r = new OpenTimelines;
    std::atexit([] {
      OpenTimelines& all = Registry();
      absl::MutexLock lock(&all.mu);
      for (Timeline* t : all.live) t->Close().IgnoreError();
    });
    return r;
  }();
  return *registry;
}

}  // namespace

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string Timeline::PathForRank(const std::string& path, int rank) {
  if (rank == 0) return path;
  const size_t slash = path.rfind('/');
  const size_t name = slash == std::string::npos ? 0 : slash + 1;
  size_t dot = path.rfind('.');
  if (dot == std::string::npos || dot <= name) dot = path.size();  // no extension
  return absl::StrCat(path.substr(0, dot), ".rank", rank, path.substr(dot));
}

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Open(const std::string& path, int rank) {
  const std::string file_path = PathForRank(path, rank);
  std::FILE* file = std::fopen(file_path.c_str(), "w");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("PSRT_TIMELINE: cannot write '", file_path, "': ", std::strerror(errno)));
  }
  std::unique_ptr<Timeline> t(new Timeline(file_path, file, rank));
  OpenTimelines& all = Registry();
  absl::MutexLock lock(&all.mu);
  all.live.insert(t.get());
  return t;
}

Timeline::Timeline(std::string path, std::FILE* file, int rank)
    : path_(std::move(path)),
      rank_(rank),
      epoch_us_(absl::ToUnixMicros(absl::Now())),
      start_(std::chrono::steady_clock::now()),
      file_(file) {
  // The array's first element, so that every later event is ",\n{...}".
  absl::MutexLock lock(&mu_);
  buffer_ = absl::StrCat("[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", rank_,
                         ",\"args\":{\"name\":", JsonString(absl::StrCat("worker ", rank_)), "}}",
                         ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":", rank_,
                         ",\"args\":{\"sort_index\":", rank_, "}}");
}

Timeline::~Timeline() {
  Close().IgnoreError();
  OpenTimelines& all = Registry();
  absl::MutexLock lock(&all.mu);
  all.live.erase(this);
}

int64_t Timeline::NowMicros() const {
  return epoch_us_ + std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now() - start_)
                         .count();
}

void Timeline::Complete(absl::string_view name, int64_t tid, int64_t start_us, int64_t end_us,
                        absl::string_view args_json) {
  Append(absl::StrCat("{\"name\":", JsonString(name), ",\"ph\":\"X\",\"pid\":", rank_,
                      ",\"tid\":", tid, ",\"ts\":", start_us, ",\"dur\":",
                      std::max<int64_t>(0, end_us - start_us), ",\"args\":{", args_json, "}}"));
}

void Timeline::NameTrack(int64_t tid, absl::string_view name) {
  {
    absl::MutexLock lock(&mu_);
    if (!named_tracks_.insert(tid).second) return;
  }
  Append(absl::StrCat("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", rank_, ",\"tid\":", tid,
                      ",\"args\":{\"name\":", JsonString(name), "}}"));
}

void Timeline::Append(std::string event) {
  mu_.Lock();
  if (closed_) {
    mu_.Unlock();
    return;
  }
  absl::StrAppend(&buffer_, ",\n", event);
  if (buffer_.size() < kChunkBytes) {
    mu_.Unlock();
    return;
  }
  std::string chunk;
  chunk.swap(buffer_);
  // Hand over: the file lock before the buffer's, so chunks are written in
  // the order they were cut while other threads go on appending.
  file_mu_.Lock();
  mu_.Unlock();
  WriteLocked(chunk);
  file_mu_.Unlock();
}

void Timeline::WriteLocked(const std::string& chunk) {
  if (file_ == nullptr || !status_.ok()) return;
  if (std::fwrite(chunk.data(), 1, chunk.size(), file_) != chunk.size()) {
    status_ = absl::DataLossError(
        absl::StrCat("PSRT_TIMELINE: writing '", path_, "' failed: ", std::strerror(errno)));
  }
}

absl::Status Timeline::Close() {
  mu_.Lock();
  if (closed_) {
    mu_.Unlock();
    absl::MutexLock lock(&file_mu_);
    return status_;
  }
  closed_ = true;
  std::string chunk = std::exchange(buffer_, "");
  chunk += "\n]\n";
  file_mu_.Lock();
  mu_.Unlock();
  WriteLocked(chunk);
  if (file_ != nullptr && std::fclose(file_) != 0 && status_.ok()) {
    status_ = absl::DataLossError(
        absl::StrCat("PSRT_TIMELINE: closing '", path_, "' failed: ", std::strerror(errno)));
  }
  file_ = nullptr;
  absl::Status s = status_;
  file_mu_.Unlock();
  return s;
}

}  // namespace psrt
