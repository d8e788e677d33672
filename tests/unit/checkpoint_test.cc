// Checkpoint building blocks: CRC32C, the shard format, the storage backends.

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/checkpoint/catalog.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/shard_format.h"
#include "server/checkpoint/storage.h"

namespace psrt {
namespace {

using crc32c_internal::Crc32cHardware;
using crc32c_internal::Crc32cPortable;
using crc32c_internal::HaveSse42;

// --- CRC32C ------------------------------------------------------------------

struct Vector {
  std::string data;
  uint32_t crc;
};

std::vector<Vector> KnownVectors() {
  // RFC 3720 appendix B.4, plus the standard check value.
  std::string inc(32, '\0'), dec(32, '\0');
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<char>(i);
    dec[i] = static_cast<char>(31 - i);
  }
  return {{std::string(32, '\0'), 0x8A9136AAu},
          {std::string(32, '\xFF'), 0x62A8AB43u},
          {inc, 0x46DD794Eu},
          {dec, 0x113FDB5Cu},
          {"123456789", 0xE3069283u},
          {"", 0u}};
}

TEST(Crc32cTest, PortableKnownVectors) {
  for (const auto& v : KnownVectors()) {
    EXPECT_EQ(Crc32cPortable(v.data.data(), v.data.size(), 0), v.crc) << v.data.size();
  }
}

TEST(Crc32cTest, HardwareKnownVectors) {
  if (!HaveSse42()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  for (const auto& v : KnownVectors()) {
    EXPECT_EQ(Crc32cHardware(v.data.data(), v.data.size(), 0), v.crc) << v.data.size();
  }
}

TEST(Crc32cTest, DispatchKnownVectors) {
  for (const auto& v : KnownVectors()) EXPECT_EQ(Crc32c(v.data), v.crc);
}

TEST(Crc32cTest, ImplementationsAgreeOnRandomData) {
  std::mt19937_64 rng(42);
  std::string buf(70000, '\0');
  for (auto& c : buf) c = static_cast<char>(rng());
  // Every length up to 300 at every alignment mod 8, then a few big ones.
  std::vector<std::pair<size_t, size_t>> cases;
  for (size_t len = 0; len <= 300; ++len) cases.push_back({len % 8, len});
  for (size_t len : {4095, 4096, 65536, 69990}) cases.push_back({3, len});
  for (auto [off, len] : cases) {
    const char* p = buf.data() + off;
    const uint32_t portable = Crc32cPortable(p, len, 0);
    EXPECT_EQ(Crc32c(p, len), portable) << off << " " << len;
    if (HaveSse42()) {
      EXPECT_EQ(Crc32cHardware(p, len, 0), portable) << off << " " << len;
    }
  }
}

TEST(Crc32cTest, Incremental) {
  const std::string s = "The quick brown fox jumps over the lazy dog, twice over.";
  const uint32_t whole = Crc32c(s);
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    const absl::string_view v(s);
    EXPECT_EQ(Crc32c(v.substr(cut), Crc32c(v.substr(0, cut))), whole) << cut;
    EXPECT_EQ(Crc32cPortable(s.data() + cut, s.size() - cut, Crc32cPortable(s.data(), cut, 0)),
              whole);
  }
}

TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::string s = "psrt checkpoint record";
  const uint32_t crc = Crc32c(s);
  for (size_t bit = 0; bit < s.size() * 8; ++bit) {
    s[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    EXPECT_NE(Crc32c(s), crc) << bit;
    s[bit / 8] ^= static_cast<char>(1 << (bit % 8));
  }
}

// --- shard format -------------------------------------------------------------

KeyRecord MakeRecord(const std::string& var, uint32_t part, int64_t n, int slots, int seed) {
  KeyRecord r;
  r.variable = var;
  r.partition = part;
  r.offset = int64_t{part} * 1000;
  r.num_elements = n;
  r.version = 7 + seed;
  r.learning_rate = 0.001 * (seed + 1);
  r.optimizer = slots == 0 ? "" : "adam";
  r.step_counters = {seed, -1, std::numeric_limits<int64_t>::max()};
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  r.weights.resize(n);
  for (auto& w : r.weights) w = dist(rng);
  r.slots.resize(slots);
  for (auto& s : r.slots) {
    s.resize(n);
    for (auto& x : s) x = dist(rng);
  }
  return r;
}

std::vector<KeyRecord> SmallShard() {
  return {MakeRecord("w", 0, 3, 2, 1), MakeRecord("w", 1, 2, 0, 2)};
}

TEST(ShardFormatTest, RoundTrip) {
  std::vector<KeyRecord> recs = {MakeRecord("dense/kernel", 0, 1000, 2, 1),
                                 MakeRecord("dense/kernel", 1, 999, 2, 2),
                                 MakeRecord("bias", 3, 0, 0, 3), MakeRecord("emb", 4, 17, 1, 4)};
  // Special values must survive bit for bit.
  recs[0].weights[0] = std::numeric_limits<float>::quiet_NaN();
  recs[0].weights[1] = -0.0f;
  recs[0].weights[2] = std::numeric_limits<float>::infinity();
  recs[0].weights[3] = std::numeric_limits<float>::denorm_min();
  recs[2].step_counters.clear();
  const std::string bytes = EncodeShard(recs);
  EXPECT_EQ(EncodeShard(recs), bytes);  // deterministic
  auto got = DecodeShard(bytes, "file:///x/shard-0");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), recs.size());
  for (size_t i = 0; i < recs.size(); ++i) EXPECT_TRUE((*got)[i] == recs[i]) << i;
  EXPECT_TRUE(std::isnan((*got)[0].weights[0]));
  EXPECT_TRUE(std::signbit((*got)[0].weights[1]));
}

TEST(ShardFormatTest, EmptyShardRoundTrips) {
  auto got = DecodeShard(EncodeShard({}), "empty");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->empty());
}

TEST(ShardFormatTest, EqualityNoticesDifferences) {
  // The round-trip test relies on operator==; make sure it can say no.
  KeyRecord a = MakeRecord("w", 0, 4, 2, 1);
  KeyRecord b = a;
  EXPECT_TRUE(a == b);
  b.slots[1][3] += 1;
  EXPECT_FALSE(a == b);
  b = a;
  b.step_counters[0]++;
  EXPECT_FALSE(a == b);
  b = a;
  b.learning_rate *= 2;
  EXPECT_FALSE(a == b);
}

TEST(ShardFormatTest, EveryTruncationFailsCleanly) {
  const std::string bytes = EncodeShard(SmallShard());
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto got = DecodeShard(absl::string_view(bytes).substr(0, len), "shard-7");
    ASSERT_FALSE(got.ok()) << "a " << len << " byte prefix of " << bytes.size() << " decoded";
    EXPECT_TRUE(absl::StrContains(got.status().message(), "shard-7")) << got.status();
  }
  // Truncated files say so rather than "bad magic" when the magic is intact.
  auto cut = DecodeShard(absl::string_view(bytes).substr(0, bytes.size() - 1), "s");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
}

TEST(ShardFormatTest, EveryBitFlipFailsCleanly) {
  const std::string good = EncodeShard(SmallShard());
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    std::string bad = good;
    bad[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    auto got = DecodeShard(bad, "shard-3");
    ASSERT_FALSE(got.ok()) << "flipping bit " << bit << " went unnoticed";
    EXPECT_TRUE(absl::StrContains(got.status().message(), "shard-3")) << got.status();
  }
}

TEST(ShardFormatTest, ChecksumErrorNamesRecordAndKey) {
  std::vector<KeyRecord> recs = SmallShard();
  const std::string good = EncodeShard(recs);
  // The last weight of record 1 sits just before its slot count and CRC, and
  // the trailer.
  std::string bad = good;
  const size_t pos = bad.size() - 20 - 4 - 4 - 1;
  bad[pos] ^= 0x10;
  auto got = DecodeShard(bad, "shard-3");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "record 1")) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "w#1")) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "checksum")) << got.status();
}

TEST(ShardFormatTest, BadMagicAndUnknownVersion) {
  std::string bytes = EncodeShard(SmallShard());
  std::string bad = bytes;
  bad[0] = 'X';
  auto got = DecodeShard(bad, "s");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "magic")) << got.status();
  EXPECT_FALSE(DecodeShard("not a shard at all, just some text", "s").ok());
  bad = bytes;
  bad[8] = 3;  // version 3, little-endian
  got = DecodeShard(bad, "s");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "version 3")) << got.status();
}

// A shard built by hand around raw record bodies with correct checksums, to
// reach the checks behind them.
void PutU32(std::string* s, uint32_t v) { s->append(reinterpret_cast<char*>(&v), 4); }
void PutU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<char*>(&v), 8); }

std::string RawShard(const std::vector<std::string>& bodies, uint64_t count, uint32_t version = 1) {
  std::string out("PSRTSHRD", 8);
  PutU32(&out, version);
  PutU32(&out, 0);
  for (const auto& b : bodies) {
    const size_t start = out.size();
    PutU64(&out, b.size());
    out += b;
    PutU32(&out, Crc32c(absl::string_view(out).substr(start)));
  }
  const size_t trailer = out.size();
  out.append("PSRTTRLR", 8);
  PutU64(&out, count);
  PutU32(&out, Crc32c(absl::string_view(out).substr(trailer), Crc32c(out.substr(0, 16))));
  return out;
}

std::string RawBody(uint64_t num_elements, uint32_t counters, uint32_t slots, size_t floats_present,
                    size_t extra = 0) {
  std::string b;
  PutU32(&b, 1);
  b += "v";
  PutU32(&b, 5);             // partition
  PutU64(&b, 0);             // offset
  PutU64(&b, num_elements);  // num_elements
  PutU64(&b, 1);             // version
  PutU64(&b, 0);             // learning rate bits
  PutU32(&b, 0);             // optimizer ""
  PutU32(&b, counters);
  b.append(8 * std::min<uint32_t>(counters, 4), '\0');
  b.append(4 * floats_present, '\0');
  PutU32(&b, slots);
  b.append(extra, '\0');
  return b;
}

TEST(ShardFormatTest, RawShardHelperMatchesEncoder) {
  // So the tests below exercise real framing, not a helper's own idea of it.
  KeyRecord r;
  r.variable = "v";
  r.partition = 5;
  r.num_elements = 0;
  r.version = 1;
  std::string body = RawBody(0, 0, 0, 0);
  PutU64(&body, 0);  // version 2: no table rows
  EXPECT_EQ(RawShard({body}, 1, 2), EncodeShard({r}));
  // Version 1 (without the rows field) still reads.
  absl::StatusOr<std::vector<KeyRecord>> old = DecodeShard(RawShard({RawBody(0, 0, 0, 0)}, 1), "v1");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ((*old)[0], r);
}

TEST(ShardFormatTest, TableRowsRoundTripAndMustFitTheValues) {
  KeyRecord r;
  r.variable = "table";
  r.partition = 1;
  r.num_elements = 6;  // 3 rows of 2
  r.version = 9;
  r.weights = {1, 2, 3, 4, 5, 6};
  r.slots = {{0.5f, 0.5f, 0.25f, 0.25f, 1, 1}};
  r.row_ids = {-5, 7, int64_t{1} << 62};
  r.row_stats = {9, 1, 3, 8, 2, 1, 9, 9, 1};
  absl::StatusOr<std::vector<KeyRecord>> back = DecodeShard(EncodeShard({r}), "t");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)[0], r);
  r.row_ids.push_back(8);  // 4 rows cannot share 6 values
  r.row_stats.resize(12);
  back = DecodeShard(EncodeShard({r}), "t");
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument) << back.status();
  EXPECT_TRUE(absl::StrContains(back.status().message(), "4 rows do not fit")) << back.status();
}

TEST(ShardFormatTest, SizesThatDoNotAddUp) {
  struct Case {
    std::string name;
    std::string shard;
  };
  const uint64_t huge = uint64_t{1} << 60;
  std::vector<Case> cases = {
      {"huge num_elements", RawShard({RawBody(huge, 0, 0, 0)}, 1)},
      {"negative num_elements", RawShard({RawBody(~uint64_t{0}, 0, 0, 0)}, 1)},
      {"huge counter count", RawShard({RawBody(0, 0xFFFFFFFFu, 0, 0)}, 1)},
      {"too many slots", RawShard({RawBody(0, 0, 0xFFFFFFFFu, 0)}, 1)},
      {"slots missing", RawShard({RawBody(2, 0, 3, 2)}, 1)},
      {"weights short", RawShard({RawBody(1000, 0, 0, 3)}, 1)},
      {"bytes left over", RawShard({RawBody(0, 0, 0, 0, 5)}, 1)},
      {"count too high", RawShard({RawBody(0, 0, 0, 0)}, 2)},
      {"count huge", RawShard({RawBody(0, 0, 0, 0)}, huge)},
      {"count too low", RawShard({RawBody(0, 0, 0, 0), RawBody(0, 0, 0, 0)}, 1)},
      {"record cut short", RawShard({std::string(3, '\0')}, 1)},
  };
  for (const auto& c : cases) {
    auto got = DecodeShard(c.shard, "crafted");
    EXPECT_FALSE(got.ok()) << c.name;
    EXPECT_TRUE(absl::StrContains(got.status().message(), "crafted")) << got.status();
  }
  // And a mismatched record from the encoder itself.
  KeyRecord r = MakeRecord("w", 0, 4, 1, 1);
  r.weights.pop_back();
  EXPECT_FALSE(DecodeShard(EncodeShard({r}), "mismatch").ok());
}

TEST(ShardFormatTest, GarbageNeverCrashes) {
  std::mt19937_64 rng(7);
  const std::string good = EncodeShard(SmallShard());
  for (int iter = 0; iter < 20000; ++iter) {
    std::string bad = good;
    const int mode = iter % 3;
    if (mode == 0) {  // a few random bytes changed
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) {
        bad[rng() % bad.size()] = static_cast<char>(rng());
      }
    } else if (mode == 1) {  // random tail after a valid header
      bad.resize(16 + rng() % 200);
      for (size_t i = 16; i < bad.size(); ++i) bad[i] = static_cast<char>(rng());
    } else {  // a valid-looking trailer over random records
      std::string body(rng() % 100, '\0');
      for (auto& c : body) c = static_cast<char>(rng());
      bad = RawShard({body}, 1 + rng() % 3);
    }
    auto got = DecodeShard(bad, "fuzz");
    if (mode == 0 && bad != good) {
      EXPECT_FALSE(got.ok()) << iter;
    }
  }
}

// --- storage -----------------------------------------------------------------

class StorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/psrt_ckpt_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    root_ = dir_ + "/root";  // not created: the first Put makes it
    auto s = OpenStorage("file://" + root_);
    ASSERT_TRUE(s.ok()) << s.status();
    storage_ = std::move(*s);
  }
  void TearDown() override {
    ::chmod(root_.c_str(), 0755);
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)std::system(cmd.c_str());
  }

  std::string dir_, root_;
  std::unique_ptr<Storage> storage_;
};

TEST_F(StorageTest, PutGetExistsDelete) {
  EXPECT_EQ(storage_->uri(), "file://" + root_);
  const std::string data("binary\0data\xff", 12);
  ASSERT_TRUE(storage_->Put("ckpt-000100/shard-00000", data).ok());
  auto got = storage_->Get("ckpt-000100/shard-00000");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, data);
  ASSERT_TRUE(storage_->Put("empty", "").ok());
  EXPECT_EQ(*storage_->Get("empty"), "");

  EXPECT_TRUE(*storage_->Exists("ckpt-000100/shard-00000"));
  EXPECT_FALSE(*storage_->Exists("ckpt-000100"));  // a directory, not an object
  EXPECT_FALSE(*storage_->Exists("nope"));
  EXPECT_FALSE(*storage_->Exists("empty/below"));
  EXPECT_EQ(storage_->Get("empty/below").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(storage_->Delete("empty/below").ok());

  auto missing = storage_->Get("ckpt-000100/shard-00001");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), root_ + "/ckpt-000100/shard-00001"))
      << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "No such file")) << missing.status();

  EXPECT_FALSE(storage_->Delete("ckpt-000100").ok());  // a directory, not an object
  ASSERT_TRUE(storage_->Delete("ckpt-000100/shard-00000").ok());
  EXPECT_FALSE(*storage_->Exists("ckpt-000100/shard-00000"));
  EXPECT_EQ(storage_->Get("ckpt-000100/shard-00000").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(storage_->Delete("ckpt-000100/shard-00000").ok());  // idempotent
  // The folder went with its last object, as in S3.
  struct stat st;
  EXPECT_NE(::stat((root_ + "/ckpt-000100").c_str(), &st), 0);
  EXPECT_EQ(::stat(root_.c_str(), &st), 0);  // never the root
}

TEST_F(StorageTest, Overwrite) {
  ASSERT_TRUE(storage_->Put("LATEST", "ckpt-1").ok());
  ASSERT_TRUE(storage_->Put("LATEST", "ckpt-22").ok());
  EXPECT_EQ(*storage_->Get("LATEST"), "ckpt-22");
  EXPECT_EQ(*storage_->List(""), std::vector<std::string>{"LATEST"});  // no temp left
}

TEST_F(StorageTest, ListIsRecursiveSortedAndPrefixed) {
  for (const char* p : {"b/2", "a/1", "a/b/3", "ab", "c", "a/b/c/4"}) {
    ASSERT_TRUE(storage_->Put(p, p).ok()) << p;
  }
  using V = std::vector<std::string>;
  EXPECT_EQ(*storage_->List(""), (V{"a/1", "a/b/3", "a/b/c/4", "ab", "b/2", "c"}));
  EXPECT_EQ(*storage_->List("a/"), (V{"a/1", "a/b/3", "a/b/c/4"}));
  EXPECT_EQ(*storage_->List("a"), (V{"a/1", "a/b/3", "a/b/c/4", "ab"}));
  EXPECT_EQ(*storage_->List("a/b"), (V{"a/b/3", "a/b/c/4"}));
  EXPECT_EQ(*storage_->List("a/b/c/"), (V{"a/b/c/4"}));
  EXPECT_EQ(*storage_->List("zzz/"), V{});
  EXPECT_EQ(*storage_->List("c/"), V{});  // c is an object, not a directory
  // A Put in progress (its temporary file) is not listed.
  std::ofstream(root_ + "/a/1.psrt-tmp.99.0") << "partial";
  EXPECT_EQ(*storage_->List("a/"), (V{"a/1", "a/b/3", "a/b/c/4"}));
}

TEST_F(StorageTest, ListOfMissingRootIsEmpty) {
  auto got = storage_->List("");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->empty());
}

TEST_F(StorageTest, BadPathsAreRejected) {
  for (const char* p : {"", "/etc/passwd", "../x", "a/../../x", "a/..", "..", ".", "a/./b", "a//b",
                        "a/", "x.psrt-tmp.1.2"}) {
    EXPECT_EQ(storage_->Put(p, "x").code(), absl::StatusCode::kInvalidArgument) << p;
    EXPECT_EQ(storage_->Get(p).status().code(), absl::StatusCode::kInvalidArgument) << p;
    EXPECT_EQ(storage_->Exists(p).status().code(), absl::StatusCode::kInvalidArgument) << p;
    EXPECT_EQ(storage_->Delete(p).code(), absl::StatusCode::kInvalidArgument) << p;
  }
  EXPECT_EQ(std::string(storage_->Put("a//b", "x").message()).find("a//b") != std::string::npos,
            true);
  for (const char* prefix : {"../", "/abs", "a/../", "a//"}) {
    EXPECT_EQ(storage_->List(prefix).status().code(), absl::StatusCode::kInvalidArgument) << prefix;
  }
  // Nothing escaped the root.
  struct stat st;
  EXPECT_NE(::stat((dir_ + "/x").c_str(), &st), 0);
}

TEST_F(StorageTest, FailedPutKeepsOldObjectAndLeavesNoTemp) {
  ASSERT_TRUE(storage_->Put("obj", "old").ok());
  // The target is a non-empty directory: the rename must fail.
  ASSERT_TRUE(storage_->Put("dir/inner", "x").ok());
  absl::Status s = storage_->Put("dir", "new");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), root_ + "/dir")) << s;
  // A parent that is a file.
  s = storage_->Put("obj/child", "x");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), root_ + "/obj")) << s;
  EXPECT_EQ(*storage_->Get("obj"), "old");
  if (::geteuid() != 0) {  // root ignores permissions
    ::chmod(root_.c_str(), 0555);
    s = storage_->Put("obj", "new");
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "Permission denied")) << s;
    ::chmod(root_.c_str(), 0755);
    EXPECT_EQ(*storage_->Get("obj"), "old");
  }
  // No temporary files anywhere, even hidden ones.
  std::string cmd = "test -z \"$(find '" + root_ + "' -name '*psrt-tmp*')\"";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

TEST_F(StorageTest, ReadersNeverSeeAPartialObject) {
  // Two large, distinct contents replaced back and forth while readers read:
  // every read is one of them, whole (old until the rename, new after).
  const std::string a(3 << 20, 'a'), b(2 << 20, 'b');
  ASSERT_TRUE(storage_->Put("big", a).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0}, bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        auto got = storage_->Get("big");
        if (!got.ok() || (*got != a && *got != b)) bad.fetch_add(1);
        reads.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(storage_->Put("big", i % 2 ? a : b).ok());
  // Let the readers get some reads in even on a slow machine.
  while (reads.load() < 20) std::this_thread::yield();
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0) << "of " << reads.load() << " reads";
}

TEST(OpenStorageTest, UriForms) {
  EXPECT_TRUE(OpenStorage("file:///tmp/psrt-ckpt").ok());
  auto trailing = OpenStorage("file:///tmp/psrt-ckpt/");
  ASSERT_TRUE(trailing.ok());
  EXPECT_EQ((*trailing)->uri(), "file:///tmp/psrt-ckpt");

  // s3:// goes to the S3 backend (tests/integration/s3_test.cc), which
  // needs a bucket.
  auto s3 = OpenStorage("s3:///prefix");
  EXPECT_EQ(s3.status().code(), absl::StatusCode::kInvalidArgument) << s3.status();
  EXPECT_TRUE(absl::StrContains(s3.status().message(), "names no bucket")) << s3.status();

  for (const char* uri :
       {"", "/abs/path", "relative/path", "file://relative/path", "file:relative", "file://",
        "gs://bucket/x", "FILE:///x", "file:///a/../b", "http://host/x"}) {
    auto got = OpenStorage(uri);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << uri;
    EXPECT_TRUE(absl::StrContains(got.status().message(), "file:///absolute/path")) << got.status();
    EXPECT_TRUE(absl::StrContains(got.status().message(), "s3://")) << got.status();
  }
}

TEST(ObjectPathTest, Validate) {
  EXPECT_TRUE(ValidateObjectPath("ckpt-000100/shard-00003").ok());
  EXPECT_TRUE(ValidateObjectPath("LATEST").ok());
  EXPECT_TRUE(ValidateObjectPath("a..b/..c").ok());  // only whole ".." components
  EXPECT_FALSE(ValidateObjectPath(absl::string_view("a\0b", 3)).ok());
}

// ---- The catalog: manifests, listing, resolving, pruning ----

v1::Manifest OneVariableManifest(const std::string& name, int64_t step) {
  v1::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_name(name);
  m.set_step(step);
  m.add_shards()->set_path(ShardPath(name, 0, 1));
  v1::ManifestVariable* v = m.add_variables();
  v->set_name("w");
  v->add_shape(10);
  for (int p = 0; p < 2; ++p) {
    v1::ManifestKey* k = m.add_keys();
    k->set_variable("w");
    k->set_partition(p);
    k->set_offset(5 * p);
    k->set_num_elements(5);
  }
  return m;
}

TEST(ManifestTest, KeysMustTileEachVariable) {
  v1::Manifest m = OneVariableManifest("step-1", 1);
  EXPECT_TRUE(CheckManifest(m, "m").ok());
  m.mutable_keys(1)->set_offset(4);  // overlaps the first
  absl::Status s = CheckManifest(m, "m");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "do not tile its 10 elements")) << s;
  m = OneVariableManifest("step-1", 1);
  m.mutable_keys()->RemoveLast();
  s = CheckManifest(m, "m");
  EXPECT_TRUE(absl::StrContains(s.message(), "cover 5 of its 10 elements")) << s;
  m = OneVariableManifest("step-1", 1);
  m.mutable_keys(0)->set_shard(3);
  EXPECT_TRUE(absl::StrContains(CheckManifest(m, "m").message(), "names shard 3 of 1"));
  m = OneVariableManifest("step-1", 1);
  m.set_format_version(kManifestFormatVersion + 1);
  EXPECT_EQ(CheckManifest(m, "m").code(), absl::StatusCode::kUnimplemented);
}

TEST_F(StorageTest, CatalogListsResolvesAndPrunes) {
  for (int step : {10, 20, 30}) {
    const std::string name = CheckpointName(step);
    ASSERT_TRUE(storage_->Put(ShardPath(name, 0, 1), "shard").ok());
    ASSERT_TRUE(WriteManifest(storage_.get(), OneVariableManifest(name, step)).ok());
  }
  ASSERT_TRUE(storage_->Put(ShardPath(CheckpointName(40), 0, 1), "half").ok());  // no manifest
  ASSERT_TRUE(storage_->Put(kLatestFile, CheckpointName(30) + "\n").ok());

  absl::StatusOr<std::vector<CheckpointEntry>> all = ListCheckpoints(storage_.get());
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 4u);
  EXPECT_EQ((*all)[0].name, "step-000000000010");
  EXPECT_TRUE((*all)[2].committed && (*all)[2].latest);
  EXPECT_FALSE((*all)[3].committed);

  absl::StatusOr<CheckpointRef> latest = ResolveCheckpoint("latest", "file://" + root_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->manifest.step(), 30);
  EXPECT_EQ(latest->uri(), "file://" + root_ + "/step-000000000030");
  absl::StatusOr<CheckpointRef> by_step = ResolveCheckpoint("20", root_);  // a plain path works too
  ASSERT_TRUE(by_step.ok()) << by_step.status();
  EXPECT_EQ(by_step->name, "step-000000000020");
  absl::StatusOr<CheckpointRef> by_uri = ResolveCheckpoint(root_ + "/step-000000000010", "");
  ASSERT_TRUE(by_uri.ok()) << by_uri.status();
  EXPECT_EQ(by_uri->manifest.step(), 10);
  absl::StatusOr<CheckpointRef> half = ResolveCheckpoint("40", root_);
  EXPECT_EQ(half.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(half.status().message(),
                                "committed checkpoints there: step-000000000010, step-000000000020, "
                                "step-000000000030"))
      << half.status();
  EXPECT_EQ(ResolveCheckpoint("bogus", root_).status().code(), absl::StatusCode::kInvalidArgument);

  // Writers that died mid-Put left temporary files: a shard in a folder of
  // its own and LATEST. Nothing lists them.
  const std::string dead_shard = root_ + "/step-000000000050/shard-00000-of-00001.psrt.psrt-tmp.123.0";
  const std::string dead_latest = root_ + "/LATEST.psrt-tmp.99.1";
  ASSERT_EQ(::mkdir((root_ + "/step-000000000050").c_str(), 0755), 0);
  std::ofstream(dead_shard) << "half a shard";
  std::ofstream(dead_latest) << "step-";
  all = ListCheckpoints(storage_.get());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 4u);

  // Keep 2: step-10 goes, the folder a crash left half written, and the
  // temporary files.
  ASSERT_TRUE(PruneCheckpoints(storage_.get(), 2, CheckpointName(30)).ok());
  all = ListCheckpoints(storage_.get());
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].name, "step-000000000020");
  EXPECT_EQ((*all)[1].name, "step-000000000030");
  struct stat st;
  EXPECT_NE(::stat(dead_shard.c_str(), &st), 0) << dead_shard;
  EXPECT_NE(::stat((root_ + "/step-000000000050").c_str(), &st), 0) << "empty folder left";
  EXPECT_NE(::stat(dead_latest.c_str(), &st), 0) << dead_latest;
  EXPECT_EQ(ReadLatest(storage_.get()).value_or(""), CheckpointName(30));
}

}  // namespace
}  // namespace psrt
