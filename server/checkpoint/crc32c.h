#ifndef PSRT_SERVER_CHECKPOINT_CRC32C_H_
#define PSRT_SERVER_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace psrt {

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of every
// checkpoint record. `crc` is the value returned for the preceding bytes (0
// to start), so a checksum can be computed over several pieces:
//   Crc32c(b, nb, Crc32c(a, na)) == Crc32c(a+b).
// Uses the SSE4.2 crc32 instruction when the CPU has it, else a portable
// slicing-by-8 table; both give identical results.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t Crc32c(absl::string_view s, uint32_t crc = 0) {
  return Crc32c(s.data(), s.size(), crc);
}

namespace crc32c_internal {
// The two implementations, exposed so tests can check them against each
// other. Crc32cHardware must only be called when HaveSse42() is true.
uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc);
uint32_t Crc32cHardware(const void* data, size_t n, uint32_t crc);
bool HaveSse42();
}  // namespace crc32c_internal

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_CRC32C_H_
