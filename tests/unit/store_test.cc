// Unit tests for psrt::Store, driven directly with hand-built v1 requests.
//
// Every expected weight is written out by hand. Gradients, learning rates and
// weights are chosen as small dyadic fractions so that the float32 update
// p - lr * g is exact and EXPECT_EQ on floats is meaningful.

#include "server/store.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/compression.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "psrt/v1/ps.pb.h"
#include "server/checkpoint/shard_format.h"

namespace psrt {
namespace {

std::string Bytes(const std::vector<float>& v) {
  std::string s(v.size() * sizeof(float), '\0');
  if (!v.empty()) std::memcpy(s.data(), v.data(), s.size());
  return s;
}

std::vector<float> Floats(const std::string& s) {
  std::vector<float> v(s.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), s.data(), v.size() * sizeof(float));
  return v;
}

v1::KeySpec Spec(const std::string& variable, uint32_t partition,
                 std::vector<int64_t> shape, int64_t offset, int64_t num_elements,
                 std::optional<std::vector<float>> init, const std::string& opt = "sgd",
                 double lr = 0.5) {
  v1::KeySpec s;
  s.set_variable(variable);
  s.set_partition(partition);
  s.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : shape) s.add_shape(d);
  s.set_offset(offset);
  s.set_num_elements(num_elements);
  s.mutable_optimizer()->set_name(opt);
  s.mutable_optimizer()->set_lr(lr);
  if (opt == "adam" || opt == "adamw") {
    s.mutable_optimizer()->set_beta1(0.9);
    s.mutable_optimizer()->set_beta2(0.999);
    s.mutable_optimizer()->set_eps(1e-8);
  }
  if (init.has_value()) s.set_init(Bytes(*init));
  return s;
}

// A whole 1-D variable as a single key, SGD.
v1::KeySpec Simple(const std::string& variable, std::optional<std::vector<float>> init,
                   int64_t n = 3, double lr = 0.5) {
  return Spec(variable, 0, {n}, 0, n, std::move(init), "sgd", lr);
}

v1::RegisterKeysRequest RegReq(int rank, std::vector<v1::KeySpec> specs) {
  v1::RegisterKeysRequest r;
  r.set_worker_rank(rank);
  for (auto& s : specs) *r.add_keys() = std::move(s);
  return r;
}

v1::KeyData Grad(const std::string& variable, int64_t version, const std::vector<float>& g,
                 uint32_t partition = 0) {
  v1::KeyData kd;
  kd.set_variable(variable);
  kd.set_partition(partition);
  kd.set_version(version);
  kd.set_dtype(v1::DTYPE_FLOAT32);
  kd.set_data(Bytes(g));
  return kd;
}

v1::PushRequest PushReq(int rank, uint64_t push_id, std::vector<v1::KeyData> keys) {
  v1::PushRequest r;
  r.set_worker_rank(rank);
  r.set_push_id(push_id);
  for (auto& k : keys) *r.add_keys() = std::move(k);
  return r;
}

v1::PullRequest PullReq(int rank, const std::string& variable, int64_t version,
                        uint32_t partition = 0) {
  v1::PullRequest r;
  r.set_worker_rank(rank);
  v1::KeyData* kd = r.add_keys();
  kd->set_variable(variable);
  kd->set_partition(partition);
  kd->set_version(version);
  return r;
}

struct Pulled {
  int64_t version;
  std::vector<float> weights;
};

absl::StatusOr<Pulled> PullOne(Store& store, int rank, const std::string& variable,
                               int64_t version, absl::Duration wait = absl::Seconds(10),
                               uint32_t partition = 0) {
  v1::PullResponse resp;
  absl::Status s =
      store.Pull(PullReq(rank, variable, version, partition), absl::Now() + wait, &resp);
  if (!s.ok()) return s;
  if (resp.keys_size() != 1) return absl::InternalError("expected one key in the reply");
  const v1::KeyData& kd = resp.keys(0);
  if (kd.variable() != variable || kd.partition() != partition ||
      kd.dtype() != v1::DTYPE_FLOAT32) {
    return absl::InternalError(absl::StrCat("reply names the wrong key: ", kd.ShortDebugString()));
  }
  return Pulled{kd.version(), Floats(kd.data())};
}

double Metric(const Metrics& m, const std::string& name) {
  auto snap = m.Snapshot();
  auto it = snap.find(name);
  if (it == snap.end()) {
    ADD_FAILURE() << "no metric " << name;
    return -1;
  }
  return it->second;
}

StoreOptions Sync(int workers, bool average = true) {
  StoreOptions o;
  o.sync = true;
  o.num_workers = workers;
  o.average_gradients = average;
  return o;
}

StoreOptions Async(int workers) {
  StoreOptions o;
  o.sync = false;
  o.num_workers = workers;
  return o;
}

// Checks that a status message contains `text`.
#define EXPECT_HAS(status, text)                                        \
  EXPECT_TRUE(absl::StrContains((status).message(), (text)))           \
      << "message: " << (status).message() << "\nwanted: " << (text)

// Checks that key `variable` is at `version` holding `weights`.
void ExpectKey(Store& store, const std::string& variable, int64_t version,
               const std::vector<float>& weights) {
  absl::StatusOr<Pulled> p = PullOne(store, 0, variable, 0);
  if (!p.ok()) {
    ADD_FAILURE() << "pull of " << variable << ": " << p.status();
    return;
  }
  EXPECT_EQ(p->version, version) << "key " << variable;
  EXPECT_EQ(p->weights, weights) << "key " << variable;
}
#define EXPECT_KEY(...)                  \
  do {                                   \
    SCOPED_TRACE("EXPECT_KEY");          \
    ExpectKey(__VA_ARGS__);              \
  } while (0)

const std::vector<float> kW0 = {1.0f, -2.0f, 3.5f};

// ---------------------------------------------------------------------------
// Registration

TEST(StoreTest, RegisterRank0WithInitCreatesKey) {
  Metrics m("t");
  Store store(Sync(1), &m);
  EXPECT_EQ(store.num_keys(), 0);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  EXPECT_EQ(store.num_keys(), 1);
  // weights + sync accumulator, SGD without momentum has no slot: 2 * 3 * 4.
  EXPECT_EQ(store.bytes_stored(), 24);
  absl::StatusOr<Pulled> p = PullOne(store, 0, "w", 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->version, 0);
  EXPECT_EQ(p->weights, kW0);
}

TEST(StoreTest, RegisterRank1WithoutInitSeesRank0Value) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  absl::Status s = store.RegisterKeys(RegReq(1, {Simple("w", std::nullopt)}));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(store.num_keys(), 1);
  absl::StatusOr<Pulled> p = PullOne(store, 1, "w", 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->version, 0);
  EXPECT_EQ(p->weights, kW0);
}

TEST(StoreTest, RegisterRank1FirstThenPullWaitsForRank0) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(1, {Simple("w", std::nullopt)})).ok());
  EXPECT_EQ(store.num_keys(), 1);
  absl::StatusOr<Pulled> early = PullOne(store, 1, "w", 0, absl::Milliseconds(50));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded) << early.status();
  EXPECT_HAS(early.status(), "rank 0 has not registered");
  // A push before rank 0 has registered has nothing to apply to.
  absl::Status push = store.Push(PushReq(1, 1, {Grad("w", 0, {1, 1, 1})}));
  EXPECT_EQ(push.code(), absl::StatusCode::kFailedPrecondition) << push;

  absl::StatusOr<Pulled> waited;
  std::thread puller([&] { waited = PullOne(store, 1, "w", 0, absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  puller.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->version, 0);
  EXPECT_EQ(waited->weights, kW0);
}

TEST(StoreTest, ReRegisterKeepsFirstValue) {
  Metrics m("t");
  Store store(Sync(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  // Train one step so "first value" is distinguishable from a reset too.
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, {2.0f, 2.0f, 2.0f})})).ok());
  // 1 - 0.5*2 = 0, -2 - 1 = -3, 3.5 - 1 = 2.5
  EXPECT_KEY(store, "w", 1, {0.0f, -3.0f, 2.5f});
  absl::Status s = store.RegisterKeys(RegReq(0, {Simple("w", {{9.0f, 9.0f, 9.0f}})}));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(store.num_keys(), 1);
  EXPECT_EQ(store.bytes_stored(), 24);  // not counted twice
  EXPECT_KEY(store, "w", 1, {0.0f, -3.0f, 2.5f});
}

TEST(StoreTest, RegisterRank1WithInitIsInvalid) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  absl::Status s = store.RegisterKeys(RegReq(1, {Simple("w", {{5, 5, 5}})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s, "w#0");
  EXPECT_KEY(store, "w", 0, kW0);
  // Not even for a key that does not exist yet.
  s = store.RegisterKeys(RegReq(1, {Simple("v", {{5, 5, 5}})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(store.num_keys(), 1);
}

TEST(StoreTest, RegisterRank0WithoutInitIsInvalid) {
  Metrics m("t");
  Store store(Sync(2), &m);
  absl::Status s = store.RegisterKeys(RegReq(0, {Simple("w", std::nullopt)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s, "initial value");
  EXPECT_EQ(store.num_keys(), 0);
}

TEST(StoreTest, RegisterBadWorkerRankOrNoKeysIsInvalid) {
  Metrics m("t");
  Store store(Sync(2), &m);
  EXPECT_EQ(store.RegisterKeys(RegReq(-1, {Simple("w", std::nullopt)})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.RegisterKeys(RegReq(2, {Simple("w", std::nullopt)})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.RegisterKeys(RegReq(0, {})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.num_keys(), 0);
}

TEST(StoreTest, ReRegisterWithDifferentShapeIsFailedPrecondition) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Spec("w", 0, {4}, 0, 4, {{1, 2, 3, 4}})})).ok());
  absl::Status s = store.RegisterKeys(RegReq(1, {Spec("w", 0, {2, 2}, 0, 4, std::nullopt)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_HAS(s, "[4]");
  EXPECT_HAS(s, "[2, 2]");
  EXPECT_HAS(s, "shape");
  EXPECT_KEY(store, "w", 0, {1, 2, 3, 4});
}

TEST(StoreTest, ReRegisterWithDifferentSliceIsFailedPrecondition) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Spec("w", 0, {8}, 0, 4, {{1, 2, 3, 4}})})).ok());
  absl::Status s = store.RegisterKeys(RegReq(1, {Spec("w", 0, {8}, 4, 4, std::nullopt)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_HAS(s, "[0, +4)");
  EXPECT_HAS(s, "[4, +4)");
  // Same offset, different length.
  s = store.RegisterKeys(RegReq(1, {Spec("w", 0, {8}, 0, 3, std::nullopt)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_HAS(s, "[0, +4)");
  EXPECT_HAS(s, "[0, +3)");
  EXPECT_KEY(store, "w", 0, {1, 2, 3, 4});
}

TEST(StoreTest, ReRegisterWithDifferentOptimizerIsFailedPrecondition) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Spec("w", 0, {3}, 0, 3, kW0, "sgd")})).ok());
  absl::Status s =
      store.RegisterKeys(RegReq(1, {Spec("w", 0, {3}, 0, 3, std::nullopt, "adam")}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_HAS(s, "sgd");
  EXPECT_HAS(s, "adam");
  EXPECT_HAS(s, "optimizer");
  EXPECT_KEY(store, "w", 0, kW0);
}

TEST(StoreTest, RegisterUnknownOptimizerIsInvalid) {
  Metrics m("t");
  Store store(Sync(1), &m);
  absl::Status s = store.RegisterKeys(RegReq(0, {Spec("w", 0, {3}, 0, 3, kW0, "rmsprop")}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s, "rmsprop");
  EXPECT_EQ(store.num_keys(), 0);
  // An invalid config of a known optimizer too.
  s = store.RegisterKeys(RegReq(0, {Spec("w", 0, {3}, 0, 3, kW0, "sgd", -1.0)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(store.num_keys(), 0);
}

TEST(StoreTest, RegisterBadShapeSliceOrInitIsInvalid) {
  Metrics m("t");
  Store store(Sync(1), &m);
  struct Case {
    const char* what;
    v1::KeySpec spec;
    const char* in_message;
  };
  v1::KeySpec f16 = Spec("w", 0, {3}, 0, 3, kW0);
  f16.set_dtype(v1::DTYPE_FLOAT16);
  std::vector<Case> cases = {
      {"negative dim", Spec("w", 0, {3, -1}, 0, 3, kW0), "negative"},
      {"slice past end", Spec("w", 0, {4}, 2, 3, kW0), "does not fit"},
      {"negative offset", Spec("w", 0, {4}, -1, 3, kW0), "does not fit"},
      {"zero elements", Spec("w", 0, {4}, 0, 0, std::vector<float>{}), "does not fit"},
      {"more elements than shape", Spec("w", 0, {2}, 0, 3, kW0), "does not fit"},
      {"init too short", Spec("w", 0, {4}, 0, 4, kW0), "expected 16"},
      {"init too long", Spec("w", 0, {2}, 0, 2, kW0), "expected 8"},
      {"empty variable", Spec("", 0, {3}, 0, 3, kW0), "empty"},
      {"float16 variable", f16, "float16"},
  };
  for (const Case& c : cases) {
    absl::Status s = store.RegisterKeys(RegReq(0, {c.spec}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_HAS(s, c.in_message) << c.what;
  }
  // Init of 11 bytes: not even a whole number of floats.
  v1::KeySpec odd = Spec("w", 0, {3}, 0, 3, std::nullopt);
  odd.set_init(std::string(11, '\0'));
  absl::Status s = store.RegisterKeys(RegReq(0, {odd}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s, "11 bytes");
  EXPECT_HAS(s, "expected 12");
  EXPECT_EQ(store.num_keys(), 0);
  EXPECT_EQ(store.bytes_stored(), 0);
}

TEST(StoreTest, RegisterWithOneBadKeyRegistersNothing) {
  Metrics m("t");
  Store store(Sync(1), &m);
  // Good key first, bad (negative dim) second.
  absl::Status s = store.RegisterKeys(
      RegReq(0, {Simple("good", kW0), Spec("bad", 0, {-3}, 0, 3, kW0)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(store.num_keys(), 0);
  EXPECT_EQ(store.bytes_stored(), 0);
  EXPECT_EQ(PullOne(store, 0, "good", 0).status().code(), absl::StatusCode::kNotFound);

  // Good key first, second one conflicts with an existing registration.
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("old", kW0)})).ok());
  s = store.RegisterKeys(RegReq(0, {Simple("good", kW0), Simple("old", {{1, 2, 3, 4}}, 4)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(store.num_keys(), 1);
  EXPECT_EQ(PullOne(store, 0, "good", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_KEY(store, "old", 0, kW0);
}

TEST(StoreTest, RegisterSeveralPartitions) {
  Metrics m("t");
  Store store(Sync(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Spec("v", 0, {2, 3}, 0, 4, {{1, 2, 3, 4}}),
                                            Spec("v", 1, {2, 3}, 4, 2, {{5, 6}})}))
                  .ok());
  EXPECT_EQ(store.num_keys(), 2);
  absl::StatusOr<Pulled> p0 = PullOne(store, 0, "v", 0, absl::Seconds(5), 0);
  absl::StatusOr<Pulled> p1 = PullOne(store, 0, "v", 0, absl::Seconds(5), 1);
  ASSERT_TRUE(p0.ok() && p1.ok());
  EXPECT_EQ(p0->weights, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(p1->weights, (std::vector<float>{5, 6}));
  EXPECT_EQ(PullOne(store, 0, "v", 0, absl::Seconds(5), 2).status().code(),
            absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------
// Sync mode

// w0 = {1, -2, 3.5}, lr = 0.5, g0 = {0.5, 1, -2}, g1 = {1.5, -3, 4}.
// mean = {1, -1, 1}  -> w1 = {0.5, -1.5, 3}
// sum  = {2, -2, 2}  -> w1 = {0, -1, 2.5}
const std::vector<float> kG0 = {0.5f, 1.0f, -2.0f};
const std::vector<float> kG1 = {1.5f, -3.0f, 4.0f};
const std::vector<float> kW1Mean = {0.5f, -1.5f, 3.0f};
const std::vector<float> kW1Sum = {0.0f, -1.0f, 2.5f};

TEST(StoreTest, SyncWaitsForAllWorkersThenAppliesMean) {
  Metrics m("t");
  Store store(Sync(2, /*average=*/true), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  ASSERT_TRUE(store.RegisterKeys(RegReq(1, {Simple("w", std::nullopt)})).ok());

  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<Pulled> early = PullOne(store, 0, "w", 1, absl::Milliseconds(100));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded) << early.status();
  EXPECT_HAS(early.status(), "waiting for pushes from workers 1");
  // Worker 1 and only worker 1: the list ends the message.
  EXPECT_TRUE(absl::EndsWith(early.status().message(), "from workers 1"))
      << early.status();
  EXPECT_HAS(early.status(), "at version 0");
  // Version 0 is still there, untouched.
  EXPECT_KEY(store, "w", 0, kW0);

  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  absl::StatusOr<Pulled> p = PullOne(store, 1, "w", 1);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->version, 1);
  EXPECT_EQ(p->weights, kW1Mean);
  EXPECT_EQ(Metric(m, "t_updates_total"), 1);
}

TEST(StoreTest, ANonFiniteStepIsSkippedOrStopsTheKeyAsTheJobSays) {
  const std::vector<float> nan_grad = {1.0f, std::numeric_limits<float>::quiet_NaN(), 0.5f};
  const std::vector<float> inf_grad = {std::numeric_limits<float>::infinity(), 0.0f, 0.0f};
  {
    // skip (the default): the version moves on, the weights stay, and the
    // next finite step applies as usual.
    Metrics m("t");
    Store store(Sync(2), &m);
    ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
    ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
    ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, nan_grad)})).ok());
    EXPECT_KEY(store, "w", 1, kW0);
    EXPECT_EQ(Metric(m, "t_nonfinite_updates_total"), 1);
    EXPECT_EQ(Metric(m, "t_updates_total"), 0);
    ASSERT_TRUE(store.Push(PushReq(0, 2, {Grad("w", 1, kG0)})).ok());
    ASSERT_TRUE(store.Push(PushReq(1, 2, {Grad("w", 1, kG1)})).ok());
    EXPECT_KEY(store, "w", 2, kW1Mean);
  }
  {
    // fail: the waiting pull and every later call get the reason.
    Metrics m("t");
    StoreOptions o = Sync(2);
    o.fail_on_nonfinite = true;
    Store store(o, &m);
    ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
    ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, inf_grad)})).ok());
    absl::StatusOr<Pulled> waited;
    std::thread puller([&] { waited = PullOne(store, 0, "w", 1, absl::Seconds(20)); });
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
    puller.join();
    EXPECT_EQ(waited.status().code(), absl::StatusCode::kFailedPrecondition) << waited.status();
    EXPECT_HAS(waited.status(), "key 'w#0' got a gradient with NaN or Inf at version 0");
    EXPECT_HAS(waited.status(), "\"nonfinite\" setting is \"fail\"");
    EXPECT_EQ(store.Push(PushReq(0, 2, {Grad("w", 0, kG0)})).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(PullOne(store, 1, "w", 0).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(Metric(m, "t_nonfinite_updates_total"), 1);
  }
  {
    // Async: the push is skipped, nothing else changes.
    Metrics m("t");
    Store store(Async(1), &m);
    ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
    ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, nan_grad)})).ok());
    EXPECT_KEY(store, "w", 1, kW0);
    EXPECT_EQ(Metric(m, "t_nonfinite_updates_total"), 1);
  }
}

v1::KeyData NoGradient(const std::string& variable, int64_t version) {
  v1::KeyData kd;
  kd.set_variable(variable);
  kd.set_version(version);
  kd.set_no_gradient(true);
  return kd;
}

TEST(StoreTest, AStepWithoutAGradientFromAnyWorkerLeavesTheKeyAsItWas) {
  // Adam: "a" goes a step without gradient and then takes kG0; "b" takes
  // kG0 at once. Both took one update, so both hold the same weights (the
  // bias correction counts updates, not versions), a version apart.
  for (int workers : {1, 2}) {
    Metrics m("t");
    Store store(Sync(workers), &m);
    std::vector<v1::KeySpec> specs = {Spec("a", 0, {3}, 0, 3, kW0, "adam"),
                                      Spec("b", 0, {3}, 0, 3, kW0, "adam")};
    ASSERT_TRUE(store.RegisterKeys(RegReq(0, specs)).ok());
    for (int w = 0; w < workers; ++w)
      ASSERT_TRUE(store.Push(PushReq(w, 1, {NoGradient("a", 0), Grad("b", 0, kG0)})).ok());
    EXPECT_KEY(store, "a", 1, kW0);
    EXPECT_EQ(Metric(m, "t_updates_total"), 1);  // b's
    for (int w = 0; w < workers; ++w)
      ASSERT_TRUE(store.Push(PushReq(w, 2, {Grad("a", 1, kG0)})).ok());
    absl::StatusOr<Pulled> a = PullOne(store, 0, "a", 2);
    absl::StatusOr<Pulled> b = PullOne(store, 0, "b", 1);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_EQ(a->version, 2);
    EXPECT_NE(a->weights, kW0);
    EXPECT_EQ(a->weights, b->weights) << "workers " << workers;
  }
}

TEST(StoreTest, AWorkerWithoutAGradientCountsAsZerosInTheMean) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 1, {NoGradient("w", 0)})).ok());
  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  // w - 0.5 * (0 + kG1) / 2
  EXPECT_KEY(store, "w", 1, (std::vector<float>{0.625f, -1.25f, 2.5f}));
  // A step's first gradient after a worker without one starts the sum.
  ASSERT_TRUE(store.Push(PushReq(1, 2, {NoGradient("w", 1)})).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 2, {Grad("w", 1, kG0)})).ok());
  EXPECT_KEY(store, "w", 2, (std::vector<float>{0.5f, -1.5f, 3.0f}));
}

TEST(StoreTest, ANoGradientPushCarriesNothingElseAndAsyncOnlyMovesTheClock) {
  {
    Metrics m("t");
    Store store(Sync(1), &m);
    ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
    v1::KeyData with_values = NoGradient("w", 0);
    with_values.set_data(Bytes(kG0));
    absl::Status s = store.Push(PushReq(0, 1, {with_values}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_HAS(s, "says it has no gradient (no_gradient) but carries values");
    EXPECT_KEY(store, "w", 0, kW0);
  }
  {
    Metrics m("t");
    Store store(Async(1), &m);
    ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
    ASSERT_TRUE(store.Push(PushReq(0, 1, {NoGradient("w", 0)})).ok());
    EXPECT_KEY(store, "w", 0, kW0);
    EXPECT_EQ(store.WorkerClocks(), std::vector<int64_t>{1});
  }
}

TEST(StoreTest, LimitsRefuseWhatWouldExceedThemAndSayWhich) {
  Metrics m("t");
  StoreOptions o = Sync(1);
  o.max_bytes = 3 * 4 * 2 * 2;  // two 3-element SGD keys: weights and accumulator
  o.max_variables = 2;
  o.max_keys_per_variable = 2;
  Store store(o, &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", kW0)})).ok());
  absl::Status s = store.RegisterKeys(RegReq(0, {Spec("b", 2, {9}, 6, 3, kW0, "sgd", 0.5)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_HAS(s, "a variable has at most 2 keys (limits.max_keys_per_variable)");
  // Two new keys in one request: the second passes the byte limit, and
  // neither is registered.
  s = store.RegisterKeys(RegReq(0, {Simple("b", kW0), Simple("c", kW0)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_HAS(s, "key 'c#0': this server holds 2 variables already, its limit (limits.max_variables)");
  EXPECT_EQ(store.num_keys(), 1);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("b", kW0)})).ok());
  s = store.RegisterKeys(RegReq(0, {Spec("a", 1, {6}, 3, 3, kW0, "sgd", 0.5)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_HAS(s, "would hold 72 bytes of weights and optimizer state, more than limits.max_server_bytes (48)");
  EXPECT_EQ(store.num_keys(), 2);
}

TEST(StoreTest, SyncNamesEveryMissingWorker) {
  Metrics m("t");
  Store store(Sync(4), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  ASSERT_TRUE(store.Push(PushReq(2, 1, {Grad("w", 0, kG0)})).ok());
  absl::StatusOr<Pulled> p = PullOne(store, 2, "w", 1, absl::Milliseconds(30));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::EndsWith(p.status().message(), "from workers 0, 1, 3")) << p.status();
}

TEST(StoreTest, SyncBlockedPullWakesWhenLastWorkerPushes) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
  absl::StatusOr<Pulled> waited;
  std::thread puller([&] { waited = PullOne(store, 0, "w", 1, absl::Seconds(20)); });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  puller.join();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->version, 1);
  EXPECT_EQ(waited->weights, kW1Mean);
}

TEST(StoreTest, SyncWithoutAveragingAppliesSum) {
  Metrics m("t");
  Store store(Sync(2, /*average=*/false), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  EXPECT_KEY(store, "w", 0, kW0);
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
  EXPECT_KEY(store, "w", 1, kW1Sum);
}

TEST(StoreTest, SyncSecondStepStartsFromFreshAccumulator) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  EXPECT_KEY(store, "w", 1, kW1Mean);
  // Step 2: g = {2, 2, 2} and {-2, 2, 6}: mean {0, 2, 4}; w2 = w1 - 0.5*mean.
  ASSERT_TRUE(store.Push(PushReq(1, 2, {Grad("w", 1, {2, 2, 2})})).ok());
  EXPECT_KEY(store, "w", 1, kW1Mean);
  ASSERT_TRUE(store.Push(PushReq(0, 2, {Grad("w", 1, {-2, 2, 6})})).ok());
  EXPECT_KEY(store, "w", 2, {0.5f, -2.5f, 1.0f});
}

TEST(StoreTest, SyncDuplicatePushIsAppliedOnce) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 0);

  ASSERT_TRUE(store.Push(PushReq(0, 7, {Grad("w", 0, kG0)})).ok());
  // The same push retried.
  ASSERT_TRUE(store.Push(PushReq(0, 7, {Grad("w", 0, kG0)})).ok());
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 1);
  // Same worker, same version, a new id and a different gradient.
  ASSERT_TRUE(store.Push(PushReq(0, 8, {Grad("w", 0, {100, 100, 100})})).ok());
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 2);
  EXPECT_KEY(store, "w", 0, kW0);  // worker 1 still missing

  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  EXPECT_KEY(store, "w", 1, kW1Mean);
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 2);
  EXPECT_EQ(Metric(m, "t_updates_total"), 1);

  // Retries arriving after the step completed change nothing either.
  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 9, {Grad("w", 0, kG0)})).ok());  // stale version
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 4);
  EXPECT_KEY(store, "w", 1, kW1Mean);
  EXPECT_EQ(Metric(m, "t_updates_total"), 1);
}

TEST(StoreTest, APushForSeveralWorkersCountsForEachAndTheStepIsTheMeanOverAll) {
  Metrics m("t");
  Store store(Sync(3), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  // Workers 0 and 1 share a host, which sums their gradients ({1, 2, 3}
  // and {3, 2, 1}) first; worker 2 pushes alone.
  v1::PushRequest host = PushReq(0, 1, {Grad("w", 0, {4, 4, 4})});
  host.add_also_for(1);
  // Refused whole, changing nothing: also_for naming the pusher, a rank
  // twice or out of range.
  for (const std::vector<int>& bad : std::vector<std::vector<int>>{{0}, {1, 1}, {3}}) {
    v1::PushRequest r = PushReq(0, 1, {Grad("w", 0, {9, 9, 9})});
    for (int rank : bad) r.add_also_for(rank);
    EXPECT_EQ(store.Push(r).code(), absl::StatusCode::kInvalidArgument);
  }
  ASSERT_TRUE(store.Push(host).ok());
  EXPECT_KEY(store, "w", 0, kW0);  // worker 2 still missing
  // Worker 1's own push for the step now is a duplicate: it was counted.
  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, {100, 100, 100})})).ok());
  ASSERT_TRUE(store.Push(host).ok());  // a retry
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 2);
  ASSERT_TRUE(store.Push(PushReq(2, 1, {Grad("w", 0, {2, 2, 2})})).ok());
  // The mean over three workers: (4 + 2) / 3 = 2.
  EXPECT_KEY(store, "w", 1, std::vector<float>({0.0f, -3.0f, 2.5f}));
  EXPECT_EQ(Metric(m, "t_updates_total"), 1);

  // Step 1: worker 1 pushed on its own, so a host push that holds its
  // gradient again is refused (it would be summed twice).
  ASSERT_TRUE(store.Push(PushReq(1, 2, {Grad("w", 1, {1, 1, 1})})).ok());
  v1::PushRequest again = PushReq(0, 2, {Grad("w", 1, {2, 2, 2})});
  again.add_also_for(1);
  const absl::Status twice = store.Push(again);
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_HAS(twice, "on their own already");

  // Async and ssp apply each worker's push alone.
  Metrics am("a");
  Store async(Async(2), &am);
  ASSERT_TRUE(async.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  v1::PushRequest r = PushReq(0, 1, {Grad("w", 0, {1, 1, 1})});
  r.add_also_for(1);
  const absl::Status refused = async.Push(r);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(refused, "for sync jobs");
  EXPECT_KEY(async, "w", 0, kW0);
}

// ---------------------------------------------------------------------------
// Keys moving to another server ("max_servers"): Release on the old one,
// Seed's hand-over and Promote on the new one.

StoreOptions SyncServer(int self) {
  StoreOptions o = Sync(2);
  o.self = self;
  return o;
}

TEST(StoreTest, AReleasedKeyGoesWithItsHalfDoneStepAndItsWaitingPullsAskAgain) {
  Metrics ma("a"), mb("b");
  Store a(SyncServer(0), &ma), b(SyncServer(1), &mb);
  ASSERT_TRUE(a.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  ASSERT_TRUE(a.RegisterKeys(RegReq(1, {Simple("w", std::nullopt)})).ok());
  auto to_b = [&](const v1::SeedRequest& req) { return b.Seed(req); };
  a.SeedCopies(0, to_b);  // the copy the move starts with
  // Worker 0's push of step 0 is in; worker 1's is not, and worker 0 waits.
  ASSERT_TRUE(a.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
  absl::Status waited;
  std::thread pull([&] { waited = PullOne(a, 0, "w", 1).status(); });
  while (a.pending_pulls() == 0) absl::SleepFor(absl::Milliseconds(1));
  a.Release(0, 1, to_b);
  pull.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_HAS(waited, "key 'w#0' moved to server 1");
  EXPECT_EQ(a.bytes_stored(), 0);  // freed
  absl::Status late = a.Push(PushReq(1, 1, {Grad("w", 0, kG1)}));
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  // Not served on b until it is told so.
  EXPECT_EQ(PullOne(b, 0, "w", 0).status().code(), absl::StatusCode::kUnavailable);
  b.Promote(0);
  // Worker 0's push, sent again, is known; worker 1's finishes the step.
  ASSERT_TRUE(b.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
  EXPECT_EQ(Metric(mb, "b_duplicate_pushes_total"), 1);
  ASSERT_TRUE(b.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  EXPECT_KEY(b, "w", 1, kW1Mean);
  EXPECT_EQ(Metric(mb, "b_updates_total"), 1);
}

TEST(StoreTest, AKeyBackAsACopyWhereItWasReleasedMidStepKeepsNoneOfThatStep) {
  // Server a lets key w go with worker 0's push of step 0 counted; b
  // finishes the step, then copies the key back to a (a is its copy holder
  // now), and a takes over: its next step waits for both workers again.
  Metrics ma("a"), mb("b");
  Store a(SyncServer(0), &ma), b(SyncServer(1), &mb);
  ASSERT_TRUE(a.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  ASSERT_TRUE(a.RegisterKeys(RegReq(1, {Simple("w", std::nullopt)})).ok());
  auto to_b = [&](const v1::SeedRequest& req) { return b.Seed(req); };
  a.SeedCopies(0, to_b);
  ASSERT_TRUE(a.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
  a.Release(0, 1, to_b);
  b.Promote(0);
  ASSERT_TRUE(b.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  EXPECT_KEY(b, "w", 1, kW1Mean);
  // (Sent once b's lock is let go: in one process a's and b's key locks
  // taken both ways round would look like a deadlock.)
  std::vector<v1::SeedRequest> copies;
  b.SeedCopies(0, [&](const v1::SeedRequest& req) {
    copies.push_back(req);
    return absl::OkStatus();
  });
  ASSERT_EQ(copies.size(), 1u);
  ASSERT_TRUE(a.Seed(copies[0]).ok());
  a.Promote(0);  // b is gone
  ASSERT_TRUE(a.Push(PushReq(0, 2, {Grad("w", 1, {2, 2, 2})})).ok());
  EXPECT_KEY(a, "w", 1, kW1Mean);  // worker 1's push of step 1 is still to come
  ASSERT_TRUE(a.Push(PushReq(1, 2, {Grad("w", 1, {-2, 2, 6})})).ok());
  EXPECT_KEY(a, "w", 2, {0.5f, -2.5f, 1.0f});
}

TEST(StoreTest, AHandOverToAServerWithoutACurrentCopyBringsTheWeights) {
  Metrics ma("a"), mb("b");
  Store a(SyncServer(0), &ma), b(SyncServer(1), &mb);
  ASSERT_TRUE(a.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  ASSERT_TRUE(a.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
  std::vector<v1::SeedRequest> sent;
  a.Release(0, 1, [&](const v1::SeedRequest& req) {
    sent.push_back(req);
    return b.Seed(req);
  });
  // First without the weights (b holds no copy: refused), then with them.
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_TRUE(sent[0].weights().empty());
  EXPECT_FALSE(sent[1].weights().empty());
  b.Promote(0);
  ASSERT_TRUE(b.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  EXPECT_KEY(b, "w", 1, kW1Mean);
}

TEST(StoreTest, AHandOverThatDoesNotFitChangesNothing) {
  Metrics mb("b");
  Store b(SyncServer(1), &mb);
  v1::SeedRequest req;
  *req.mutable_spec() = Simple("w", std::nullopt);
  req.set_primary(0);
  req.set_weights(Bytes(kW0));
  req.set_handover(true);
  req.add_contributed(true);  // two workers, one flag
  EXPECT_EQ(b.Seed(req).code(), absl::StatusCode::kInvalidArgument);
  req.clear_contributed();
  req.add_recent_next(-1);
  EXPECT_EQ(b.Seed(req).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.num_keys(), 0);
  // An owner that is no server, or a copy that names one, is refused.
  v1::RegisterKeysRequest reg = RegReq(0, {Simple("w", kW0)});
  reg.set_owner(-2);
  EXPECT_EQ(b.RegisterKeys(reg).code(), absl::StatusCode::kInvalidArgument);
  reg.set_owner(0);
  reg.set_replica(true);
  EXPECT_EQ(b.RegisterKeys(reg).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.num_keys(), 0);
}

// A table's part: an open hash table of rows of 2, Adam (two slots), on
// one server.
v1::KeySpec TablePart() {
  v1::KeySpec s = Spec("t", 0, {0, 2}, 0, 0, std::nullopt, "adam", 0.25);
  v1::TableSpec* t = s.mutable_table();
  t->set_dim(2);
  t->set_seed(3);
  t->set_init_std(1.0);
  t->set_num_shards(1);
  t->set_evict_after_steps(4);
  return s;
}

v1::KeyData Rows(int64_t version, const std::vector<int64_t>& ids, const std::vector<float>& g) {
  v1::KeyData kd = Grad("t", version, g);
  for (int64_t id : ids) kd.add_ids(id);
  return kd;
}

absl::StatusOr<std::vector<float>> PullRows(Store& store, int64_t version,
                                            const std::vector<int64_t>& ids) {
  v1::PullRequest r = PullReq(0, "t", version);
  for (int64_t id : ids) r.mutable_keys(0)->add_ids(id);
  v1::PullResponse resp;
  if (absl::Status s = store.Pull(r, absl::Now() + absl::Seconds(10), &resp); !s.ok()) return s;
  return Floats(resp.keys(0).data());
}

// A rate for every variable is the dense variables': a table keeps its own
// (psrt.keras.Embedding's lr beside the model's schedule) until set by name.
TEST(StoreTest, ARateForEveryVariableLeavesATablesOwnRate) {
  Metrics m("t");
  Store store(Sync(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", kW0), TablePart()})).ok());
  v1::SetLearningRateRequest lr;
  lr.set_worker_rank(0);
  lr.set_lr(0.5);
  absl::StatusOr<int64_t> changed = store.SetLearningRate(lr);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(*changed, 1);  // "a" alone
  lr.set_variable("t");
  changed = store.SetLearningRate(lr);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(*changed, 1);
}

// Steps 0..steps-1 of two workers on a table; worker 1 skips its push of
// the last step when `half` (the step is then half done).
void TrainTable(Store& store, int steps, bool half) {
  for (int step = 0; step < steps; ++step) {
    const int64_t a = step % 5, b = 7 + step % 3;
    const float g = 0.125f * (step + 1);
    ASSERT_TRUE(PullRows(store, step, {a, b, 11}).ok());
    ASSERT_TRUE(store.Push(PushReq(0, 100 + step, {Rows(step, {a, 11}, {g, -g, g, g})})).ok());
    if (half && step == steps - 1) return;
    ASSERT_TRUE(store.Push(PushReq(1, 200 + step, {Rows(step, {b, a}, {-g, g, 2 * g, 0})})).ok());
  }
}

TEST(StoreTest, ATablesPartMovesWholeWithItsRowsSlotsCountersAndHalfDoneStep) {
  Metrics ma("a"), mb("b"), mr("r");
  Store a(SyncServer(0), &ma), b(SyncServer(1), &mb), ref(SyncServer(0), &mr);
  for (Store* s : {&a, &ref}) {
    ASSERT_TRUE(s->RegisterKeys(RegReq(0, {TablePart()})).ok());
    ASSERT_TRUE(s->RegisterKeys(RegReq(1, {TablePart()})).ok());
  }
  // Five steps (rows made, updated, evicted at steps 2 and 4), then half of
  // the sixth; `a` lets the part go to `b` there, `ref` keeps it.
  TrainTable(a, 6, /*half=*/true);
  TrainTable(ref, 6, /*half=*/true);
  std::vector<v1::SeedRequest> sent;
  a.Release(0, 1, [&](const v1::SeedRequest& req) {
    sent.push_back(req);
    return b.Seed(req);
  });
  ASSERT_EQ(sent.size(), 1u);  // one part: no copy to build, the rows go along
  EXPECT_FALSE(sent[0].rows().empty());
  EXPECT_EQ(sent[0].accum_ids_size(), 2);  // worker 0's rows of the sixth step
  EXPECT_EQ(a.bytes_stored(), 0);
  EXPECT_EQ(b.bytes_stored(), ref.bytes_stored());
  EXPECT_EQ(PullRows(b, 5, {1}).status().code(), absl::StatusCode::kUnavailable);
  b.Promote(0);
  // Worker 0's push, sent again, is known; worker 1's finishes the step.
  const int64_t last = 5, x = last % 5, y = 7 + last % 3;
  const float g = 0.125f * (last + 1);
  ASSERT_TRUE(b.Push(PushReq(0, 100 + last, {Rows(last, {x, 11}, {g, -g, g, g})})).ok());
  EXPECT_EQ(Metric(mb, "b_duplicate_pushes_total"), 1);
  for (Store* s : {&b, &ref}) {
    ASSERT_TRUE(s->Push(PushReq(1, 200 + last, {Rows(last, {y, x}, {-g, g, 2 * g, 0})})).ok());
  }
  // Two more steps on both: the same rows, bit for bit, and the same
  // eviction (rows 0..4 not seen for 4 steps go at step 8).
  for (int step = 6; step < 8; ++step) {
    for (Store* s : {&b, &ref}) {
      ASSERT_TRUE(s->Push(PushReq(0, 100 + step, {Rows(step, {11}, {1, 1})})).ok());
      ASSERT_TRUE(s->Push(PushReq(1, 200 + step, {Rows(step, {}, {})})).ok());
    }
  }
  const std::vector<int64_t> ids = {0, 1, 2, 3, 4, 7, 8, 9, 11};
  absl::StatusOr<std::vector<float>> moved = PullRows(b, 8, ids), kept = PullRows(ref, 8, ids);
  ASSERT_TRUE(moved.ok()) << moved.status();
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(0, std::memcmp(moved->data(), kept->data(), kept->size() * 4));
  EXPECT_EQ(Metric(mb, "b_evicted_rows_total") + Metric(ma, "a_evicted_rows_total"),
            Metric(mr, "r_evicted_rows_total"));
}

TEST(StoreTest, ATablesPartInPartsIsTakenOnceEachAndNotServedUntilAllAreHere) {
  Metrics ma("a"), mb("b");
  Store a(SyncServer(0), &ma), b(SyncServer(1), &mb);
  ASSERT_TRUE(a.RegisterKeys(RegReq(0, {TablePart()})).ok());
  ASSERT_TRUE(a.RegisterKeys(RegReq(1, {TablePart()})).ok());
  TrainTable(a, 2, /*half=*/false);
  v1::SeedRequest whole;
  a.Release(0, 1, [&](const v1::SeedRequest& req) {
    whole = req;
    return absl::OkStatus();
  });
  // The same rows as three parts of one row, two rows and the rest.
  absl::StatusOr<std::vector<KeyRecord>> rec = DecodeShard(whole.rows(), "t");
  ASSERT_TRUE(rec.ok()) << rec.status();
  const size_t rows = (*rec)[0].row_ids.size();
  ASSERT_GE(rows, 4u);
  std::vector<v1::SeedRequest> parts;
  for (auto [first, end] : {std::pair<size_t, size_t>{0, 1}, {1, 3}, {3, rows}}) {
    KeyRecord part = (*rec)[0];
    part.row_ids.clear(), part.row_stats.clear(), part.weights.clear();
    for (auto& slot : part.slots) slot.clear();
    for (size_t r = first; r < end; ++r) AppendRow((*rec)[0], r, 2, &part);
    part.num_elements = static_cast<int64_t>(part.weights.size());
    v1::SeedRequest req = whole;
    req.set_rows(EncodeShard({part}));
    req.set_rows_before(static_cast<int64_t>(first));
    req.set_more_rows(end < rows);
    parts.push_back(req);
  }
  // A later part without the ones before, or one out of turn, changes
  // nothing.
  EXPECT_EQ(b.Seed(parts[1]).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.num_keys(), 1);  // the key, still without a value
  ASSERT_TRUE(b.Seed(parts[0]).ok());
  EXPECT_EQ(b.Seed(parts[2]).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(b.Seed(parts[1]).ok());
  ASSERT_TRUE(b.Seed(parts[1]).ok());  // sent again: taken once
  // Promoted before the last part: not served, and it says why.
  b.Promote(0);
  absl::StatusOr<std::vector<float>> early = PullRows(b, 2, {1});
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDataLoss) << early.status();
  EXPECT_HAS(early.status(), "not all of its rows arrived");
  // Rows that are not this part's, or sums that do not fit, are refused.
  v1::SeedRequest bad = parts[2];
  bad.add_accum_ids(1);
  EXPECT_EQ(b.Seed(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = parts[2];
  bad.set_rows("garbage");
  EXPECT_EQ(b.Seed(bad).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.Seed(parts[2]).ok());
  b.Promote(0);
  absl::StatusOr<std::vector<float>> all = PullRows(b, 2, (*rec)[0].row_ids);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, (*rec)[0].weights);
}

TEST(StoreTest, SyncPushOrPullOutOfRange) {
  Metrics m("t");
  Store store(Sync(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());

  absl::Status s = store.Push(PushReq(0, 1, {Grad("w", 1, kG0)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_HAS(s, "version 1");
  s = store.Push(PushReq(0, 2, {Grad("w", -1, kG0)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_KEY(store, "w", 0, kW0);

  absl::StatusOr<Pulled> p = PullOne(store, 0, "w", 2, absl::Seconds(10));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kOutOfRange) << p.status();
  p = PullOne(store, 0, "w", -1, absl::Seconds(10));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kOutOfRange) << p.status();

  // After one step, version 2 is one ahead (allowed, times out); 3 is not.
  ASSERT_TRUE(store.Push(PushReq(0, 3, {Grad("w", 0, {2, 2, 2})})).ok());
  EXPECT_KEY(store, "w", 1, {0.0f, -3.0f, 2.5f});
  p = PullOne(store, 0, "w", 2, absl::Milliseconds(20));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDeadlineExceeded) << p.status();
  p = PullOne(store, 0, "w", 3, absl::Seconds(10));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kOutOfRange) << p.status();
  EXPECT_EQ(store.Push(PushReq(0, 4, {Grad("w", 2, kG0)})).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_KEY(store, "w", 1, {0.0f, -3.0f, 2.5f});
}

TEST(StoreTest, PullWaitIsCappedByMaxPullWait) {
  Metrics m("t");
  StoreOptions o = Sync(2);
  o.max_pull_wait = absl::Milliseconds(50);
  Store store(o, &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<Pulled> p = PullOne(store, 0, "w", 1, absl::Seconds(60));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDeadlineExceeded) << p.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// ---------------------------------------------------------------------------
// Async mode

TEST(StoreTest, AsyncAppliesEachPushAtOnce) {
  Metrics m("t");
  Store store(Async(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  // bytes_stored has no accumulator in async mode.
  EXPECT_EQ(store.bytes_stored(), 12);

  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
  // w0 - 0.5*g0 = {0.75, -2.5, 4.5}
  EXPECT_KEY(store, "w", 1, {0.75f, -2.5f, 4.5f});
  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, kG1)})).ok());
  // - 0.5*g1 = {0, -1, 2.5}
  EXPECT_KEY(store, "w", 2, {0.0f, -1.0f, 2.5f});

  // Worker 0 retries push 1: not applied again.
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());
  EXPECT_KEY(store, "w", 2, {0.0f, -1.0f, 2.5f});
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 1);

  // A new id from worker 0, for an old version: async applies it.
  ASSERT_TRUE(store.Push(PushReq(0, 2, {Grad("w", 0, {2, 2, 2})})).ok());
  EXPECT_KEY(store, "w", 3, {-1.0f, -2.0f, 1.5f});
  EXPECT_EQ(Metric(m, "t_updates_total"), 3);
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 1);
}

// An outside client pushed for clock 2^62: a clock moves one push at a time.
TEST(StoreTest, AsyncAndSspPushesThatJumpAheadOfTheClockAreRefused) {
  for (int staleness : {-1, 1}) {
    SCOPED_TRACE(staleness < 0 ? "async" : "ssp");
    Metrics m("t");
    StoreOptions o = Async(2);
    o.staleness = staleness;
    Store store(o, &m);
    ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
    ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, kG0)})).ok());  // clock 0 -> 1
    absl::Status s = store.Push(PushReq(0, 2, {Grad("w", int64_t{1} << 62, kG0)}));
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
    EXPECT_HAS(s, "worker 0's clock there is 1");
    s = store.Push(PushReq(0, 3, {Grad("w", 2, kG0)}));
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
    EXPECT_KEY(store, "w", 1, {0.75f, -2.5f, 4.5f});  // nothing applied
    ASSERT_TRUE(store.Push(PushReq(0, 4, {Grad("w", 1, kG0)})).ok());  // the next clock
    ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 0, kG0)})).ok());  // each worker its own
    EXPECT_EQ(Metric(m, "t_updates_total"), 3);
  }
}

TEST(StoreTest, AsyncPushesThatOvertakeEachOtherAreEachAppliedOnce) {
  Metrics m("t");
  Store store(Async(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", {{0}}, 1, 1.0)})).ok());
  // Push 2 arrives before push 1: both are new and both count.
  ASSERT_TRUE(store.Push(PushReq(0, 2, {Grad("w", 0, {1})})).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, {2})})).ok());
  EXPECT_KEY(store, "w", 2, {-3});
  // Retries of either are dropped.
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, {2})})).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 2, {Grad("w", 0, {1})})).ok());
  EXPECT_KEY(store, "w", 2, {-3});
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 2);
  // Six more pushes (8 distinct ids in all): a retry of the oldest is still
  // recognised.
  for (uint64_t id = 3; id <= 8; ++id) {
    ASSERT_TRUE(store.Push(PushReq(0, id, {Grad("w", 0, {4})})).ok());
  }
  EXPECT_KEY(store, "w", 8, {-27});
  ASSERT_TRUE(store.Push(PushReq(0, 2, {Grad("w", 0, {1})})).ok());
  EXPECT_KEY(store, "w", 8, {-27});
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 3);
}

// ---------------------------------------------------------------------------
// Bad input leaves everything as it was.

TEST(StoreTest, BadPushesAndPullsChangeNothing) {
  Metrics m("t");
  Store store(Async(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", kW0), Simple("b", {{1, 2}}, 2)})).ok());
  const std::vector<float> kB0 = {1, 2};

  auto check_unchanged = [&](const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_KEY(store, "a", 0, kW0);
    EXPECT_KEY(store, "b", 0, kB0);
    EXPECT_EQ(Metric(m, "t_updates_total"), 0);
  };

  absl::Status s = store.Push(PushReq(0, 1, {Grad("nope", 0, kG0)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_HAS(s, "nope#0");
  check_unchanged("unknown key");

  v1::KeyData f16 = Grad("a", 0, kG0);
  f16.set_dtype(v1::DTYPE_FLOAT16);
  f16.set_data(std::string(5, '\0'));  // 3 float16 take 6 bytes
  s = store.Push(PushReq(0, 2, {f16}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s, "float16 (6 bytes)");
  check_unchanged("float16");

  s = store.Push(PushReq(0, 3, {Grad("a", 0, {1, 2})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s, "8 bytes");
  EXPECT_HAS(s, "12 bytes");
  check_unchanged("wrong size");

  s = store.Push(PushReq(-1, 4, {Grad("a", 0, kG0)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s, "-1");
  s = store.Push(PushReq(2, 4, {Grad("a", 0, kG0)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_HAS(s, "rank 2");
  check_unchanged("bad rank");

  s = store.Push(PushReq(0, 5, {}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  check_unchanged("no keys");

  v1::PullRequest with_data = PullReq(0, "a", 0);
  with_data.mutable_keys(0)->set_data(Bytes(kG0));
  v1::PullResponse resp;
  s = store.Pull(with_data, absl::Now() + absl::Seconds(5), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  v1::PullRequest no_keys;
  s = store.Pull(no_keys, absl::Now() + absl::Seconds(5), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = store.Pull(PullReq(2, "a", 0), absl::Now() + absl::Seconds(5), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  check_unchanged("bad pulls");

  // First key fine, second bad (each way): the first is not applied.
  s = store.Push(PushReq(0, 6, {Grad("a", 0, kG0), Grad("b", 0, {1, 2, 3})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = store.Push(PushReq(0, 7, {Grad("a", 0, kG0), Grad("nope", 0, kG0)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  check_unchanged("second key bad");
  EXPECT_EQ(Metric(m, "t_push_requests_total"), 0);
  EXPECT_EQ(Metric(m, "t_bytes_in_total"), 12 + 8);  // the two inits only

  // The rejected ids were not consumed: the same id, fixed, is applied.
  ASSERT_TRUE(store.Push(PushReq(0, 7, {Grad("a", 0, kG0), Grad("b", 0, {2, -2})})).ok());
  EXPECT_KEY(store, "a", 1, {0.75f, -2.5f, 4.5f});
  EXPECT_KEY(store, "b", 1, {0.0f, 3.0f});
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 0);
}

TEST(StoreTest, SyncRejectedPushDoesNotCountAsContribution) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", kW0), Simple("b", {{1, 2}}, 2)})).ok());
  // Worker 0's push is rejected for its second key.
  absl::Status s =
      store.Push(PushReq(0, 1, {Grad("a", 0, {64, 64, 64}), Grad("b", 1, {1, 1})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  // The corrected push is accepted as worker 0's contribution.
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("a", 0, kG0), Grad("b", 0, {1, 1})})).ok());
  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("a", 0, kG1), Grad("b", 0, {3, -1})})).ok());
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 0);
  EXPECT_KEY(store, "a", 1, kW1Mean);
  // b: mean {2, 0}; {1, 2} - 0.5*{2, 0} = {0, 2}
  EXPECT_KEY(store, "b", 1, {0.0f, 2.0f});
}

// ---------------------------------------------------------------------------
// PushPull

TEST(StoreTest, PushPullSyncOneWorkerReturnsNextVersion) {
  Metrics m("t");
  Store store(Sync(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  v1::PushPullRequest req;
  *req.mutable_push() = PushReq(0, 1, {Grad("w", 0, kG0)});
  v1::PushPullResponse resp;
  absl::Status s = store.PushPull(req, absl::Now() + absl::Seconds(10), &resp);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(resp.keys_size(), 1);
  EXPECT_EQ(resp.keys(0).variable(), "w");
  EXPECT_EQ(resp.keys(0).version(), 1);
  EXPECT_EQ(Floats(resp.keys(0).data()), (std::vector<float>{0.75f, -2.5f, 4.5f}));

  *req.mutable_push() = PushReq(0, 2, {Grad("w", 1, {2, 2, 2})});
  v1::PushPullResponse resp2;
  ASSERT_TRUE(store.PushPull(req, absl::Now() + absl::Seconds(10), &resp2).ok());
  ASSERT_EQ(resp2.keys_size(), 1);
  EXPECT_EQ(resp2.keys(0).version(), 2);
  EXPECT_EQ(Floats(resp2.keys(0).data()), (std::vector<float>{-0.25f, -3.5f, 3.5f}));

  // A bad push makes PushPull fail without pulling.
  *req.mutable_push() = PushReq(0, 3, {Grad("w", 5, kG0)});
  v1::PushPullResponse resp3;
  EXPECT_EQ(store.PushPull(req, absl::Now() + absl::Seconds(10), &resp3).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(resp3.keys_size(), 0);
}

TEST(StoreTest, PushPullSyncTwoWorkersBothGetTheStep) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0)})).ok());
  v1::PushPullResponse r0, r1;
  absl::Status s0, s1;
  std::thread t0([&] {
    v1::PushPullRequest req;
    *req.mutable_push() = PushReq(0, 1, {Grad("w", 0, kG0)});
    s0 = store.PushPull(req, absl::Now() + absl::Seconds(20), &r0);
  });
  absl::SleepFor(absl::Milliseconds(30));
  v1::PushPullRequest req;
  *req.mutable_push() = PushReq(1, 1, {Grad("w", 0, kG1)});
  s1 = store.PushPull(req, absl::Now() + absl::Seconds(20), &r1);
  t0.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  ASSERT_EQ(r0.keys_size(), 1);
  ASSERT_EQ(r1.keys_size(), 1);
  EXPECT_EQ(r0.keys(0).version(), 1);
  EXPECT_EQ(r1.keys(0).version(), 1);
  EXPECT_EQ(Floats(r0.keys(0).data()), kW1Mean);
  EXPECT_EQ(Floats(r1.keys(0).data()), kW1Mean);
}

// ---------------------------------------------------------------------------
// Learning rate

TEST(StoreTest, SetLearningRateChangesNextUpdate) {
  Metrics m("t");
  Store store(Sync(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", kW0), Simple("b", {{1, 2}}, 2)})).ok());
  const std::vector<float> g = {2, 2, 2};

  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("a", 0, g)})).ok());  // lr 0.5
  EXPECT_KEY(store, "a", 1, {0.0f, -3.0f, 2.5f});

  v1::SetLearningRateRequest lr;
  lr.set_worker_rank(0);
  lr.set_lr(0.25);
  absl::StatusOr<int64_t> changed = store.SetLearningRate(lr);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ(*changed, 2);
  ASSERT_TRUE(store.Push(PushReq(0, 2, {Grad("a", 1, g)})).ok());  // lr 0.25
  EXPECT_KEY(store, "a", 2, {-0.5f, -3.5f, 2.0f});

  // Only variable b: a keeps 0.25.
  lr.set_lr(2.0);
  lr.set_variable("b");
  changed = store.SetLearningRate(lr);
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ(*changed, 1);
  ASSERT_TRUE(store.Push(PushReq(0, 3, {Grad("a", 2, g), Grad("b", 0, {1, 1})})).ok());
  EXPECT_KEY(store, "a", 3, {-1.0f, -4.0f, 1.5f});
  EXPECT_KEY(store, "b", 1, {-1.0f, 0.0f});
  // A variable this server holds no key of is NOT_FOUND.
  lr.set_variable("none");
  changed = store.SetLearningRate(lr);
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kNotFound);

  // Zero is allowed: the version moves, the weights do not.
  lr.set_variable("");
  lr.set_lr(0.0);
  ASSERT_TRUE(store.SetLearningRate(lr).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 4, {Grad("a", 3, g)})).ok());
  EXPECT_KEY(store, "a", 4, {-1.0f, -4.0f, 1.5f});
}

TEST(StoreTest, SetLearningRateRejectsNegativeNaNAndInf) {
  Metrics m("t");
  Store store(Sync(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", kW0)})).ok());
  v1::SetLearningRateRequest lr;
  lr.set_worker_rank(0);
  for (double bad : {-0.5, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    lr.set_lr(bad);
    absl::StatusOr<int64_t> r = store.SetLearningRate(lr);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  lr.set_lr(1.0);
  lr.set_worker_rank(1);
  EXPECT_EQ(store.SetLearningRate(lr).status().code(), absl::StatusCode::kInvalidArgument);
  // The lr is still the registered 0.5.
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("a", 0, {2, 2, 2})})).ok());
  EXPECT_KEY(store, "a", 1, {0.0f, -3.0f, 2.5f});
}

// ---------------------------------------------------------------------------
// Concurrency

TEST(StoreTest, ConcurrentAsyncPushesAreAllApplied) {
  Metrics m("t");
  constexpr int kThreads = 4;
  constexpr int kPushes = 200;
  Store store(Async(kThreads), &m);
  std::vector<v1::KeySpec> specs = {Simple("shared", {{1000, 2000, -1000, 0}}, 4, 1.0)};
  for (int t = 0; t < kThreads; ++t) {
    specs.push_back(Simple(absl::StrCat("own", t), {{500, 0.5f}}, 2, 1.0));
  }
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, specs)).ok());

  std::vector<std::thread> threads;
  std::vector<absl::Status> first_error(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 1; i <= kPushes; ++i) {
        absl::Status s = store.Push(PushReq(
            t, i, {Grad("shared", 0, {1, 1, 1, 1}), Grad(absl::StrCat("own", t), 0, {1, 1})}));
        if (!s.ok() && first_error[t].ok()) first_error[t] = s;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(first_error[t].ok()) << first_error[t];

  EXPECT_KEY(store, "shared", kThreads * kPushes, {200, 1200, -1800, -800});
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_KEY(store, absl::StrCat("own", t), kPushes, {300, -199.5f});
  }
  EXPECT_EQ(Metric(m, "t_updates_total"), 2 * kThreads * kPushes);
  EXPECT_EQ(Metric(m, "t_duplicate_pushes_total"), 0);
  EXPECT_EQ(Metric(m, "t_push_requests_total"), kThreads * kPushes);
}

TEST(StoreTest, ConcurrentSyncStepsStayInLockstep) {
  Metrics m("t");
  constexpr int kThreads = 4;
  constexpr int kSteps = 200;
  Store store(Sync(kThreads), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", {{1000, 0}}, 2, 1.0)})).ok());
  std::vector<std::thread> threads;
  std::vector<absl::Status> first_error(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int v = 0; v < kSteps; ++v) {
        // Worker t sends {1, t}: the mean is {1, 1.5}.
        absl::Status s = store.Push(PushReq(t, v + 1, {Grad("w", v, {1, float(t)})}));
        if (s.ok()) {
          absl::StatusOr<Pulled> p = PullOne(store, t, "w", v + 1, absl::Seconds(30));
          s = p.status();
          if (s.ok() && p->version != v + 1) s = absl::InternalError("wrong version");
        }
        if (!s.ok()) {
          first_error[t] = s;
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(first_error[t].ok()) << first_error[t];
  EXPECT_KEY(store, "w", kSteps, {800, -300});
  EXPECT_EQ(Metric(m, "t_updates_total"), kSteps);
}

// ---------------------------------------------------------------------------
// Byte counters

TEST(StoreTest, ByteCountersFollowPayloads) {
  Metrics m("t");
  Store store(Sync(2), &m);
  EXPECT_EQ(Metric(m, "t_bytes_in_total"), 0);
  EXPECT_EQ(Metric(m, "t_bytes_out_total"), 0);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", kW0), Simple("v", {{1, 2}}, 2)})).ok());
  EXPECT_EQ(Metric(m, "t_bytes_in_total"), 12 + 8);
  ASSERT_TRUE(store.RegisterKeys(RegReq(1, {Simple("w", std::nullopt)})).ok());
  EXPECT_EQ(Metric(m, "t_bytes_in_total"), 20);

  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 0, kG0), Grad("v", 0, {1, 1})})).ok());
  EXPECT_EQ(Metric(m, "t_bytes_in_total"), 20 + 20);
  EXPECT_EQ(Metric(m, "t_key_pushes_total"), 2);
  EXPECT_EQ(Metric(m, "t_bytes_out_total"), 0);

  v1::PullRequest pull = PullReq(0, "w", 0);
  v1::KeyData* second = pull.add_keys();
  second->set_variable("v");
  v1::PullResponse resp;
  ASSERT_TRUE(store.Pull(pull, absl::Now() + absl::Seconds(5), &resp).ok());
  ASSERT_EQ(resp.keys_size(), 2);
  EXPECT_EQ(resp.keys(0).data().size(), 12u);
  EXPECT_EQ(resp.keys(1).data().size(), 8u);
  EXPECT_EQ(Metric(m, "t_bytes_out_total"), 20);
  EXPECT_EQ(Metric(m, "t_key_pulls_total"), 2);

  // Rejected requests move nothing.
  EXPECT_FALSE(store.Push(PushReq(0, 2, {Grad("w", 0, {1})})).ok());
  EXPECT_FALSE(store.Pull(PullReq(0, "w", 5), absl::Now() + absl::Seconds(5), &resp).ok());
  EXPECT_EQ(Metric(m, "t_bytes_in_total"), 40);
  EXPECT_EQ(Metric(m, "t_bytes_out_total"), 20);
}

TEST(StoreTest, TheSameKeyTwiceInOneRequestRegistersNothing) {
  Metrics m("t");
  Store store(Sync(1), &m);
  absl::Status s = store.RegisterKeys(RegReq(0, {Simple("a", {{1, 2, 3}}), Spec("a", 0, {4}, 0, 4, {{1, 2, 3, 4}})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s, "key 'a#0' appears twice");
  EXPECT_EQ(store.num_keys(), 0);
  EXPECT_EQ(store.bytes_stored(), 0);
}

TEST(StoreTest, Rank0sOptimizerSettingsWinWhoeverRegistersFirst) {
  Metrics m("t");
  Store store(Async(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(1, {Simple("a", std::nullopt, 1, 0.25)})).ok());
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", {{0}}, 1, 1.0)})).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("a", 0, {1})})).ok());
  EXPECT_KEY(store, "a", 1, {-1.0f});  // lr 1.0 from rank 0, not rank 1's 0.25
}

TEST(StoreTest, ALearningRateSetBeforeRank0RegistersIsKept) {
  Metrics m("t");
  Store store(Async(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(1, {Simple("a", std::nullopt, 1, 1.0)})).ok());
  v1::SetLearningRateRequest lr;
  lr.set_worker_rank(1);
  lr.set_lr(0.25);
  ASSERT_TRUE(store.SetLearningRate(lr).ok());
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", {{0}}, 1, 1.0)})).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("a", 0, {1})})).ok());
  EXPECT_KEY(store, "a", 1, {-0.25f});
}

TEST(StoreTest, AKeyBeyondThePartitionSizeIsRefusedBeforeAnyAllocation) {
  Metrics m("t");
  StoreOptions o = Sync(1);
  o.max_key_bytes = 4096;
  Store store(o, &m);
  // (2^62 + 1) * 4 wraps to 4 in 64 bits: the size check must not multiply.
  const int64_t huge = (int64_t{1} << 62) + 1;
  absl::Status s = store.RegisterKeys(RegReq(0, {Spec("huge", 0, {huge}, 0, huge, {{1}})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS(s, "a key holds at most 1024 float32");
  EXPECT_EQ(store.RegisterKeys(RegReq(0, {Simple("big", std::vector<float>(1025, 0.f), 1025)})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.num_keys(), 0);
  EXPECT_TRUE(store.RegisterKeys(RegReq(0, {Simple("fits", std::vector<float>(1024, 0.f), 1024)})).ok());
}

// A gradient compressed as the client does it (common/compression.h).
v1::KeyData Compressed(const std::string& variable, int64_t version, const std::vector<float>& g,
                       v1::DType dtype) {
  v1::KeyData kd = Grad(variable, version, g);
  kd.set_dtype(dtype);
  const EncodeInfo info = EncodeValues(g.data(), g.size(), dtype, kd.mutable_data());
  kd.set_scale(info.scale);
  return kd;
}

TEST(StoreTest, CompressedPushesAreDecodedAndSummedInFloat32) {
  Metrics m("t");
  Store store(Sync(3), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", {{0, 0, 0}}, 3, 1.0)})).ok());
  // Exact in fp16 and bf16; 2^20 needs fp16's scale.
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Compressed("a", 0, {1, 0x1p20f, -0.5}, v1::DTYPE_FLOAT16)})).ok());
  ASSERT_TRUE(store.Push(PushReq(1, 1, {Compressed("a", 0, {2, 0x1p20f, -0.5}, v1::DTYPE_BFLOAT16)})).ok());
  ASSERT_TRUE(store.Push(PushReq(2, 1, {Grad("a", 0, {3, 0x1p20f, -0.5})})).ok());
  EXPECT_KEY(store, "a", 1, {-2.f, -0x1p20f, 0.5f});
  EXPECT_EQ(Metric(m, "t_compressed_pushes_total"), 2);
  EXPECT_EQ(Metric(m, "t_rescaled_pushes_total"), 1);
  EXPECT_EQ(Metric(m, "t_bytes_in_total"), 12 + 6 + 6 + 12);  // init, fp16, bf16, fp32
}

TEST(StoreTest, PullsSendTheDtypeAsked) {
  Metrics m("t");
  Store store(Async(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", {{1.5f, 0x1p20f, -3}}, 3)})).ok());
  v1::PullRequest req = PullReq(0, "a", 0);
  req.mutable_keys(0)->set_dtype(v1::DTYPE_FLOAT16);
  v1::PullResponse resp;
  ASSERT_TRUE(store.Pull(req, absl::Now() + absl::Seconds(5), &resp).ok());
  ASSERT_EQ(resp.keys(0).dtype(), v1::DTYPE_FLOAT16);
  ASSERT_EQ(resp.keys(0).data().size(), 6u);
  std::vector<float> w(3);
  DecodeValues(resp.keys(0).data(), v1::DTYPE_FLOAT16, resp.keys(0).scale(), w.data(), 3, false);
  EXPECT_EQ(w, (std::vector<float>{1.5f, 0x1p20f, -3}));
}

}  // namespace
}  // namespace psrt

namespace psrt {
namespace {

// ---- Checkpoint snapshots and restore ----

// A hold key: rank 0 alone registers and sets it, whole, for the step it
// names; an armed checkpoint waits for it as for any key of the step.
TEST(StoreSnapshotTest, AHoldKeyIsRank0sValueForTheStepItNamesAndTheCheckpointWaitsForIt) {
  Metrics m("t");
  StoreOptions o = Sync(2);
  o.registration_wait = absl::ZeroDuration();  // only rank 0 registers it
  Store store(o, &m);
  ASSERT_TRUE(store
                  .RegisterKeys(RegReq(
                      0, {Spec("state", 0, {3}, 0, 3, std::vector<float>{0, 0, 0}, "hold", 0.0)}))
                  .ok());
  ASSERT_TRUE(store.ArmSnapshot(4).ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now()), 1);  // still at 0: not stray
  // Only rank 0, whole, float32.
  absl::Status s = store.Push(PushReq(1, 1, {Grad("state", 4, {1, 2, 3})}));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("rank 0 alone sets it"), std::string::npos) << s;
  v1::PushRequest half = PushReq(0, 2, {Grad("state", 4, {1, 2, 3})});
  half.mutable_keys(0)->set_dtype(v1::DTYPE_FLOAT16);
  half.mutable_keys(0)->set_data(std::string(6, '\0'));
  EXPECT_EQ(store.Push(half).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_KEY(store, "state", 0, {0, 0, 0});  // the refusals changed nothing
  // Step 4's value, with a bit pattern no update would keep (NaN).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(store.Push(PushReq(0, 3, {Grad("state", 4, {7, nan, -0.5f})})).ok());
  absl::StatusOr<Pulled> p = PullOne(store, 1, "state", 4);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->version, 4);
  EXPECT_EQ(p->weights[0], 7.0f);
  EXPECT_TRUE(std::isnan(p->weights[1]));
  EXPECT_EQ(p->weights[2], -0.5f);
  EXPECT_EQ(store.WaitSnapshot(absl::Now()), 0);
  // A step it reached again, or an earlier one: dropped.
  ASSERT_TRUE(store.Push(PushReq(0, 4, {Grad("state", 4, {1, 1, 1})})).ok());
  ASSERT_TRUE(store.Push(PushReq(0, 5, {Grad("state", 2, {1, 1, 1})})).ok());
  std::string shard;
  v1::SaveShardResponse info;
  store.EncodeSnapshot(&shard, &info);
  absl::StatusOr<std::vector<KeyRecord>> records = DecodeShard(shard, "test");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0].version, 4);
  EXPECT_EQ((*records)[0].optimizer, "hold");
  EXPECT_EQ((*records)[0].weights[0], 7.0f);
  EXPECT_TRUE(std::isnan((*records)[0].weights[1]));
}

TEST(StoreSnapshotTest, CopiesEachKeyExactlyAtTheArmedStep) {
  Metrics m("t");
  Store store(Sync(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", std::vector<float>{1, 2, 3}),
                                            Simple("b", std::vector<float>{4, 5, 6})}))
                  .ok());
  ASSERT_TRUE(store.ArmSnapshot(2).ok());
  const std::vector<float> g = {1, 1, 1};
  for (int v = 0; v < 2; ++v) ASSERT_TRUE(store.Push(PushReq(0, v + 1, {Grad("a", v, g)})).ok());
  absl::StatusOr<Pulled> a2 = PullOne(store, 0, "a", 2);
  ASSERT_TRUE(a2.ok()) << a2.status();
  // Training goes on past the step; the copy keeps step 2.
  ASSERT_TRUE(store.Push(PushReq(0, 3, {Grad("a", 2, g)})).ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now()), 1);  // b is still at 0
  for (int v = 0; v < 2; ++v) ASSERT_TRUE(store.Push(PushReq(0, v + 4, {Grad("b", v, g)})).ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now() + absl::Seconds(5)), 0);

  std::string shard;
  v1::SaveShardResponse info;
  store.EncodeSnapshot(&shard, &info);
  absl::StatusOr<std::vector<KeyRecord>> records = DecodeShard(shard, "test");
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[0].variable, "a");
  EXPECT_EQ((*records)[0].version, 2);
  EXPECT_EQ((*records)[0].weights, a2->weights);
  EXPECT_EQ((*records)[0].optimizer, "sgd");
  EXPECT_EQ((*records)[1].variable, "b");
  EXPECT_EQ((*records)[1].version, 2);
  ASSERT_EQ(info.keys_size(), 2);
  EXPECT_EQ(info.keys(0).version(), 2);
  ASSERT_EQ(info.variables_size(), 2);
  EXPECT_EQ(info.variables(0).optimizer().name(), "sgd");
  EXPECT_EQ(Metric(m, "t_checkpoint_pause_seconds_count"), 2);
}

TEST(StoreSnapshotTest, ArmingAStepAKeyIsPastIsRefused) {
  Metrics m("t");
  Store store(Sync(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", std::vector<float>{1, 2, 3})})).ok());
  for (int v = 0; v < 3; ++v) ASSERT_TRUE(store.Push(PushReq(0, v + 1, {Grad("a", v, {1, 1, 1})})).ok());
  absl::Status s = store.ArmSnapshot(2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_HAS(s, "key 'a#0' is at version 3, past the checkpoint's step 2");
  // Now (step < 0) copies every key as it is.
  ASSERT_TRUE(store.ArmSnapshot(-1).ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now()), 0);
}

TEST(StoreSnapshotTest, AKeyNotYetInitializedIsWaitedFor) {
  Metrics m("t");
  Store store(Sync(2), &m);
  // Rank 1 registers first: the key exists, without rank 0's value yet.
  ASSERT_TRUE(store.RegisterKeys(RegReq(1, {Simple("a", std::nullopt, 3)})).ok());
  ASSERT_TRUE(store.ArmSnapshot(1).ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now()), 1);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("a", std::vector<float>{1, 2, 3})})).ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now()), 1);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(store.Push(PushReq(r, 1, {Grad("a", 0, {1, 1, 1})})).ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now() + absl::Seconds(5)), 0);
  std::string shard;
  v1::SaveShardResponse info;
  store.EncodeSnapshot(&shard, &info);
  ASSERT_EQ(info.keys_size(), 1);
  EXPECT_EQ(info.keys(0).version(), 1);
}

// Encodes the armed snapshot: each variable's version in it, and `info`.
std::map<std::string, int64_t> SnapshotVersions(Store* store, v1::SaveShardResponse* info) {
  std::string shard;
  store->EncodeSnapshot(&shard, info);
  std::map<std::string, int64_t> versions;
  for (const v1::ManifestKey& k : info->keys()) versions[k.variable()] = k.version();
  return versions;
}

// Assign keys (the mean gradient, BatchNorm's statistics, frozen weights)
// do not follow the step: a snapshot takes them as they are, the step is read
// from the other keys, and NaN in them is kept (it is what workers must see).
TEST(StoreSnapshotTest, AssignKeysAreTakenAsTheyAreAndDoNotSetTheStep) {
  Metrics m("t");
  Store store(Sync(1), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", std::vector<float>{1, 2, 3}),
                                            Spec("frozen", 0, {3}, 0, 3, std::vector<float>{7, 8, 9},
                                                 "assign", 0.0),
                                            Spec("mean", 0, {3}, 0, 3, std::vector<float>{0, 0, 0},
                                                 "assign", 0.0)}))
                  .ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int v = 0; v < 3; ++v) ASSERT_TRUE(store.Push(PushReq(0, v + 1, {Grad("mean", v, {1, nan, 3})})).ok());
  absl::StatusOr<Pulled> mean = PullOne(store, 0, "mean", 3);
  ASSERT_TRUE(mean.ok()) << mean.status();
  EXPECT_EQ(mean->weights[0], 1);
  EXPECT_TRUE(std::isnan(mean->weights[1]));
  EXPECT_EQ(store.VersionRange(), std::make_pair(int64_t{0}, int64_t{0}));  // w's
  ASSERT_TRUE(store.ArmSnapshot(1).ok());                                    // mean is at 3
  EXPECT_EQ(store.WaitSnapshot(absl::Now()), 1);                             // w
  ASSERT_TRUE(store.Push(PushReq(0, 4, {Grad("w", 0, {1, 1, 1})})).ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now() + absl::Seconds(5)), 0);
  v1::SaveShardResponse info;
  const std::map<std::string, int64_t> versions = SnapshotVersions(&store, &info);
  EXPECT_EQ(versions, (std::map<std::string, int64_t>{{"frozen", 0}, {"mean", 3}, {"w", 1}}));
}

// A key one worker registered and the other has not, registration_wait
// later, cannot take a step: a checkpoint of a later step takes it as it is
// (version 0) or, without rank 0's value, leaves it out, and says which.
TEST(StoreSnapshotTest, AKeyNotEveryWorkerRegisteredIsWaitedForOnlySoLong) {
  Metrics m("t");
  StoreOptions o = Sync(2);
  o.registration_wait = absl::Milliseconds(300);
  Store store(o, &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", std::vector<float>{1, 2, 3}),
                                            Simple("stray", std::vector<float>{4, 5, 6})}))
                  .ok());
  ASSERT_TRUE(store.RegisterKeys(RegReq(1, {Simple("w", std::nullopt, 3), Simple("lone", std::nullopt, 3)})).ok());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(store.Push(PushReq(r, 1, {Grad("w", 0, {1, 1, 1})})).ok());
  ASSERT_TRUE(store.ArmSnapshot(1).ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now()), 2) << "stray and lone are waited for at first";
  EXPECT_EQ(store.WaitSnapshot(absl::Now() + absl::Seconds(5)), 0);
  v1::SaveShardResponse info;
  const std::map<std::string, int64_t> versions = SnapshotVersions(&store, &info);
  EXPECT_EQ(versions, (std::map<std::string, int64_t>{{"stray", 0}, {"w", 1}}));
  EXPECT_EQ(std::vector<std::string>(info.stray_keys().begin(), info.stray_keys().end()),
            std::vector<std::string>{"stray#0"});
}

// A registration waits for the server's restore only as long as its caller.
TEST(StoreRestoreTest, ARegistrationWaitsForTheRestoreByItsCallersDeadlineAndNoLonger) {
  Metrics m("t");
  StoreOptions o = Sync(1);
  o.restore_pending = true;
  Store store(o, &m);
  absl::Time start = absl::Now();
  absl::Status s = store.RegisterKeys(RegReq(0, {Simple("a", std::vector<float>{1, 2, 3})}),
                                      start + absl::Milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_HAS(s, "still restoring its checkpoint");
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  start = absl::Now();
  s = store.RegisterKeys(RegReq(0, {Simple("a", std::vector<float>{1, 2, 3})}), absl::InfiniteFuture(),
                         [] { return true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(store.num_keys(), 0);
}

TEST(StoreSnapshotTest, AnAssignKeyWaitingForRankZerosValueIsWaitedFor) {
  Metrics m("t");
  Store store(Sync(2), &m);
  ASSERT_TRUE(store.RegisterKeys(RegReq(1, {Spec("stats", 0, {3}, 0, 3, std::nullopt, "assign", 0.0)})).ok());
  ASSERT_TRUE(store.ArmSnapshot(5).ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now()), 1);
  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Spec("stats", 0, {3}, 0, 3, std::vector<float>{1, 2, 3}, "assign",
                                                 0.0)}))
                  .ok());
  EXPECT_EQ(store.WaitSnapshot(absl::Now()), 0);  // taken as it is, at version 0
  std::string shard;
  v1::SaveShardResponse info;
  store.EncodeSnapshot(&shard, &info);
  ASSERT_EQ(info.keys_size(), 1);
  EXPECT_EQ(info.keys(0).version(), 0);
}

Store::RestoredKey Restored(const std::string& variable, std::vector<float> weights, int64_t version) {
  Store::RestoredKey r;
  r.spec = Simple(variable, std::nullopt, static_cast<int64_t>(weights.size()));
  r.state.variable = variable;
  r.state.num_elements = static_cast<int64_t>(weights.size());
  r.state.version = version;
  r.state.learning_rate = 0.25;
  r.state.weights = std::move(weights);
  return r;
}

TEST(StoreSnapshotTest, RestoredKeysWinAndOtherModelsAreRefused) {
  Metrics m("t");
  StoreOptions options = Sync(2);
  options.restore_pending = true;
  Store store(options, &m);
  std::vector<Store::RestoredKey> keys;
  keys.push_back(Restored("w", {7, 8, 9}, 5));
  store.FinishRestore(std::move(keys), 5, "file:///ckpt/step-5");

  ASSERT_TRUE(store.RegisterKeys(RegReq(0, {Simple("w", std::vector<float>{0, 0, 0})})).ok());
  EXPECT_KEY(store, "w", 5, (std::vector<float>{7, 8, 9}));
  // The restored learning rate applies: 7 - 0.25 * mean(2, 2) = 6.5.
  ASSERT_TRUE(store.Push(PushReq(0, 1, {Grad("w", 5, {2, 2, 2})})).ok());
  ASSERT_TRUE(store.Push(PushReq(1, 1, {Grad("w", 5, {2, 2, 2})})).ok());
  EXPECT_KEY(store, "w", 6, (std::vector<float>{6.5, 7.5, 8.5}));

  absl::Status other = store.RegisterKeys(RegReq(0, {Simple("v", std::vector<float>{1, 2, 3})}));
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
  EXPECT_HAS(other, "key 'v#0' is not in checkpoint file:///ckpt/step-5");
  absl::Status shape = store.RegisterKeys(RegReq(1, {Simple("w", std::nullopt, 4)}));
  EXPECT_EQ(shape.code(), absl::StatusCode::kFailedPrecondition) << shape;
  EXPECT_HAS(shape, "holds, in checkpoint file:///ckpt/step-5, shape [3]");
}

TEST(StoreSnapshotTest, RegistrationsWaitForTheRestoreAndShareItsFailure) {
  Metrics m("t");
  StoreOptions options = Sync(1);
  options.restore_pending = true;
  Store store(options, &m);
  absl::Status got;
  std::thread registering([&] { got = store.RegisterKeys(RegReq(0, {Simple("w", std::vector<float>{1, 2, 3})})); });
  absl::SleepFor(absl::Milliseconds(50));
  store.FinishRestore(absl::DataLossError("shard x record 3: CRC32C mismatch"), 0, "file:///c/step-1");
  registering.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kFailedPrecondition) << got;
  EXPECT_HAS(got, "could not restore its checkpoint: shard x record 3: CRC32C mismatch");
}

}  // namespace
}  // namespace psrt
