// Copyright 2024 The psrt Authors.
//
// A worker's timeline (PSRT_TIMELINE=path.json): its pushes, pulls and waits
// as Chrome trace format events, which Perfetto (ui.perfetto.dev) and
// chrome://tracing open, as Horovod's and BytePS's timelines.
//
// The file is a JSON array of events: "X" (complete) events with ts and dur
// in microseconds, pid = the worker's rank, and "M" metadata naming the
// process and its tracks. Events are buffered and written in chunks of about
// 1 MiB, so memory stays bounded however long the job runs; Close() (the
// client's destructor, or the process's exit) writes the rest and the closing
// bracket. A process killed before that leaves the bracket out, which the
// Chrome trace format allows.

#ifndef PSRT_WORKER_TIMELINE_H_
#define PSRT_WORKER_TIMELINE_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace psrt {

class Timeline {
 public:
  // The file rank `rank` writes when PSRT_TIMELINE is `path`: rank 0 writes
  // `path` itself, rank R > 0 inserts ".rank<R>" before the extension of the
  // file's name ("t.json" -> "t.rank3.json"; "trace" -> "trace.rank3").
  static std::string PathForRank(const std::string& path, int rank);

  // Creates (truncates) PathForRank(path, rank). INVALID_ARGUMENT naming the
  // file when it cannot be written.
  static absl::StatusOr<std::unique_ptr<Timeline>> Open(const std::string& path, int rank);

  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Microseconds on the timeline's clock: monotonic (durations are never
  // negative), and counted from the Unix epoch as of Open(), so that the
  // files of ranks on one host (or hosts with synchronised clocks) line up.
  int64_t NowMicros() const;

  // A complete event ("X") from start_us to end_us on track `tid`.
  // `args_json` is a JSON object's members without braces ("" for none).
  void Complete(absl::string_view name, int64_t tid, int64_t start_us, int64_t end_us,
                absl::string_view args_json);

  // Names track `tid` ("thread_name" metadata) the first time it is asked.
  void NameTrack(int64_t tid, absl::string_view name);

  // Writes the buffered events and closes the array; events after that are
  // dropped. Safe to call more than once; the first call's outcome counts.
  absl::Status Close();

  const std::string& path() const { return path_; }

 private:
  Timeline(std::string path, std::FILE* file, int rank);

  // Appends one event (its JSON object) and writes the buffer out once it is
  // large.
  void Append(std::string event);
  // Writes `chunk` (under file_mu_, taken while mu_ is held, so chunks keep
  // their order).
  void WriteLocked(const std::string& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(file_mu_);

  const std::string path_;
  const int rank_;
  const int64_t epoch_us_;  // Unix time at Open()
  const std::chrono::steady_clock::time_point start_;

  absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(file_mu_);
  std::string buffer_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<int64_t> named_tracks_ ABSL_GUARDED_BY(mu_);

  absl::Mutex file_mu_;
  std::FILE* file_ ABSL_GUARDED_BY(file_mu_);
  absl::Status status_ ABSL_GUARDED_BY(file_mu_);
};

// `s` as a JSON string literal, quotes included.
std::string JsonString(absl::string_view s);

}  // namespace psrt

#endif  // PSRT_WORKER_TIMELINE_H_
