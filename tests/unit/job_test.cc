// The job's decisions (server/job.h) without gRPC's transport or
// processes: the RPCs' work called directly, time on a fake clock, and Tick
// advancing the job as the monitor thread would.
#include "server/job.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/distribution.h"
#include "common/metrics.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

class JobTest : public ::testing::Test {
 protected:
  // A job on `hosts` hosts, one server and one worker each, as `more`
  // (parameter_server keys) says.
  void Start(int hosts, const std::string& more = "") {
    absl::StatusOr<PsOptions> ps = ParseDistribution(absl::StrCat(
        R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":5,"barrier_timeout_s":60)",
        more, "}}"));
    ASSERT_TRUE(ps.ok()) << ps.status();
    CoordinatorOptions o;
    for (int h = 0; h < hosts; ++h) o.hosts.push_back(absl::StrCat("h", h));
    o.ps = *ps;
    o.clock = [this] { return now_; };
    o.monitor = false;
    job_ = std::make_unique<Job>(std::move(o), &metrics_);
  }

  absl::Status Register(v1::Role role, int index, v1::RegisterResponse* resp = nullptr) {
    v1::RegisterRequest req;
    req.mutable_id()->set_role(role);
    req.mutable_id()->set_index(index);
    req.set_host(absl::StrCat("h", index));
    if (role == v1::ROLE_SERVER) req.set_address(absl::StrCat("127.0.0.1:", 1000 + index));
    req.set_pid(100 + index);
    v1::RegisterResponse ignored;
    return job_->Register(req, resp != nullptr ? resp : &ignored);
  }
  // Every process of a job of `hosts` hosts.
  void RegisterAll(int hosts) {
    for (int i = 0; i < hosts; ++i) {
      ASSERT_TRUE(Register(v1::ROLE_AGENT, i).ok());
      ASSERT_TRUE(Register(v1::ROLE_SERVER, i).ok());
      ASSERT_TRUE(Register(v1::ROLE_WORKER, i).ok());
    }
  }
  absl::Status Heartbeat(v1::Role role, int index, int64_t shard_map_epoch = 0) {
    v1::HeartbeatRequest req;
    req.mutable_id()->set_role(role);
    req.mutable_id()->set_index(index);
    req.set_shard_map_epoch(shard_map_epoch);
    v1::HeartbeatResponse resp;
    return job_->Heartbeat(req, &resp);
  }
  absl::Status Exit(v1::Role role, int index, int code) {
    v1::ReportExitRequest req;
    req.mutable_id()->set_role(role);
    req.mutable_id()->set_index(index);
    req.set_exit_code(code);
    return job_->ReportExit(req);
  }
  v1::JobStatusResponse Status() {
    v1::JobStatusResponse resp;
    EXPECT_TRUE(job_->GetStatus(&resp).ok());
    return resp;
  }
  // Ticks at now_; the job has failed, its reason saying `why`.
  void ExpectFailsAtTick(const std::string& why) {
    job_->Tick(now_);
    const v1::JobStatusResponse s = Status();
    EXPECT_EQ(s.state(), v1::JOB_FAILED);
    EXPECT_TRUE(absl::StrContains(s.reason(), why)) << s.reason();
  }

  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  Metrics metrics_{"t"};
  std::unique_ptr<Job> job_;
};

TEST_F(JobTest, AJobWhoseWorkersAllFinishedSucceeds) {
  Start(2);
  RegisterAll(2);
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 0, 0).ok());
  EXPECT_EQ(Status().state(), v1::JOB_RUNNING);  // worker 1 trains on
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 0).ok());
  const v1::JobStatusResponse s = Status();
  EXPECT_EQ(s.state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(s.reason(), "every worker finished");
}

TEST_F(JobTest, TheBarrierAnswersEveryoneOnceAllAreThereAndTheOthersAtTheirEnd) {
  Start(2);
  std::vector<std::string> heard;  // "worker 0: CANCELLED", ...
  v1::BarrierResponse passed;
  auto wait = [&](v1::Role role, int index, absl::Time deadline, std::function<bool()> cancelled) {
    v1::BarrierRequest req;
    req.mutable_id()->set_role(role);
    req.mutable_id()->set_index(index);
    const std::string who = absl::StrCat(role == v1::ROLE_WORKER ? "worker " : "server ", index);
    job_->Barrier(req, deadline, std::move(cancelled),
                  [&, who](const absl::Status& s, std::shared_ptr<const std::string> answer) {
                    heard.push_back(absl::StrCat(who, ": ", absl::StatusCodeToString(s.code())));
                    if (answer != nullptr) EXPECT_TRUE(passed.ParseFromString(*answer));
                  });
  };
  const absl::Time later = absl::Now() + absl::Hours(1);
  wait(v1::ROLE_WORKER, 0, later, nullptr);  // not registered: refused at once
  EXPECT_EQ(heard, (std::vector<std::string>{"worker 0: FAILED_PRECONDITION"}));
  ASSERT_TRUE(Register(v1::ROLE_AGENT, 0).ok());
  ASSERT_TRUE(Register(v1::ROLE_SERVER, 0).ok());
  ASSERT_TRUE(Register(v1::ROLE_WORKER, 0).ok());
  wait(v1::ROLE_SERVER, 0, absl::Now() - absl::Seconds(1), nullptr);  // its caller's time is up
  bool gone = false;
  wait(v1::ROLE_WORKER, 0, later, [&] { return gone; });
  wait(v1::ROLE_SERVER, 0, later, nullptr);
  EXPECT_EQ(heard.size(), 2u);
  gone = true;  // heard at the next registration
  ASSERT_TRUE(Register(v1::ROLE_AGENT, 1).ok());
  ASSERT_TRUE(Register(v1::ROLE_SERVER, 1).ok());
  EXPECT_EQ(heard,
            (std::vector<std::string>{"worker 0: FAILED_PRECONDITION",
                                      "server 0: DEADLINE_EXCEEDED", "worker 0: CANCELLED"}));
  EXPECT_EQ(passed.shard_map().server_addresses_size(), 0);
  ASSERT_TRUE(Register(v1::ROLE_WORKER, 1).ok());  // the last one
  EXPECT_EQ(heard.back(), "server 0: OK");
  EXPECT_EQ(passed.shard_map().server_addresses_size(), 2);
  EXPECT_EQ(passed.config().num_workers(), 2);
  EXPECT_EQ(passed.membership().active_workers_size(), 2);
}

TEST_F(JobTest, AWorkerSilentPastItsTimeoutFailsTheJobNamingIt) {
  Start(1);
  RegisterAll(1);
  now_ += absl::Seconds(4);
  ASSERT_TRUE(Heartbeat(v1::ROLE_AGENT, 0).ok());
  ASSERT_TRUE(Heartbeat(v1::ROLE_SERVER, 0).ok());
  job_->Tick(now_);
  EXPECT_EQ(Status().state(), v1::JOB_RUNNING);
  now_ += absl::Seconds(2);  // the worker: 6 s without a heartbeat
  ASSERT_TRUE(Heartbeat(v1::ROLE_AGENT, 0).ok());
  ASSERT_TRUE(Heartbeat(v1::ROLE_SERVER, 0).ok());
  ExpectFailsAtTick("worker 0 on h0 was lost: no heartbeat for 6s");
  // The job's fate is decided: later calls are told so, and change nothing.
  const absl::Status late = Heartbeat(v1::ROLE_SERVER, 0);
  EXPECT_TRUE(late.ok()) << late.message();
  EXPECT_EQ(Exit(v1::ROLE_WORKER, 0, 0).code(), absl::StatusCode::kOk);
  EXPECT_EQ(Status().state(), v1::JOB_FAILED);
}

TEST_F(JobTest, AHostSilentAsAWholeIsOneLossTheHosts) {
  Start(2);
  RegisterAll(2);
  now_ += absl::Seconds(6);  // host 1: nothing at all
  for (v1::Role r : {v1::ROLE_AGENT, v1::ROLE_SERVER, v1::ROLE_WORKER})
    ASSERT_TRUE(Heartbeat(r, 0).ok());
  ExpectFailsAtTick("agent on h1 was lost");
}

TEST_F(JobTest, TheReadinessBarrierFailsTheJobNamingWhoNeverCame) {
  Start(2);
  ASSERT_TRUE(Register(v1::ROLE_AGENT, 0).ok());
  ASSERT_TRUE(Register(v1::ROLE_SERVER, 0).ok());
  ASSERT_TRUE(Register(v1::ROLE_WORKER, 0).ok());
  // Host 0 keeps up its heartbeats; host 1 never comes.
  auto seconds = [&](int n) {
    for (int i = 0; i < n; ++i) {
      now_ += absl::Seconds(1);
      for (v1::Role r : {v1::ROLE_AGENT, v1::ROLE_SERVER, v1::ROLE_WORKER})
        ASSERT_TRUE(Heartbeat(r, 0).ok());
      job_->Tick(now_);
    }
  };
  seconds(59);
  EXPECT_EQ(Status().state(), v1::JOB_RUNNING) << Status().reason();
  seconds(2);
  const v1::JobStatusResponse s = Status();
  EXPECT_EQ(s.state(), v1::JOB_FAILED);
  EXPECT_TRUE(absl::StrContains(s.reason(), "readiness barrier timed out")) << s.reason();
  EXPECT_TRUE(absl::StrContains(s.reason(), "server 1 on h1")) << s.reason();
  EXPECT_TRUE(absl::StrContains(s.reason(), "worker 1 on h1")) << s.reason();
}

TEST_F(JobTest, WithReplicasASilentServersKeysFailOverAndTheJobGoesOn) {
  Start(2, R"(,"replicas":1)");
  RegisterAll(2);
  now_ += absl::Seconds(6);  // server 1 alone is silent
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Heartbeat(v1::ROLE_AGENT, i).ok());
    ASSERT_TRUE(Heartbeat(v1::ROLE_WORKER, i).ok());
  }
  ASSERT_TRUE(Heartbeat(v1::ROLE_SERVER, 0).ok());
  job_->Tick(now_);
  const v1::JobStatusResponse s = Status();
  EXPECT_EQ(s.state(), v1::JOB_RUNNING) << s.reason();
  EXPECT_EQ(s.failovers(), 1);
  ASSERT_EQ(s.served_by_size(), 2);
  EXPECT_EQ(s.served_by(1), 0);
  // Without a copy left, the next loss ends the job.
  now_ += absl::Seconds(6);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Heartbeat(v1::ROLE_AGENT, i).ok());
    ASSERT_TRUE(Heartbeat(v1::ROLE_WORKER, i).ok());
  }
  ExpectFailsAtTick("server 0 on h0 was lost");
}

TEST_F(JobTest, AProcessOfAnotherGenerationOrJobIsRefusedAndChangesNothing) {
  Start(1);
  v1::RegisterRequest req;
  req.mutable_id()->set_role(v1::ROLE_WORKER);
  req.mutable_id()->set_index(0);
  req.set_host("h0");
  req.set_generation(7);
  v1::RegisterResponse resp;
  EXPECT_EQ(job_->Register(req, &resp).code(), absl::StatusCode::kFailedPrecondition);
  req.set_generation(0);
  req.mutable_id()->set_index(3);  // no worker 3
  EXPECT_NE(job_->Register(req, &resp).code(), absl::StatusCode::kOk);
  // A heartbeat before registering is refused.
  EXPECT_EQ(Heartbeat(v1::ROLE_WORKER, 0).code(), absl::StatusCode::kFailedPrecondition);
  const v1::JobStatusResponse s = Status();
  ASSERT_GT(s.processes_size(), 0);
  for (const v1::ProcessStatus& p : s.processes()) EXPECT_FALSE(p.registered()) << p.name();
}

}  // namespace
}  // namespace psrt
