#ifndef PSRT_TESTS_FUZZ_PROTO_MUTATOR_H_
#define PSRT_TESTS_FUZZ_PROTO_MUTATOR_H_

// Structure-aware mutation of protobuf messages through reflection, as
// libprotobuf-mutator does (Debian does not package it): each call changes
// one field somewhere in the message tree to a value chosen to reach edge
// cases (0, -1, the extremes, NaN, long or binary strings, extra or missing
// repeated elements), so the mutated request still decodes and reaches the
// handler's checks instead of dying in the parser.

#include <cstdint>
#include <random>
#include <string>

#include <google/protobuf/message.h>

namespace psrt::fuzz {

class ProtoMutator {
 public:
  explicit ProtoMutator(uint64_t seed) : rng_(seed) {}
  void Mutate(google::protobuf::Message* m);

 private:
  void MutateField(google::protobuf::Message* m, const google::protobuf::FieldDescriptor* f, int depth);
  void MutateRepeated(google::protobuf::Message* m, const google::protobuf::FieldDescriptor* f, int depth);
  void Mutate(google::protobuf::Message* m, int depth);
  int64_t Int();
  double Double();
  std::string Bytes(const std::string& from);
  std::string Text(const google::protobuf::FieldDescriptor* f, std::string s);
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  std::mt19937_64 rng_;
};

}  // namespace psrt::fuzz

#endif  // PSRT_TESTS_FUZZ_PROTO_MUTATOR_H_
