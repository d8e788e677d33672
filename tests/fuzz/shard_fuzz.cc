// The checkpoint shard reader on arbitrary bytes: it refuses what it cannot
// read with an error and never crashes, over-allocates or reads past the
// end; what it accepts encodes back to a shard that decodes to the same.

#include <cstdlib>
#include <string>

#include "server/checkpoint/shard_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<psrt::KeyRecord>> records = psrt::DecodeShard(bytes, "fuzz");
  if (!records.ok()) return 0;
  absl::StatusOr<std::vector<psrt::KeyRecord>> again = psrt::DecodeShard(psrt::EncodeShard(*records), "again");
  if (!again.ok() || *again != *records) std::abort();
  return 0;
}
