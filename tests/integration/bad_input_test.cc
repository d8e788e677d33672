// Malformed requests against a real psrt-server: each is refused with the
// right gRPC status and a message that names the problem, none changes the
// stored state, and the server keeps serving afterwards.
//
// The job: one coordinator, one server, one worker (sync mode); the test is
// worker 0 and talks to the server through a raw ParameterServer stub.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "gtest/gtest.h"
#include "psrt/v1/coordinator.grpc.pb.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "tests/integration/test_cluster.h"

namespace psrt {
namespace {

constexpr char kDistribution[] =
    R"({"parameter_server":{"enabled":true,"mode":"sync","workers_per_host":1,)"
    R"("limits":{"max_calls_per_worker":4}}})";
constexpr int64_t kN = 1024;           // elements of "w"
constexpr float kLr = 0.5f;
constexpr absl::Duration kRpcTimeout = absl::Seconds(10);
constexpr char kRejectedMetric[] = "psrt_server_rejected_requests_total";

// Dyadic values keep init - lr * grad exact in float32.
std::vector<float> Init() {
  std::vector<float> v(kN);
  for (int64_t i = 0; i < kN; ++i) v[i] = static_cast<float>(i % 64) * 0.25f - 8.0f;
  return v;
}

std::vector<float> Grad() {
  std::vector<float> v(kN);
  for (int64_t i = 0; i < kN; ++i) v[i] = static_cast<float>((i * 7) % 32) * 0.125f - 2.0f;
  return v;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

v1::OptimizerConfig Sgd() {
  v1::OptimizerConfig o;
  o.set_name("sgd");
  o.set_lr(kLr);
  o.set_momentum(0);
  o.set_dampening(0);
  o.set_nesterov(false);
  o.set_weight_decay(0);
  o.set_beta1(0.9);
  o.set_beta2(0.999);
  o.set_eps(1e-8);
  o.set_lr_decay(0);
  o.set_initial_accumulator_value(0);
  return o;
}

// "w", partition 0: the whole [1024] float32 variable, with its init.
v1::KeySpec WSpec() {
  v1::KeySpec k;
  k.set_variable("w");
  k.set_partition(0);
  k.set_dtype(v1::DTYPE_FLOAT32);
  k.add_shape(kN);
  k.set_offset(0);
  k.set_num_elements(kN);
  *k.mutable_optimizer() = Sgd();
  k.set_init(Bytes(Init()));
  return k;
}

v1::KeyData Key(const std::string& variable, uint32_t partition, int64_t version,
                v1::DType dtype = v1::DTYPE_FLOAT32, std::string data = "") {
  v1::KeyData k;
  k.set_variable(variable);
  k.set_partition(partition);
  k.set_version(version);
  k.set_dtype(dtype);
  k.set_data(std::move(data));
  return k;
}

v1::PushRequest PushOf(v1::KeyData key, int32_t rank = 0, uint64_t push_id = 0) {
  v1::PushRequest r;
  r.set_worker_rank(rank);
  r.set_push_id(push_id);
  *r.add_keys() = std::move(key);
  return r;
}

v1::PullRequest PullOf(const std::string& variable, uint32_t partition, int64_t version,
                       int32_t rank = 0) {
  v1::PullRequest r;
  r.set_worker_rank(rank);
  *r.add_keys() = Key(variable, partition, version, v1::DTYPE_UNSPECIFIED);
  return r;
}

v1::RegisterKeysRequest RegisterOf(v1::KeySpec spec, int32_t rank = 0) {
  v1::RegisterKeysRequest r;
  r.set_worker_rank(rank);
  *r.add_keys() = std::move(spec);
  return r;
}

std::string CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "CANCELLED";
    case grpc::UNKNOWN: return "UNKNOWN";
    case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND: return "NOT_FOUND";
    case grpc::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::ABORTED: return "ABORTED";
    case grpc::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::INTERNAL: return "INTERNAL";
    case grpc::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::DATA_LOSS: return "DATA_LOSS";
    case grpc::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return absl::StrCat("code ", static_cast<int>(c));
  }
}

std::string Describe(const grpc::Status& s) {
  return absl::StrCat(CodeName(s.error_code()), ": ", s.error_message());
}

// The call was refused with `code`, and its message contains every fragment.
::testing::AssertionResult Refused(const grpc::Status& s, grpc::StatusCode code,
                                   const std::vector<std::string>& fragments) {
  if (s.error_code() != code) {
    return ::testing::AssertionFailure()
           << "expected " << CodeName(code) << ", got " << Describe(s);
  }
  for (const std::string& f : fragments) {
    if (s.error_message().find(f) == std::string::npos) {
      return ::testing::AssertionFailure()
             << CodeName(code) << " message \"" << s.error_message() << "\" does not mention \""
             << f << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

// A new directory under /tmp for a job's checkpoints ("" if none could be made).
std::string MakeTempDir(const std::string& name) {
  std::string path = "/tmp/psrt-" + name + "-XXXXXX";
  return mkdtemp(path.data()) != nullptr ? path : "";
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ClusterOptions options;
    options.distribution = kDistribution;
    options.hosts = {"local0"};
    absl::StatusOr<std::unique_ptr<testing::TestCluster>> cluster =
        testing::TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << "starting the cluster: " << cluster.status();
    cluster_ = std::move(*cluster);
    ASSERT_EQ(cluster_->num_servers(), 1);
    ASSERT_EQ(cluster_->config().num_workers(), 1);
    ASSERT_EQ(cluster_->config().mode(), "sync");
    // Room to send more than the server takes, to see the server refuse it.
    stub_ = v1::ParameterServer::NewStub(MakeChannel(cluster_->server_address(0), 512ll << 20));
    grpc::Status s = Register(RegisterOf(WSpec()));
    ASSERT_TRUE(s.ok()) << "registering w: " << Describe(s);
  }

  void TearDown() override {
    // Whatever a test sent, the server must have survived it.
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->ServerAlive(0))
          << "psrt-server 0 " << cluster_->ServerExitDescription(0);
    }
  }

  const std::string& token() const { return cluster_->token(); }

  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout = kRpcTimeout) {
    PrepareContext(ctx, token(), timeout);
  }

  grpc::Status Register(const v1::RegisterKeysRequest& req) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::RegisterKeysResponse resp;
    return stub_->RegisterKeys(&ctx, req, &resp);
  }
  grpc::Status Push(const v1::PushRequest& req) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::PushResponse resp;
    return stub_->Push(&ctx, req, &resp);
  }
  grpc::Status Pull(const v1::PullRequest& req, v1::PullResponse* resp,
                    absl::Duration timeout = kRpcTimeout) {
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout);
    return stub_->Pull(&ctx, req, resp);
  }
  grpc::Status Pull(const v1::PullRequest& req) {
    v1::PullResponse resp;
    return Pull(req, &resp);
  }
  grpc::Status PushPull(const v1::PushPullRequest& req) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::PushPullResponse resp;
    return stub_->PushPull(&ctx, req, &resp);
  }
  grpc::Status SetLearningRate(const v1::SetLearningRateRequest& req) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::SetLearningRateResponse resp;
    return stub_->SetLearningRate(&ctx, req, &resp);
  }
  grpc::Status Stats(v1::StatsResponse* resp) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    return stub_->Stats(&ctx, v1::StatsRequest(), resp);
  }

  double Rejected() {
    v1::StatsResponse stats;
    grpc::Status s = Stats(&stats);
    EXPECT_TRUE(s.ok()) << "Stats: " << Describe(s);
    auto it = stats.metrics().find(kRejectedMetric);
    EXPECT_NE(it, stats.metrics().end()) << "Stats has no " << kRejectedMetric;
    return it == stats.metrics().end() ? -1 : it->second;
  }

  // "w" still holds its init at version 0, untouched by what was refused.
  void ExpectUntouched() {
    SCOPED_TRACE("w must still hold its init at version 0");
    ASSERT_TRUE(cluster_->ServerAlive(0)) << "psrt-server 0 " << cluster_->ServerExitDescription(0);
    v1::PullResponse resp;
    grpc::Status s = Pull(PullOf("w", 0, 0), &resp);
    ASSERT_TRUE(s.ok()) << "pull of w at version 0: " << Describe(s);
    ASSERT_EQ(resp.keys_size(), 1);
    const v1::KeyData& k = resp.keys(0);
    EXPECT_EQ(k.variable(), "w");
    EXPECT_EQ(k.partition(), 0u);
    EXPECT_EQ(k.version(), 0) << "a refused request moved the version";
    EXPECT_EQ(k.dtype(), v1::DTYPE_FLOAT32);
    ASSERT_EQ(k.data().size(), static_cast<size_t>(kN * 4));
    EXPECT_TRUE(k.data() == Bytes(Init())) << "a refused request changed the weights";
  }

  // --- each kind of malformed request -------------------------------------------

  void UnknownKey() {
    SCOPED_TRACE("unknown key");
    const std::string grad = Bytes(Grad());
    EXPECT_TRUE(Refused(Push(PushOf(Key("nope", 0, 0, v1::DTYPE_FLOAT32, grad))), grpc::NOT_FOUND,
                        {"'nope#0'", "not registered"}));
    // A registered variable, an unregistered partition.
    EXPECT_TRUE(Refused(Pull(PullOf("w", 7, 0)), grpc::NOT_FOUND, {"'w#7'", "not registered"}));
    // One good key and one unknown: the whole push is refused, nothing applied.
    v1::PushRequest both = PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, grad));
    *both.add_keys() = Key("w", 1, 0, v1::DTYPE_FLOAT32, grad);
    EXPECT_TRUE(Refused(Push(both), grpc::NOT_FOUND, {"'w#1'", "not registered"}));
    v1::PushPullRequest pp;
    *pp.mutable_push() = PushOf(Key("nope", 3, 0, v1::DTYPE_FLOAT32, grad));
    EXPECT_TRUE(Refused(PushPull(pp), grpc::NOT_FOUND, {"'nope#3'"}));
  }

  void WrongDtype() {
    SCOPED_TRACE("wrong dtype");
    // float16 and bfloat16 gradients are 2 bytes a value: float32's byte count
    // under their label is refused, naming the size expected.
    EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT16, Bytes(Grad())))),
                        grpc::INVALID_ARGUMENT, {"'w#0'", "float16", "2048 bytes"}));
    EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, 0, v1::DTYPE_BFLOAT16, Bytes(Grad())))),
                        grpc::INVALID_ARGUMENT, {"'w#0'", "bfloat16", "2048 bytes"}));
    EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, 0, v1::DTYPE_UNSPECIFIED, Bytes(Grad())))),
                        grpc::INVALID_ARGUMENT, {"'w#0'", "unspecified", "float32, float16 or bfloat16"}));
    EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, 0, static_cast<v1::DType>(99), Bytes(Grad())))),
                        grpc::INVALID_ARGUMENT, {"'w#0'", "float32, float16 or bfloat16"}));
    // A negative or infinite scale.
    v1::KeyData scaled = Key("w", 0, 0, v1::DTYPE_FLOAT16, std::string(kN * 2, '\0'));
    scaled.set_scale(-2);
    EXPECT_TRUE(Refused(Push(PushOf(scaled)), grpc::INVALID_ARGUMENT, {"'w#0'", "scale -2"}));
    scaled.set_scale(INFINITY);
    EXPECT_TRUE(Refused(Push(PushOf(scaled)), grpc::INVALID_ARGUMENT, {"'w#0'", "scale inf"}));
    // A pull asking for weights in a dtype that does not exist.
    v1::PullRequest odd = PullOf("w", 0, 0);
    odd.mutable_keys(0)->set_dtype(static_cast<v1::DType>(42));
    EXPECT_TRUE(Refused(Pull(odd), grpc::INVALID_ARGUMENT, {"'w#0'", "dtype 42"}));
    // Registering a variable of an unsupported dtype.
    v1::KeySpec half = WSpec();
    half.set_variable("h");
    half.set_dtype(v1::DTYPE_FLOAT16);
    EXPECT_TRUE(Refused(Register(RegisterOf(half)), grpc::INVALID_ARGUMENT,
                        {"'h#0'", "float16", "not supported"}));
    EXPECT_TRUE(Refused(Pull(PullOf("h", 0, 0)), grpc::NOT_FOUND, {"'h#0'"}))
        << "a refused registration created the key";
  }

  void WrongSize() {
    SCOPED_TRACE("wrong size");
    std::vector<float> short_grad = Grad();
    short_grad.pop_back();
    EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, Bytes(short_grad)))),
                        grpc::INVALID_ARGUMENT,
                        {"'w#0'", "4092 bytes", "1024 float32", "4096 bytes"}));
    std::vector<float> long_grad = Grad();
    long_grad.push_back(1);
    EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, Bytes(long_grad)))),
                        grpc::INVALID_ARGUMENT, {"'w#0'", "4100 bytes", "4096 bytes"}));
    EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, ""))),
                        grpc::INVALID_ARGUMENT, {"'w#0'", "0 bytes", "4096 bytes"}));
    // An initial value of the wrong size.
    v1::KeySpec bad_init = WSpec();
    bad_init.set_variable("x");
    bad_init.set_init(std::string(8, '\0'));
    EXPECT_TRUE(Refused(Register(RegisterOf(bad_init)), grpc::INVALID_ARGUMENT,
                        {"'x#0'", "8 bytes", "expected 4096", "1024 float32"}));
    // A slice that does not fit the shape.
    v1::KeySpec bad_slice = WSpec();
    bad_slice.set_variable("y");
    bad_slice.set_offset(1);
    EXPECT_TRUE(Refused(Register(RegisterOf(bad_slice)), grpc::INVALID_ARGUMENT,
                        {"'y#0'", "[1, +1024)", "[1024]"}));
    // A pull that carries data.
    v1::PullRequest pull = PullOf("w", 0, 0);
    pull.mutable_keys(0)->set_data(Bytes(Grad()));
    EXPECT_TRUE(Refused(Pull(pull), grpc::INVALID_ARGUMENT, {"'w#0'", "carries data"}));
    // Requests naming no key at all.
    EXPECT_TRUE(Refused(Push(v1::PushRequest()), grpc::INVALID_ARGUMENT, {"no keys"}));
    EXPECT_TRUE(Refused(Pull(v1::PullRequest()), grpc::INVALID_ARGUMENT, {"no keys"}));
    EXPECT_TRUE(Refused(Register(v1::RegisterKeysRequest()), grpc::INVALID_ARGUMENT, {"no keys"}));
  }

  void ShapeMismatch() {
    SCOPED_TRACE("shape mismatch on re-registration");
    v1::KeySpec reshaped = WSpec();
    reshaped.clear_shape();
    reshaped.add_shape(512);
    reshaped.add_shape(2);
    EXPECT_TRUE(Refused(Register(RegisterOf(reshaped)), grpc::FAILED_PRECONDITION,
                        {"'w#0'", "shape [1024]", "[512, 2]", "worker 0"}));
    v1::KeySpec bigger = WSpec();
    bigger.set_shape(0, 2048);
    EXPECT_TRUE(Refused(Register(RegisterOf(bigger)), grpc::FAILED_PRECONDITION,
                        {"'w#0'", "shape [1024]", "[2048]"}));
    v1::KeySpec other_optimizer = WSpec();
    other_optimizer.mutable_optimizer()->set_name("adam");
    EXPECT_TRUE(Refused(Register(RegisterOf(other_optimizer)), grpc::FAILED_PRECONDITION,
                        {"'w#0'", "optimizer sgd", "adam"}));
    // One request naming a new key twice, with different shapes: refused as a
    // whole, so the key does not exist afterwards.
    v1::KeySpec four = WSpec();
    four.set_variable("d");
    four.set_shape(0, 4);
    four.set_num_elements(4);
    four.set_init(std::string(16, '\0'));
    v1::KeySpec eight = four;
    eight.set_shape(0, 8);
    v1::RegisterKeysRequest twice = RegisterOf(four);
    *twice.add_keys() = eight;
    EXPECT_TRUE(Refused(Register(twice), grpc::INVALID_ARGUMENT, {"'d#0'", "twice"}));
    EXPECT_TRUE(Refused(Pull(PullOf("d", 0, 0)), grpc::NOT_FOUND, {"'d#0'"}))
        << "a refused registration created the key";
    // The same spec again is fine, and rank 0's first value keeps winning.
    v1::KeySpec same = WSpec();
    std::vector<float> other(kN, 42.f);
    same.set_init(Bytes(other));
    grpc::Status s = Register(RegisterOf(same));
    EXPECT_TRUE(s.ok()) << "re-registering w unchanged: " << Describe(s);
  }

  void Oversized() {
    SCOPED_TRACE("oversized message");
    const absl::Time start = absl::Now();
    {
      v1::PushRequest big = PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, std::string(300ll << 20, '\1')));
      grpc::Status s = Push(big);
      EXPECT_TRUE(Refused(s, grpc::RESOURCE_EXHAUSTED, {"268435456"}));
    }
    const absl::Duration took = absl::Now() - start;
    EXPECT_LT(took, absl::Seconds(8)) << "refusing a 300 MiB push took " << took;
  }

  void BadWorkerId() {
    SCOPED_TRACE("bad worker id");
    const std::string grad = Bytes(Grad());
    for (int32_t rank : {1, -1, 1 << 30}) {
      SCOPED_TRACE(absl::StrCat("rank ", rank));
      const std::string named = absl::StrCat("worker rank ", rank);
      EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, grad), rank)),
                          grpc::INVALID_ARGUMENT, {named, "1 workers", "ranks 0..0"}));
      EXPECT_TRUE(Refused(Pull(PullOf("w", 0, 0, rank)), grpc::INVALID_ARGUMENT,
                          {named, "ranks 0..0"}));
      EXPECT_TRUE(Refused(Register(RegisterOf(WSpec(), rank)), grpc::INVALID_ARGUMENT,
                          {named, "ranks 0..0"}));
      v1::SetLearningRateRequest lr;
      lr.set_worker_rank(rank);
      lr.set_lr(1.0);
      EXPECT_TRUE(Refused(SetLearningRate(lr), grpc::INVALID_ARGUMENT, {named, "ranks 0..0"}));
    }
  }

  void OutOfRangeVersion() {
    SCOPED_TRACE("out-of-range version");
    const std::string grad = Bytes(Grad());
    // Sync mode: a worker pushes for the version it pulled, never ahead.
    EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, 1, v1::DTYPE_FLOAT32, grad))), grpc::OUT_OF_RANGE,
                        {"'w#0'", "version 1", "at version 0"}));
    EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, 1000, v1::DTYPE_FLOAT32, grad))),
                        grpc::OUT_OF_RANGE, {"'w#0'", "version 1000", "at version 0"}));
    EXPECT_TRUE(Refused(Push(PushOf(Key("w", 0, -1, v1::DTYPE_FLOAT32, grad))), grpc::OUT_OF_RANGE,
                        {"'w#0'", "version -1"}));
    // A pull may ask at most one version ahead.
    EXPECT_TRUE(Refused(Pull(PullOf("w", 0, 2)), grpc::OUT_OF_RANGE,
                        {"'w#0'", "version 2", "at version 0", "at most one version ahead"}));
    EXPECT_TRUE(Refused(Pull(PullOf("w", 0, -1)), grpc::OUT_OF_RANGE,
                        {"'w#0'", "version -1", "versions start at 0"}));
    v1::PushPullRequest pp;
    *pp.mutable_push() = PushOf(Key("w", 0, 5, v1::DTYPE_FLOAT32, grad));
    EXPECT_TRUE(Refused(PushPull(pp), grpc::OUT_OF_RANGE, {"'w#0'", "version 5"}));
  }

  void JobToken() {
    SCOPED_TRACE("missing or wrong job token");
    const v1::PushRequest push = PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, Bytes(Grad())));
    for (const std::string& t : {std::string(), std::string("not-the-token"),
                                 token() + "x"}) {
      SCOPED_TRACE(t.empty() ? "no token" : absl::StrCat("token '", t, "'"));
      const std::string why = t.empty() ? "carries no psrt job token" : "not this job's";
      auto ctx = [&](grpc::ClientContext* c) {
        // PrepareContext leaves the token out when it is empty.
        PrepareContext(c, t, kRpcTimeout);
      };
      {
        grpc::ClientContext c;
        ctx(&c);
        v1::PushResponse r;
        EXPECT_TRUE(Refused(stub_->Push(&c, push, &r), grpc::UNAUTHENTICATED, {why}));
      }
      {
        grpc::ClientContext c;
        ctx(&c);
        v1::PullResponse r;
        EXPECT_TRUE(Refused(stub_->Pull(&c, PullOf("w", 0, 0), &r), grpc::UNAUTHENTICATED, {why}));
      }
      {
        grpc::ClientContext c;
        ctx(&c);
        v1::PushPullRequest pp;
        *pp.mutable_push() = push;
        v1::PushPullResponse r;
        EXPECT_TRUE(Refused(stub_->PushPull(&c, pp, &r), grpc::UNAUTHENTICATED, {why}));
      }
      {
        grpc::ClientContext c;
        ctx(&c);
        v1::KeySpec spec = WSpec();
        spec.set_variable("t");
        v1::RegisterKeysResponse r;
        EXPECT_TRUE(Refused(stub_->RegisterKeys(&c, RegisterOf(spec), &r), grpc::UNAUTHENTICATED,
                            {why}));
      }
      {
        grpc::ClientContext c;
        ctx(&c);
        v1::SetLearningRateRequest lr;
        lr.set_lr(100);
        v1::SetLearningRateResponse r;
        EXPECT_TRUE(Refused(stub_->SetLearningRate(&c, lr, &r), grpc::UNAUTHENTICATED, {why}));
      }
      {
        grpc::ClientContext c;
        ctx(&c);
        v1::StatsResponse r;
        EXPECT_TRUE(Refused(stub_->Stats(&c, v1::StatsRequest(), &r), grpc::UNAUTHENTICATED,
                            {why}));
      }
    }
    EXPECT_TRUE(Refused(Pull(PullOf("t", 0, 0)), grpc::NOT_FOUND, {"'t#0'"}))
        << "an unauthenticated registration created the key";
  }

  void GarbageOptimizer() {
    SCOPED_TRACE("garbage optimizer");
    for (const std::string& name : {std::string("sgdd"), std::string(""), std::string("SGD"),
                                    std::string("adam\n; drop")}) {
      v1::KeySpec spec = WSpec();
      spec.set_variable("v");
      spec.mutable_optimizer()->set_name(name);
      EXPECT_TRUE(Refused(Register(RegisterOf(spec)), grpc::INVALID_ARGUMENT,
                          {"'v#0'", absl::StrCat("unknown optimizer '", name, "'"),
                           "sgd, adam, adamw, adagrad"}));
    }
    // A known optimizer with settings it refuses.
    v1::KeySpec negative_lr = WSpec();
    negative_lr.set_variable("v");
    negative_lr.mutable_optimizer()->set_lr(-1);
    EXPECT_TRUE(Refused(Register(RegisterOf(negative_lr)), grpc::INVALID_ARGUMENT,
                        {"'v#0'", "lr", "-1"}));
    v1::KeySpec bad_beta = WSpec();
    bad_beta.set_variable("v");
    bad_beta.mutable_optimizer()->set_name("adam");
    bad_beta.mutable_optimizer()->set_beta1(1.5);
    EXPECT_TRUE(Refused(Register(RegisterOf(bad_beta)), grpc::INVALID_ARGUMENT,
                        {"'v#0'", "beta1", "1.5"}));
    // The same garbage on the registered key: refused before anything else.
    v1::KeySpec w_garbage = WSpec();
    w_garbage.mutable_optimizer()->set_name("sgdd");
    EXPECT_TRUE(Refused(Register(RegisterOf(w_garbage)), grpc::INVALID_ARGUMENT,
                        {"'w#0'", "unknown optimizer 'sgdd'"}));
    // A bad learning rate at run time.
    v1::SetLearningRateRequest lr;
    lr.set_lr(-0.1);
    EXPECT_TRUE(Refused(SetLearningRate(lr), grpc::INVALID_ARGUMENT, {"learning rate", "-0.1"}));
    lr.set_lr(std::nan(""));
    EXPECT_TRUE(Refused(SetLearningRate(lr), grpc::INVALID_ARGUMENT, {"learning rate", "nan"}));
    EXPECT_TRUE(Refused(Pull(PullOf("v", 0, 0)), grpc::NOT_FOUND, {"'v#0'"}))
        << "a refused registration created the key";
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

// What an outside client found accepted, now refused.
TEST_F(BadInputTest, LearningRateOfAnUnknownVariableIsNotFound) {
  v1::SetLearningRateRequest lr;
  lr.set_lr(0.5);
  lr.set_variable("nope");
  EXPECT_TRUE(Refused(SetLearningRate(lr), grpc::NOT_FOUND, {"'nope'", "no key on this server"}));
  lr.set_variable("w");
  EXPECT_TRUE(SetLearningRate(lr).ok());
}

TEST_F(BadInputTest, AKeyTwiceInOnePushIsRefused) {
  v1::PushRequest twice = PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, Bytes(Grad())));
  *twice.add_keys() = twice.keys(0);
  EXPECT_TRUE(Refused(Push(twice), grpc::INVALID_ARGUMENT, {"'w#0'", "appears twice in one push"}));
  v1::PushPullRequest pp;
  *pp.mutable_push() = twice;
  EXPECT_TRUE(Refused(PushPull(pp), grpc::INVALID_ARGUMENT, {"'w#0'", "appears twice"}));
  ExpectUntouched();
}

TEST_F(BadInputTest, VariableNamesAreShortPrintableText) {
  v1::KeySpec huge = WSpec();
  huge.set_variable(std::string(1 << 20, 'a'));
  EXPECT_TRUE(Refused(Register(RegisterOf(huge)), grpc::INVALID_ARGUMENT, {"1048576 bytes", "at most 256"}));
  v1::KeySpec control = WSpec();
  control.set_variable("bad\x01name");
  EXPECT_TRUE(Refused(Register(RegisterOf(control)), grpc::INVALID_ARGUMENT,
                      {"bad\\x01name", "not printable"}));
  v1::KeySpec longest = WSpec();
  longest.set_variable(std::string(256, 'n'));
  EXPECT_TRUE(Register(RegisterOf(longest)).ok());
  ExpectUntouched();
}

TEST_F(BadInputTest, TheCoordinatorNamesUnknownRolesAndIndicesPlainly) {
  auto coordinator = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
  auto heartbeat = [&](v1::Role role, int index) {
    v1::HeartbeatRequest req;
    req.mutable_id()->set_role(role);
    req.mutable_id()->set_index(index);
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::HeartbeatResponse resp;
    return coordinator->Heartbeat(&ctx, req, &resp);
  };
  EXPECT_TRUE(Refused(heartbeat(v1::ROLE_UNSPECIFIED, 0), grpc::INVALID_ARGUMENT,
                      {"role 0 is not a role of a psrt job"}));
  EXPECT_TRUE(Refused(heartbeat(static_cast<v1::Role>(7), 0), grpc::INVALID_ARGUMENT, {"role 7"}));
  EXPECT_TRUE(Refused(heartbeat(v1::ROLE_WORKER, 5), grpc::INVALID_ARGUMENT,
                      {"no worker with index 5 in this job; it has 1 worker (indices 0..0)"}));
  // A process of the job that never registered (this cluster starts no
  // agent): its heartbeats and barrier are refused, and it stays unknown.
  EXPECT_TRUE(Refused(heartbeat(v1::ROLE_AGENT, 0), grpc::FAILED_PRECONDITION,
                      {"agent on", "sent a heartbeat before registering"}));
  EXPECT_TRUE(Refused(heartbeat(v1::ROLE_AGENT, 0), grpc::FAILED_PRECONDITION,
                      {"sent a heartbeat before registering"}));
  v1::BarrierRequest barrier;
  barrier.mutable_id()->set_role(v1::ROLE_AGENT);
  barrier.mutable_id()->set_index(0);
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::BarrierResponse released;
  EXPECT_TRUE(Refused(coordinator->Barrier(&ctx, barrier, &released), grpc::FAILED_PRECONDITION,
                      {"entered the barrier before registering"}));
}

// Bytes that are not a valid message, to every method of both services:
// INVALID_ARGUMENT naming the message type, not gRPC's INTERNAL.
TEST_F(BadInputTest, UndecodableRequestsAreInvalidArgumentOnEveryMethod) {
  // A length-delimited field 1 running past the end of the message.
  const std::string garbage("\x0a\xff\xff\x03", 4);
  auto call = [&](const std::string& address, const std::string& method, const std::string& token) {
    grpc::GenericStub stub(MakeChannel(address));
    grpc::ClientContext ctx;
    PrepareContext(&ctx, token, kRpcTimeout);
    grpc::Slice slice(garbage);
    grpc::ByteBuffer req(&slice, 1), resp;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  };
  const std::vector<std::pair<std::string, std::string>> server_methods = {
      {"RegisterKeys", "RegisterKeysRequest"}, {"Push", "PushRequest"},
      {"Pull", "PullRequest"}, {"PushPull", "PushPullRequest"},
      {"SetLearningRate", "SetLearningRateRequest"}, {"Stats", "StatsRequest"},
      {"SaveShard", "SaveShardRequest"}, {"AttachSharedMemory", "AttachSharedMemoryRequest"},
      {"Replicate", "ReplicateRequest"}, {"Seed", "SeedRequest"}};
  const std::vector<std::pair<std::string, std::string>> coordinator_methods = {
      {"Register", "RegisterRequest"},        {"Barrier", "BarrierRequest"},
      {"Heartbeat", "HeartbeatRequest"},      {"ReportExit", "ReportExitRequest"},
      {"GetJobStatus", "JobStatusRequest"},   {"Checkpoint", "CheckpointRequest"},
      {"RemoveServer", "RemoveServerRequest"}};
  std::vector<std::tuple<std::string, std::string, std::string>> all;
  for (const auto& [method, type] : server_methods) {
    all.emplace_back(cluster_->server_address(0), "/psrt.v1.ParameterServer/" + method, type);
  }
  for (const auto& [method, type] : coordinator_methods) {
    all.emplace_back(cluster_->coordinator_address(), "/psrt.v1.Coordinator/" + method, type);
  }
  for (const auto& [address, method, type] : all) {
    SCOPED_TRACE(method);
    EXPECT_TRUE(Refused(call(address, method, token()), grpc::INVALID_ARGUMENT, {"psrt.v1." + type}));
    // Without the job's token, nothing is said about the request.
    EXPECT_TRUE(Refused(call(address, method, ""), grpc::UNAUTHENTICATED, {"carries no psrt job token"}));
    EXPECT_TRUE(Refused(call(address, method, "x" + token()), grpc::UNAUTHENTICATED, {"not this job's"}));
  }
  ExpectUntouched();
}

TEST_F(BadInputTest, UnknownKeyIsNotFound) {
  UnknownKey();
  ExpectUntouched();
}

TEST_F(BadInputTest, WrongDtypeIsInvalidArgument) {
  WrongDtype();
  ExpectUntouched();
}

TEST_F(BadInputTest, WrongSizeIsInvalidArgument) {
  WrongSize();
  ExpectUntouched();
}

TEST_F(BadInputTest, ShapeMismatchOnReregistrationIsFailedPrecondition) {
  ShapeMismatch();
  ExpectUntouched();
}

TEST_F(BadInputTest, OversizedMessageIsResourceExhausted) {
  Oversized();
  ExpectUntouched();
}

TEST_F(BadInputTest, BadWorkerIdIsInvalidArgument) {
  BadWorkerId();
  ExpectUntouched();
}

TEST_F(BadInputTest, OutOfRangeVersionIsOutOfRange) {
  OutOfRangeVersion();
  ExpectUntouched();
}

TEST_F(BadInputTest, MissingOrWrongTokenIsUnauthenticated) {
  JobToken();
  ExpectUntouched();
}

TEST_F(BadInputTest, GarbageOptimizerIsInvalidArgument) {
  GarbageOptimizer();
  ExpectUntouched();
}

// Every kind in one job, then: the server is alive, w is untouched, a
// correct step applies exactly, and the refusals were counted.
TEST_F(BadInputTest, ServerSurvivesEveryMalformedRequestThenTrainsCorrectly) {
  const double rejected_before = Rejected();
  UnknownKey();
  WrongDtype();
  WrongSize();
  ShapeMismatch();
  Oversized();
  BadWorkerId();
  OutOfRangeVersion();
  JobToken();
  GarbageOptimizer();

  ASSERT_TRUE(cluster_->ServerAlive(0)) << "psrt-server 0 " << cluster_->ServerExitDescription(0);
  ASSERT_TRUE(cluster_->CheckAllAlive().ok()) << cluster_->CheckAllAlive();
  ExpectUntouched();

  // A correct push for version 0 completes the step (one worker)...
  const std::vector<float> init = Init();
  const std::vector<float> grad = Grad();
  grpc::Status s = Push(PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, Bytes(grad)), 0, /*push_id=*/1));
  ASSERT_TRUE(s.ok()) << "correct push: " << Describe(s);
  // ...and version 1 is init - lr * grad, exactly.
  v1::PullResponse resp;
  s = Pull(PullOf("w", 0, 1), &resp);
  ASSERT_TRUE(s.ok()) << "pull of version 1: " << Describe(s);
  ASSERT_EQ(resp.keys_size(), 1);
  EXPECT_EQ(resp.keys(0).version(), 1);
  ASSERT_EQ(resp.keys(0).data().size(), static_cast<size_t>(kN * 4));
  const std::vector<float> got = Floats(resp.keys(0).data());
  int wrong = 0;
  for (int64_t i = 0; i < kN; ++i) {
    const float want = init[i] - kLr * grad[i];
    if (got[i] != want && ++wrong <= 5) {
      ADD_FAILURE() << "w[" << i << "] = " << got[i] << ", want " << init[i] << " - " << kLr
                    << " * " << grad[i] << " = " << want;
    }
  }
  EXPECT_EQ(wrong, 0) << "elements of w off after one sgd step";

  const double rejected = Rejected();
  EXPECT_GT(rejected, 0) << kRejectedMetric;
  // Each malformed kind that reaches the service counts at least once.
  EXPECT_GE(rejected - rejected_before, 7) << kRejectedMetric << " went from " << rejected_before
                                           << " to " << rejected;
  EXPECT_TRUE(cluster_->ServerAlive(0)) << "psrt-server 0 " << cluster_->ServerExitDescription(0);
}

// A pull of a version nobody will push ends at the caller's deadline.
TEST_F(BadInputTest, AWorkerPastItsCallsInFlightIsRefusedNamingTheLimit) {
  // Of the worker's 4 calls, 1 is kept for pushes: 3 pulls wait for a
  // version nobody pushed yet, and a fourth is one too many.
  std::vector<std::thread> waiting;
  std::vector<grpc::Status> answers(3);
  for (int i = 0; i < 3; ++i) {
    waiting.emplace_back([&, i] {
      v1::PullResponse ignored;
      answers[i] = Pull(PullOf("w", 0, 1), &ignored, absl::Seconds(5));
    });
  }
  absl::SleepFor(absl::Milliseconds(500));
  v1::PullResponse resp;
  EXPECT_TRUE(Refused(Pull(PullOf("w", 0, 0), &resp), grpc::RESOURCE_EXHAUSTED,
                      {"worker 0 has 3 calls in flight", "limits.max_calls_per_worker", "1 are kept for pushes"}));
  // The push the pulls wait for still goes through, and releases them.
  const grpc::Status pushed = Push(PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, Bytes(Grad()))));
  EXPECT_TRUE(pushed.ok()) << "the worker's push was starved by its own pulls: " << Describe(pushed);
  for (std::thread& t : waiting) t.join();
  for (const grpc::Status& a : answers) EXPECT_TRUE(a.ok()) << "a waiting pull: " << Describe(a);
  EXPECT_TRUE(Pull(PullOf("w", 0, 1), &resp).ok());
}

TEST_F(BadInputTest, ARefusedPushPullPushesNothing) {
  // The pull part is invalid: the push part must not have been applied.
  v1::PushPullRequest pp;
  *pp.mutable_push() = PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, Bytes(Grad())));
  pp.mutable_push()->mutable_keys(0)->set_pull_dtype(static_cast<v1::DType>(42));
  EXPECT_TRUE(Refused(PushPull(pp), grpc::INVALID_ARGUMENT, {"'w#0'", "dtype 42"}));
  ExpectUntouched();
}

TEST_F(BadInputTest, HyperparametersMustStayFiniteAsTheFloat32UpdatesRunIn) {
  struct Case {
    const char* optimizer;
    std::function<void(v1::OptimizerConfig*)> set;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"sgd", [](v1::OptimizerConfig* o) { o->set_lr(INFINITY); }, {"lr", "inf"}},
      {"sgd", [](v1::OptimizerConfig* o) { o->set_lr(1e300); }, {"lr", "1e+300", "float32"}},
      {"sgd", [](v1::OptimizerConfig* o) { o->set_momentum(INFINITY); }, {"momentum", "inf"}},
      {"sgd", [](v1::OptimizerConfig* o) { o->set_weight_decay(INFINITY); }, {"weight_decay", "inf"}},
      {"sgd", [](v1::OptimizerConfig* o) { o->set_dampening(-INFINITY); }, {"dampening", "-inf"}},
      {"adam", [](v1::OptimizerConfig* o) { o->set_eps(INFINITY); }, {"eps", "inf"}},
      {"adam", [](v1::OptimizerConfig* o) { o->set_eps(0); }, {"eps", "must be > 0"}},
      {"adam", [](v1::OptimizerConfig* o) { o->set_eps(1e-60); }, {"eps", "float32"}},
      // Finite as float32, but the first step, lr / (1 - beta1), is not.
      {"adam", [](v1::OptimizerConfig* o) { o->set_lr(1e38); o->set_beta1(0.99); }, {"lr", "1e+38", "first update"}},
      {"adagrad", [](v1::OptimizerConfig* o) { o->set_lr_decay(INFINITY); }, {"lr_decay", "inf"}},
      {"adagrad", [](v1::OptimizerConfig* o) { o->set_initial_accumulator_value(INFINITY); },
       {"initial_accumulator_value", "inf"}},
  };
  for (const Case& c : cases) {
    v1::KeySpec spec = WSpec();
    spec.set_variable("p");
    spec.mutable_optimizer()->set_name(c.optimizer);
    spec.mutable_optimizer()->set_eps(1e-8);
    c.set(spec.mutable_optimizer());
    SCOPED_TRACE(spec.optimizer().ShortDebugString());
    std::vector<std::string> says = c.says;
    says.push_back("'p#0'");
    EXPECT_TRUE(Refused(Register(RegisterOf(spec)), grpc::INVALID_ARGUMENT, says));
    EXPECT_TRUE(Refused(Pull(PullOf("p", 0, 0)), grpc::NOT_FOUND, {"'p#0'"})) << "a refused registration created the key";
  }
  // At run time: a learning rate finite as a double only, or one that makes
  // an Adam key's first step overflow, changes no key.
  v1::KeySpec adam = WSpec();
  adam.set_variable("a");
  adam.mutable_optimizer()->set_name("adam");
  adam.mutable_optimizer()->set_beta1(0.99);
  ASSERT_TRUE(Register(RegisterOf(adam)).ok());
  v1::SetLearningRateRequest lr;
  lr.set_lr(1e300);
  EXPECT_TRUE(Refused(SetLearningRate(lr), grpc::INVALID_ARGUMENT, {"learning rate", "1e+300", "float32"}));
  lr.set_lr(1e38);
  EXPECT_TRUE(Refused(SetLearningRate(lr), grpc::INVALID_ARGUMENT, {"learning rate for key 'a#0'", "first update"}));
  // A scale whose inverse overflows would turn the gradient into Inf.
  v1::KeyData tiny = Key("w", 0, 0, v1::DTYPE_FLOAT16, std::string(kN * 2, '\x01'));
  tiny.set_scale(1e-45f);
  EXPECT_TRUE(Refused(Push(PushOf(tiny)), grpc::INVALID_ARGUMENT, {"'w#0'", "scale"}));
  ExpectUntouched();  // w trains at kLr still: one step shows it
  ASSERT_TRUE(Push(PushOf(Key("w", 0, 0, v1::DTYPE_FLOAT32, Bytes(Grad())))).ok());
  v1::PullResponse resp;
  ASSERT_TRUE(Pull(PullOf("w", 0, 1), &resp).ok());
  const std::vector<float> got = Floats(resp.keys(0).data()), init = Init(), grad = Grad();
  for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(got[i], init[i] - kLr * grad[i]) << "element " << i;
}

TEST_F(BadInputTest, ErrorTextsAreCutToWhatGrpcCanDeliver) {
  // A 64 KiB name echoed back, and a shape of 3000 entries.
  const std::string name(64 << 10, 'n');
  const grpc::Status unknown = Push(PushOf(Key(name, 0, 0, v1::DTYPE_FLOAT32, Bytes(Grad()))));
  EXPECT_TRUE(Refused(unknown, grpc::NOT_FOUND, {"nnnn", "bytes in all)"}));
  EXPECT_LE(unknown.error_message().size(), kMaxErrorBytes);
  v1::KeySpec reshaped = WSpec();
  reshaped.clear_shape();
  for (int i = 0; i < 3000; ++i) reshaped.add_shape(1000000);
  const grpc::Status shape = Register(RegisterOf(reshaped));
  EXPECT_TRUE(Refused(shape, grpc::INVALID_ARGUMENT, {"'w#0'"})) << Describe(shape);
  EXPECT_LE(shape.error_message().size(), kMaxErrorBytes);
  ExpectUntouched();
}

TEST(SaveShardTest, AServerWritesOnlyUnderTheJobsCheckpointUriAndAnswersByTheCallersDeadline) {
  const std::string dir = MakeTempDir("saveshard");
  ASSERT_FALSE(dir.empty());
  testing::ClusterOptions options;
  options.distribution = absl::StrCat(R"({"parameter_server":{"enabled":true,"mode":"sync","workers_per_host":1,)",
                                      R"("checkpoint":{"uri":"file://)", dir, R"(/ckpt"}}})");
  absl::StatusOr<std::unique_ptr<testing::TestCluster>> cluster = testing::TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto stub = v1::ParameterServer::NewStub(MakeChannel((*cluster)->server_address(0)));
  {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, (*cluster)->token(), kRpcTimeout);
    v1::RegisterKeysResponse resp;
    ASSERT_TRUE(stub->RegisterKeys(&ctx, RegisterOf(WSpec()), &resp).ok());
  }
  auto save = [&](const std::string& root, int64_t step, absl::Duration timeout, v1::SaveShardResponse* resp) {
    v1::SaveShardRequest req;
    req.set_root_uri(root);
    req.set_name(absl::StrCat("step-", step));
    req.set_shard_path(absl::StrCat("step-", step, "/shard-00000-of-00001.psrt"));
    req.set_step(step);
    req.set_wait_s(3);
    grpc::ClientContext ctx;
    PrepareContext(&ctx, (*cluster)->token(), timeout);
    return stub->SaveShard(&ctx, req, resp);
  };
  // A destination of the client's choosing: refused, nothing written there.
  v1::SaveShardResponse resp;
  const std::string elsewhere = dir + "/elsewhere";
  EXPECT_TRUE(Refused(save("file://" + elsewhere, -1, kRpcTimeout, &resp), grpc::PERMISSION_DENIED,
                      {"only under the job's checkpoint.uri", dir + "/ckpt"}));
  EXPECT_NE(access(elsewhere.c_str(), F_OK), 0) << "a refused SaveShard wrote under " << elsewhere;
  // Four at once for a step nobody reaches: each answers "not done" by its
  // 3 s wait, none queues past it behind the others.
  std::vector<std::thread> calls;
  std::vector<grpc::Status> answers(4);
  std::vector<absl::Duration> took(4);
  for (int i = 0; i < 4; ++i) {
    calls.emplace_back([&, i] {
      const absl::Time start = absl::Now();
      v1::SaveShardResponse r;
      answers[i] = save("file://" + dir + "/ckpt", 5, absl::Seconds(6), &r);
      took[i] = absl::Now() - start;
      if (answers[i].ok()) EXPECT_FALSE(r.done()) << "call " << i;
    });
  }
  for (std::thread& t : calls) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(answers[i].ok()) << "call " << i << ": " << Describe(answers[i]);
    EXPECT_LT(took[i], absl::Milliseconds(4500)) << "call " << i << " outlived its 3 s wait";
  }
  std::filesystem::remove_all(dir);
}
TEST_F(BadInputTest, PullOfUnpushedVersionEndsAtDeadline) {
  v1::PullResponse resp;
  const absl::Time start = absl::Now();
  grpc::Status s = Pull(PullOf("w", 0, 1), &resp, absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.error_code(), grpc::DEADLINE_EXCEEDED) << Describe(s);
  EXPECT_GE(took, absl::Milliseconds(250)) << "the pull returned before its deadline";
  EXPECT_LT(took, absl::Seconds(2)) << "the pull outlived its 300 ms deadline by far";
  EXPECT_EQ(resp.keys_size(), 0);
  // The server is not wedged: the waiting handler let go.
  ExpectUntouched();
}

// One rank registers a variable the other never does (a bug in a training
// script): it cannot take a step, but it must block neither checkpoints nor
// the job's end (its final checkpoint).
// The end of a job (docs/runtime.md, "Failures and job end"): a sync job
// with the default barrier_timeout_s (60 s) whose variable 'stray' rank 0
// alone registered (with its value) and 'rank1' rank 1 alone (without one),
// after 3 steps of 'w' by both ranks.
class JobEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("partial");
    ASSERT_FALSE(dir_.empty());
    testing::ClusterOptions options;
    options.distribution =
        absl::StrCat(R"({"parameter_server":{"enabled":true,"mode":"sync","workers_per_host":2,)",
                     R"("checkpoint":{"uri":"file://)", dir_, R"("}}})");
    absl::StatusOr<std::unique_ptr<testing::TestCluster>> started =
        testing::TestCluster::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = *std::move(started);
    ASSERT_EQ(cluster_->config().num_workers(), 2);
    auto stub = v1::ParameterServer::NewStub(MakeChannel(cluster_->server_address(0)));
    auto call = [&](auto method, const auto& req, auto* resp) {
      grpc::ClientContext ctx;
      PrepareContext(&ctx, cluster_->token(), kRpcTimeout);
      return ((*stub).*method)(&ctx, req, resp);
    };
    v1::KeySpec stray = WSpec();
    stray.set_variable("stray");
    v1::RegisterKeysRequest rank0 = RegisterOf(WSpec(), 0);
    *rank0.add_keys() = stray;
    v1::RegisterKeysResponse registered;
    ASSERT_TRUE(call(&v1::ParameterServer::Stub::RegisterKeys, rank0, &registered).ok());
    v1::KeySpec w1 = WSpec();
    w1.clear_init();
    v1::KeySpec rank1_only = w1;
    rank1_only.set_variable("rank1");
    v1::RegisterKeysRequest rank1 = RegisterOf(w1, 1);
    *rank1.add_keys() = rank1_only;
    ASSERT_TRUE(call(&v1::ParameterServer::Stub::RegisterKeys, rank1, &registered).ok());
    for (int step = 0; step < 3; ++step) {
      for (int rank = 0; rank < 2; ++rank) {
        v1::PushResponse pushed;
        const grpc::Status s =
            call(&v1::ParameterServer::Stub::Push,
                 PushOf(Key("w", 0, step, v1::DTYPE_FLOAT32, Bytes(Grad())), rank), &pushed);
        ASSERT_TRUE(s.ok()) << "step " << step << ", rank " << rank << ": " << Describe(s);
      }
    }
  }
  void TearDown() override {
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Both workers finish; the job's state once it ended, or after `within`.
  v1::JobState FinishWithin(absl::Duration within) {
    for (int rank = 0; rank < 2; ++rank) {
      v1::ProcessId id;
      id.set_role(v1::ROLE_WORKER);
      id.set_index(rank);
      EXPECT_TRUE(cluster_->worker_link(rank)->ReportExit(id, 0, "").ok());
    }
    const absl::Time deadline = absl::Now() + within;
    v1::JobState state = v1::JOB_RUNNING;
    while (state == v1::JOB_RUNNING && absl::Now() < deadline) {
      absl::StatusOr<v1::JobStatusResponse> status = cluster_->worker_link(0)->GetJobStatus();
      if (status.ok()) state = status->state();
      absl::SleepFor(absl::Milliseconds(50));
    }
    return state;
  }

  std::string dir_;
  std::unique_ptr<testing::TestCluster> cluster_;
};

TEST_F(JobEndTest, ACheckpointWaitsSecondsNotBarrierTimeoutForVariablesSomeRanksNeverRegister) {
  // Such keys never took a step: taken as they are after 5 s, not 60.
  auto coordinator = v1::Coordinator::NewStub(MakeChannel(cluster_->coordinator_address()));
  grpc::ClientContext ctx;
  PrepareContext(&ctx, cluster_->token(), absl::Seconds(20));
  v1::CheckpointResponse saved;
  const absl::Time start = absl::Now();
  const grpc::Status s = coordinator->Checkpoint(&ctx, v1::CheckpointRequest(), &saved);
  ASSERT_TRUE(s.ok()) << "a checkpoint with variables one rank alone registered: " << Describe(s);
  EXPECT_EQ(saved.step(), 3);
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_EQ(FinishWithin(absl::Seconds(10)), v1::JOB_SUCCEEDED);
}

TEST_F(JobEndTest, TheJobEndsAtOnceDespiteVariablesSomeRanksNeverRegistered) {
  // Nobody can register them any more: the final checkpoint takes them at
  // once (not after the 5 s a checkpoint waits while workers train).
  EXPECT_EQ(FinishWithin(absl::Seconds(3)), v1::JOB_SUCCEEDED)
      << "the job did not end 3 s after its workers did";
}

TEST_F(JobEndTest, AServerSlowToAnswerDelaysTheFinalCheckpointWithoutFailingIt) {
  // Stopped for 2.5 s as the workers finish: a connection to it opens but
  // its HTTP/2 greeting does not come (a loaded host). The final checkpoint
  // asks it again until it answers.
  const pid_t server = cluster_->server_pid(0);
  ASSERT_EQ(kill(server, SIGSTOP), 0);
  std::thread resume([server] {
    absl::SleepFor(absl::Milliseconds(2500));
    kill(server, SIGCONT);
  });
  const v1::JobState state = FinishWithin(absl::Seconds(20));
  resume.join();
  EXPECT_EQ(state, v1::JOB_SUCCEEDED);
  absl::StatusOr<v1::JobStatusResponse> status = cluster_->worker_link(0)->GetJobStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->reason(), "every worker finished");
}

}  // namespace
}  // namespace psrt
