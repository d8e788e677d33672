// The data channel (common/data_channel.h) against a real psrt-server: its
// hello, its framing, deadlines and cancellation, and bytes that are no
// frame. The jobs that train over it are in data_path_test.cc.
#include "common/data_channel.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/net.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "tests/integration/test_cluster.h"

namespace psrt {
namespace {

constexpr int kN = 1000;

grpc::ByteBuffer Bytes(const google::protobuf::Message& m) {
  grpc::Slice slice(m.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

template <typename Message>
Message Parse(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string all;
  for (const grpc::Slice& s : slices)
    all.append(reinterpret_cast<const char*>(s.begin()), s.size());
  Message m;
  EXPECT_TRUE(m.ParseFromString(all));
  return m;
}

v1::PullRequest PullOfW(int rank, int64_t version) {
  v1::PullRequest req;
  req.set_worker_rank(rank);
  v1::KeyData* k = req.add_keys();
  k->set_variable("w");
  k->set_version(version);
  return req;
}

v1::PushRequest PushToW(int rank, uint64_t id, float value) {
  v1::PushRequest push;
  push.set_worker_rank(rank);
  push.set_push_id(id);
  v1::KeyData* k = push.add_keys();
  k->set_variable("w");
  k->set_version(0);
  k->set_dtype(v1::DTYPE_FLOAT32);
  const std::vector<float> g(kN, value);
  k->set_data(reinterpret_cast<const char*>(g.data()), kN * 4);
  return push;
}

// One call over a channel, waited for.
struct Answer {
  grpc::Status status;
  grpc::ByteBuffer body;
  absl::Duration took;
};
Answer CallAndWait(DataChannel* channel, FrameKind kind, const google::protobuf::Message& req,
                   absl::Duration timeout) {
  Answer a;
  absl::Notification done;
  const grpc::ByteBuffer bytes = Bytes(req);
  const absl::Time start = absl::Now();
  channel->Call(kind, bytes, timeout, &a.body, [&](grpc::Status s) {
    a.status = std::move(s);
    a.took = absl::Now() - start;
    done.Notify();
  });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(timeout + absl::Seconds(10)))
      << "the call never ended";
  return a;
}

class DataChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ClusterOptions options;
    options.distribution =
        R"({"parameter_server":{"enabled":true,"mode":"sync","workers_per_host":2}})";
    absl::StatusOr<std::unique_ptr<testing::TestCluster>> cluster =
        testing::TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << "starting the cluster: " << cluster.status();
    cluster_ = std::move(*cluster);
    stub_ = v1::ParameterServer::NewStub(MakeChannel(cluster_->server_address(0)));
    grpc::ClientContext ctx;
    PrepareContext(&ctx, cluster_->token(), absl::Seconds(30));
    v1::DataChannelRequest req;
    v1::DataChannelResponse resp;
    grpc::Status s = stub_->DataChannel(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_GT(resp.port(), 0);
    port_ = resp.port();
    // "w": kN float32 zeros, SGD with lr 1, registered by both workers.
    for (int r = 0; r < 2; ++r) {
      v1::RegisterKeysRequest reg;
      reg.set_worker_rank(r);
      v1::KeySpec* k = reg.add_keys();
      k->set_variable("w");
      k->set_dtype(v1::DTYPE_FLOAT32);
      k->add_shape(kN);
      k->set_num_elements(kN);
      k->mutable_optimizer()->set_name("sgd");
      k->mutable_optimizer()->set_lr(1);
      if (r == 0) k->set_init(std::string(kN * 4, '\0'));
      grpc::ClientContext rctx;
      PrepareContext(&rctx, cluster_->token(), absl::Seconds(60));
      v1::RegisterKeysResponse rresp;
      grpc::Status rs = stub_->RegisterKeys(&rctx, reg, &rresp);
      ASSERT_TRUE(rs.ok()) << rs.error_message();
    }
  }

  std::shared_ptr<DataChannel> Open() {
    absl::StatusOr<std::shared_ptr<DataChannel>> c = DataChannel::Connect(
        HostOf(cluster_->server_address(0)), port_, cluster_->token(), absl::Seconds(10));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }

  double Metric(const std::string& name) {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, cluster_->token(), absl::Seconds(30));
    v1::StatsResponse stats;
    grpc::Status s = stub_->Stats(&ctx, v1::StatsRequest(), &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    auto it = stats.metrics().find(name);
    return it == stats.metrics().end() ? -1 : it->second;
  }

  // w's values at version 0, read over gRPC: what nothing may have changed.
  std::vector<float> WeightsNow() {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, cluster_->token(), absl::Seconds(30));
    v1::PullResponse resp;
    grpc::Status s = stub_->Pull(&ctx, PullOfW(0, 0), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<float> w(kN, -1);
    if (resp.keys_size() == 1 && resp.keys(0).data().size() == kN * 4) {
      std::memcpy(w.data(), resp.keys(0).data().data(), kN * 4);
    }
    return w;
  }

  // A plain socket to the data port, to send it anything.
  int RawSocket() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port_);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << std::strerror(errno);
    timeval tv{15, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }

  // Sends a hello with the job's token on `fd` and reads its answer.
  void Hello(int fd) {
    FrameHeader h;
    h.kind = FrameKind::kHello;
    h.text_bytes = static_cast<uint32_t>(cluster_->token().size());
    ASSERT_TRUE(WriteFrame(fd, h, cluster_->token(), nullptr, absl::Now() + absl::Seconds(5)).ok());
    char head[FrameHeader::kBytes];
    ASSERT_TRUE(ReadFull(fd, head, sizeof(head)).ok());
    absl::StatusOr<FrameHeader> answer = FrameHeader::Read(head, 0);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->code, 0u);
  }

  // Whether the server closed `fd` (reads end-of-stream) within 15 s.
  static bool ClosedByServer(int fd) {
    char c;
    ssize_t n;
    do {
      n = recv(fd, &c, 1, 0);
    } while (n > 0);
    return n == 0;
  }

  std::unique_ptr<testing::TestCluster> cluster_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  int port_ = 0;
};

TEST_F(DataChannelTest, OnlyTheJobsTokenOpensAChannel) {
  absl::StatusOr<std::shared_ptr<DataChannel>> wrong = DataChannel::Connect(
      HostOf(cluster_->server_address(0)), port_, "another-jobs-token", absl::Seconds(10));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated) << wrong.status();
  EXPECT_NE(wrong.status().message().find("not this job's"), std::string::npos) << wrong.status();
  // A request without a hello is never read.
  const int fd = RawSocket();
  const grpc::ByteBuffer push = Bytes(PushToW(0, 1, 5));
  FrameHeader h;
  h.kind = FrameKind::kPush;
  h.code = 10000;
  h.call = 1;
  h.payload_bytes = push.Length();
  ASSERT_TRUE(WriteFrame(fd, h, "", &push, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_TRUE(ClosedByServer(fd));
  close(fd);
  EXPECT_EQ(WeightsNow(), std::vector<float>(kN, 0.0f));
  std::shared_ptr<DataChannel> right = Open();
  ASSERT_NE(right, nullptr);
  EXPECT_TRUE(cluster_->ServerAlive(0)) << cluster_->ServerExitDescription(0);
}

TEST_F(DataChannelTest, PushesAndPullsOverTheChannelMeetThoseOverGrpc) {
  std::shared_ptr<DataChannel> channel = Open();
  ASSERT_NE(channel, nullptr);
  // Worker 1 pushes 3 over gRPC, worker 0 pushes 1 over the channel: the
  // step's mean gradient is 2, so version 1 is -2 with lr 1.
  {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, cluster_->token(), absl::Seconds(30));
    v1::PushResponse resp;
    grpc::Status s = stub_->Push(&ctx, PushToW(1, 1, 3), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  Answer pushed = CallAndWait(channel.get(), FrameKind::kPush, PushToW(0, 1, 1), absl::Seconds(30));
  ASSERT_TRUE(pushed.status.ok()) << pushed.status.error_message();
  Answer pulled = CallAndWait(channel.get(), FrameKind::kPull, PullOfW(0, 1), absl::Seconds(30));
  ASSERT_TRUE(pulled.status.ok()) << pulled.status.error_message();
  v1::PullResponse resp = Parse<v1::PullResponse>(pulled.body);
  ASSERT_EQ(resp.keys_size(), 1);
  EXPECT_EQ(resp.keys(0).version(), 1);
  ASSERT_EQ(resp.keys(0).data().size(), kN * 4u);
  std::vector<float> w(kN);
  std::memcpy(w.data(), resp.keys(0).data().data(), kN * 4);
  EXPECT_EQ(w, std::vector<float>(kN, -2.0f));
  // A refused request is answered with the store's error, and the channel
  // goes on serving.
  Answer refused = CallAndWait(channel.get(), FrameKind::kPull, PullOfW(7, 1), absl::Seconds(30));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << refused.status.error_message();
  EXPECT_FALSE(channel->broken());
  Answer again = CallAndWait(channel.get(), FrameKind::kPull, PullOfW(0, 1), absl::Seconds(30));
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
}

TEST_F(DataChannelTest, AWaitingPullEndsAtItsDeadlineNamingTheMissingWorkers) {
  std::shared_ptr<DataChannel> channel = Open();
  ASSERT_NE(channel, nullptr);
  Answer a = CallAndWait(channel.get(), FrameKind::kPull, PullOfW(1, 1), absl::Milliseconds(800));
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(a.status.error_message().find("waiting for pushes from workers 0, 1"),
            std::string::npos)
      << a.status.error_message();
  EXPECT_LT(a.took, absl::Seconds(5));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(Metric("psrt_server_waiting_pulls"), 0);
  EXPECT_FALSE(channel->broken());
}

TEST_F(DataChannelTest, ClosingTheChannelEndsItsCallsAndTheServersWait) {
  std::shared_ptr<DataChannel> channel = Open();
  ASSERT_NE(channel, nullptr);
  absl::Notification done;
  grpc::Status status;
  grpc::ByteBuffer body;
  const grpc::ByteBuffer req = Bytes(PullOfW(0, 1));
  channel->Call(FrameKind::kPull, req, absl::Seconds(60), &body, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Metric("psrt_server_waiting_pulls") < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(Metric("psrt_server_waiting_pulls"), 1);
  channel->Close();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  // The server sees its caller gone and stops waiting for it.
  const absl::Time drained = absl::Now() + absl::Seconds(5);
  while (Metric("psrt_server_waiting_pulls") != 0 && absl::Now() < drained) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(Metric("psrt_server_waiting_pulls"), 0);
}

// Whatever a connection sends, the server closes it at the first thing that
// is not a frame, before reading (or allocating) what the frame announces,
// and keeps serving everyone else; nothing reaches the store.
TEST_F(DataChannelTest, ReplicateFramesAreCheckedWholeAndChangeNothingHere) {
  // A server forwards updates of its keys' copies as Replicate frames; this
  // server holds no copies, and malformed frames are refused as such.
  std::shared_ptr<DataChannel> channel = Open();
  ASSERT_NE(channel, nullptr);
  const std::vector<float> g(kN, 1.0f);
  grpc::Slice slice(g.data(), kN * 4);
  const grpc::ByteBuffer gradient(&slice, 1);
  v1::ReplicateRequest named;
  named.set_variable("w");
  named.set_version(0);
  v1::ReplicateRequest with_gradient = named;
  with_gradient.set_gradient("abcd");
  struct Case {
    const char* what;
    std::string text;
    grpc::StatusCode code;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"text that is no request", "\xff\xff\xff", grpc::StatusCode::INVALID_ARGUMENT,
       "no ReplicateRequest"},
      {"the gradient inside the text", with_gradient.SerializeAsString(),
       grpc::StatusCode::INVALID_ARGUMENT, "without its gradient"},
      {"a key this server does not keep a copy of", named.SerializeAsString(),
       grpc::StatusCode::FAILED_PRECONDITION, "is not a replica on this server"},
  };
  for (const Case& c : cases) {
    Answer a;
    absl::Notification done;
    channel->Call(
        FrameKind::kReplicate, gradient, absl::Seconds(10), &a.body,
        [&](grpc::Status s) {
          a.status = std::move(s);
          done.Notify();
        },
        c.text);
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20))) << c.what;
    EXPECT_EQ(a.status.error_code(), c.code) << c.what << ": " << a.status.error_message();
    EXPECT_NE(a.status.error_message().find(c.says), std::string::npos)
        << c.what << ": " << a.status.error_message();
  }
  EXPECT_FALSE(channel->broken()) << "a well-framed request broke the channel";
  EXPECT_EQ(WeightsNow(), std::vector<float>(kN, 0.0f)) << "a refused update changed w";
}

TEST_F(DataChannelTest, BytesThatAreNoFrameCloseOnlyTheirConnection) {
  struct Case {
    const char* what;
    std::string bytes;
  };
  auto header = [](FrameKind kind, uint64_t payload, uint32_t text) {
    FrameHeader h;
    h.kind = kind;
    h.code = 1000;
    h.call = 9;
    h.payload_bytes = payload;
    h.text_bytes = text;
    std::string out(FrameHeader::kBytes, '\0');
    h.Write(out.data());
    return out;
  };
  std::string bad_magic = header(FrameKind::kPush, 0, 0);
  bad_magic[0] ^= 1;
  std::string bad_kind = header(FrameKind::kPush, 0, 0);
  bad_kind[4] = 9;
  const std::vector<Case> cases = {
      {"bytes that are no header", std::string(64, 'x')},
      {"a wrong magic", bad_magic},
      {"an unknown kind", bad_kind},
      {"a payload of a terabyte", header(FrameKind::kPush, uint64_t{1} << 40, 0)},
      {"a request with text", header(FrameKind::kPull, 0, 16) + std::string(16, 'a')},
      {"an answer sent to the server", header(FrameKind::kAnswer, 0, 0)},
      {"a second hello", header(FrameKind::kHello, 0, 0)},
      {"a push whose body is no PushRequest",
       header(FrameKind::kPush, 8, 0) + "\xff\xff\xff\xff\xff\xff\xff\xff"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const int fd = RawSocket();
    Hello(fd);
    ASSERT_EQ(send(fd, c.bytes.data(), c.bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(c.bytes.size()));
    if (std::string(c.what).rfind("a push whose", 0) == 0) {
      // A frame, but no valid message: answered INVALID_ARGUMENT, and the
      // connection stays.
      char head[FrameHeader::kBytes];
      ASSERT_TRUE(ReadFull(fd, head, sizeof(head)).ok());
      absl::StatusOr<FrameHeader> answer = FrameHeader::Read(head, 0);
      ASSERT_TRUE(answer.ok()) << answer.status();
      EXPECT_EQ(answer->call, 9u);
      EXPECT_EQ(answer->code, static_cast<uint32_t>(grpc::StatusCode::INVALID_ARGUMENT));
    } else {
      EXPECT_TRUE(ClosedByServer(fd));
    }
    close(fd);
  }
  EXPECT_EQ(WeightsNow(), std::vector<float>(kN, 0.0f));
  std::shared_ptr<DataChannel> channel = Open();
  ASSERT_NE(channel, nullptr);
  Answer ok = CallAndWait(channel.get(), FrameKind::kPull, PullOfW(0, 0), absl::Seconds(30));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_TRUE(cluster_->ServerAlive(0)) << cluster_->ServerExitDescription(0);
}

}  // namespace
}  // namespace psrt
