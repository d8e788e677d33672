#ifndef PSRT_COMMON_KEY_MAP_H_
#define PSRT_COMMON_KEY_MAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace psrt {

// One key: a contiguous slice of a variable's flattened elements, held by
// one server.
struct Partition {
  uint32_t index = 0;
  int64_t offset = 0;        // first element
  int64_t num_elements = 0;
  int server = 0;
};

// Cuts a variable of `num_elements` elements of `element_bytes` each into
// partitions of at most `partition_bytes` (equal sizes, the last one
// shorter) and spreads them round-robin over `num_servers` servers starting
// at a server chosen by the variable's name. Every process computes the same
// map from the same inputs, so no key directory is ever sent.
absl::StatusOr<std::vector<Partition>> PartitionVariable(
    absl::string_view name, int64_t num_elements, int64_t element_bytes,
    int64_t partition_bytes, int num_servers);

// 64-bit FNV-1a: stable across processes, builds and machines.
uint64_t StableHash(absl::string_view s);

// The name of a key in messages and errors: "variable#partition".
std::string KeyName(absl::string_view variable, uint32_t partition);

// "replicas": 1: the server that keeps copies of server `server`'s keys, on
// the next host where there is one (same slot), else the next server.
inline int BackupServer(int server, int num_servers, int servers_per_host) {
  const int step = servers_per_host < num_servers ? servers_per_host : 1;
  return (server + step) % num_servers;
}

// "max_servers": the server that serves server `server`'s keys at the start
// of a job that starts `started` of its servers (the others join later).
inline int InitialServer(int server, int started) {
  return started <= 0 || server < started ? server : server % started;
}

}  // namespace psrt

#endif  // PSRT_COMMON_KEY_MAP_H_
