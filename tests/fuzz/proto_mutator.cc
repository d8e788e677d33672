#include "tests/fuzz/proto_mutator.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

namespace psrt::fuzz {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

namespace {
constexpr int kMaxDepth = 4;
}  // namespace

int64_t ProtoMutator::Int() {
  static const int64_t kInteresting[] = {0,   1,    -1,   2,     3,      7,      8,         63,
                                         64,  255,  256,  1024,  4096,   65535,  1 << 20,   INT32_MAX,
                                         INT32_MIN, INT64_MAX, INT64_MIN, int64_t{1} << 62, -(int64_t{1} << 40)};
  if (Below(3) == 0) return static_cast<int64_t>(rng_());
  return kInteresting[Below(sizeof(kInteresting) / sizeof(kInteresting[0]))];
}

double ProtoMutator::Double() {
  static const double kInteresting[] = {0.0,     -0.0,   1.0,   -1.0,  0.5,   1e-45, 1e30, -1e30, 1e308,
                                        -1e308, 1e-320, std::numeric_limits<double>::quiet_NaN(),
                                        std::numeric_limits<double>::infinity(),
                                        -std::numeric_limits<double>::infinity()};
  if (Below(3) == 0) return std::ldexp(static_cast<double>(rng_() % 2001) - 1000.0, static_cast<int>(Below(40)) - 20);
  return kInteresting[Below(sizeof(kInteresting) / sizeof(kInteresting[0]))];
}

std::string ProtoMutator::Bytes(const std::string& from) {
  std::string s = from;
  switch (Below(6)) {
    case 0:
      return "";
    case 1:  // random bytes, sometimes long
      s.resize(Below(2) == 0 ? Below(16) : Below(1 << 12));
      for (char& c : s) c = static_cast<char>(rng_());
      return s;
    case 2:  // flip a byte
      if (!s.empty()) s[Below(s.size())] ^= static_cast<char>(1 + Below(255));
      return s;
    case 3:  // grow
      s.append(Below(64), static_cast<char>(rng_()));
      return s;
    case 4:  // cut
      s.resize(Below(s.size() + 1));
      return s;
    default:  // printable
      s.resize(Below(300));
      for (char& c : s) c = static_cast<char>(' ' + Below(95));
      return s;
  }
}

std::string ProtoMutator::Text(const FieldDescriptor* f, std::string s) {
  // A proto3 string must be UTF-8 or the whole message is refused before any
  // handler sees it: mostly keep string fields ASCII, now and then not.
  if (f->type() != FieldDescriptor::TYPE_STRING || Below(8) == 0) return s;
  for (char& c : s) c = static_cast<char>(static_cast<unsigned char>(c) & 0x7f);
  return s;
}

void ProtoMutator::Mutate(Message* m) { Mutate(m, 0); }

void ProtoMutator::Mutate(Message* m, int depth) {
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  if (d->field_count() == 0) return;
  const FieldDescriptor* f = d->field(static_cast<int>(Below(d->field_count())));
  if (f->is_repeated()) {
    MutateRepeated(m, f, depth);
  } else {
    MutateField(m, f, depth);
  }
}

void ProtoMutator::MutateField(Message* m, const FieldDescriptor* f, int depth) {
  const Reflection* r = m->GetReflection();
  if (Below(8) == 0) {
    r->ClearField(m, f);
    return;
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      r->SetInt32(m, f, static_cast<int32_t>(Int()));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(m, f, Int());
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      r->SetUInt32(m, f, static_cast<uint32_t>(Int()));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      r->SetUInt64(m, f, static_cast<uint64_t>(Int()));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(m, f, Double());
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      r->SetFloat(m, f, static_cast<float>(Double()));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      r->SetBool(m, f, !r->GetBool(*m, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      r->SetEnumValue(m, f, static_cast<int>(Int() % 8));  // proto3 enums are open
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(m, f, Text(f, Bytes(r->GetString(*m, f))));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      if (depth < kMaxDepth) Mutate(r->MutableMessage(m, f), depth + 1);
      break;
  }
}

void ProtoMutator::MutateRepeated(Message* m, const FieldDescriptor* f, int depth) {
  const Reflection* r = m->GetReflection();
  const int n = r->FieldSize(*m, f);
  const uint64_t choice = Below(4);
  if (choice == 0 && n > 0) {  // drop the last (or all)
    if (Below(4) == 0) {
      r->ClearField(m, f);
    } else {
      r->RemoveLast(m, f);
    }
    return;
  }
  if (choice == 1 && n > 0 && f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {  // a copy
    Message* copy = r->AddMessage(m, f);
    copy->CopyFrom(r->GetRepeatedMessage(*m, f, static_cast<int>(Below(n))));
    return;
  }
  if (choice == 2 && n > 0) {  // change one element
    const int i = static_cast<int>(Below(n));
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->SetRepeatedInt32(m, f, i, static_cast<int32_t>(Int())); return;
      case FieldDescriptor::CPPTYPE_INT64: r->SetRepeatedInt64(m, f, i, Int()); return;
      case FieldDescriptor::CPPTYPE_UINT32: r->SetRepeatedUInt32(m, f, i, static_cast<uint32_t>(Int())); return;
      case FieldDescriptor::CPPTYPE_UINT64: r->SetRepeatedUInt64(m, f, i, static_cast<uint64_t>(Int())); return;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->SetRepeatedDouble(m, f, i, Double()); return;
      case FieldDescriptor::CPPTYPE_FLOAT: r->SetRepeatedFloat(m, f, i, static_cast<float>(Double())); return;
      case FieldDescriptor::CPPTYPE_BOOL: r->SetRepeatedBool(m, f, i, !r->GetRepeatedBool(*m, f, i)); return;
      case FieldDescriptor::CPPTYPE_ENUM: r->SetRepeatedEnumValue(m, f, i, static_cast<int>(Int() % 8)); return;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetRepeatedString(m, f, i, Text(f, Bytes(r->GetRepeatedString(*m, f, i))));
        return;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth < kMaxDepth) Mutate(r->MutableRepeatedMessage(m, f, i), depth + 1);
        return;
    }
  }
  // Add an element.
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: r->AddInt32(m, f, static_cast<int32_t>(Int())); break;
    case FieldDescriptor::CPPTYPE_INT64: r->AddInt64(m, f, Int()); break;
    case FieldDescriptor::CPPTYPE_UINT32: r->AddUInt32(m, f, static_cast<uint32_t>(Int())); break;
    case FieldDescriptor::CPPTYPE_UINT64: r->AddUInt64(m, f, static_cast<uint64_t>(Int())); break;
    case FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(m, f, Double()); break;
    case FieldDescriptor::CPPTYPE_FLOAT: r->AddFloat(m, f, static_cast<float>(Double())); break;
    case FieldDescriptor::CPPTYPE_BOOL: r->AddBool(m, f, Below(2) == 0); break;
    case FieldDescriptor::CPPTYPE_ENUM: r->AddEnumValue(m, f, static_cast<int>(Int() % 8)); break;
    case FieldDescriptor::CPPTYPE_STRING: r->AddString(m, f, Text(f, Bytes(""))); break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      if (depth < kMaxDepth) Mutate(r->AddMessage(m, f), depth + 1);
      break;
  }
}

}  // namespace psrt::fuzz
