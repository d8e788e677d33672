// The job's decisions (server/job.h) without gRPC's transport or
// processes: the RPCs' work called directly, time on a fake clock, Tick
// advancing the job as the monitor thread would, and the checkpoints and
// the servers' answers faked.
#include "server/job.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/distribution.h"
#include "common/metrics.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

constexpr JobPhase kPhases[] = {
    JobPhase::kStarting,           JobPhase::kRunning,
    JobPhase::kPausingCheckpoints, JobPhase::kCheckpointsPaused,
    JobPhase::kRecovering,         JobPhase::kFinishing,
    JobPhase::kFinalSaved,         JobPhase::kStopping,
    JobPhase::kSucceeded,          JobPhase::kFailed,
};

// Every pair of phases: the transitions the job makes, and no other.
TEST(JobPhaseTest, OnlyTheListedTransitionsAreAllowed) {
  using P = JobPhase;
  const std::set<std::pair<P, P>> allowed = {
      {P::kStarting, P::kRunning},
      {P::kStarting, P::kRecovering},
      {P::kStarting, P::kFinishing},
      {P::kStarting, P::kSucceeded},
      {P::kRunning, P::kPausingCheckpoints},
      {P::kRunning, P::kCheckpointsPaused},
      {P::kRunning, P::kRecovering},
      {P::kRunning, P::kStopping},
      {P::kRunning, P::kFinishing},
      {P::kRunning, P::kSucceeded},
      {P::kPausingCheckpoints, P::kCheckpointsPaused},
      {P::kPausingCheckpoints, P::kRecovering},
      {P::kPausingCheckpoints, P::kStopping},
      {P::kPausingCheckpoints, P::kFinishing},
      {P::kCheckpointsPaused, P::kRunning},
      {P::kCheckpointsPaused, P::kRecovering},
      {P::kCheckpointsPaused, P::kStopping},
      {P::kCheckpointsPaused, P::kFinishing},
      {P::kCheckpointsPaused, P::kSucceeded},
      {P::kRecovering, P::kStarting},
      {P::kStopping, P::kFinishing},
      {P::kFinishing, P::kFinalSaved},
      {P::kFinalSaved, P::kSucceeded},
  };
  for (P from : kPhases) {
    for (P to : kPhases) {
      const bool ends = to == P::kFailed && from != P::kSucceeded && from != P::kFailed;
      const bool expected = ends || allowed.count({from, to}) > 0;
      EXPECT_EQ(JobPhaseAllows(from, to), expected)
          << JobPhaseName(from) << " -> " << JobPhaseName(to);
      const absl::Status s = CheckJobTransition(from, to);
      EXPECT_EQ(s.ok(), expected);
      if (!expected) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
        EXPECT_TRUE(absl::StrContains(s.message(), JobPhaseName(from))) << s.message();
        EXPECT_TRUE(absl::StrContains(s.message(), JobPhaseName(to))) << s.message();
      }
    }
  }
}

TEST(JobPhaseTest, OnlyTheEndsAreNotRunning) {
  for (JobPhase p : kPhases) {
    const v1::JobState want = p == JobPhase::kSucceeded ? v1::JOB_SUCCEEDED
                              : p == JobPhase::kFailed  ? v1::JOB_FAILED
                                                        : v1::JOB_RUNNING;
    EXPECT_EQ(JobStateOf(p), want) << JobPhaseName(p);
  }
}

v1::CheckpointResponse Saved(const std::string& uri, int64_t step) {
  v1::CheckpointResponse r;
  r.set_uri(uri);
  r.set_step(step);
  return r;
}

// The checkpoints as the job asks for them: each call logged ("start
// A,B from 10", "abort", ...); SaveNow and Finish answer `answer` at once,
// or once the test lets them go (Hold, Release) or the job cancels them.
class FakeCheckpoints final : public CheckpointControl {
 public:
  void Start(const std::vector<std::string>& servers, int64_t step) override {
    Log(absl::StrCat("start ", absl::StrJoin(servers, ","), " from ", step));
  }
  absl::StatusOr<v1::CheckpointResponse> SaveNow(absl::Time) override {
    Log("save");
    return Answer();
  }
  absl::StatusOr<v1::CheckpointResponse> Finish(const std::vector<std::string>& servers) override {
    Log(absl::StrCat("finish ", absl::StrJoin(servers, ",")));
    return Answer();
  }
  void Abort(absl::Duration) override { Log("abort"); }
  void StopTriggers() override { Log("stop triggers"); }
  void Cancel() override {
    Log("cancel");
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    held_ = false;
  }
  std::optional<v1::CheckpointResponse> LastCommitted() override {
    absl::MutexLock lock(&mu_);
    return last_;
  }
  int64_t saved() const override { return 0; }
  double saved_seconds() const override { return 0; }
  absl::Status WriteRecord(int64_t generation, const std::string& uri, int64_t step,
                           const std::vector<int>&) override {
    Log(absl::StrCat("record ", generation, " ", uri, " ", step));
    return absl::OkStatus();
  }

  // As new, for the next job.
  void Reset() {
    absl::MutexLock lock(&mu_);
    calls_.clear();
    last_.reset();
    held_ = cancelled_ = false;
  }
  void Commit(const std::string& uri, int64_t step) {
    absl::MutexLock lock(&mu_);
    last_ = Saved(uri, step);
  }
  void Hold() {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    held_ = false;
  }
  // Whether a SaveNow or Finish waits for Release.
  bool Waiting() {
    absl::MutexLock lock(&mu_);
    return waiting_ > 0;
  }
  std::vector<std::string> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  bool Called(const std::string& call) {
    const std::vector<std::string> all = calls();
    return std::find(all.begin(), all.end(), call) != all.end();
  }

 private:
  void Log(std::string call) {
    absl::MutexLock lock(&mu_);
    calls_.push_back(std::move(call));
  }
  absl::StatusOr<v1::CheckpointResponse> Answer() {
    absl::MutexLock lock(&mu_);
    ++waiting_;
    auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_; };
    mu_.Await(absl::Condition(&free));
    --waiting_;
    if (cancelled_) return absl::CancelledError("cancelled");
    return Saved("file:///ckpt/step-7", 7);
  }

  absl::Mutex mu_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::CheckpointResponse> last_ ABSL_GUARDED_BY(mu_);
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// Servers that all say they reached `reached` (sync: their keys' version).
class FakeServerCalls final : public ServerCalls {
 public:
  absl::StatusOr<v1::StatsResponse> Stats(const std::string& address, absl::Duration) override {
    asked_.push_back(address);
    v1::StatsResponse s;
    s.set_max_version(reached);
    return s;
  }
  std::atomic<int64_t> reached{0};
  std::vector<std::string> asked_;  // read once the job's thread is done
};

class JobTest : public ::testing::Test {
 protected:
  // A job on `hosts` hosts, one server and one worker each, as `more`
  // (parameter_server keys) says.
  void Start(int hosts, const std::string& more = "") {
    absl::StatusOr<PsOptions> ps = ParseDistribution(absl::StrCat(
        R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":5,"barrier_timeout_s":60)",
        more, "}}"));
    ASSERT_TRUE(ps.ok()) << ps.status();
    job_.reset();  // a test's earlier job, with the fakes it used
    checkpoints_.Reset();
    servers_.asked_.clear();
    CoordinatorOptions o;
    for (int h = 0; h < hosts; ++h) o.hosts.push_back(absl::StrCat("h", h));
    o.ps = *ps;
    o.clock = [this] {
      absl::MutexLock lock(&clock_mu_);
      return now_;
    };
    o.monitor = false;
    if (absl::StrContains(more, R"("checkpoint")")) o.checkpointer = &checkpoints_;
    o.server_calls = &servers_;
    job_ = std::make_unique<Job>(std::move(o), &metrics_);
  }
  // Moves the job's clock while its threads may read it.
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&clock_mu_);
    now_ += d;
  }
  // Whether `done` holds within 10 s (of real time: the job's threads).
  static bool Eventually(const std::function<bool()>& done) {
    for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return done();
  }
  bool EventuallyIn(JobPhase phase) {
    return Eventually([&] { return job_->phase() == phase; });
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
  absl::Status Heartbeat(v1::Role role, int index, int64_t shard_map_epoch = 0,
                         v1::HeartbeatResponse* resp = nullptr) {
    v1::HeartbeatRequest req;
    req.mutable_id()->set_role(role);
    req.mutable_id()->set_index(index);
    req.set_shard_map_epoch(shard_map_epoch);
    v1::HeartbeatResponse ignored;
    return job_->Heartbeat(req, resp != nullptr ? resp : &ignored);
  }
  // `silence` passes in a 2-host job in which every process but server 1
  // heartbeats; then the job's monitor looks.
  void SilenceServer1For(absl::Duration silence) {
    now_ += silence;
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(Heartbeat(v1::ROLE_AGENT, i).ok());
      ASSERT_TRUE(Heartbeat(v1::ROLE_WORKER, i).ok());
    }
    ASSERT_TRUE(Heartbeat(v1::ROLE_SERVER, 0).ok());
    job_->Tick(now_);
  }
  // The epoch of the job's newest shard map.
  int64_t MapEpoch() {
    v1::HeartbeatResponse resp;
    EXPECT_TRUE(Heartbeat(v1::ROLE_SERVER, 0, -1, &resp).ok());
    return resp.shard_map().epoch();
  }
  // A heartbeat from every process of a job of `hosts` hosts and
  // `servers` servers, the servers saying they apply map `epoch`.
  void HeartbeatAll(int hosts, int servers, int64_t epoch) {
    for (int i = 0; i < hosts; ++i) {
      ASSERT_TRUE(Heartbeat(v1::ROLE_AGENT, i).ok());
      ASSERT_TRUE(Heartbeat(v1::ROLE_WORKER, i).ok());
    }
    for (int i = 0; i < servers; ++i) ASSERT_TRUE(Heartbeat(v1::ROLE_SERVER, i, epoch).ok());
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

  absl::Mutex clock_mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);  // set directly where no thread reads it
  Metrics metrics_{"t"};
  FakeCheckpoints checkpoints_;
  FakeServerCalls servers_;
  std::unique_ptr<Job> job_;  // before the fakes it calls go
};

TEST_F(JobTest, AJobWhoseWorkersAllFinishedSucceeds) {
  Start(2);
  EXPECT_EQ(job_->phase(), JobPhase::kStarting);
  RegisterAll(2);
  EXPECT_EQ(job_->phase(), JobPhase::kRunning);  // at the last registration
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 0, 0).ok());
  EXPECT_EQ(Status().state(), v1::JOB_RUNNING);  // worker 1 trains on
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 0).ok());
  const v1::JobStatusResponse s = Status();
  EXPECT_EQ(job_->phase(), JobPhase::kSucceeded);  // no checkpoints: no final one
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
  // Deadlines are on the job's clock.
  const absl::Time later = now_ + absl::Hours(1);
  wait(v1::ROLE_WORKER, 0, later, nullptr);  // not registered: refused at once
  EXPECT_EQ(heard, (std::vector<std::string>{"worker 0: FAILED_PRECONDITION"}));
  ASSERT_TRUE(Register(v1::ROLE_AGENT, 0).ok());
  ASSERT_TRUE(Register(v1::ROLE_SERVER, 0).ok());
  ASSERT_TRUE(Register(v1::ROLE_WORKER, 0).ok());
  wait(v1::ROLE_SERVER, 0, now_ - absl::Seconds(1), nullptr);  // its caller's time is up
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
  ASSERT_NO_FATAL_FAILURE(SilenceServer1For(absl::Seconds(6)));
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

TEST_F(JobTest, EachRoleRegistersByItsOwnRules) {
  Start(2, R"(,"on_worker_failure":"continue")");
  RegisterAll(2);
  const int64_t epoch = Status().membership().epoch();
  v1::RegisterRequest req;
  req.mutable_id()->set_role(v1::ROLE_SERVER);
  v1::RegisterResponse resp;
  // A server says where it listens, and one address is one process's.
  EXPECT_EQ(job_->Register(req, &resp).code(), absl::StatusCode::kInvalidArgument);
  req.set_address("127.0.0.1:2000");
  EXPECT_EQ(job_->Register(req, &resp).code(), absl::StatusCode::kAlreadyExists);
  // A lost worker that comes back takes part again, from a new epoch.
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 1).ok());
  EXPECT_EQ(Status().membership().active_workers_size(), 1);
  EXPECT_EQ(Status().membership().epoch(), epoch + 1);
  ASSERT_TRUE(Register(v1::ROLE_WORKER, 1).ok());
  EXPECT_EQ(Status().membership().active_workers_size(), 2);
  EXPECT_EQ(Status().membership().epoch(), epoch + 2);
  // An agent registers again as often as it likes.
  ASSERT_TRUE(Register(v1::ROLE_AGENT, 1).ok());
  EXPECT_EQ(job_->phase(), JobPhase::kRunning);
}

constexpr char kRecover[] =
    R"(,"on_failure":"recover","max_recoveries":1,"checkpoint":{"uri":"file:///ckpt"})";
constexpr char kCheckpoints[] = R"(,"checkpoint":{"uri":"file:///ckpt"})";

TEST_F(JobTest, ALossWithRecoverRollsBackToTheLastCheckpointAsTheNextGeneration) {
  Start(2, kRecover);
  RegisterAll(2);
  EXPECT_EQ(checkpoints_.calls(),
            (std::vector<std::string>{"record 1  0",  // nothing to return to yet
                                      "start 127.0.0.1:1000,127.0.0.1:1001 from 0"}));
  checkpoints_.Commit("file:///ckpt/step-10", 10);
  servers_.reached = 15;  // the furthest key: 5 steps past the checkpoint
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 3).ok());
  ASSERT_TRUE(EventuallyIn(JobPhase::kStarting));
  v1::JobStatusResponse s = Status();
  EXPECT_EQ(s.state(), v1::JOB_RUNNING);
  EXPECT_EQ(s.recoveries(), 1);
  EXPECT_EQ(s.config().generation(), 2);
  EXPECT_EQ(s.config().restore_uri(), "file:///ckpt/step-10");
  EXPECT_EQ(s.config().restored_step(), 10);
  for (const v1::ProcessStatus& p : s.processes()) {
    if (p.id().role() != v1::ROLE_AGENT) EXPECT_FALSE(p.registered()) << p.name();
  }
  EXPECT_EQ(servers_.asked_, (std::vector<std::string>{"127.0.0.1:1000", "127.0.0.1:1001"}));
  EXPECT_TRUE(checkpoints_.Called("abort"));
  // Written after the recovery, outside the job's lock.
  EXPECT_TRUE(Eventually([&] {
    return checkpoints_.calls().back() == "record 2 file:///ckpt/step-10 10";
  })) << checkpoints_.calls().back();
  EXPECT_EQ(metrics_.GetCounter("recovery_steps_lost_total", "")->value(), 5);
  // The last generation's processes are refused; the next one's start
  // the checkpoints again from the step it went back to.
  v1::RegisterRequest old;
  old.mutable_id()->set_role(v1::ROLE_WORKER);
  old.set_generation(1);
  v1::RegisterResponse resp;
  EXPECT_EQ(job_->Register(old, &resp).code(), absl::StatusCode::kFailedPrecondition);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Register(v1::ROLE_SERVER, i).ok());
    ASSERT_TRUE(Register(v1::ROLE_WORKER, i).ok());
  }
  EXPECT_EQ(job_->phase(), JobPhase::kRunning);
  EXPECT_EQ(checkpoints_.calls().back(), "start 127.0.0.1:1000,127.0.0.1:1001 from 10");
  // max_recoveries is 1: the next loss ends the job.
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 0, 9).ok());
  s = Status();
  EXPECT_EQ(s.state(), v1::JOB_FAILED);
  EXPECT_TRUE(absl::StrContains(s.reason(), "no recovery left (max_recoveries is 1)"))
      << s.reason();
}

TEST_F(JobTest, StopJobWritesAFinalCheckpointThenEndsTheJobSayingWhich) {
  Start(1, kCheckpoints);
  // Before every process is there it has none to write: it ends at once.
  ASSERT_TRUE(Register(v1::ROLE_AGENT, 0).ok());
  job_->StopJob("got signal 15", absl::Seconds(30));
  EXPECT_EQ(job_->phase(), JobPhase::kFailed);
  EXPECT_TRUE(
      absl::StrContains(Status().reason(), "got signal 15; no final checkpoint: not every server"))
      << Status().reason();

  Start(1, kCheckpoints);
  RegisterAll(1);
  job_->StopJob("got signal 15", absl::Seconds(30));
  ASSERT_TRUE(EventuallyIn(JobPhase::kFailed));
  EXPECT_EQ(Status().reason(), "got signal 15; final checkpoint file:///ckpt/step-7 (step 7)");
  const std::vector<std::string> calls = checkpoints_.calls();
  EXPECT_EQ(std::vector<std::string>(calls.end() - 3, calls.end()),
            (std::vector<std::string>{"stop triggers", "save", "cancel"}));
}

TEST_F(JobTest, AFinalCheckpointNotWrittenWithinTheGraceOnTheJobsClockIsCancelled) {
  Start(1, kCheckpoints);
  RegisterAll(1);
  checkpoints_.Commit("file:///ckpt/step-4", 4);
  checkpoints_.Hold();
  job_->StopJob("got signal 15", absl::Seconds(30));
  EXPECT_EQ(job_->phase(), JobPhase::kStopping);
  ASSERT_TRUE(Eventually([&] { return checkpoints_.Waiting(); }));
  Advance(absl::Seconds(29));
  absl::SleepFor(absl::Milliseconds(120));  // more than a slice of the wait
  EXPECT_EQ(job_->phase(), JobPhase::kStopping);
  Advance(absl::Seconds(2));
  ASSERT_TRUE(EventuallyIn(JobPhase::kFailed));
  EXPECT_EQ(Status().reason(),
            "got signal 15; no final checkpoint: not written within 30s; the newest is "
            "file:///ckpt/step-4 (step 4)");

  // Asked again meanwhile, it ends the job at once.
  Start(1, kCheckpoints);
  RegisterAll(1);
  checkpoints_.Hold();
  job_->StopJob("got signal 15", absl::Seconds(30));
  job_->StopJob("got signal 2", absl::Seconds(30));
  EXPECT_EQ(job_->phase(), JobPhase::kFailed);
  EXPECT_TRUE(absl::StrContains(Status().reason(),
                                "got signal 2 again, before the final checkpoint was written"))
      << Status().reason();
}

TEST_F(JobTest, WhenEveryWorkerFinishedItsFinalCheckpointComesBeforeSuccess) {
  Start(2, kCheckpoints);
  RegisterAll(2);
  checkpoints_.Hold();
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 0, 0).ok());
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 0).ok());
  EXPECT_EQ(job_->phase(), JobPhase::kFinishing);
  EXPECT_EQ(Status().state(), v1::JOB_RUNNING);  // nobody hears of the end before it is saved
  ASSERT_TRUE(Eventually([&] { return checkpoints_.Waiting(); }));
  EXPECT_EQ(checkpoints_.calls().back(), "finish 127.0.0.1:1000,127.0.0.1:1001");
  // Neither a stop nor a checkpoint on demand comes in between.
  job_->StopJob("got signal 15", absl::Seconds(30));
  EXPECT_EQ(job_->phase(), JobPhase::kFinishing);
  v1::CheckpointResponse resp;
  EXPECT_EQ(job_->Checkpoint(now_ + absl::Minutes(1), &resp).code(),
            absl::StatusCode::kFailedPrecondition);
  checkpoints_.Release();
  ASSERT_TRUE(EventuallyIn(JobPhase::kSucceeded));
  EXPECT_EQ(Status().reason(), "every worker finished");
}

TEST_F(JobTest, ACheckpointOnDemandWaitsForEveryProcess) {
  Start(1);
  v1::CheckpointResponse resp;
  EXPECT_EQ(job_->Checkpoint(now_ + absl::Minutes(1), &resp).code(),
            absl::StatusCode::kFailedPrecondition);  // no checkpoint.uri

  Start(1, kCheckpoints);
  ASSERT_TRUE(Register(v1::ROLE_AGENT, 0).ok());
  ASSERT_TRUE(Register(v1::ROLE_SERVER, 0).ok());
  const absl::Status early = job_->Checkpoint(now_ + absl::Minutes(1), &resp);
  EXPECT_EQ(early.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(early.message(), "worker 0 on h0")) << early.message();
  EXPECT_FALSE(checkpoints_.Called("save"));
  ASSERT_TRUE(Register(v1::ROLE_WORKER, 0).ok());
  ASSERT_TRUE(job_->Checkpoint(now_ + absl::Minutes(1), &resp).ok());
  EXPECT_EQ(resp.uri(), "file:///ckpt/step-7");
  EXPECT_EQ(checkpoints_.calls(),
            (std::vector<std::string>{"record 1  0", "start 127.0.0.1:1000 from 0", "save"}));
}

TEST_F(JobTest, AFailoverStartsTheCheckpointsAgainWithTheServersLeft) {
  Start(2, R"(,"replicas":1,"checkpoint":{"uri":"file:///ckpt"})");
  RegisterAll(2);
  checkpoints_.Commit("file:///ckpt/step-6", 6);
  ASSERT_NO_FATAL_FAILURE(SilenceServer1For(absl::Seconds(6)));
  EXPECT_EQ(Status().failovers(), 1);
  EXPECT_EQ(job_->phase(), JobPhase::kRunning);
  // The checkpoint being written ends first (on the failover's thread).
  ASSERT_TRUE(Eventually([&] {
    return checkpoints_.calls().back() == "start 127.0.0.1:1000 from 6";
  })) << checkpoints_.calls().back();
  EXPECT_TRUE(checkpoints_.Called("abort"));
}

constexpr char kJoins[] = R"(,"max_servers":3,"checkpoint":{"uri":"file:///ckpt"})";

TEST_F(JobTest, AJoiningServersKeysMoveWithTheCheckpointsPausedMeanwhile) {
  Start(2, kJoins);
  RegisterAll(2);
  servers_.reached = 20;
  v1::RegisterRequest req;
  req.mutable_id()->set_role(v1::ROLE_SERVER);
  req.mutable_id()->set_index(2);
  req.set_host("h2");
  req.set_address("127.0.0.1:1002");
  v1::RegisterResponse joined;
  ASSERT_TRUE(job_->Register(req, &joined).ok());
  EXPECT_TRUE(joined.spare());  // it starts empty
  std::set<JobPhase> seen;
  for (int round = 0; round < 50 && Status().moves() == 0; ++round) {
    HeartbeatAll(2, 3, MapEpoch());  // the servers apply the newest map
    job_->Tick(now_);
    seen.insert(job_->phase());
    if (job_->phase() == JobPhase::kCheckpointsPaused) {
      v1::CheckpointResponse resp;
      EXPECT_EQ(job_->Checkpoint(now_ + absl::Minutes(1), &resp).code(),
                absl::StatusCode::kUnavailable);
    }
    absl::SleepFor(absl::Milliseconds(1));  // the pause's thread
  }
  const v1::JobStatusResponse s = Status();
  EXPECT_EQ(s.served_by(2), 2);
  EXPECT_EQ(s.moves(), 1);
  EXPECT_TRUE(seen.count(JobPhase::kCheckpointsPaused)) << "never paused";
  EXPECT_EQ(job_->phase(), JobPhase::kRunning);
  EXPECT_TRUE(checkpoints_.Called("abort"));
  // Again with the servers there are, from a step no key has reached.
  ASSERT_TRUE(Eventually([&] {
    return checkpoints_.calls().back() ==
           "start 127.0.0.1:1000,127.0.0.1:1001,127.0.0.1:1002 from 20";
  })) << checkpoints_.calls().back();
}

TEST_F(JobTest, AMoveWhoseCopyIsNotBuiltInTimeOnTheJobsClockIsGivenUp) {
  Start(2, kJoins);
  RegisterAll(2);
  v1::RegisterRequest req;
  req.mutable_id()->set_role(v1::ROLE_SERVER);
  req.mutable_id()->set_index(2);
  req.set_host("h2");
  req.set_address("127.0.0.1:1002");
  v1::RegisterResponse joined;
  ASSERT_TRUE(job_->Register(req, &joined).ok());
  const int from = Status().served_by(2);
  ASSERT_TRUE(Eventually([&] {
    job_->Tick(now_);
    return job_->phase() == JobPhase::kCheckpointsPaused;
  }));
  // The servers keep up their heartbeats but never apply the new map: the
  // copy is never built.
  for (int second = 0; second < 62; ++second) {
    Advance(absl::Seconds(1));
    HeartbeatAll(2, 3, 0);
    job_->Tick(now_);
  }
  const v1::JobStatusResponse s = Status();
  EXPECT_EQ(s.state(), v1::JOB_RUNNING) << s.reason();
  EXPECT_EQ(s.served_by(2), from);  // the keys stay where they were
  EXPECT_EQ(s.moves(), 0);
  EXPECT_EQ(job_->phase(), JobPhase::kRunning);
  ASSERT_TRUE(Eventually([&] { return absl::StartsWith(checkpoints_.calls().back(), "start "); }));
}

TEST_F(JobTest, WaitForEndWaitsForTheWatchersReadOrItsGraceOnTheJobsClock) {
  Start(1);
  RegisterAll(1);
  Status();  // psrt-run watches
  job_->Fail("told to");
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    EXPECT_EQ(job_->WaitForEnd(), v1::JOB_FAILED);
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(120));
  EXPECT_FALSE(done);         // nobody heard yet, and no time passed
  Advance(absl::Seconds(6));  // past the grace (5 s here)
  waiter.join();
  EXPECT_TRUE(done);
}

}  // namespace
}  // namespace psrt
