// coordinator_load: one real psrt-coordinator against the processes of a job
// of N hosts (an agent, a server and a training process each: 3N processes),
// played by this program over gRPC, for each N of --hosts:
//
//   start-up    every process registers, and servers and training processes
//               wait in the readiness barrier, as they do at a job's start;
//   heartbeats  each process heartbeats at the job's interval, staggered,
//               for --seconds (servers report the membership epoch they
//               hold, as psrt-server does);
//   epoch       one training process fails (on_worker_failure "continue"):
//               the time until every server heartbeats the new epoch;
//   end         every other training process reports its exit, and the
//               time until the coordinator says the job succeeded.
//
// Reported per N: Register and barrier latency percentiles, heartbeat
// latency percentiles, late heartbeats (answered after the next was due)
// and whether the coordinator declared anyone lost, the coordinator's CPU
// (cores busy) and resident memory over the heartbeat phase, and the epoch
// and end times. Checkpoint rounds are not played: they need servers that
// save shards.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmarks/bench_util.h"
#include "common/flags.h"
#include "common/grpc_util.h"
#include "common/process.h"
#include "psrt/v1/coordinator.grpc.pb.h"

namespace psrt {
namespace {

constexpr char kProgram[] = "coordinator_load";
constexpr char kToken[] = "coordinator-load";
constexpr int kMaxInFlight = 512;  // registrations and exits at once

// Latencies of one kind of call, in microseconds.
class Latencies {
 public:
  void Add(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    us_.push_back(absl::ToDoubleMicroseconds(d));
  }
  nlohmann::json Summary() {
    absl::MutexLock lock(&mu_);
    std::sort(us_.begin(), us_.end());
    auto at = [&](double q) { return us_.empty() ? 0 : us_[static_cast<size_t>(q * (us_.size() - 1))]; };
    return {{"count", us_.size()}, {"p50_us", at(0.5)}, {"p99_us", at(0.99)}, {"max_us", at(1)}};
  }

 private:
  absl::Mutex mu_;
  std::vector<double> us_ ABSL_GUARDED_BY(mu_);
};

// Counts calls in flight, to bound them and to wait for them.
class InFlight {
 public:
  // Waits while `limit` calls are in flight.
  void Begin(int limit = 1 << 30) {
    absl::MutexLock lock(&mu_);
    while (n_ >= limit) changed_.Wait(&mu_);
    ++n_;
  }
  void End() {
    absl::MutexLock lock(&mu_);
    --n_;
    changed_.SignalAll();
  }
  // False when calls are still in flight after `timeout`.
  bool Drain(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    while (n_ > 0) {
      if (changed_.WaitWithDeadline(&mu_, deadline)) return n_ == 0;
    }
    return true;
  }

 private:
  absl::Mutex mu_;
  absl::CondVar changed_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

// One asynchronous call: what it sends and gets, and when it started.
template <typename Request, typename Response>
struct Call {
  explicit Call(absl::Duration timeout) { PrepareContext(&ctx, kToken, timeout); }
  grpc::ClientContext ctx;
  Request req;
  Response resp;
  absl::Time start = absl::Now();
};

v1::ProcessId Id(v1::Role role, int index) {
  v1::ProcessId id;
  id.set_role(role);
  id.set_index(index);
  return id;
}

// CPU seconds (user + system) and resident bytes of `pid`.
std::pair<double, int64_t> Usage(pid_t pid) {
  std::istringstream stat(ReadFile(absl::StrCat("/proc/", pid, "/stat")));
  std::string field;
  double ticks = 0;
  for (int i = 1; i <= 15 && stat >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::atof(field.c_str());
  }
  int64_t rss = 0;
  std::istringstream status(ReadFile(absl::StrCat("/proc/", pid, "/status")));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::atoll(line.c_str() + 6) * 1024;
  }
  return {ticks / sysconf(_SC_CLK_TCK), rss};
}

struct Settings {
  double seconds = 10;
  double heartbeat_timeout_s = 10;  // the job's default
  int timeout_s = 300;
};

// One coordinator, one N.
class Run {
 public:
  Run(int hosts, const Settings& settings)
      : hosts_(hosts),
        settings_(settings),
        interval_(absl::Seconds(std::clamp(settings.heartbeat_timeout_s / 5, 0.05, 1.0))),
        registered_(3 * hosts, false),
        epoch_held_(3 * hosts, 0),
        shard_map_held_(3 * hosts, 0) {}
  ~Run() {
    stop_driver_ = true;
    if (driver_.joinable()) driver_.join();
    beating_.Drain(absl::Seconds(30));
    if (pid_ > 0) Terminate({pid_}, absl::Seconds(5));
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  absl::StatusOr<nlohmann::json> Go() {
    if (absl::Status s = StartCoordinator(); !s.ok()) return s;
    driver_ = std::thread([this] { Drive(); });
    nlohmann::json out = {{"hosts", hosts_}, {"processes", 3 * hosts_}};
    if (absl::Status s = StartUp(&out); !s.ok()) return s;
    if (absl::Status s = Heartbeats(&out); !s.ok()) return s;
    if (absl::Status s = End(&out); !s.ok()) return s;
    return out;
  }

 private:
  absl::Status StartCoordinator() {
    char dir[] = "/tmp/psrt-coordinator-load-XXXXXX";
    if (mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp failed");
    dir_ = dir;
    std::vector<std::string> names;
    for (int h = 0; h < hosts_; ++h) names.push_back(absl::StrCat("load-host-", h));
    const std::string distribution = absl::StrCat(
        R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":)", settings_.heartbeat_timeout_s,
        R"(,"barrier_timeout_s":)", settings_.timeout_s, R"(,"on_worker_failure":"continue"}})");
    const std::string port_file = dir_ + "/port";
    // Its log (a line per registration) goes to a file; the shell execs it,
    // so the pid is the coordinator's.
    absl::StatusOr<pid_t> pid = Spawn(
        {"/bin/sh", "-c",
         absl::StrCat("exec \"$0\" \"$@\" 2>", dir_, "/coordinator.log"),
         SelfDirectory() + "/psrt-coordinator", "--bind=127.0.0.1", "--port=0",
         "--port-file=" + port_file, "--metrics-port=-1", absl::StrCat("--token=", kToken),
         "--hosts=" + absl::StrJoin(names, ","), "--distribution=" + distribution},
        {});
    if (!pid.ok()) return pid.status();
    pid_ = *pid;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    int port = 0;
    while (absl::Now() < deadline && !absl::SimpleAtoi(ReadFile(port_file), &port)) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (port == 0) return absl::DeadlineExceededError("psrt-coordinator wrote no port within 30 s");
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Coordinator::NewStub(channel);
    generic_ = std::make_unique<grpc::GenericStub>(channel);
    return absl::OkStatus();
  }

  // Every process registers; servers and training processes then wait in
  // the barrier, which ends when the last of them registered.
  absl::Status StartUp(nlohmann::json* out) {
    Latencies reg, barrier;
    InFlight registering, waiting;
    std::atomic<int> failed{0};
    std::string error;
    absl::Mutex error_mu;
    auto fail = [&](const grpc::Status& s, const std::string& what) {
      if (failed.fetch_add(1) == 0) {
        absl::MutexLock lock(&error_mu);
        error = absl::StrCat(what, ": ", s.error_message());
      }
    };
    const absl::Time start = absl::Now();
    std::atomic<int64_t> last_registered_ns{0};
    for (v1::Role role : {v1::ROLE_AGENT, v1::ROLE_SERVER, v1::ROLE_WORKER}) {
      for (int h = 0; h < hosts_ && failed == 0; ++h) {
        registering.Begin(kMaxInFlight);
        auto* c = new Call<v1::RegisterRequest, v1::RegisterResponse>(
            absl::Seconds(settings_.timeout_s));
        *c->req.mutable_id() = Id(role, h);
        c->req.set_host(absl::StrCat("load-host-", h));
        c->req.set_pid(100000 + h);
        if (role == v1::ROLE_SERVER) c->req.set_address(absl::StrCat("127.0.0.1:", 20000 + h));
        stub_->async()->Register(&c->ctx, &c->req, &c->resp, [&, c, role, h](grpc::Status s) {
          const absl::Time now = absl::Now();
          reg.Add(now - c->start);
          int64_t ns = absl::ToUnixNanos(now);
          for (int64_t was = last_registered_ns.load(); ns > was;) {
            if (last_registered_ns.compare_exchange_weak(was, ns)) break;
          }
          delete c;
          if (s.ok()) {
            absl::MutexLock lock(&hb_mu_);
            registered_[role % 3 * hosts_ + h] = true;  // as RoleOf orders them
          }
          if (!s.ok()) fail(s, absl::StrCat("Register of ", role, "/", h));
          if (s.ok() && role != v1::ROLE_AGENT) Wait(role, h, &waiting, &barrier, fail);
          registering.End();
        });
      }
    }
    if (!registering.Drain(absl::Seconds(settings_.timeout_s))) {
      return absl::DeadlineExceededError("registrations still unanswered");
    }
    if (!waiting.Drain(absl::Seconds(settings_.timeout_s))) {
      return absl::DeadlineExceededError("barriers still unanswered");
    }
    if (failed > 0) return absl::InternalError(error);
    const absl::Time last = absl::FromUnixNanos(last_registered_ns.load());
    (*out)["register"] = reg.Summary();
    (*out)["barrier"] = barrier.Summary();
    absl::MutexLock lock(&mu_);
    (*out)["barrier_after_last_register_s"] = absl::ToDoubleSeconds(barrier_end_ - last);
    (*out)["start_up_s"] = absl::ToDoubleSeconds(barrier_end_ - start);
    (*out)["barrier_answer_bytes"] = barrier_bytes_;
    return absl::OkStatus();
  }

  template <typename Fail>
  void Wait(v1::Role role, int h, InFlight* waiting, Latencies* barrier, Fail& fail) {
    // As bytes: the answers (a shard map each) are counted, not parsed, so
    // that this program's parsing does not take the machine's cores from
    // the coordinator.
    waiting->Begin();
    auto* c = new Call<grpc::ByteBuffer, grpc::ByteBuffer>(absl::Seconds(settings_.timeout_s));
    v1::BarrierRequest req;
    *req.mutable_id() = Id(role, h);
    bool own = false;
    (void)grpc::SerializationTraits<v1::BarrierRequest>::Serialize(req, &c->req, &own);
    generic_->UnaryCall(&c->ctx, "/psrt.v1.Coordinator/Barrier", grpc::StubOptions(), &c->req,
                        &c->resp, [&fail, this, c, role, h, waiting, barrier](grpc::Status s) {
      const absl::Time now = absl::Now();
      barrier->Add(now - c->start);
      {
        absl::MutexLock lock(&mu_);
        barrier_end_ = std::max(barrier_end_, now);
        barrier_bytes_ = std::max<int64_t>(barrier_bytes_, c->resp.Length());
      }
      delete c;
      if (!s.ok()) fail(s, absl::StrCat("Barrier of ", role, "/", h));
      waiting->End();
    });
  }

  // Process i of the 3N: agents, then servers, then training processes.
  v1::Role RoleOf(int i) const {
    return i < hosts_ ? v1::ROLE_AGENT : i < 2 * hosts_ ? v1::ROLE_SERVER : v1::ROLE_WORKER;
  }

  // Heartbeats each registered process at the job's interval (the first
  // at a random point of its first interval), as CoordinatorLink does: with
  // the membership and shard map epochs it holds. Runs from the first
  // registration to the end; counted only while measuring_.
  void Drive() {
    const int n = 3 * hosts_;
    std::vector<absl::Time> due(n, absl::InfiniteFuture());
    std::vector<bool> started(n, false);
    std::mt19937 rng(1);
    const int64_t interval_ns = absl::ToInt64Nanoseconds(interval_);
    while (!stop_driver_.load()) {
      const absl::Time now = absl::Now();
      std::vector<int> send;
      {
        absl::MutexLock lock(&hb_mu_);
        for (int i = 0; i < n; ++i) {
          if (!started[i] && registered_[i]) {
            started[i] = true;
            due[i] = now + absl::Nanoseconds(std::uniform_int_distribution<int64_t>(0, interval_ns)(rng));
          }
          if (due[i] > now) continue;
          if (i == silent_) {
            due[i] = absl::InfiniteFuture();
            continue;
          }
          due[i] = std::max(due[i] + interval_, now);
          send.push_back(i);
        }
      }
      for (int i : send) Beat(i);
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  void Beat(int i) {
    auto* c = new Call<v1::HeartbeatRequest, v1::HeartbeatResponse>(
        std::max(interval_, absl::Seconds(1)));
    const v1::Role role = RoleOf(i);
    *c->req.mutable_id() = Id(role, i % hosts_);
    if (role == v1::ROLE_WORKER) c->req.set_step(1);
    {
      absl::MutexLock lock(&hb_mu_);
      c->req.set_membership_epoch(epoch_held_[i]);
      c->req.set_shard_map_epoch(shard_map_held_[i]);
    }
    beating_.Begin();
    stub_->async()->Heartbeat(&c->ctx, &c->req, &c->resp, [this, c, i, role](grpc::Status s) {
      const absl::Time done = absl::Now();
      if (measuring_.load()) {
        beats_.Add(done - c->start);
        if (done - c->start > interval_) late_.fetch_add(1);
        if (!s.ok() || c->resp.state() != v1::JOB_RUNNING) errors_.fetch_add(1);
      }
      if (s.ok()) {
        absl::MutexLock lock(&hb_mu_);
        if (c->resp.has_shard_map()) shard_map_held_[i] = c->resp.shard_map().epoch();
        if (c->resp.has_membership() && c->resp.membership().epoch() != epoch_held_[i]) {
          epoch_held_[i] = c->resp.membership().epoch();
          if (role == v1::ROLE_SERVER && epoch_held_[i] == watched_epoch_ &&
              ++servers_on_watched_ == hosts_) {
            all_servers_on_watched_ = done;
          }
        }
      }
      delete c;
      beating_.End();
    });
  }

  // --seconds of heartbeats from every process; halfway, a training process
  // fails and the servers take the new epoch.
  absl::Status Heartbeats(nlohmann::json* out) {
    const auto [cpu0, rss0] = Usage(pid_);
    measuring_ = true;
    absl::SleepFor(absl::Seconds(settings_.seconds / 2));
    const int failing = 3 * hosts_ - 1;  // the last host's training process
    {
      absl::MutexLock lock(&hb_mu_);
      silent_ = failing;
      watched_epoch_ = epoch_held_[hosts_] + 1;  // server 0's, plus one
    }
    const absl::Time failed_at = absl::Now();
    grpc::ClientContext ctx;
    PrepareContext(&ctx, kToken, absl::Seconds(30));
    v1::ReportExitRequest req;
    *req.mutable_id() = Id(v1::ROLE_WORKER, hosts_ - 1);
    req.set_exit_code(1);
    req.set_message("coordinator_load: this process fails on purpose");
    v1::ReportExitResponse resp;
    if (grpc::Status s = stub_->ReportExit(&ctx, req, &resp); !s.ok()) {
      return absl::InternalError(absl::StrCat("ReportExit: ", s.error_message()));
    }
    absl::SleepFor(absl::Seconds(settings_.seconds / 2));
    measuring_ = false;
    const auto [cpu1, rss1] = Usage(pid_);
    (*out)["heartbeat"] = beats_.Summary();
    (*out)["heartbeat_interval_s"] = absl::ToDoubleSeconds(interval_);
    (*out)["heartbeats_late"] = late_.load();
    (*out)["heartbeat_errors"] = errors_.load();
    (*out)["coordinator_cores_busy"] = (cpu1 - cpu0) / settings_.seconds;
    (*out)["coordinator_rss_bytes"] = std::max(rss0, rss1);
    absl::MutexLock lock(&hb_mu_);
    (*out)["epoch_to_every_server_s"] = all_servers_on_watched_ == absl::InfiniteFuture()
                                            ? -1.0
                                            : absl::ToDoubleSeconds(all_servers_on_watched_ - failed_at);
    return absl::OkStatus();
  }

  // The other training processes report their exits; the job succeeds.
  absl::Status End(nlohmann::json* out) {
    const absl::Time start = absl::Now();
    InFlight inflight;
    std::atomic<int> errors{0};
    for (int h = 0; h + 1 < hosts_; ++h) {
      inflight.Begin(kMaxInFlight);
      auto* c = new Call<v1::ReportExitRequest, v1::ReportExitResponse>(absl::Seconds(30));
      *c->req.mutable_id() = Id(v1::ROLE_WORKER, h);
      stub_->async()->ReportExit(&c->ctx, &c->req, &c->resp, [&, c](grpc::Status s) {
        if (!s.ok()) errors.fetch_add(1);
        delete c;
        inflight.End();
      });
    }
    if (!inflight.Drain(absl::Seconds(60)) || errors > 0) {
      return absl::InternalError("exit reports failed or went unanswered");
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      grpc::ClientContext ctx;
      PrepareContext(&ctx, kToken, absl::Seconds(10));
      v1::JobStatusResponse status;
      grpc::Status s = stub_->GetJobStatus(&ctx, v1::JobStatusRequest(), &status);
      if (s.ok() && status.state() == v1::JOB_SUCCEEDED) {
        (*out)["end_s"] = absl::ToDoubleSeconds(absl::Now() - start);
        return absl::OkStatus();
      }
      if (s.ok() && status.state() == v1::JOB_FAILED) {
        return absl::InternalError(absl::StrCat("the job failed: ", status.reason()));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError("the job did not succeed within 60 s of the exits");
  }

  const int hosts_;
  const Settings settings_;
  std::string dir_;
  pid_t pid_ = 0;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<grpc::GenericStub> generic_;
  const absl::Duration interval_;
  absl::Mutex mu_;
  absl::Time barrier_end_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t barrier_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // one barrier's answer
  // The heartbeats (Drive).
  std::thread driver_;
  std::atomic<bool> stop_driver_{false}, measuring_{false};
  InFlight beating_;
  Latencies beats_;
  std::atomic<int> late_{0}, errors_{0};
  absl::Mutex hb_mu_;
  std::vector<bool> registered_ ABSL_GUARDED_BY(hb_mu_);
  std::vector<int64_t> epoch_held_ ABSL_GUARDED_BY(hb_mu_), shard_map_held_ ABSL_GUARDED_BY(hb_mu_);
  int silent_ ABSL_GUARDED_BY(hb_mu_) = -1;  // the process that failed
  int64_t watched_epoch_ ABSL_GUARDED_BY(hb_mu_) = -1;
  int servers_on_watched_ ABSL_GUARDED_BY(hb_mu_) = 0;
  absl::Time all_servers_on_watched_ ABSL_GUARDED_BY(hb_mu_) = absl::InfiniteFuture();
};

int Main(int argc, char** argv) {
  Settings settings;
  std::string hosts = "64,256,1024,2048,4096", json_path;
  Flags flags(kProgram, "[--hosts=64,256,1024,2048,4096] [--seconds=10] [--json=PATH]");
  flags.Add("hosts", &hosts, "Comma-separated host counts N (each: an agent, a server, a worker).");
  flags.Add("seconds", &settings.seconds, "Seconds of heartbeats per N.");
  flags.Add("heartbeat-timeout", &settings.heartbeat_timeout_s,
            "The job's heartbeat_timeout_s (the interval is a fifth of it, at most 1 s); "
            "10 is the job's default.");
  flags.Add("timeout", &settings.timeout_s, "Give up on a start-up after this many seconds.");
  flags.Add("json", &json_path, "Write the results as JSON here.");
  flags.ParseOrExit(argc, argv);
  absl::StatusOr<std::vector<int>> counts = ParseCounts(hosts, 2, 16384);
  if (!counts.ok()) {
    std::fprintf(stderr, "%s: --hosts: %s\n", kProgram, std::string(counts.status().message()).c_str());
    return 2;
  }
  if (counts->empty() || settings.seconds < 2 || settings.heartbeat_timeout_s <= 0 ||
      settings.timeout_s < 1) {
    std::fprintf(stderr, "%s: need --hosts, --seconds >= 2, --heartbeat-timeout > 0, --timeout >= 1\n",
                 kProgram);
    return 2;
  }
  std::printf("%s: one psrt-coordinator, N hosts played (agent, server, worker each); nproc %ld, load %s\n",
              kProgram, sysconf(_SC_NPROCESSORS_ONLN), LoadAverage().c_str());
  std::printf("%6s %9s %12s %12s %12s %12s %12s %6s %6s %9s %8s %8s\n", "hosts", "start s",
              "barrier p99", "hb p50 ms", "hb p99 ms", "hb max ms", "beats/s", "late", "errors",
              "cores", "RSS MiB", "epoch s");
  nlohmann::json results = nlohmann::json::array();
  for (int n : *counts) {
    Run run(n, settings);
    absl::StatusOr<nlohmann::json> r = run.Go();
    if (!r.ok()) {
      // The size past which this coordinator (on this machine) cannot go:
      // said, and the scan goes on.
      std::printf("%6d  failed: %s\n", n, std::string(r.status().message()).c_str());
      std::fflush(stdout);
      results.push_back({{"hosts", n}, {"failed", std::string(r.status().message())}});
      continue;
    }
    const nlohmann::json& j = *r;
    std::printf("%6d %9.2f %10.1fms %12.2f %12.2f %12.2f %12.0f %6d %6d %9.2f %8.1f %8.2f\n", n,
                j["start_up_s"].get<double>(), j["barrier"]["p99_us"].get<double>() / 1e3,
                j["heartbeat"]["p50_us"].get<double>() / 1e3,
                j["heartbeat"]["p99_us"].get<double>() / 1e3,
                j["heartbeat"]["max_us"].get<double>() / 1e3,
                j["heartbeat"]["count"].get<double>() / settings.seconds,
                j["heartbeats_late"].get<int>(), j["heartbeat_errors"].get<int>(),
                j["coordinator_cores_busy"].get<double>(),
                j["coordinator_rss_bytes"].get<double>() / (1 << 20),
                j["epoch_to_every_server_s"].get<double>());
    std::fflush(stdout);
    results.push_back(j);
  }
  std::printf("late: heartbeats answered after the next was due; errors: refused, or the job not running\n");
  if (!json_path.empty()) {
    std::ofstream(json_path) << nlohmann::json({{"benchmark", kProgram},
                                                {"date", absl::FormatTime(absl::RFC3339_sec, absl::Now(),
                                                                          absl::UTCTimeZone())},
                                                {"nproc", sysconf(_SC_NPROCESSORS_ONLN)},
                                                {"heartbeat_timeout_s", settings.heartbeat_timeout_s},
                                                {"results", results}})
                                    .dump(2)
                             << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace psrt

int main(int argc, char** argv) { return psrt::Main(argc, argv); }
