#include "server/checkpoint/crc32c.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define PSRT_CRC32C_X86 1
#endif

namespace psrt {
namespace crc32c_internal {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, bit-reflected

// kTable[k][b]: the CRC of byte b followed by k zero bytes; lets the portable
// path fold 8 input bytes per step instead of one (slicing-by-8).
struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    }
  }
};

const Tables& GetTables() {
  static const Tables* const tables = new Tables();
  return *tables;
}

inline uint64_t LoadLE64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

}  // namespace

uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc) {
  const auto& t = GetTables().t;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    const uint64_t v = LoadLE64(p) ^ c;
    c = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
        t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

#ifdef PSRT_CRC32C_X86
// Compiled for SSE4.2 as a single function (not the whole file), so the rest
// of the binary still runs on CPUs without it; only called after HaveSse42().
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(const void* data, size_t n,
                                                          uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t c = static_cast<uint32_t>(~crc);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#else
uint32_t Crc32cHardware(const void* data, size_t n, uint32_t crc) {
  return Crc32cPortable(data, n, crc);
}
bool HaveSse42() { return false; }
#endif

}  // namespace crc32c_internal

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  // The choice is made once; the static is thread-safe to initialize.
  using Fn = uint32_t (*)(const void*, size_t, uint32_t);
  static const Fn fn = crc32c_internal::HaveSse42() ? &crc32c_internal::Crc32cHardware
                                                    : &crc32c_internal::Crc32cPortable;
  return fn(data, n, crc);
}

}  // namespace psrt
