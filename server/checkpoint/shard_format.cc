#include "server/checkpoint/shard_format.h"

#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/key_map.h"
#include "server/checkpoint/crc32c.h"

namespace psrt {
namespace {

constexpr size_t kMagicSize = 8;
constexpr size_t kHeaderSize = kMagicSize + 4 + 4;
constexpr char kTrailerMagic[] = "PSRTTRLR";
constexpr size_t kTrailerSize = kMagicSize + 8 + 4;
// Length field and CRC around each record body.
constexpr size_t kRecordOverhead = 8 + 4;
// The smallest body: empty strings, no counters, elements or slots.
constexpr size_t kMinBody = 4 + 4 + 8 + 8 + 8 + 8 + 4 + 4 + 4;  // + 8 in version 2

constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// --- encoding ----------------------------------------------------------------

template <typename T>
void PutFixed(std::string* out, T v) {
  static_assert(std::is_integral_v<T>);
  char buf[sizeof(T)];
  using U = std::make_unsigned_t<T>;
  U u = static_cast<U>(v);
  for (size_t i = 0; i < sizeof(T); ++i) buf[i] = static_cast<char>((u >> (8 * i)) & 0xFF);
  out->append(buf, sizeof(T));
}

void PutDouble(std::string* out, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  PutFixed(out, bits);
}

void PutString(std::string* out, absl::string_view s) {
  PutFixed(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

void PutFloats(std::string* out, const std::vector<float>& v) {
  if (v.empty()) return;
  if (kLittleEndian) {
    out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    return;
  }
  for (float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    PutFixed(out, bits);
  }
}

// --- decoding ----------------------------------------------------------------

// Reads fixed-size fields from a byte range; every read is checked against
// what is left, so no field can point past the end.
class Reader {
 public:
  explicit Reader(absl::string_view b) : b_(b) {}
  size_t left() const { return b_.size(); }

  template <typename T>
  bool Fixed(T* v) {
    if (b_.size() < sizeof(T)) return false;
    using U = std::make_unsigned_t<T>;
    U u = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      u |= static_cast<U>(static_cast<uint8_t>(b_[i])) << (8 * i);
    }
    *v = static_cast<T>(u);
    b_.remove_prefix(sizeof(T));
    return true;
  }
  bool Double(double* d) {
    uint64_t bits;
    if (!Fixed(&bits)) return false;
    std::memcpy(d, &bits, 8);
    return true;
  }
  bool Bytes(size_t n, absl::string_view* out) {
    if (b_.size() < n) return false;
    *out = b_.substr(0, n);
    b_.remove_prefix(n);
    return true;
  }
  bool String(std::string* s) {
    uint32_t n;
    absl::string_view v;
    if (!Fixed(&n) || !Bytes(n, &v)) return false;
    s->assign(v.data(), v.size());
    return true;
  }
  // `n` floats, or false if fewer are left.
  bool Floats(size_t n, std::vector<float>* v) {
    absl::string_view raw;
    if (n > left() / sizeof(float) || !Bytes(n * sizeof(float), &raw)) return false;
    v->resize(n);
    if (n == 0) return true;  // data() may be null: no memcpy
    if (kLittleEndian) {
      std::memcpy(v->data(), raw.data(), raw.size());
    } else {
      Reader r(raw);
      for (size_t i = 0; i < n; ++i) {
        uint32_t bits;
        r.Fixed(&bits);
        std::memcpy(&(*v)[i], &bits, 4);
      }
    }
    return true;
  }

 private:
  absl::string_view b_;
};

// Parses one record body (already CRC-checked). `where` prefixes errors.
absl::Status DecodeBody(absl::string_view body, const std::string& where, uint32_t format, KeyRecord* rec) {
  Reader r(body);
  auto short_body = [&](absl::string_view field) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": record ends inside field '", field, "'"));
  };
  if (!r.String(&rec->variable)) return short_body("variable");
  if (rec->variable.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": empty variable name"));
  }
  if (!r.Fixed(&rec->partition)) return short_body("partition");
  if (!r.Fixed(&rec->offset)) return short_body("offset");
  if (!r.Fixed(&rec->num_elements)) return short_body("num_elements");
  if (!r.Fixed(&rec->version)) return short_body("version");
  if (!r.Double(&rec->learning_rate)) return short_body("learning_rate");
  if (!r.String(&rec->optimizer)) return short_body("optimizer");
  const std::string key = KeyName(rec->variable, rec->partition);
  if (rec->offset < 0 || rec->num_elements < 0 || rec->version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " key ", key, ": negative offset (", rec->offset, "), num_elements (",
                     rec->num_elements, ") or version (", rec->version, ")"));
  }
  uint32_t num_counters;
  if (!r.Fixed(&num_counters)) return short_body("step counter count");
  if (num_counters > r.left() / 8) {
    return absl::InvalidArgumentError(absl::StrCat(where, " key ", key, ": ", num_counters,
                                                   " step counters do not fit in the ", r.left(),
                                                   " bytes left"));
  }
  rec->step_counters.resize(num_counters);
  for (auto& c : rec->step_counters) r.Fixed(&c);
  const uint64_t n = static_cast<uint64_t>(rec->num_elements);
  if (n > r.left() / sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " key ", key, ": ", n, " weights do not fit in the ", r.left(), " bytes left"));
  }
  r.Floats(n, &rec->weights);
  uint32_t num_slots;
  if (!r.Fixed(&num_slots)) return short_body("slot count");
  if (num_slots > kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat(where, " key ", key, ": ", num_slots,
                                                   " optimizer slots (at most ", kMaxSlots, ")"));
  }
  if (n > 0 && num_slots > r.left() / sizeof(float) / n) {
    return absl::InvalidArgumentError(absl::StrCat(where, " key ", key, ": ", num_slots,
                                                   " slots of ", n, " floats do not fit in the ",
                                                   r.left(), " bytes left"));
  }
  rec->slots.resize(num_slots);
  for (auto& slot : rec->slots) r.Floats(n, &slot);
  rec->row_ids.clear();
  rec->row_stats.clear();
  if (format >= 2) {
    uint64_t rows;
    if (!r.Fixed(&rows)) return short_body("row count");
    if (rows > r.left() / 32 || (rows > 0 && n % rows != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(where, " key ", key, ": ", rows, " rows do not fit its ", n,
                                                     " values and the ", r.left(), " bytes left"));
    }
    rec->row_ids.resize(rows);
    for (auto& id : rec->row_ids) r.Fixed(&id);
    rec->row_stats.resize(3 * rows);
    for (auto& c : rec->row_stats) r.Fixed(&c);
  }
  if (r.left() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " key ", key, ": ", r.left(), " bytes left over after the last field"));
  }
  return absl::OkStatus();
}

// The variable name at the start of a body that failed its CRC, for the
// message only (it may itself be the corrupt part).
std::string GuessKey(absl::string_view body) {
  Reader r(body);
  std::string variable;
  uint32_t partition = 0;
  if (!r.String(&variable) || !r.Fixed(&partition) || variable.size() > 256) return "?";
  return absl::CHexEscape(KeyName(variable, partition));
}

}  // namespace

bool KeyRecord::operator==(const KeyRecord& o) const {
  auto same_floats = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() &&
           (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  };
  if (variable != o.variable || partition != o.partition || offset != o.offset ||
      num_elements != o.num_elements || version != o.version ||
      std::memcmp(&learning_rate, &o.learning_rate, sizeof(double)) != 0 ||
      optimizer != o.optimizer || step_counters != o.step_counters || row_ids != o.row_ids ||
      row_stats != o.row_stats ||
      !same_floats(weights, o.weights) || slots.size() != o.slots.size()) {
    return false;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (!same_floats(slots[i], o.slots[i])) return false;
  }
  return true;
}

void EncodeShardTo(absl::Span<const KeyRecord* const> records, std::string* out) {
  size_t total = kHeaderSize + kTrailerSize;
  for (const KeyRecord* r : records) {
    total += kRecordOverhead + kMinBody + r->variable.size() + r->optimizer.size() +
             8 * r->step_counters.size() + 4 * r->weights.size() + 8 + 8 * r->row_ids.size() +
             8 * r->row_stats.size();
    for (const auto& s : r->slots) total += 4 * s.size();
  }
  out->clear();
  out->reserve(total);
  out->append(kShardMagic, kMagicSize);
  PutFixed(out, kShardFormatVersion);
  PutFixed(out, uint32_t{0});  // flags
  for (const KeyRecord* r : records) {
    // The body goes straight into `out`; its length is patched in after.
    const size_t start = out->size();
    PutFixed(out, uint64_t{0});
    PutString(out, r->variable);
    PutFixed(out, r->partition);
    PutFixed(out, r->offset);
    PutFixed(out, r->num_elements);
    PutFixed(out, r->version);
    PutDouble(out, r->learning_rate);
    PutString(out, r->optimizer);
    PutFixed(out, static_cast<uint32_t>(r->step_counters.size()));
    for (int64_t c : r->step_counters) PutFixed(out, c);
    PutFloats(out, r->weights);
    PutFixed(out, static_cast<uint32_t>(r->slots.size()));
    for (const auto& s : r->slots) PutFloats(out, s);
    PutFixed(out, static_cast<uint64_t>(r->row_ids.size()));
    for (int64_t id : r->row_ids) PutFixed(out, id);
    for (int64_t c : r->row_stats) PutFixed(out, c);
    std::string length;
    PutFixed(&length, static_cast<uint64_t>(out->size() - start - 8));
    out->replace(start, 8, length);
    PutFixed(out, Crc32c(absl::string_view(*out).substr(start)));
  }
  const size_t trailer = out->size();
  out->append(kTrailerMagic, kMagicSize);
  PutFixed(out, static_cast<uint64_t>(records.size()));
  uint32_t crc = Crc32c(absl::string_view(*out).substr(0, kHeaderSize));
  crc = Crc32c(absl::string_view(*out).substr(trailer), crc);
  PutFixed(out, crc);
}

void AppendRow(const KeyRecord& src, size_t row, size_t dim, KeyRecord* dst) {
  dst->row_ids.push_back(src.row_ids[row]);
  dst->row_stats.insert(dst->row_stats.end(), src.row_stats.begin() + 3 * row,
                        src.row_stats.begin() + 3 * row + 3);
  dst->weights.insert(dst->weights.end(), src.weights.begin() + row * dim,
                      src.weights.begin() + (row + 1) * dim);
  for (size_t s = 0; s < src.slots.size(); ++s) {
    dst->slots[s].insert(dst->slots[s].end(), src.slots[s].begin() + row * dim,
                         src.slots[s].begin() + (row + 1) * dim);
  }
}

std::string EncodeShard(const std::vector<KeyRecord>& records) {
  std::vector<const KeyRecord*> ptrs;
  ptrs.reserve(records.size());
  for (const KeyRecord& r : records) ptrs.push_back(&r);
  std::string out;
  EncodeShardTo(ptrs, &out);
  return out;
}

absl::StatusOr<std::vector<KeyRecord>> DecodeShard(absl::string_view bytes,
                                                   absl::string_view name_for_errors) {
  const std::string name(name_for_errors);
  if (bytes.size() < kMagicSize &&
      absl::string_view(kShardMagic, kMagicSize).substr(0, bytes.size()) == bytes) {
    return absl::DataLossError(
        absl::StrCat("shard ", name, ": truncated (", bytes.size(), " bytes)"));
  }
  if (bytes.size() < kMagicSize ||
      bytes.substr(0, kMagicSize) != absl::string_view(kShardMagic, kMagicSize)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", name, ": not a psrt shard (bad magic; ", bytes.size(), " bytes)"));
  }
  if (bytes.size() < kHeaderSize + kTrailerSize) {
    return absl::DataLossError(absl::StrCat("shard ", name, ": truncated (", bytes.size(),
                                            " bytes, shorter than header and trailer)"));
  }
  Reader header(bytes.substr(kMagicSize, kHeaderSize - kMagicSize));
  uint32_t version = 0, flags = 0;
  header.Fixed(&version);
  header.Fixed(&flags);
  if (version < 1 || version > kShardFormatVersion) {
    return absl::UnimplementedError(absl::StrCat("shard ", name, ": format version ", version,
                                                 " (this build reads versions 1 to ", kShardFormatVersion,
                                                 ")"));
  }
  const absl::string_view trailer = bytes.substr(bytes.size() - kTrailerSize);
  if (trailer.substr(0, kMagicSize) != absl::string_view(kTrailerMagic, kMagicSize)) {
    return absl::DataLossError(
        absl::StrCat("shard ", name, ": no trailer at the end (", bytes.size(),
                     " bytes): the file is truncated or its end is corrupt"));
  }
  Reader tr(trailer.substr(kMagicSize));
  uint64_t count = 0;
  uint32_t stored_crc = 0;
  tr.Fixed(&count);
  tr.Fixed(&stored_crc);
  uint32_t crc = Crc32c(bytes.substr(0, kHeaderSize));
  crc = Crc32c(trailer.substr(0, kTrailerSize - 4), crc);
  if (crc != stored_crc) {
    return absl::DataLossError(
        absl::StrCat("shard ", name, ": header/trailer checksum mismatch (stored 0x",
                     absl::Hex(stored_crc), ", computed 0x", absl::Hex(crc), ")"));
  }
  if (flags != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", name, ": unknown header flags 0x", absl::Hex(flags)));
  }
  Reader records(bytes.substr(kHeaderSize, bytes.size() - kHeaderSize - kTrailerSize));
  // Bound the count by what the bytes could hold before reserving for it.
  if (count > records.left() / (kRecordOverhead + kMinBody)) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", name, ": trailer claims ", count,
                                                   " records, more than the ", records.left(),
                                                   " record bytes can hold"));
  }
  std::vector<KeyRecord> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const size_t record_at = bytes.size() - kTrailerSize - records.left();
    const std::string where = absl::StrCat("shard ", name, " record ", i, " at byte ", record_at);
    uint64_t len = 0;
    if (!records.Fixed(&len)) {
      return absl::DataLossError(absl::StrCat(where, ": record length is cut off"));
    }
    absl::string_view body, crc_bytes;
    if (len > records.left() || records.left() - len < 4) {
      return absl::DataLossError(absl::StrCat(where, ": record length ", len, " exceeds the ",
                                              records.left(), " bytes left before the trailer"));
    }
    records.Bytes(len, &body);
    records.Bytes(4, &crc_bytes);
    uint32_t stored = 0;
    Reader(crc_bytes).Fixed(&stored);
    const uint32_t computed = Crc32c(bytes.substr(record_at, 8 + len));
    if (stored != computed) {
      return absl::DataLossError(absl::StrCat(where, " (key ", GuessKey(body),
                                              "): checksum mismatch (stored 0x", absl::Hex(stored),
                                              ", computed 0x", absl::Hex(computed), ")"));
    }
    KeyRecord rec;
    absl::Status s = DecodeBody(body, where, version, &rec);
    if (!s.ok()) return s;
    out.push_back(std::move(rec));
  }
  if (records.left() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", name, ": ", records.left(),
                                                   " bytes after the ", count,
                                                   " records the trailer counts"));
  }
  return out;
}

}  // namespace psrt
