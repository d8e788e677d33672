#include "common/key_map.h"

#include "absl/strings/str_cat.h"

namespace psrt {

uint64_t StableHash(absl::string_view s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string KeyName(absl::string_view variable, uint32_t partition) {
  return absl::StrCat(variable, "#", partition);
}

absl::StatusOr<std::vector<Partition>> PartitionVariable(
    absl::string_view name, int64_t num_elements, int64_t element_bytes,
    int64_t partition_bytes, int num_servers) {
  if (name.empty()) return absl::InvalidArgumentError("variable name is empty");
  if (num_elements <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variable '", name, "' has ", num_elements, " elements; need at least 1"));
  }
  if (element_bytes <= 0 || partition_bytes < element_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition size ", partition_bytes, " bytes cannot hold one element of ",
        element_bytes, " bytes"));
  }
  if (num_servers <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("need at least one server, have ", num_servers));
  }
  const int64_t per_part_max = partition_bytes / element_bytes;
  const int64_t parts = (num_elements + per_part_max - 1) / per_part_max;
  if (parts > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "variable '", name, "' would need ", parts, " partitions"));
  }
  // Equal-sized partitions load the servers evenly.
  const int64_t per_part = (num_elements + parts - 1) / parts;
  const int first = static_cast<int>(StableHash(name) % num_servers);
  std::vector<Partition> out;
  out.reserve(parts);
  for (int64_t p = 0; p < parts; ++p) {
    Partition part;
    part.index = static_cast<uint32_t>(p);
    part.offset = p * per_part;
    part.num_elements = std::min(per_part, num_elements - part.offset);
    part.server = static_cast<int>((first + p) % num_servers);
    out.push_back(part);
  }
  return out;
}

}  // namespace psrt
