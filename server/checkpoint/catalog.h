#ifndef PSRT_SERVER_CHECKPOINT_CATALOG_H_
#define PSRT_SERVER_CHECKPOINT_CATALOG_H_

// The layout of checkpoints under a root URI, and the operations on it that
// the coordinator, the servers and psrt-ckpt share:
//
//   ROOT/LATEST                                  name of the newest committed one
//   ROOT/step-000000000120/shard-00001-of-00003.psrt   one per server
//   ROOT/step-000000000120/MANIFEST.json         written last: the commit point
//
// A folder without MANIFEST.json is not a checkpoint (a crash left it half
// written) and nothing reads it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "psrt/v1/ps.pb.h"
#include "server/checkpoint/storage.h"

namespace psrt {

inline constexpr char kManifestFile[] = "MANIFEST.json";
inline constexpr char kLatestFile[] = "LATEST";
inline constexpr int kManifestFormatVersion = 1;

std::string CheckpointName(int64_t step);  // "step-000000000120"
std::string ShardPath(absl::string_view name, int index, int count);
std::string ManifestPath(absl::string_view name);

// "/abs/path" becomes "file:///abs/path"; URIs are returned as they are.
std::string NormalizeUri(absl::string_view uri_or_path);

absl::StatusOr<v1::Manifest> ReadManifest(Storage* root, absl::string_view name);
// A manifest's JSON text, checked (CheckManifest); `where` names it in errors.
absl::StatusOr<v1::Manifest> ParseManifest(absl::string_view text, absl::string_view where);
absl::Status WriteManifest(Storage* root, const v1::Manifest& manifest);
// Structure only (no shard is read): format version, shard indices, and that
// each variable's keys tile it exactly. DATA_LOSS naming what is wrong.
absl::Status CheckManifest(const v1::Manifest& manifest, absl::string_view where);

// A committed checkpoint, opened.
struct CheckpointRef {
  std::unique_ptr<Storage> root;
  std::string name;
  v1::Manifest manifest;
  std::string uri() const;  // ROOT/name
};

// The checkpoint a job's "restore" setting names: "latest" or a step number
// under `root_uri`, or a checkpoint's own URI (or absolute path). Errors say
// what exists instead (NOT_FOUND), or why the storage cannot be read.
absl::StatusOr<CheckpointRef> ResolveCheckpoint(absl::string_view restore,
                                                absl::string_view root_uri);
// The checkpoint at `uri` (ROOT/name).
absl::StatusOr<CheckpointRef> OpenCheckpoint(absl::string_view uri);

struct CheckpointEntry {
  std::string name;
  bool committed = false;  // has a manifest
  bool latest = false;     // LATEST names it
  v1::Manifest manifest;   // when committed
};
// Every checkpoint folder under the root, oldest first, with the manifests
// of the committed ones (read and checked).
absl::StatusOr<std::vector<CheckpointEntry>> ListCheckpoints(Storage* root);
// LATEST's content; NOT_FOUND when there is none.
absl::StatusOr<std::string> ReadLatest(Storage* root);

struct VerifyReport {
  int64_t shards = 0;
  int64_t records = 0;
  int64_t bytes = 0;
};
// Reads every shard of a checkpoint: its size and CRC32C against the
// manifest, every record's checksum, and that the records are the keys the
// manifest lists. The first problem is DATA_LOSS naming the file and record.
absl::StatusOr<VerifyReport> VerifyCheckpoint(Storage* root, const v1::Manifest& manifest);

// Reads one shard and checks its size and CRC32C against the manifest.
absl::StatusOr<std::string> ReadShard(Storage* root, const v1::Manifest& manifest, int index);

// Keeps the newest `keep` committed checkpoints (all if keep <= 0) and
// removes the rest, and removes folders a crash left without a manifest,
// except `in_progress`. A checkpoint's manifest goes first, so an
// interrupted removal never leaves something that looks committed. Last it
// removes what interrupted writes left (Storage::RemoveUnfinished), so call
// it when no write to `root` is in flight, as the coordinator does right
// after a commit.
absl::Status PruneCheckpoints(Storage* root, int keep, absl::string_view in_progress);

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_CATALOG_H_
