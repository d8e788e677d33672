#include "common/coordinator_link.h"

#include <unistd.h>

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/net.h"

namespace psrt {
namespace {

// How often a server that waits for its first shard map asks for it.
constexpr absl::Duration kShardMapPoll = absl::Milliseconds(50);

// Calls `rpc` until it gets through or `deadline` passes: daemons start in
// any order, so an unreachable coordinator is worth waiting for.
absl::Status RetryWhileUnreachable(const std::string& coordinator, absl::Time deadline,
                                   const std::function<grpc::Status(absl::Duration)>& rpc) {
  // An unresolvable name is waited for here, not by gRPC: its channel backs
  // off for longer and longer after each failed resolution.
  if (absl::Status s = WaitForHostName(coordinator, deadline, "the coordinator"); !s.ok()) {
    return absl::UnavailableError(s.message());
  }
  Backoff backoff(deadline, absl::Milliseconds(50));
  const absl::Time start = absl::Now();
  while (true) {
    grpc::Status s = rpc(std::max(absl::Milliseconds(100), deadline - absl::Now()));
    if (s.ok()) return absl::OkStatus();
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("coordinator at ", coordinator, " refused: ", s.error_message()));
    }
    if (!backoff.Wait()) {
      return absl::UnavailableError(absl::StrCat(
          "could not reach the coordinator at ", coordinator, " within ",
          absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(100))), ": ",
          s.error_message(), TlsEnabled() ? kTlsHint : ""));
    }
  }
}

}  // namespace

CoordinatorLink::CoordinatorLink(Options options)
    : options_(std::move(options)),
      stub_(v1::Coordinator::NewStub(MakeChannel(options_.coordinator))) {}

absl::StatusOr<std::unique_ptr<CoordinatorLink>> CoordinatorLink::Connect(Options options) {
  std::unique_ptr<CoordinatorLink> link(new CoordinatorLink(std::move(options)));
  const Options& o = link->options_;
  v1::RegisterRequest req;
  *req.mutable_id() = o.id;
  req.set_address(o.address);
  req.set_host(o.host);
  req.set_pid(getpid());
  req.set_generation(o.generation);
  v1::RegisterResponse resp;
  int tries = 0;
  absl::Status s = RetryWhileUnreachable(
      o.coordinator, absl::Now() + o.connect_timeout, [&](absl::Duration timeout) {
        // A channel that failed to connect waits out gRPC's own backoff
        // (seconds, whatever the channel's settings say) before it tries
        // again: each try gets a fresh one, so a coordinator that came up
        // a moment late is reached at the next.
        if (tries++ > 0) link->stub_ = v1::Coordinator::NewStub(MakeChannel(o.coordinator));
        grpc::ClientContext ctx;
        PrepareContext(&ctx, o.token, std::min(o.rpc_timeout, timeout));
        return link->stub_->Register(&ctx, req, &resp);
      });
  if (!s.ok()) return s;
  link->config_ = resp.config();
  link->spare_ = resp.spare();
  {
    absl::MutexLock lock(&link->mu_);
    link->generation_ = resp.config().generation();
    link->current_config_ = resp.config();
    link->host_index_ = resp.host_index();
  }
  link->heartbeats_ = std::thread([l = link.get()] { l->HeartbeatLoop(); });
  return link;
}

CoordinatorLink::~CoordinatorLink() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (heartbeats_.joinable()) heartbeats_.join();
  // A training process's last word: its final totals.
  if (options_.stats) SendStats();
}

void CoordinatorLink::SetProgress(int64_t step) {
  int64_t seen = progress_.load(std::memory_order_relaxed);
  while (step > seen && !progress_.compare_exchange_weak(seen, step, std::memory_order_relaxed)) {
  }
}

void CoordinatorLink::SendStats() {
  if (!options_.stats) return;
  {
    absl::MutexLock lock(&mu_);
    if (end_.state != v1::JOB_RUNNING) return;  // the job no longer counts it
  }
  v1::HeartbeatRequest req;
  *req.mutable_stats() = options_.stats();
  *req.mutable_id() = options_.id;
  req.set_generation(options_.generation);
  req.set_step(progress_.load(std::memory_order_relaxed));
  grpc::ClientContext ctx;
  PrepareContext(&ctx, options_.token, absl::Seconds(1));
  v1::HeartbeatResponse resp;
  (void)stub_->Heartbeat(&ctx, req, &resp);
}

void CoordinatorLink::HeartbeatLoop() {
  const absl::Duration interval = absl::Seconds(config_.heartbeat_interval_s());
  // With on_failure "recover" an agent outlasts its coordinator's loss for
  // as long as a lost host may take to return: a restarted coordinator goes
  // on with the agents that are still there.
  const bool outlast = options_.id.role() == v1::ROLE_AGENT && config_.on_failure() == "recover";
  const absl::Duration timeout =
      absl::Seconds(outlast ? config_.host_wait_s() : config_.heartbeat_timeout_s());
  absl::Time last_ok = absl::Now();
  int64_t epoch = 0, shard_epoch = 0;
  v1::HeartbeatRequest req;
  *req.mutable_id() = options_.id;
  req.set_generation(options_.generation);
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.Unlock();
    if (options_.stats) *req.mutable_stats() = options_.stats();
    req.clear_copies_building();
    if (options_.copies_building) {
      for (int owner : options_.copies_building()) req.add_copies_building(owner);
    }
    req.set_step(progress_.load(std::memory_order_relaxed));
    req.set_membership_epoch(epoch);
    req.set_shard_map_epoch(shard_epoch);
    grpc::ClientContext ctx;
    PrepareContext(&ctx, options_.token, std::max(interval, absl::Seconds(1)));
    v1::HeartbeatResponse resp;
    grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
    const absl::Time now = absl::Now();
    // Each comes only when it changed; the next request says it is held
    // (by a server: applied to every key, as the callback returns).
    if (s.ok() && resp.has_membership() && resp.membership().epoch() != epoch) {
      if (options_.on_membership) options_.on_membership(resp.membership());
      epoch = resp.membership().epoch();
    }
    bool new_map = false;
    if (s.ok() && resp.has_shard_map() && resp.shard_map().epoch() != shard_epoch) {
      if (options_.on_shard_map) options_.on_shard_map(resp.shard_map());
      shard_epoch = resp.shard_map().epoch();
      new_map = true;
    }
    mu_.Lock();
    if (s.ok()) {
      last_ok = now;
      generation_ = std::max(generation_, resp.generation());
      if (resp.has_config()) {
        current_config_ = resp.config();
        host_index_ = resp.host_index();
      }
      if (end_.state == v1::JOB_RUNNING && resp.leave()) {
        end_.state = v1::JOB_SUCCEEDED;
        end_.reason = "removed from the job: its keys moved to the other servers";
        end_.left = true;
      } else if (end_.state == v1::JOB_RUNNING && resp.state() != v1::JOB_RUNNING) {
        end_.state = resp.state();
        end_.reason = resp.reason();
      } else if (end_.state == v1::JOB_RUNNING && options_.generation != 0 &&
                 resp.generation() > options_.generation) {
        end_.state = v1::JOB_FAILED;
        end_.reason = absl::StrCat("replaced: the job recovered from a failure and is at generation ",
                                   resp.generation(), ", this process belongs to generation ",
                                   options_.generation);
      }
    } else if (end_.state == v1::JOB_RUNNING && now - last_ok > timeout) {
      end_.state = v1::JOB_FAILED;
      end_.reason = absl::StrCat("lost the coordinator at ", options_.coordinator, ": no answer for ",
                                 absl::FormatDuration(absl::Trunc(now - last_ok, absl::Milliseconds(100))),
                                 " (", s.error_message(), ")");
    } else if (!s.ok() && s.error_code() != grpc::StatusCode::UNAVAILABLE &&
               s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED && end_.state == v1::JOB_RUNNING) {
      end_.state = v1::JOB_FAILED;
      end_.reason = absl::StrCat("the coordinator refused a heartbeat: ", s.error_message());
    }
    // Until the first shard map (every server registered), ask again soon:
    // a replica's first updates wait for it. So too while keys move: after
    // a new map (the coordinator waits to hear it applied) and while copies
    // are being built.
    const bool want_map = (options_.on_shard_map && (shard_epoch == 0 || new_map)) ||
                          req.copies_building_size() > 0 || (options_.moving && options_.moving());
    auto stop_or_wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
    // A new map is said to be held at once (a move waits for that).
    mu_.AwaitWithTimeout(absl::Condition(&stop_or_wake), new_map ? absl::ZeroDuration()
                                                         : want_map
                                                             ? std::min(interval, kShardMapPoll)
                                                             : interval);
    wake_ = false;
  }
}

void CoordinatorLink::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

int64_t CoordinatorLink::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

v1::JobConfig CoordinatorLink::current_config() const {
  absl::MutexLock lock(&mu_);
  return current_config_;
}

int CoordinatorLink::host_index() const {
  absl::MutexLock lock(&mu_);
  return host_index_;
}

CoordinatorLink::JobEnd CoordinatorLink::state() const {
  absl::MutexLock lock(&mu_);
  return end_;
}

CoordinatorLink::JobEnd CoordinatorLink::WaitForEnd() const {
  return WaitForEnd(absl::InfiniteDuration());
}

CoordinatorLink::JobEnd CoordinatorLink::WaitForEnd(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return end_.state != v1::JOB_RUNNING; };
  mu_.AwaitWithTimeout(absl::Condition(&ended), timeout);
  return end_;
}

absl::StatusOr<v1::BarrierResponse> CoordinatorLink::Barrier() {
  const absl::Duration timeout = absl::Seconds(config_.barrier_timeout_s());
  grpc::ClientContext ctx;
  PrepareContext(&ctx, options_.token, timeout + absl::Seconds(5));
  v1::BarrierRequest req;
  *req.mutable_id() = options_.id;
  v1::BarrierResponse resp;
  grpc::Status s = stub_->Barrier(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s);
  return resp;
}

absl::Status CoordinatorLink::ReportExit(const v1::ProcessId& id, int exit_code,
                                         const std::string& message, bool restarting,
                                         int64_t generation) {
  grpc::ClientContext ctx;
  PrepareContext(&ctx, options_.token, options_.rpc_timeout);
  v1::ReportExitRequest req;
  *req.mutable_id() = id;
  req.set_exit_code(exit_code);
  req.set_message(message);
  req.set_restarting(restarting);
  const bool own = id.role() == options_.id.role() && id.index() == options_.id.index();
  req.set_generation(generation != 0 ? generation : own ? options_.generation : 0);
  v1::ReportExitResponse resp;
  return FromGrpc(stub_->ReportExit(&ctx, req, &resp));
}

absl::StatusOr<v1::JobStatusResponse> CoordinatorLink::GetJobStatus() {
  return QueryJobStatus(options_.coordinator, options_.token, options_.rpc_timeout);
}

absl::StatusOr<v1::JobConfig> FetchJobConfig(const std::string& coordinator,
                                             const std::string& token, absl::Duration timeout) {
  v1::JobStatusResponse resp;
  absl::Status s = RetryWhileUnreachable(coordinator, absl::Now() + timeout, [&](absl::Duration t) {
    auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));  // fresh: see Connect
    grpc::ClientContext ctx;
    PrepareContext(&ctx, token, std::min(t, absl::Seconds(10)));
    return stub->GetJobStatus(&ctx, v1::JobStatusRequest(), &resp);
  });
  if (!s.ok()) return s;
  return resp.config();
}

absl::StatusOr<v1::JobStatusResponse> QueryJobStatus(const std::string& coordinator,
                                                     const std::string& token,
                                                     absl::Duration timeout) {
  auto stub = v1::Coordinator::NewStub(MakeChannel(coordinator));
  grpc::ClientContext ctx;
  PrepareContext(&ctx, token, timeout);
  v1::JobStatusResponse resp;
  grpc::Status s = stub->GetJobStatus(&ctx, v1::JobStatusRequest(), &resp);
  if (!s.ok()) return FromGrpc(s);
  return resp;
}

}  // namespace psrt
