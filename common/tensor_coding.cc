#include "common/tensor_coding.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/compression.h"

namespace psrt {
namespace {

// Protobuf wire types.
constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kLen = 2;
constexpr int kFixed32 = 5;

// Field numbers of psrt.v1.KeyData.
enum KeyField {
  kVariable = 1,
  kPartition = 2,
  kVersion = 3,
  kDType = 4,
  kData = 5,
  kScale = 6,
  kNonfinite = 7,
  kPullDType = 8,
  kShared = 9,
  kIds = 10,
  kNoGradient = 11,
};

// ---- Writing --------------------------------------------------------------

int VarintSize(uint64_t v) {
  int n = 1;
  while (v >= 0x80) v >>= 7, ++n;
  return n;
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(std::string* out, int field, int wire_type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

// Scalars as protobuf writes them: proto3 leaves default values out.
void PutVarintField(std::string* out, int field, uint64_t v) {
  if (v == 0) return;
  PutTag(out, field, kVarint);
  PutVarint(out, v);
}

// The fields of a KeyData other than its data.
void PutKeyHeader(std::string* out, const OutKey& k) {
  if (!k.variable.empty()) {
    PutTag(out, kVariable, kLen);
    PutVarint(out, k.variable.size());
    out->append(k.variable.data(), k.variable.size());
  }
  PutVarintField(out, kPartition, k.partition);
  PutVarintField(out, kVersion, static_cast<uint64_t>(k.version));
  PutVarintField(out, kDType, static_cast<uint64_t>(static_cast<int64_t>(k.dtype)));
  if (k.scale != 0) {
    PutTag(out, kScale, kFixed32);
    char b[4];
    std::memcpy(b, &k.scale, 4);  // little-endian, as protobuf's fixed32
    out->append(b, 4);
  }
  PutVarintField(out, kNonfinite, k.nonfinite ? 1 : 0);
  PutVarintField(out, kNoGradient, k.no_gradient ? 1 : 0);
  PutVarintField(out, kPullDType, static_cast<uint64_t>(static_cast<int64_t>(k.pull_dtype)));
  if (k.has_shared) {
    const uint64_t span[] = {k.shared.region, static_cast<uint64_t>(k.shared.offset),
                             static_cast<uint64_t>(k.shared.size),
                             static_cast<uint64_t>(k.shared.capacity)};
    int len = 0;  // fields 1..4, each a one-byte tag and its varint
    for (uint64_t v : span) len += v == 0 ? 0 : 1 + VarintSize(v);
    PutTag(out, kShared, kLen);
    PutVarint(out, len);
    for (int f = 0; f < 4; ++f) PutVarintField(out, f + 1, span[f]);
  }
}

void DestroyBufferRef(void* user_data) { static_cast<Buffer*>(user_data)->Unref(); }

// A message as slices: framing bytes collect in `pending` until a key's
// values go out as a slice of their own.
class SliceWriter {
 public:
  std::string* header() { return &pending_; }

  void AddData(const OutKey& k) {
    if (k.size == 0) return;
    Flush();
    char* p = const_cast<char*>(k.data);
    if (k.owner) {
      Buffer* b = k.owner.get();
      b->Ref();  // released by gRPC through DestroyBufferRef
      slices_.emplace_back(p, static_cast<size_t>(k.size), &DestroyBufferRef, b);
    } else {
      slices_.emplace_back(p, static_cast<size_t>(k.size), grpc::Slice::STATIC_SLICE);
    }
    size_ += k.size;
  }

  // Borrowed bytes as a slice of their own (the caller keeps them alive).
  void AddBorrowed(const void* data, int64_t size) {
    if (size == 0) return;
    Flush();
    slices_.emplace_back(const_cast<void*>(data), static_cast<size_t>(size), grpc::Slice::STATIC_SLICE);
    size_ += size;
  }

  void Flush() {
    if (pending_.empty()) return;
    size_ += static_cast<int64_t>(pending_.size());
    slices_.emplace_back(pending_);
    pending_.clear();
  }

  // Frames the keys as repeated field `field`.
  void AddKeys(int field, absl::Span<const OutKey> keys) {
    std::string meta;
    for (const OutKey& k : keys) {
      meta.clear();
      PutKeyHeader(&meta, k);
      const bool inline_data = k.size > 0 && !k.has_shared;
      const int64_t id_bytes = k.num_ids * 8;
      int64_t len = static_cast<int64_t>(meta.size());
      if (inline_data) len += 1 + VarintSize(k.size) + k.size;
      if (id_bytes > 0) len += 1 + VarintSize(id_bytes) + id_bytes;
      PutTag(&pending_, field, kLen);
      PutVarint(&pending_, len);
      pending_ += meta;
      if (inline_data) {
        PutTag(&pending_, kData, kLen);
        PutVarint(&pending_, k.size);
        AddData(k);
      }
      if (id_bytes > 0) {
        // Packed sfixed64: little-endian int64s, as they lie in memory.
        PutTag(&pending_, kIds, kLen);
        PutVarint(&pending_, id_bytes);
        AddBorrowed(k.ids, id_bytes);
      }
    }
  }

  int64_t size() const { return size_ + static_cast<int64_t>(pending_.size()); }

  grpc::ByteBuffer Finish(std::string prefix = "") {
    Flush();
    if (!prefix.empty()) slices_.insert(slices_.begin(), grpc::Slice(prefix));
    return grpc::ByteBuffer(slices_.data(), slices_.size());
  }

 private:
  std::vector<grpc::Slice> slices_;
  std::string pending_;
  int64_t size_ = 0;
};

void WritePush(SliceWriter* w, int32_t worker_rank, uint64_t push_id, absl::Span<const OutKey> keys,
               absl::Span<const int32_t> also_for, bool assign_rows) {
  PutVarintField(w->header(), 1, static_cast<uint64_t>(static_cast<int64_t>(worker_rank)));
  PutVarintField(w->header(), 2, push_id);
  w->AddKeys(3, keys);
  // Unpacked (protobuf parsers take either form), rank 0 included.
  for (int32_t rank : also_for) {
    PutTag(w->header(), 4, kVarint);
    PutVarint(w->header(), static_cast<uint64_t>(static_cast<int64_t>(rank)));
  }
  if (assign_rows) PutVarintField(w->header(), 5, 1);
}

// ---- Reading --------------------------------------------------------------

// A cursor over a received message's slices.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices) size_ += static_cast<int64_t>(s.size());
  }
  int64_t pos() const { return pos_; }
  int64_t size() const { return size_; }

  bool ReadByte(uint8_t* b) {
    while (idx_ < slices_.size() && off_ == slices_[idx_].size()) ++idx_, off_ = 0;
    if (idx_ == slices_.size()) return false;
    *b = slices_[idx_].begin()[off_++];
    ++pos_;
    return true;
  }

  bool Skip(int64_t n) {
    return Take(n, [](absl::string_view) {});
  }

  // At most `max_bytes` bytes: 10 for a value, 5 for a tag (protobuf refuses
  // a longer tag even when its value fits).
  bool ReadVarint(uint64_t* v, int max_bytes = 10) {
    *v = 0;
    for (int shift = 0; shift < 7 * max_bytes; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes
  }

  // The next `n` bytes, handed to on_piece(string_view) one slice's part
  // at a time (no copy).
  template <typename OnPiece>
  bool Take(int64_t n, OnPiece on_piece) {
    if (n < 0 || n > size_ - pos_) return false;
    pos_ += n;
    while (n > 0) {
      const grpc::Slice& s = slices_[idx_];
      const int64_t here = std::min<int64_t>(n, static_cast<int64_t>(s.size() - off_));
      on_piece(absl::string_view(reinterpret_cast<const char*>(s.begin()) + off_, here));
      off_ += here;
      n -= here;
      if (off_ == s.size()) ++idx_, off_ = 0;
    }
    return true;
  }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t idx_ = 0;
  size_t off_ = 0;
  int64_t pos_ = 0;
  int64_t size_ = 0;
};

// Reads the fields of one message ending at byte `end`, calling
// on_field(field, wire_type, value) for varints and fixed32 (value holds
// the bits) and on_len(field, length) for length-delimited ones, which must
// consume exactly `length` bytes. Unknown fields are skipped by the caller
// returning false ("not mine"). Returns an error text, or "" when well formed.
template <typename OnScalar, typename OnLen>
std::string ReadFields(SliceReader* r, int64_t end, OnScalar on_scalar, OnLen on_len) {
  while (r->pos() < end) {
    const int64_t at = r->pos();
    uint64_t tag;
    if (!r->ReadVarint(&tag, 5)) return absl::StrCat("a field tag is cut short or too long at byte ", at);
    const int field = static_cast<int>(tag >> 3);
    const int wire_type = static_cast<int>(tag & 7);
    if (field == 0 || (tag >> 3) > 0x1fffffff) return absl::StrCat("field number 0 at byte ", at);
    switch (wire_type) {
      case kVarint: {
        uint64_t v;
        if (!r->ReadVarint(&v)) return absl::StrCat("field ", field, " is cut short at byte ", at);
        on_scalar(field, wire_type, v);
        break;
      }
      case kFixed32:
      case kFixed64: {
        const int n = wire_type == kFixed32 ? 4 : 8;
        uint64_t v = 0;
        for (int i = 0; i < n; ++i) {
          uint8_t b;
          if (!r->ReadByte(&b)) return absl::StrCat("field ", field, " is cut short at byte ", at);
          v |= static_cast<uint64_t>(b) << (8 * i);
        }
        on_scalar(field, wire_type, v);
        break;
      }
      case kLen: {
        uint64_t len;
        // The tag and length may themselves run past `end`: no room then.
        if (!r->ReadVarint(&len) || r->pos() > end || len > static_cast<uint64_t>(end - r->pos())) {
          return absl::StrCat("field ", field, " at byte ", at,
                              " runs past the end of its message");
        }
        const int64_t stop = r->pos() + static_cast<int64_t>(len);
        std::string err = on_len(field, static_cast<int64_t>(len));
        if (!err.empty()) return err;
        if (r->pos() != stop)
          return absl::StrCat("field ", field, " at byte ", at, " is malformed");
        break;
      }
      default:
        return absl::StrCat("field ", field, " at byte ", at, " has wire type ", wire_type,
                            ", which no psrt.v1 message uses");
    }
    if (r->pos() > end)
      return absl::StrCat("a field runs past the end of its message at byte ", at);
  }
  return "";
}

// Well-formed UTF-8 (Unicode's Table 3-7: no overlong forms, surrogates or
// code points past U+10FFFF), which protobuf requires of proto3 strings.
bool IsUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const uint8_t c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int n;
    uint8_t lo = 0x80, hi = 0xbf;  // the range of the byte after the first
    if (c >= 0xc2 && c <= 0xdf) {
      n = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (end - p <= n || p[1] < lo || p[1] > hi) return false;
    for (int i = 2; i <= n; ++i) {
      if (p[i] < 0x80 || p[i] > 0xbf) return false;
    }
    p += n + 1;
  }
  return true;
}

std::string ReadKey(SliceReader* r, int64_t len, WireKey* k) {
  const int64_t end = r->pos() + len;
  return ReadFields(
      r, end,
      [k](int field, int wire_type, uint64_t v) {
        if (wire_type == kFixed32 && field == kScale) {
          const uint32_t bits = static_cast<uint32_t>(v);
          std::memcpy(&k->scale, &bits, 4);
        } else if (wire_type == kVarint) {
          switch (field) {
            case kPartition:
              k->partition = static_cast<uint32_t>(v);
              break;
            case kVersion:
              k->version = static_cast<int64_t>(v);
              break;
            case kDType:
              k->dtype = static_cast<v1::DType>(static_cast<int32_t>(v));
              break;
            case kNonfinite:
              k->nonfinite = v != 0;
              break;
            case kNoGradient:
              k->no_gradient = v != 0;
              break;
            case kPullDType:
              k->pull_dtype = static_cast<v1::DType>(static_cast<int32_t>(v));
              break;
            default:
              break;
          }
        } else if (wire_type == kFixed64 && field == kIds) {
          k->ids.push_back(static_cast<int64_t>(v));  // unpacked, as protobuf also accepts
        }
      },
      [r, k](int field, int64_t n) -> std::string {
        if (field == kShared) {
          if (!k->has_shared) k->shared = SharedSpan();  // a second one merges, as in protobuf
          k->has_shared = true;
          SharedSpan* span = &k->shared;
          return ReadFields(
              r, r->pos() + n,
              [span](int f, int wire_type, uint64_t v) {
                if (wire_type != kVarint) return;
                if (f == 1) span->region = v;
                if (f == 2) span->offset = static_cast<int64_t>(v);
                if (f == 3) span->size = static_cast<int64_t>(v);
                if (f == 4) span->capacity = static_cast<int64_t>(v);
              },
              [r](int, int64_t len) -> std::string {
                r->Skip(len);
                return "";
              });
        }
        if (field == kIds) {
          if (n % 8 != 0) return absl::StrCat("ids field of ", n, " bytes is not whole int64s");
          const size_t at = k->ids.size();  // packed runs add up, as in protobuf
          k->ids.resize(at + n / 8);
          char* to = reinterpret_cast<char*>(k->ids.data() + at);
          r->Take(n, [&to](absl::string_view piece) {
            std::memcpy(to, piece.data(), piece.size());
            to += piece.size();
          });
          return "";
        }
        if (field == kData) {
          k->data.Clear();  // the last occurrence wins, as in protobuf
          r->Take(n, [k](absl::string_view piece) { k->data.Add(piece); });
        } else if (field == kVariable) {
          k->variable.clear();
          r->Take(n,
                  [k](absl::string_view piece) { k->variable.append(piece.data(), piece.size()); });
          // Every occurrence, as protobuf checks every one of a proto3 string.
          if (!IsUtf8(k->variable)) return "a key's variable name is not valid UTF-8";
        } else {
          r->Skip(n);
        }
        return "";
      });
}

// Parses a message whose repeated KeyData is field `keys_field`; `wrapped`:
// the message sits in field 1 of an outer one (PushPullRequest's push).
absl::Status Parse(const grpc::ByteBuffer& in, const char* type, int keys_field, bool wrapped,
                   WireMessage* out) {
  out->slices.clear();
  size_t used = 0;  // keys parsed; elements past it are reused, not freed
  auto next_key = [&]() {
    if (used == out->keys.size()) out->keys.emplace_back();
    WireKey* k = &out->keys[used++];
    k->Reset();
    return k;
  };
  out->worker_rank = 0;
  out->push_id = 0;
  out->also_for.clear();
  out->assign_rows = false;
  if (!in.Dump(&out->slices).ok()) {
    out->keys.clear();
    return absl::InvalidArgumentError(absl::StrCat("cannot read the ", type, " received"));
  }
  SliceReader r(out->slices);
  auto body = [&](int64_t end) {
    return ReadFields(
        &r, end,
        [&](int field, int wire_type, uint64_t v) {
          if (wire_type != kVarint || keys_field == 1) return;
          if (field == 1) out->worker_rank = static_cast<int32_t>(v);
          if (field == 2 && keys_field == 3) out->push_id = v;
          if (field == 4 && keys_field == 3) out->also_for.push_back(static_cast<int32_t>(v));
          if (field == 5 && keys_field == 3) out->assign_rows = v != 0;
        },
        [&](int field, int64_t n) -> std::string {
          if (field == 4 && keys_field == 3) {  // also_for, packed
            const int64_t stop = r.pos() + n;
            while (r.pos() < stop) {
              uint64_t v;
              if (!r.ReadVarint(&v) || r.pos() > stop) return "field 4 (also_for) is malformed";
              out->also_for.push_back(static_cast<int32_t>(v));
            }
            return "";
          }
          if (field != keys_field) {
            r.Skip(n);
            return "";
          }
          return ReadKey(&r, n, next_key());
        });
  };
  std::string err;
  if (wrapped) {
    err = ReadFields(
        &r, r.size(), [](int, int, uint64_t) {},
        [&](int field, int64_t n) -> std::string {
          if (field != 1) {
            r.Skip(n);
            return "";
          }
          return body(r.pos() + n);
        });
  } else {
    err = body(r.size());
  }
  if (!err.empty()) {
    used = 0;
    out->also_for.clear();
    out->assign_rows = false;
  }
  out->keys.resize(used);
  if (!err.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the message is not a valid psrt.v1.", type, ": ", err));
  }
  return absl::OkStatus();
}

}  // namespace

std::string Payload::ToString() const {
  std::string s;
  s.reserve(size_);
  for (absl::string_view p : pieces_) s.append(p.data(), p.size());
  return s;
}

void DecodePayload(const Payload& p, v1::DType dtype, float scale, float* out, bool accumulate) {
  const int bpv = BytesPerValue(dtype);
  if (bpv == 0) return;
  char carry[4];
  int have = 0;      // bytes of a split value held in `carry`
  int64_t done = 0;  // values written
  for (absl::string_view piece : p.pieces()) {
    if (have > 0) {
      const int take = static_cast<int>(std::min<size_t>(bpv - have, piece.size()));
      std::memcpy(carry + have, piece.data(), take);
      have += take;
      piece.remove_prefix(take);
      if (have < bpv) continue;
      DecodeValues(absl::string_view(carry, bpv), dtype, scale, out + done, 1, accumulate);
      ++done;
      have = 0;
    }
    const int64_t whole = static_cast<int64_t>(piece.size()) / bpv;
    if (whole > 0) {
      DecodeValues(piece.substr(0, whole * bpv), dtype, scale, out + done, whole, accumulate);
      done += whole;
    }
    have = static_cast<int>(piece.size() - whole * bpv);
    std::memcpy(carry, piece.data() + whole * bpv, have);
  }
}

absl::Status ParsePushRequest(const grpc::ByteBuffer& in, WireMessage* out) {
  return Parse(in, "PushRequest", 3, false, out);
}
absl::Status ParsePullRequest(const grpc::ByteBuffer& in, WireMessage* out) {
  return Parse(in, "PullRequest", 2, false, out);
}
absl::Status ParsePushPullRequest(const grpc::ByteBuffer& in, WireMessage* out) {
  return Parse(in, "PushPullRequest", 3, true, out);
}
absl::Status ParseKeysResponse(const grpc::ByteBuffer& in, WireMessage* out) {
  return Parse(in, "PullResponse", 1, false, out);
}

grpc::ByteBuffer EncodePushRequest(int32_t worker_rank, uint64_t push_id,
                                   absl::Span<const OutKey> keys,
                                   absl::Span<const int32_t> also_for, bool assign_rows) {
  SliceWriter w;
  WritePush(&w, worker_rank, push_id, keys, also_for, assign_rows);
  return w.Finish();
}

grpc::ByteBuffer EncodePushPullRequest(int32_t worker_rank, uint64_t push_id,
                                       absl::Span<const OutKey> keys,
                                       absl::Span<const int32_t> also_for) {
  SliceWriter w;
  WritePush(&w, worker_rank, push_id, keys, also_for, false);
  std::string prefix;
  PutTag(&prefix, 1, kLen);
  PutVarint(&prefix, w.size());
  return w.Finish(std::move(prefix));
}

grpc::ByteBuffer EncodePullRequest(int32_t worker_rank, absl::Span<const OutKey> keys) {
  SliceWriter w;
  PutVarintField(w.header(), 1, static_cast<uint64_t>(static_cast<int64_t>(worker_rank)));
  w.AddKeys(2, keys);
  return w.Finish();
}

grpc::ByteBuffer EncodeKeysResponse(absl::Span<const OutKey> keys) {
  SliceWriter w;
  w.AddKeys(1, keys);
  return w.Finish();
}

}  // namespace psrt
