#include "tests/fuzz/calls.h"

#include <cstring>
#include <memory>
#include <random>

#include <google/protobuf/stubs/logging.h>

#include "common/logging.h"
#include "tests/fuzz/proto_mutator.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace psrt::fuzz {

void QuietLogs() {
  SilenceLogs();
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
}

std::vector<Call> DecodeCalls(const uint8_t* data, size_t size) {
  std::vector<Call> calls;
  size_t at = 0;
  while (size - at >= 5) {
    uint32_t len;
    std::memcpy(&len, data + at + 1, 4);
    if (len > size - at - 5) break;
    calls.push_back({data[at], std::string(reinterpret_cast<const char*>(data + at + 5), len)});
    at += 5 + len;
  }
  return calls;
}

std::string EncodeCalls(const std::vector<Call>& calls) {
  std::string out;
  for (const Call& c : calls) {
    out.push_back(static_cast<char>(c.kind));
    const uint32_t len = static_cast<uint32_t>(c.bytes.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += c.bytes;
  }
  return out;
}

size_t MutateCalls(uint8_t* data, size_t size, size_t max_size, unsigned seed,
                   const std::vector<const google::protobuf::Message*>& prototypes) {
  std::mt19937 rng(seed);
  if (rng() % 10 == 0) return LLVMFuzzerMutate(data, size, max_size);
  std::vector<Call> calls = DecodeCalls(data, size);
  const uint8_t kinds = static_cast<uint8_t>(prototypes.size());
  const unsigned choice = rng() % 20;
  if (calls.empty() || choice < 3) {  // a new call
    calls.insert(calls.begin() + rng() % (calls.size() + 1), Call{static_cast<uint8_t>(rng() % kinds), ""});
  } else if (choice < 5) {
    calls.erase(calls.begin() + rng() % calls.size());
  } else if (choice < 7) {
    const Call copy = calls[rng() % calls.size()];
    calls.insert(calls.begin() + rng() % (calls.size() + 1), copy);
  } else if (choice < 8) {
    calls[rng() % calls.size()].kind = static_cast<uint8_t>(rng() % kinds);
  }
  if (calls.empty()) return size;
  Call& call = calls[rng() % calls.size()];
  call.kind %= kinds;
  std::unique_ptr<google::protobuf::Message> m(prototypes[call.kind]->New());
  if (!m->ParseFromString(call.bytes)) m->Clear();
  ProtoMutator mutator(rng());
  for (unsigned n = 1 + rng() % 3; n > 0; --n) mutator.Mutate(m.get());
  call.bytes = m->SerializeAsString();
  const std::string out = EncodeCalls(calls);
  if (out.size() > max_size) return size;  // unchanged
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

}  // namespace psrt::fuzz
