#ifndef PSRT_SERVER_CHECKPOINT_SHARD_FORMAT_H_
#define PSRT_SERVER_CHECKPOINT_SHARD_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace psrt {

// One key's state in a checkpoint: enough to rebuild it on any server, also
// after re-partitioning onto a different number of servers (offset and
// num_elements place the slice within its variable).
struct KeyRecord {
  std::string variable;
  uint32_t partition = 0;
  int64_t offset = 0;  // first element within the variable
  int64_t num_elements = 0;
  int64_t version = 0;
  double learning_rate = 0;
  std::string optimizer;  // e.g. "adam"; empty if none
  // Optimizer step counters (e.g. the update count driving bias correction).
  std::vector<int64_t> step_counters;
  std::vector<float> weights;             // num_elements values
  std::vector<std::vector<float>> slots;  // each num_elements values
  // Sparse tables: the ids of the rows that weights and slots hold, row
  // after row (num_elements = ids * dim), and per row 3 counters: the step
  // it was last seen at, the step it was made at, and its pushes.
  std::vector<int64_t> row_ids;
  std::vector<int64_t> row_stats;

  bool operator==(const KeyRecord& o) const;  // bitwise on the floats
};

// On-disk layout of one server's shard file (all integers little-endian):
//   header : "PSRTSHRD" | u32 format version (kShardFormatVersion) | u32 flags (0)
//   records: per key  u64 body length | body | u32 CRC32C(length and body)
//     body : u32 len, variable | u32 partition | i64 offset |
//            i64 num_elements | i64 version | f64 learning_rate |
//            u32 len, optimizer | u32 n, i64 step_counters[n] |
//            f32 weights[num_elements] | u32 slots, f32 [num_elements] each |
//            (version 2) u64 rows, i64 row_ids[rows], i64 row_stats[3 * rows]
//   trailer: "PSRTTRLR" | u64 record count | u32 CRC32C(header, trailer so far)
// Each record checks itself, so a corrupt shard names the key that is bad;
// the trailer makes a truncated file (missing whole records) detectable.
inline constexpr char kShardMagic[] = "PSRTSHRD";
inline constexpr uint32_t kShardFormatVersion = 2;  // version 1 (no rows) is read too

// Records with more slots are rejected (every optimizer keeps a few).
inline constexpr uint32_t kMaxSlots = 16;

// Encodes the records. Each record's weights and slots must hold
// num_elements values (checked by DecodeShard, not here: callers build
// records from consistent stored keys).
std::string EncodeShard(const std::vector<KeyRecord>& records);
// The same into `out`, reusing its capacity (servers encode every checkpoint
// into one buffer).
void EncodeShardTo(absl::Span<const KeyRecord* const> records, std::string* out);

// Appends row `row` of a table's record `src` (rows of `dim` values) to
// `dst`: its id, counters, values and slots (dst has src's slot count).
// num_elements is left to the caller, once its rows are in.
void AppendRow(const KeyRecord& src, size_t row, size_t dim, KeyRecord* dst);

// Decodes and verifies a whole shard. `name_for_errors` (a file or URI)
// starts every error message. DATA_LOSS for truncation or a checksum
// mismatch, INVALID_ARGUMENT for bad magic or sizes that do not add up,
// UNIMPLEMENTED for a newer format version. Never trusts a length field
// beyond the bytes actually present, so garbage cannot make it over-allocate.
absl::StatusOr<std::vector<KeyRecord>> DecodeShard(absl::string_view bytes,
                                                   absl::string_view name_for_errors);

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_SHARD_FORMAT_H_
