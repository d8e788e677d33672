#ifndef PSRT_SERVER_CHECKPOINT_STORAGE_H_
#define PSRT_SERVER_CHECKPOINT_STORAGE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace psrt {

// A checkpoint destination: a flat namespace of objects named by relative,
// '/'-separated paths under the URI the storage was opened on. Servers write
// their shards, then the coordinator writes the manifest (the commit point)
// and LATEST; that protocol is only safe because Put is atomic.
//
// Paths must be non-empty and relative, with no "", "." or ".." components
// (no leading/trailing or doubled '/'): a path can never escape the root.
// Implementations are safe to call from several threads at once.
class Storage {
 public:
  virtual ~Storage() = default;

  // Creates or replaces the object at `path`. Atomic: a reader sees either
  // the whole previous object (or none) or the whole new one, never a part,
  // even if the process or machine dies during the call. Durable on OK.
  virtual absl::Status Put(absl::string_view path, absl::string_view data) = 0;
  // The whole object; NOT_FOUND if there is none.
  virtual absl::StatusOr<std::string> Get(absl::string_view path) = 0;
  // Every object whose path starts with `prefix` (a plain string prefix, as
  // in S3; "" lists everything), as paths relative to the root, sorted.
  virtual absl::StatusOr<std::vector<std::string>> List(absl::string_view prefix) = 0;
  // Removes the object. Deleting a missing object is OK (as in S3), so that
  // an interrupted cleanup can simply be run again.
  virtual absl::Status Delete(absl::string_view path) = 0;
  virtual absl::StatusOr<bool> Exists(absl::string_view path) = 0;
  // Removes what Puts under `prefix` that never finished left behind: the
  // temporary files of a writer that died (POSIX), multipart uploads never
  // completed (S3). A Put under `prefix` still in flight fails instead, so
  // call it when none should be.
  virtual absl::Status RemoveUnfinished(absl::string_view prefix) = 0;

  // The URI this storage was opened on, for messages.
  virtual std::string uri() const = 0;
};

// Opens the destination named by `uri`:
//   file:///absolute/dir   POSIX files under /absolute/dir (created on the
//                          first Put if missing)
//   s3://bucket/prefix     OpenS3Storage
// Anything else is INVALID_ARGUMENT.
absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(absl::string_view uri);

// Checks an object path as described on Storage (what every backend accepts).
absl::Status ValidateObjectPath(absl::string_view path);

// s3://bucket/prefix on S3, or on an S3-compatible store named by
// AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL; credentials and region as the AWS
// tools find them (server/checkpoint/s3_client.h).
absl::StatusOr<std::unique_ptr<Storage>> OpenS3Storage(absl::string_view uri);

// The POSIX backend on directory `root` (absolute). OpenStorage("file://...")
// is the usual way in.
std::unique_ptr<Storage> NewPosixStorage(std::string root);

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_STORAGE_H_
