// Sparse tables against real psrt-servers: rows made from (seed, id), pushed
// and pulled by id through the data path, updated row-wise, capped and
// evicted; every malformed request refused with a message naming the
// problem, and the servers serving on.
//
// The job: one coordinator, two servers, one worker (sync mode); the test is
// worker 0 and talks to the servers through raw ParameterServer stubs.
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "kernels/row_optimizer.h"
#include "psrt/v1/coordinator.grpc.pb.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "tests/integration/test_cluster.h"
#include "worker/client.h"

namespace psrt {
namespace {

constexpr char kDistribution[] =
    R"({"parameter_server":{"enabled":true,"mode":"sync","servers_per_host":2,"workers_per_host":1}})";
constexpr int64_t kDim = 4;
constexpr int64_t kVocab = 100;
constexpr uint64_t kSeed = 7;
constexpr double kLr = 0.5;

v1::KeySpec TableSpec(const std::string& name, int server, int64_t vocab, int64_t max_rows = 0,
                      int64_t evict_after = 0) {
  v1::KeySpec k;
  k.set_variable(name);
  k.set_partition(server);
  k.set_dtype(v1::DTYPE_FLOAT32);
  k.add_shape(vocab);
  k.add_shape(kDim);
  k.mutable_optimizer()->set_name("sgd");
  k.mutable_optimizer()->set_lr(kLr);
  v1::TableSpec* t = k.mutable_table();
  t->set_dim(kDim);
  t->set_vocab(vocab);
  t->set_seed(kSeed);
  t->set_init_std(1.0);
  t->set_max_rows(max_rows);
  t->set_evict_after_steps(evict_after);
  t->set_num_shards(2);
  return k;
}

// Ids of server `s` among 0..kVocab-1, the first `n`.
std::vector<int64_t> IdsOf(int s, size_t n) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < kVocab && ids.size() < n; ++id) {
    if (RowShard(id, 2) == s) ids.push_back(id);
  }
  return ids;
}

v1::KeyData Rows(const std::string& table, int server, int64_t version,
                 const std::vector<int64_t>& ids, const std::vector<float>& grads = {}) {
  v1::KeyData k;
  k.set_variable(table);
  k.set_partition(server);
  k.set_version(version);
  k.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t id : ids) k.add_ids(id);
  k.set_data(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
  return k;
}

std::vector<float> Init(int64_t id) {
  std::vector<float> row(kDim);
  InitRow(kSeed, id, 1.0, row.data(), kDim);
  return row;
}

class TableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ClusterOptions options;
    options.distribution = kDistribution;
    absl::StatusOr<std::unique_ptr<testing::TestCluster>> cluster =
        testing::TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << "starting the cluster: " << cluster.status();
    cluster_ = std::move(*cluster);
    ASSERT_EQ(cluster_->num_servers(), 2);
    for (int s = 0; s < 2; ++s) {
      stubs_.push_back(v1::ParameterServer::NewStub(MakeChannel(cluster_->server_address(s))));
    }
  }

  void TearDown() override {
    for (int s = 0; s < 2 && cluster_ != nullptr; ++s) {
      EXPECT_TRUE(cluster_->ServerAlive(s))
          << "psrt-server " << s << " " << cluster_->ServerExitDescription(s);
    }
  }

  grpc::Status Register(int s, const v1::KeySpec& spec) {
    v1::RegisterKeysRequest req;
    *req.add_keys() = spec;
    grpc::ClientContext ctx;
    PrepareContext(&ctx, cluster_->token(), absl::Seconds(10));
    v1::RegisterKeysResponse resp;
    return stubs_[s]->RegisterKeys(&ctx, req, &resp);
  }

  // The table on both servers.
  // A real Client as the job's worker 0, beside the raw stubs.
  absl::StatusOr<std::unique_ptr<Client>> ConnectWorker0() {
    ClientOptions o;
    o.coordinator = cluster_->coordinator_address();
    o.token = cluster_->token();
    o.rank = 0;
    o.host = "127.0.0.1";
    o.rpc_timeout = absl::Seconds(30);
    o.connect_timeout = absl::Seconds(20);
    return Client::Connect(o);
  }

  void RegisterTable(const std::string& name, int64_t vocab, int64_t max_rows = 0,
                     int64_t evict_after = 0) {
    for (int s = 0; s < 2; ++s) {
      grpc::Status st = Register(s, TableSpec(name, s, vocab, max_rows, evict_after));
      ASSERT_TRUE(st.ok()) << "registering " << name << " on server " << s << ": "
                           << st.error_message();
    }
  }

  grpc::Status Push(int s, v1::KeyData key, bool assign_rows = false) {
    v1::PushRequest req;
    req.set_assign_rows(assign_rows);
    *req.add_keys() = std::move(key);
    grpc::ClientContext ctx;
    PrepareContext(&ctx, cluster_->token(), absl::Seconds(10));
    v1::PushResponse resp;
    return stubs_[s]->Push(&ctx, req, &resp);
  }

  grpc::Status Pull(int s, v1::KeyData key, std::vector<float>* rows, int64_t* version = nullptr) {
    v1::PullRequest req;
    key.clear_data();
    *req.add_keys() = std::move(key);
    grpc::ClientContext ctx;
    PrepareContext(&ctx, cluster_->token(), absl::Seconds(10));
    v1::PullResponse resp;
    grpc::Status st = stubs_[s]->Pull(&ctx, req, &resp);
    if (st.ok()) {
      const std::string& data = resp.keys(0).data();
      rows->resize(data.size() / 4);
      std::memcpy(rows->data(), data.data(), data.size());
      if (version != nullptr) *version = resp.keys(0).version();
    }
    return st;
  }

  double Metric(int s, const std::string& name) {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, cluster_->token(), absl::Seconds(10));
    v1::StatsResponse stats;
    EXPECT_TRUE(stubs_[s]->Stats(&ctx, v1::StatsRequest(), &stats).ok());
    auto it = stats.metrics().find(name);
    return it == stats.metrics().end() ? -1 : it->second;
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs_;
};

::testing::AssertionResult Refused(const grpc::Status& s, grpc::StatusCode code,
                                   const std::string& fragment) {
  if (s.error_code() != code || s.error_message().find(fragment) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "expected code " << code << " naming \"" << fragment << "\", got code "
           << s.error_code() << ": " << s.error_message();
  }
  return ::testing::AssertionSuccess();
}

TEST_F(TableTest, RowsStartFromTheSeedAndTakeRowWiseUpdatesOnTheirServer) {
  RegisterTable("t", kVocab);
  for (int s = 0; s < 2; ++s) {
    const std::vector<int64_t> ids = IdsOf(s, 3);
    std::vector<float> rows;
    ASSERT_TRUE(Pull(s, Rows("t", s, 0, ids), &rows).ok());
    ASSERT_EQ(rows.size(), ids.size() * kDim);
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::vector<float> want = Init(ids[i]);
      EXPECT_EQ(0, std::memcmp(rows.data() + i * kDim, want.data(), kDim * 4)) << "row " << ids[i];
    }
    // One step: the first id gets a gradient, the others none.
    std::vector<float> grad(kDim, 1.0f);
    ASSERT_TRUE(Push(s, Rows("t", s, 0, {ids[0]}, grad)).ok());
    int64_t version = 0;
    ASSERT_TRUE(Pull(s, Rows("t", s, 1, ids), &rows, &version).ok());
    EXPECT_EQ(version, 1);
    const std::vector<float> first = Init(ids[0]);
    for (int64_t j = 0; j < kDim; ++j) EXPECT_FLOAT_EQ(rows[j], first[j] - static_cast<float>(kLr));
    const std::vector<float> second = Init(ids[1]);
    EXPECT_EQ(0, std::memcmp(rows.data() + kDim, second.data(), kDim * 4));
  }
}

// A table that starts from given rows (PushRequest.assign_rows): they take
// the values, the rows not given start from the seed, the assigned rows
// train from there with fresh optimizer state; an assignment once a step's
// gradient is in, of a dense key, or of compressed values is refused and
// changes nothing.
TEST_F(TableTest, AssignedRowsStartThereBeforeTheFirstStepAndAreRefusedAfter) {
  RegisterTable("t", kVocab);
  const std::vector<int64_t> ids = IdsOf(0, 3);
  std::vector<float> values(ids.size() * kDim);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i);
  ASSERT_TRUE(Push(0,
                   Rows("t", 0, 0, {ids[0], ids[1]}, {values.begin(), values.begin() + 2 * kDim}),
                   /*assign_rows=*/true)
                  .ok());
  std::vector<float> rows;
  ASSERT_TRUE(Pull(0, Rows("t", 0, 0, ids), &rows).ok());
  EXPECT_EQ(0, std::memcmp(rows.data(), values.data(), 2 * kDim * 4));
  const std::vector<float> third = Init(ids[2]);
  EXPECT_EQ(0, std::memcmp(rows.data() + 2 * kDim, third.data(), kDim * 4)) << "not assigned";

  v1::KeyData fp16 = Rows("t", 0, 0, {ids[2]}, {values.begin(), values.begin() + kDim / 2});
  fp16.set_dtype(v1::DTYPE_FLOAT16);
  EXPECT_TRUE(Refused(Push(0, fp16, true), grpc::StatusCode::INVALID_ARGUMENT, "float32"));
  std::vector<float> grad(kDim, 1.0f);
  ASSERT_TRUE(Push(0, Rows("t", 0, 0, {ids[0]}, grad)).ok());
  EXPECT_TRUE(Refused(Push(0, Rows("t", 0, 0, {ids[2]}, std::vector<float>(kDim, 9.0f)), true),
                      grpc::StatusCode::FAILED_PRECONDITION, "before its first step"));
  ASSERT_TRUE(Pull(0, Rows("t", 0, 1, ids), &rows).ok());
  for (int64_t j = 0; j < kDim; ++j) {
    EXPECT_FLOAT_EQ(rows[j], values[j] - static_cast<float>(kLr)) << "trained from the given row";
  }
  EXPECT_EQ(0, std::memcmp(rows.data() + 2 * kDim, third.data(), kDim * 4))
      << "the refusal set nothing";
}

// A worker that registers a table of a running sync job (restarted, or
// joining) learns where the table is: its steps start there, not at 0.
TEST_F(TableTest, RegisteringARunningJobsTableTellsItsVersion) {
  RegisterTable("v", kVocab);
  for (int64_t step = 0; step < 3; ++step) {
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(Push(s, Rows("v", s, step, IdsOf(s, 1), std::vector<float>(kDim, 1.0f))).ok());
    }
  }
  absl::StatusOr<std::unique_ptr<Client>> c = ConnectWorker0();
  ASSERT_TRUE(c.ok()) << c.status();
  TableOptions table;
  table.dim = kDim;
  table.vocab = kVocab;
  table.seed = kSeed;
  table.init_std = 1.0;
  table.optimizer = DefaultOptimizer(OptimizerKind::kSgd, kLr);
  ASSERT_TRUE((*c)->RegisterTable("v", table).ok());
  absl::StatusOr<int64_t> version = (*c)->PulledVersion("v");
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 3);
}

// Client::AssignRows: a table bigger than a message goes in several (9.6 MB
// of rows, requests of at most 4 MiB), and every row is where it was sent.
TEST_F(TableTest, ATableBiggerThanAMessageIsAssignedInSeveral) {
  absl::StatusOr<std::unique_ptr<Client>> c = ConnectWorker0();
  ASSERT_TRUE(c.ok()) << c.status();
  constexpr int64_t kRows = 600000;
  TableOptions table;
  table.dim = kDim;
  table.vocab = kRows;
  table.seed = kSeed;
  table.optimizer = DefaultOptimizer(OptimizerKind::kSgd, kLr);
  ASSERT_TRUE((*c)->RegisterTable("big", table).ok());
  std::vector<int64_t> ids(kRows);
  std::vector<float> values(kRows * kDim);
  for (int64_t i = 0; i < kRows; ++i) ids[i] = i;
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i);
  const double before =
      Metric(0, "psrt_server_push_requests_total") + Metric(1, "psrt_server_push_requests_total");
  ASSERT_TRUE((*c)->AssignRows("big", ids.data(), kRows, values.data()).ok());
  EXPECT_GE(Metric(0, "psrt_server_push_requests_total") +
                Metric(1, "psrt_server_push_requests_total") - before,
            3);
  const std::vector<int64_t> some = {0, 1, 123457, kRows - 1};
  std::vector<float> got(some.size() * kDim);
  ASSERT_TRUE((*c)->Wait((*c)->PullRows("big", some.data(), 4, got.data(), 0)).ok());
  for (size_t i = 0; i < some.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(got.data() + i * kDim, values.data() + some[i] * kDim, kDim * 4))
        << "row " << some[i];
  }
}

TEST_F(TableTest, BadRequestsAreRefusedClearlyAndTheServersServeOn) {
  RegisterTable("t", kVocab);
  const std::vector<int64_t> mine = IdsOf(0, 2);
  const std::vector<int64_t> theirs = IdsOf(1, 1);
  std::vector<float> rows;
  EXPECT_TRUE(Refused(Pull(0, Rows("t", 0, 0, {kVocab + 5}), &rows), grpc::INVALID_ARGUMENT,
                      absl::StrCat("id ", kVocab + 5, " is out of range")));
  EXPECT_TRUE(Refused(Pull(0, Rows("t", 0, 0, {-1}), &rows), grpc::INVALID_ARGUMENT,
                      "id -1 is out of range"));
  EXPECT_TRUE(Refused(Pull(0, Rows("t", 0, 0, theirs), &rows), grpc::INVALID_ARGUMENT,
                      "belongs to server 1"));
  EXPECT_TRUE(Refused(Push(0, Rows("t", 0, 0, {mine[0], mine[0]}, std::vector<float>(2 * kDim))),
                      grpc::INVALID_ARGUMENT, "appears twice"));
  EXPECT_TRUE(Refused(Push(0, Rows("t", 0, 0, mine, std::vector<float>(kDim))),
                      grpc::INVALID_ARGUMENT, "for 2 ids"));
  v1::KeySpec negative = TableSpec("neg", 0, kVocab);
  negative.mutable_table()->set_dim(-3);
  negative.set_shape(1, -3);
  EXPECT_TRUE(Refused(Register(0, negative), grpc::INVALID_ARGUMENT, "dim -3"));
  v1::KeySpec momentum = TableSpec("mom", 0, kVocab);
  momentum.mutable_optimizer()->set_momentum(0.9);
  EXPECT_TRUE(Refused(Register(0, momentum), grpc::INVALID_ARGUMENT, "momentum"));
  EXPECT_TRUE(Refused(Register(0, TableSpec("t", 0, kVocab + 1)), grpc::FAILED_PRECONDITION, "t"));
  // Nothing refused changed a row or the step: a good push and pull work.
  ASSERT_TRUE(Push(0, Rows("t", 0, 0, {mine[0]}, std::vector<float>(kDim, 2.0f))).ok());
  int64_t version = 0;
  ASSERT_TRUE(Pull(0, Rows("t", 0, 1, mine), &rows, &version).ok());
  EXPECT_EQ(version, 1);
  EXPECT_FLOAT_EQ(rows[0], Init(mine[0])[0] - 2 * static_cast<float>(kLr));
  EXPECT_EQ(0, std::memcmp(rows.data() + kDim, Init(mine[1]).data(), kDim * 4));
}

TEST_F(TableTest, AnOpenHashTableTakesAnyIdUpToItsCap) {
  RegisterTable("h", 0, /*max_rows=*/3);
  std::vector<int64_t> ids;
  for (int64_t id = int64_t{1} << 62; ids.size() < 4; ++id) {
    if (RowShard(id, 2) == 0) ids.push_back(id);
  }
  std::vector<float> rows;
  ASSERT_TRUE(Pull(0, Rows("h", 0, 0, {ids[0], ids[1], ids[2]}), &rows).ok());
  EXPECT_EQ(0, std::memcmp(rows.data(), Init(ids[0]).data(), kDim * 4));
  EXPECT_TRUE(
      Refused(Pull(0, Rows("h", 0, 0, {ids[3]}), &rows), grpc::RESOURCE_EXHAUSTED, "max_rows (3)"));
  // Rows it holds are still served.
  ASSERT_TRUE(Pull(0, Rows("h", 0, 0, {ids[1]}), &rows).ok());
  EXPECT_EQ(0, std::memcmp(rows.data(), Init(ids[1]).data(), kDim * 4));
}

TEST_F(TableTest, RowsNotSeenForTheEvictionStepsAreDroppedAndStartOverIfSeenAgain) {
  RegisterTable("e", 0, 0, /*evict_after=*/2);
  const std::vector<int64_t> ids = IdsOf(0, 2);
  std::vector<float> rows;
  // Step 0 trains both rows; steps 1..4 only the first.
  ASSERT_TRUE(Push(0, Rows("e", 0, 0, ids, std::vector<float>(2 * kDim, 1.0f))).ok());
  for (int64_t step = 1; step <= 4; ++step) {
    ASSERT_TRUE(Push(0, Rows("e", 0, step, {ids[0]}, std::vector<float>(kDim, 1.0f))).ok());
  }
  EXPECT_EQ(Metric(0, "psrt_server_evicted_rows_total"), 1);
  int64_t version = 0;
  ASSERT_TRUE(Pull(0, Rows("e", 0, 5, ids), &rows, &version).ok());
  EXPECT_EQ(version, 5);
  EXPECT_FLOAT_EQ(rows[0], Init(ids[0])[0] - 5 * static_cast<float>(kLr));
  // The dropped row comes back as new: its update is gone.
  EXPECT_EQ(0, std::memcmp(rows.data() + kDim, Init(ids[1]).data(), kDim * 4));
}

// Two workers through the client library, in sync mode. Worker 0's batches
// only ever hold ids of server 0, so it never pulls from server 1; worker 1
// (raw requests, to control which server hears from it when) has pushed step
// 0 to server 0 but not yet to server 1. Worker 0's push for step 1 must wait
// on server 1 for step 0 (as a pull would) rather than reach it early and be
// refused (OUT_OF_RANGE, "is for version 1 but the key is at version 0").
TEST(TableSyncTest, APushWaitsForItsStepOnAServerTheWorkerHasNotPulledFrom) {
  testing::ClusterOptions options;
  options.distribution =
      R"({"parameter_server":{"enabled":true,"mode":"sync","servers_per_host":2,"workers_per_host":2}})";
  options.test_workers = 0;
  absl::StatusOr<std::unique_ptr<testing::TestCluster>> cluster =
      testing::TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << "starting the cluster: " << cluster.status();
  std::vector<std::future<absl::StatusOr<std::unique_ptr<Client>>>> connecting;
  for (int r = 0; r < 2; ++r) {
    connecting.push_back(std::async(std::launch::async, [&, r] {
      ClientOptions o;
      o.coordinator = (*cluster)->coordinator_address();
      o.token = (*cluster)->token();
      o.rank = r;
      o.host = "127.0.0.1";
      o.rpc_timeout = absl::Seconds(30);
      o.connect_timeout = absl::Seconds(20);
      return Client::Connect(o);
    }));
  }
  std::vector<std::unique_ptr<Client>> clients;
  for (auto& f : connecting) {
    absl::StatusOr<std::unique_ptr<Client>> c = f.get();
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
  }
  TableOptions table;
  table.dim = kDim;
  table.vocab = kVocab;
  table.seed = kSeed;
  table.optimizer = DefaultOptimizer(OptimizerKind::kSgd, kLr);
  std::vector<std::future<absl::Status>> registering;
  for (auto& c : clients) {
    registering.push_back(
        std::async(std::launch::async, [&c, &table] { return c->RegisterTable("t", table); }));
  }
  for (auto& f : registering) ASSERT_TRUE(f.get().ok());

  // Worker 1's raw pushes need the servers' addresses: the barrier's shard map.
  auto coordinator = v1::Coordinator::NewStub(MakeChannel((*cluster)->coordinator_address()));
  v1::BarrierRequest barrier;
  barrier.mutable_id()->set_role(v1::ROLE_WORKER);
  barrier.mutable_id()->set_index(1);
  v1::BarrierResponse map;
  {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, (*cluster)->token(), absl::Seconds(10));
    grpc::Status st = coordinator->Barrier(&ctx, barrier, &map);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  ASSERT_EQ(map.shard_map().server_addresses_size(), 2);
  auto push_as_worker_1 = [&](int s, int64_t version) {
    auto stub = v1::ParameterServer::NewStub(MakeChannel(map.shard_map().server_addresses(s)));
    v1::PushRequest req;
    req.set_worker_rank(1);
    *req.add_keys() = Rows("t", s, version, {});
    grpc::ClientContext ctx;
    PrepareContext(&ctx, (*cluster)->token(), absl::Seconds(10));
    v1::PushResponse resp;
    return stub->Push(&ctx, req, &resp);
  };

  Client& w0 = *clients[0];
  const std::vector<int64_t> ids = IdsOf(0, 2);
  std::vector<float> rows(ids.size() * kDim);
  const std::vector<float> grads(ids.size() * kDim, 1.0f);
  // Step 0: worker 0 pulls and pushes; worker 1 pushes to server 0 only.
  ASSERT_TRUE(w0.Wait(w0.PullRows("t", ids.data(), 2, rows.data(), 0)).ok());
  ASSERT_TRUE(w0.Wait(w0.PushRows("t", ids.data(), 2, grads.data(), 0)).ok());
  grpc::Status st = push_as_worker_1(0, 0);
  ASSERT_TRUE(st.ok()) << st.error_message();
  // Step 1: server 0 has applied step 0, server 1 has not.
  ASSERT_TRUE(w0.Wait(w0.PullRows("t", ids.data(), 2, rows.data(), 1)).ok());
  std::future<absl::Status> pushed = std::async(std::launch::async, [&] {
    return w0.Wait(w0.PushRows("t", ids.data(), 2, grads.data(), 1));
  });
  ASSERT_EQ(pushed.wait_for(std::chrono::milliseconds(500)), std::future_status::timeout)
      << "worker 0's push for step 1 ended before server 1 applied step 0: " << pushed.get();
  st = push_as_worker_1(1, 0);
  ASSERT_TRUE(st.ok()) << st.error_message();
  absl::Status s = pushed.get();
  ASSERT_TRUE(s.ok()) << s;
  // Worker 1's step 1 (through the client: no rows); then both steps are
  // applied, each the mean of one gradient of 1 and none.
  ASSERT_TRUE(clients[1]->Wait(clients[1]->PushRows("t", nullptr, 0, nullptr, 1)).ok());
  ASSERT_TRUE(w0.Wait(w0.PullRows("t", ids.data(), 2, rows.data(), 2)).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<float> init = Init(ids[i]);
    for (int64_t j = 0; j < kDim; ++j) {
      EXPECT_FLOAT_EQ(rows[i * kDim + j], init[j] - 2 * 0.5f * static_cast<float>(kLr))
          << "row " << ids[i];
    }
  }
  EXPECT_TRUE((*cluster)->CheckAllAlive().ok());
}

}  // namespace
}  // namespace psrt
