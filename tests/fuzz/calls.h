#ifndef PSRT_TESTS_FUZZ_CALLS_H_
#define PSRT_TESTS_FUZZ_CALLS_H_

// A fuzz input that is a sequence of RPC calls: records of
// [u8 kind][u32 length, little-endian][a serialized request of that kind],
// and the structure-aware mutator over it (tests/fuzz/proto_mutator.h).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/message.h>

namespace psrt::fuzz {

struct Call {
  uint8_t kind = 0;
  std::string bytes;
};

// For LLVMFuzzerInitialize: psrt's and protobuf's log lines off (millions
// of refused inputs would otherwise be logged).
void QuietLogs();

// Stops at the first incomplete record.
std::vector<Call> DecodeCalls(const uint8_t* data, size_t size);
std::string EncodeCalls(const std::vector<Call>& calls);

// LLVMFuzzerCustomMutator's work: adds, removes, copies or re-kinds calls,
// or mutates one call's decoded request (`prototypes[kind]` is its type);
// now and then hands the raw bytes to libFuzzer's own mutator.
size_t MutateCalls(uint8_t* data, size_t size, size_t max_size, unsigned seed,
                   const std::vector<const google::protobuf::Message*>& prototypes);

}  // namespace psrt::fuzz

#endif  // PSRT_TESTS_FUZZ_CALLS_H_
