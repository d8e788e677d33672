// coordinator_load: one real psrt-coordinator against the processes of a job
// of N hosts (an agent, a server and a training process each: 3N processes),
// played by this program over gRPC, for each N of --hosts:
//
//   start-up    every process registers, and the training processes wait
//               in the readiness barrier, as they do at a job's start (a
//               server's first heartbeat brings it the shard map instead);
//   heartbeats  each process heartbeats at the job's interval, staggered,
//               for --seconds (servers report the membership epoch they
//               hold, as psrt-server does);
//   epoch       one training process fails (on_worker_failure "continue"):
//               the time until every server heartbeats the new epoch;
//   checkpoints meanwhile, training steps every --step-ms and the job
//               checkpoints every --checkpoint-every steps (sync): the
//               coordinator polls every server's SaveShard as it does in a
//               job, and each played server writes a real one-key shard
//               (tmpfs) once the step is reached;
//   end         every other training process reports its exit, and the
//               time until the coordinator says the job succeeded (after
//               its final checkpoint).
//
// Reported per N: Register and barrier latency percentiles, heartbeat
// latency percentiles, late heartbeats (answered after the next was due)
// and whether the coordinator declared anyone lost, the coordinator's CPU
// (cores busy), resident memory and most threads over the heartbeat phase,
// the checkpoints committed and their mean time, and the epoch and end
// times.
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
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmarks/bench_util.h"
#include "common/flags.h"
#include "common/grpc_util.h"
#include "common/process.h"
#include "psrt/v1/coordinator.grpc.pb.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/shard_format.h"
#include "server/checkpoint/storage.h"

namespace psrt {
namespace {

constexpr char kProgram[] = "coordinator_load";
constexpr char kToken[] = "coordinator-load";
constexpr int kMaxInFlight = 512;  // registrations and exits at once
constexpr int kConnections = 64;   // to the coordinator (Run::StartCoordinator)

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
    auto at = [&](double q) {
      return us_.empty() ? 0 : us_[static_cast<size_t>(q * (us_.size() - 1))];
    };
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

// The servers' side of checkpoints, played: one gRPC server listening on a
// loopback port per played server (each its own address, so that the
// coordinator holds a connection per server, as in a job). Stats says the step training is
// at; SaveShard for a step answers once training reached it (or its wait
// ran out: not done), with a real one-key shard written through the
// checkpoint format and storage, as psrt-server answers.
class PlayedServers final : public v1::ParameterServer::CallbackService {
 public:
  static constexpr int kElements = 16;  // per server's key

  PlayedServers(int servers, std::string root_uri)
      : servers_(servers), root_uri_(std::move(root_uri)) {}
  ~PlayedServers() {
    stop_ = true;
    if (ticker_.joinable()) ticker_.join();
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  }

  // Listens on loopback; training steps every `step` from now on.
  absl::Status Start(absl::Duration step) {
    absl::StatusOr<std::unique_ptr<Storage>> storage = OpenStorage(root_uri_);
    if (!storage.ok()) return storage.status();
    storage_ = *std::move(storage);
    grpc::ServerBuilder builder;
    ports_.resize(servers_);
    for (int& port : ports_)
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || std::count(ports_.begin(), ports_.end(), 0) > 0) {
      return absl::InternalError("played servers: cannot listen");
    }
    ticker_ = std::thread([this, step] {
      absl::Time next = absl::Now() + step;
      while (!stop_.load()) {
        if (absl::Now() >= next) {
          step_.fetch_add(1);
          next += step;
        }
        Sweep(absl::Now());
        absl::SleepFor(absl::Milliseconds(5));
      }
      Sweep(absl::InfiniteFuture());
    });
    return absl::OkStatus();
  }
  std::string address(int server) const { return absl::StrCat("127.0.0.1:", ports_[server]); }
  int64_t shards_written() const { return written_.load(); }

  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const v1::StatsRequest*,
                                  v1::StatsResponse* resp) override {
    resp->set_num_keys(1);
    resp->set_min_version(step_.load());
    resp->set_max_version(step_.load());
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  grpc::ServerUnaryReactor* SaveShard(grpc::CallbackServerContext* ctx,
                                      const v1::SaveShardRequest* req,
                                      v1::SaveShardResponse* resp) override {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    // The coordinator names each server's shard "shard-IIIII-of-NNNNN".
    const size_t at = req->shard_path().rfind("shard-");
    int index = -1;
    if (req->root_uri() != root_uri_ || at == std::string::npos ||
        !absl::SimpleAtoi(req->shard_path().substr(at + 6, 5), &index) || index < 0 ||
        index >= servers_) {
      r->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             "played servers: not a shard of this job"));
      return r;
    }
    if (req->step() < 0 || step_.load() >= req->step()) {
      r->Finish(Write(*req, index, resp));
      return r;
    }
    absl::MutexLock lock(&mu_);
    waiting_.push_back({r, req, resp, index, absl::Now() + absl::Seconds(req->wait_s())});
    return r;
  }

 private:
  struct Waiting {
    grpc::ServerUnaryReactor* reactor;
    const v1::SaveShardRequest* req;
    v1::SaveShardResponse* resp;
    int index;
    absl::Time until;
  };

  // Answers the SaveShards whose step was reached (written) or whose wait
  // ended by `now` (not done).
  void Sweep(absl::Time now) {
    std::vector<Waiting> ready;
    {
      absl::MutexLock lock(&mu_);
      auto keep = std::partition(waiting_.begin(), waiting_.end(), [&](const Waiting& w) {
        return w.req->step() > step_.load() && w.until > now;
      });
      ready.assign(keep, waiting_.end());
      waiting_.erase(keep, waiting_.end());
    }
    for (Waiting& w : ready) {
      if (w.req->step() <= step_.load()) {
        w.reactor->Finish(Write(*w.req, w.index, w.resp));
      } else {
        w.resp->set_done(false);
        w.resp->set_keys_waiting(1);
        w.reactor->Finish(grpc::Status::OK);
      }
    }
  }

  grpc::Status Write(const v1::SaveShardRequest& req, int index, v1::SaveShardResponse* resp) {
    if (req.wait_only()) {  // the step is reached: its one key waits no more
      resp->set_num_keys(1);
      return grpc::Status::OK;
    }
    KeyRecord key;
    key.variable = "load";
    key.partition = static_cast<uint32_t>(index);
    key.offset = int64_t{index} * kElements;
    key.num_elements = kElements;
    key.version = req.step() >= 0 ? req.step() : step_.load();
    key.learning_rate = 0.1;
    key.optimizer = "sgd";
    key.weights.assign(kElements, 0.5f);
    const std::string bytes = EncodeShard({key});
    if (absl::Status s = storage_->Put(req.shard_path(), bytes); !s.ok()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(s.message()));
    }
    written_.fetch_add(1);
    resp->set_done(true);
    v1::ManifestShard* shard = resp->mutable_shard();
    shard->set_path(req.shard_path());
    shard->set_bytes(static_cast<int64_t>(bytes.size()));
    shard->set_crc32c(Crc32c(bytes));
    shard->set_num_records(1);
    v1::ManifestKey* k = resp->add_keys();
    k->set_variable(key.variable);
    k->set_partition(key.partition);
    k->set_offset(key.offset);
    k->set_num_elements(key.num_elements);
    k->set_version(key.version);
    v1::ManifestVariable* v = resp->add_variables();
    v->set_name(key.variable);
    v->add_shape(int64_t{servers_} * kElements);
    v->set_dtype(v1::DTYPE_FLOAT32);
    v->mutable_optimizer()->set_name("sgd");
    v->mutable_optimizer()->set_lr(0.1);
    return grpc::Status::OK;
  }

  const int servers_;
  const std::string root_uri_;
  std::unique_ptr<Storage> storage_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<int> ports_;
  std::atomic<int64_t> step_{0}, written_{0};
  std::atomic<bool> stop_{false};
  std::thread ticker_;
  absl::Mutex mu_;
  std::vector<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
};

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

// The threads `pid` runs now.
int Threads(pid_t pid) {
  std::istringstream status(ReadFile(absl::StrCat("/proc/", pid, "/status")));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return 0;
}

struct Settings {
  double seconds = 10;
  double heartbeat_timeout_s = 10;  // the job's default
  int timeout_s = 300;
  int step_ms = 500;         // a training step
  int checkpoint_every = 2;  // steps; 0: no checkpoints
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
    played_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    if (!checkpoints_.empty()) std::filesystem::remove_all(checkpoints_);
  }

  absl::StatusOr<nlohmann::json> Go() {
    if (absl::Status s = StartCoordinator(); !s.ok()) return s;
    driver_ = std::thread([this] { Drive(); });
    nlohmann::json out = {{"hosts", hosts_}, {"processes", 3 * hosts_}};
    absl::Status s = StartUp(&out);
    if (s.ok()) s = Heartbeats(&out);
    if (s.ok()) s = End(&out);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(s.message(), LastLogLines()));
    return out;
  }

 private:
  absl::Status StartCoordinator() {
    char dir[] = "/tmp/psrt-coordinator-load-XXXXXX";
    if (mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp failed");
    dir_ = dir;
    std::string checkpoint;
    if (settings_.checkpoint_every > 0) {
      // On tmpfs where there is one: the played servers' shards are written
      // on this one machine, and their fsyncs are not the coordinator's cost.
      char root[] = "/dev/shm/psrt-coordinator-load-XXXXXX";
      checkpoints_ = mkdtemp(root) != nullptr ? root : dir_ + "/checkpoints";
      played_ = std::make_unique<PlayedServers>(hosts_, "file://" + checkpoints_);
      if (absl::Status s = played_->Start(absl::Milliseconds(settings_.step_ms)); !s.ok()) return s;
      checkpoint = absl::StrCat(R"(,"checkpoint":{"uri":"file://)", checkpoints_,
                                R"(","every_steps":)", settings_.checkpoint_every, R"(,"keep":2})");
    }
    std::vector<std::string> names;
    for (int h = 0; h < hosts_; ++h) names.push_back(absl::StrCat("load-host-", h));
    const std::string distribution =
        absl::StrCat(R"({"parameter_server":{"enabled":true,"heartbeat_timeout_s":)",
                     settings_.heartbeat_timeout_s, R"(,"barrier_timeout_s":)", settings_.timeout_s,
                     R"(,"on_worker_failure":"continue")", checkpoint, "}}");
    const std::string port_file = dir_ + "/port";
    // Its log (a line per registration) goes to a file; the shell execs it,
    // so the pid is the coordinator's.
    absl::StatusOr<pid_t> pid =
        Spawn({"/bin/sh", "-c", absl::StrCat("exec \"$0\" \"$@\" 2>", dir_, "/coordinator.log"),
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
    // A job's processes each have a connection of their own; the played
    // ones share kConnections, host h's calls going by connection h % it, so
    // that one host's heartbeats do not queue behind all the barrier's
    // answers on one connection.
    for (int c = 0; c < kConnections; ++c) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
          absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args);
      stubs_.push_back(v1::Coordinator::NewStub(channel));
      generic_.push_back(std::make_unique<grpc::GenericStub>(channel));
    }
    return absl::OkStatus();
  }

  // Every process registers; the training processes then wait in the
  // barrier, which ends when the last process registered.
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
        auto* c =
            new Call<v1::RegisterRequest, v1::RegisterResponse>(absl::Seconds(settings_.timeout_s));
        *c->req.mutable_id() = Id(role, h);
        c->req.set_host(absl::StrCat("load-host-", h));
        c->req.set_pid(100000 + h);
        if (role == v1::ROLE_SERVER) {
          c->req.set_address(played_ != nullptr ? played_->address(h)
                                                : absl::StrCat("127.0.0.1:", 20000 + h));
        }
        Stub(h)->async()->Register(&c->ctx, &c->req, &c->resp, [&, c, role, h](grpc::Status s) {
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
          if (s.ok() && role == v1::ROLE_WORKER) Wait(role, h, &waiting, &barrier, fail);
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
    generic_[h % kConnections]->UnaryCall(
        &c->ctx, "/psrt.v1.Coordinator/Barrier", grpc::StubOptions(), &c->req, &c->resp,
        [&fail, this, c, role, h, waiting, barrier](grpc::Status s) {
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
            due[i] = now +
                     absl::Nanoseconds(std::uniform_int_distribution<int64_t>(0, interval_ns)(rng));
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
    Stub(i % hosts_)
        ->async()
        ->Heartbeat(&c->ctx, &c->req, &c->resp, [this, c, i, role](grpc::Status s) {
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
    const absl::StatusOr<v1::JobStatusResponse> status0 = JobStatus();
    if (!status0.ok()) return status0.status();
    measuring_ = true;
    std::atomic<bool> sampling{true};
    std::atomic<int> threads{0};
    std::thread sampler([&] {
      while (sampling.load()) {
        threads = std::max(threads.load(), Threads(pid_));
        absl::SleepFor(absl::Milliseconds(20));
      }
    });
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
    grpc::Status reported = Stub(hosts_ - 1)->ReportExit(&ctx, req, &resp);
    if (reported.ok()) absl::SleepFor(absl::Seconds(settings_.seconds / 2));
    measuring_ = false;
    sampling = false;
    sampler.join();
    if (!reported.ok())
      return absl::InternalError(absl::StrCat("ReportExit: ", reported.error_message()));
    const auto [cpu1, rss1] = Usage(pid_);
    const absl::StatusOr<v1::JobStatusResponse> status1 = JobStatus();
    if (!status1.ok()) return status1.status();
    const int64_t checkpoints = status1->checkpoints() - status0->checkpoints();
    (*out)["checkpoints"] = checkpoints;
    (*out)["checkpoint_mean_s"] =
        checkpoints > 0
            ? (status1->checkpoint_seconds() - status0->checkpoint_seconds()) / checkpoints
            : 0.0;
    (*out)["coordinator_threads_max"] = threads.load();
    (*out)["heartbeat"] = beats_.Summary();
    (*out)["heartbeat_interval_s"] = absl::ToDoubleSeconds(interval_);
    (*out)["heartbeats_late"] = late_.load();
    (*out)["heartbeat_errors"] = errors_.load();
    (*out)["coordinator_cores_busy"] = (cpu1 - cpu0) / settings_.seconds;
    (*out)["coordinator_rss_bytes"] = std::max(rss0, rss1);
    absl::MutexLock lock(&hb_mu_);
    (*out)["epoch_to_every_server_s"] =
        all_servers_on_watched_ == absl::InfiniteFuture()
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
      Stub(h)->async()->ReportExit(&c->ctx, &c->req, &c->resp, [&, c](grpc::Status s) {
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
      absl::StatusOr<v1::JobStatusResponse> status = JobStatus();
      if (status.ok() && status->state() == v1::JOB_SUCCEEDED) {
        (*out)["end_s"] = absl::ToDoubleSeconds(absl::Now() - start);
        return absl::OkStatus();
      }
      if (status.ok() && status->state() == v1::JOB_FAILED) {
        return absl::InternalError(absl::StrCat("the job failed: ", status->reason()));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError("the job did not succeed within 60 s of the exits");
  }

  // The coordinator's last lines, for a run that failed.
  std::string LastLogLines() const {
    std::vector<std::string> lines =
        absl::StrSplit(ReadFile(dir_ + "/coordinator.log"), '\n', absl::SkipEmpty());
    if (lines.size() > 3) lines.erase(lines.begin(), lines.end() - 3);
    return lines.empty()
               ? ""
               : absl::StrCat("; the coordinator's last lines:\n  ", absl::StrJoin(lines, "\n  "));
  }

  absl::StatusOr<v1::JobStatusResponse> JobStatus() {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, kToken, absl::Seconds(10));
    v1::JobStatusResponse status;
    grpc::Status s = Stub(0)->GetJobStatus(&ctx, v1::JobStatusRequest(), &status);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("GetJobStatus: ", s.error_message()));
    return status;
  }

  const int hosts_;
  const Settings settings_;
  std::string dir_, checkpoints_;
  std::unique_ptr<PlayedServers> played_;  // with checkpoints
  pid_t pid_ = 0;
  v1::Coordinator::Stub* Stub(int host) { return stubs_[host % kConnections].get(); }
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic_;
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
  flags.Add("step-ms", &settings.step_ms,
            "Milliseconds per training step, as the played servers report it.");
  flags.Add("checkpoint-every", &settings.checkpoint_every,
            "The job checkpoints every this many steps (sync); 0: no checkpoints.");
  flags.Add("json", &json_path, "Write the results as JSON here.");
  flags.ParseOrExit(argc, argv);
  absl::StatusOr<std::vector<int>> counts = ParseCounts(hosts, 2, 16384);
  if (!counts.ok()) {
    std::fprintf(stderr, "%s: --hosts: %s\n", kProgram,
                 std::string(counts.status().message()).c_str());
    return 2;
  }
  if (counts->empty() || settings.seconds < 2 || settings.heartbeat_timeout_s <= 0 ||
      settings.timeout_s < 1 || settings.step_ms < 1 || settings.checkpoint_every < 0) {
    std::fprintf(stderr,
                 "%s: need --hosts, --seconds >= 2, --heartbeat-timeout > 0, --timeout >= 1, "
                 "--step-ms >= 1, --checkpoint-every >= 0\n",
                 kProgram);
    return 2;
  }
  std::printf(
      "%s: one psrt-coordinator, N hosts played (agent, server, worker each); nproc %ld, load %s\n",
      kProgram, sysconf(_SC_NPROCESSORS_ONLN), LoadAverage().c_str());
  std::printf("%6s %9s %12s %12s %12s %12s %12s %6s %6s %9s %8s %8s %8s %7s %8s %8s\n", "hosts",
              "start s", "barrier p99", "hb p50 ms", "hb p99 ms", "hb max ms", "beats/s", "late",
              "errors", "cores", "RSS MiB", "threads", "epoch s", "ckpts", "ckpt s", "end s");
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
    std::printf(
        "%6d %9.2f %10.1fms %12.2f %12.2f %12.2f %12.0f %6d %6d %9.2f %8.1f %8d %8.2f %7d %8.3f "
        "%8.2f\n",
        n, j["start_up_s"].get<double>(), j["barrier"]["p99_us"].get<double>() / 1e3,
        j["heartbeat"]["p50_us"].get<double>() / 1e3, j["heartbeat"]["p99_us"].get<double>() / 1e3,
        j["heartbeat"]["max_us"].get<double>() / 1e3,
        j["heartbeat"]["count"].get<double>() / settings.seconds, j["heartbeats_late"].get<int>(),
        j["heartbeat_errors"].get<int>(), j["coordinator_cores_busy"].get<double>(),
        j["coordinator_rss_bytes"].get<double>() / (1 << 20),
        j["coordinator_threads_max"].get<int>(), j["epoch_to_every_server_s"].get<double>(),
        j["checkpoints"].get<int>(), j["checkpoint_mean_s"].get<double>(),
        j["end_s"].get<double>());
    std::fflush(stdout);
    results.push_back(j);
  }
  std::printf(
      "late: heartbeats answered after the next was due; errors: refused, or the job not "
      "running\n");
  if (!json_path.empty()) {
    std::ofstream(json_path) << nlohmann::json(
                                    {{"benchmark", kProgram},
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
