#include "server/checkpointer.h"

#include <openssl/sha.h>

#include <algorithm>
#include <climits>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/failpoint.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "server/checkpoint/catalog.h"

namespace psrt {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(10);
// How long a save keeps asking servers that could not be reached (a slow
// connect on a loaded host; a server restarting): a lost one is the
// coordinator's to find, by heartbeats, within this.
constexpr absl::Duration kUnreachableRetry = absl::Seconds(30);
constexpr char kJobRecordFile[] = "JOB";

// Names the job without revealing its token.
std::string JobId(const std::string& token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}
// How long a periodic sync checkpoint's server calls wait for the step
// before the coordinator looks at its other triggers again: 250 ms, and 1 ms
// per server beyond, so that the polls of thousands of servers (one call
// each, all the time between checkpoints) stay near a thousand calls a
// second.
absl::Duration PollWait(size_t servers) {
  return std::max(absl::Milliseconds(250), absl::Milliseconds(static_cast<int64_t>(servers)));
}

std::vector<double> SecondsBuckets() { return {0.01, 0.1, 1, 10, 100, 1000}; }

}  // namespace

Checkpointer::Checkpointer(CheckpointerOptions options, std::unique_ptr<Storage> root,
                           Metrics* metrics)
    : options_(std::move(options)),
      root_(std::move(root)),
      saved_(metrics->GetCounter("checkpoints_total", "Checkpoints committed")),
      failed_(metrics->GetCounter("checkpoint_failures_total", "Checkpoints that failed")),
      seconds_(metrics->GetHistogram(
          "checkpoint_seconds", "Time to write and commit a checkpoint once its step is reached",
          SecondsBuckets())),
      last_step_(
          metrics->GetGauge("checkpoint_last_step", "Step of the newest committed checkpoint")),
      last_pause_(
          metrics->GetGauge("checkpoint_pause_seconds_max",
                            "Longest a key was held to copy it, in the newest checkpoint")) {}

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Open(CheckpointerOptions options,
                                                                 Metrics* metrics) {
  absl::StatusOr<std::unique_ptr<Storage>> root = OpenStorage(NormalizeUri(options.config.uri()));
  if (!root.ok()) return root.status();
  // One listing request: a missing bucket, a dead endpoint or wrong
  // credentials show here; an empty destination is fine.
  absl::StatusOr<std::vector<std::string>> probe = (*root)->List(kLatestFile);
  if (!probe.ok()) {
    return absl::Status(probe.status().code(),
                        absl::StrCat("cannot read checkpoint destination ", (*root)->uri(), ": ",
                                     probe.status().message()));
  }
  return std::unique_ptr<Checkpointer>(
      new Checkpointer(std::move(options), *std::move(root), metrics));
}

Checkpointer::~Checkpointer() { Stop(); }

void Checkpointer::Retarget(const std::vector<std::string>& server_addresses) {
  absl::MutexLock save(&save_mu_);
  addresses_ = server_addresses;
  absl::MutexLock stubs(&stubs_mu_);
  servers_.clear();  // made at the first call (Servers)
}

void Checkpointer::Start(const std::vector<std::string>& server_addresses, int64_t start_step) {
  const bool loop = options_.config.every_steps() > 0 || options_.config.every_seconds() > 0;
  Retarget(server_addresses);
  absl::MutexLock halt(&halt_mu_);
  if (loop_.joinable()) loop_.join();  // a stopped loop that nobody joined yet
  {
    absl::MutexLock save(&save_mu_);
    start_step_ = start_step;
    absl::MutexLock lock(&mu_);
    stopping_ = false;
    cancelled_ = false;
    finishing_ = false;
    job_failed_ = false;
    looping_ = loop;
  }
  if (loop) {
    loop_ = std::thread([this] {
      Loop();
      absl::MutexLock lock(&mu_);
      looping_ = false;
    });
  }
}

void Checkpointer::Stop() { Halt(absl::InfiniteDuration()); }

void Checkpointer::Abort(absl::Duration grace) { Halt(grace); }

void Checkpointer::Halt(absl::Duration grace) {
  const bool cancel = grace != absl::InfiniteDuration();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (cancel && !finishing_) {
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !looping_; };
      mu_.AwaitWithTimeout(absl::Condition(&idle), grace);
      // Whatever is still being written (by the triggers or on demand)
      // ends, unless the final checkpoint began meanwhile.
      if (!finishing_) {
        cancelled_ = true;
        for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
      }
    }
  }
  {
    absl::MutexLock halt(&halt_mu_);
    if (loop_.joinable()) loop_.join();
  }
  if (cancel) {
    absl::MutexLock save(&save_mu_);  // an on-demand SaveNow has returned
  }
}

void Checkpointer::StopTriggers() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void Checkpointer::Cancel() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  cancelled_ = true;
  job_failed_ = true;
  for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
}

std::optional<v1::CheckpointResponse> Checkpointer::LastCommitted() {
  absl::MutexLock lock(&mu_);
  return last_committed_;
}

absl::Status Checkpointer::PutRecord() {
  record_.set_job_id(JobId(options_.token));
  return root_->Put(kJobRecordFile, record_.SerializeAsString());
}

absl::Status Checkpointer::WriteRecord(int64_t generation, const std::string& uri, int64_t step,
                                       const std::vector<int>& hosts) {
  absl::MutexLock lock(&record_mu_);
  record_.set_generation(generation);
  record_.mutable_hosts()->Assign(hosts.begin(), hosts.end());
  record_.set_checkpoint_uri(uri);
  record_.set_checkpoint_step(step);
  return PutRecord();
}

absl::StatusOr<v1::JobRecord> Checkpointer::ReadRecord() {
  absl::StatusOr<std::string> data = root_->Get(kJobRecordFile);
  if (!data.ok()) return data.status();
  v1::JobRecord r;
  if (!r.ParseFromString(*data)) {
    return absl::DataLossError(
        absl::StrCat(root_->uri(), "/", kJobRecordFile, " is not a job record"));
  }
  if (r.job_id() != JobId(options_.token)) {
    return absl::FailedPreconditionError(
        absl::StrCat(root_->uri(), "/", kJobRecordFile, " is another job's (its token differs)"));
  }
  absl::MutexLock lock(&record_mu_);
  record_ = r;
  return r;
}

bool Checkpointer::stopping() {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

bool Checkpointer::Track(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  calls_.push_back(ctx);
  return true;
}

void Checkpointer::Untrack(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  calls_.erase(std::find(calls_.begin(), calls_.end(), ctx));
}

const std::vector<std::unique_ptr<v1::ParameterServer::Stub>>& Checkpointer::Servers() {
  absl::MutexLock lock(&stubs_mu_);
  if (servers_.empty()) {
    for (const std::string& a : addresses_)
      servers_.push_back(v1::ParameterServer::NewStub(MakeControlChannel(a)));
  }
  return servers_;
}

std::vector<grpc::Status> Checkpointer::CallEach(absl::Duration timeout, const StartCall& start) {
  const std::vector<std::unique_ptr<v1::ParameterServer::Stub>>& servers = Servers();
  const int n = static_cast<int>(servers.size());
  std::vector<grpc::Status> status(n);
  std::vector<std::unique_ptr<grpc::ClientContext>> calls(n);
  absl::BlockingCounter answered(n);
  for (int i = 0; i < n; ++i) {
    calls[i] = std::make_unique<grpc::ClientContext>();
    PrepareContext(calls[i].get(), options_.token, timeout);
    if (!Track(calls[i].get())) {
      calls[i].reset();
      status[i] = grpc::Status(grpc::StatusCode::CANCELLED, "the checkpoint was cancelled");
      answered.DecrementCount();
      continue;
    }
    start(i, servers[i].get(), calls[i].get(), [&status, &answered, i](grpc::Status s) {
      status[i] = std::move(s);
      answered.DecrementCount();
    });
  }
  answered.Wait();
  for (const auto& ctx : calls) {
    if (ctx != nullptr) Untrack(ctx.get());
  }
  return status;
}

absl::StatusOr<std::vector<v1::StatsResponse>> Checkpointer::AllStats(absl::Time retry_until) {
  std::vector<v1::StatsResponse> out(addresses_.size());
  const v1::StatsRequest req;
  Backoff backoff(retry_until);
  for (;;) {
    std::vector<grpc::Status> status = CallEach(
        kRpcTimeout, [&](int i, v1::ParameterServer::Stub* server, grpc::ClientContext* ctx,
                         std::function<void(grpc::Status)> done) {
          server->async()->Stats(ctx, &req, &out[i], std::move(done));
        });
    absl::Status failed;
    bool unreachable = false;
    for (size_t i = 0; i < status.size() && failed.ok(); ++i) {
      if (status[i].error_code() == grpc::StatusCode::CANCELLED) {
        return absl::CancelledError("the checkpoint was cancelled");
      }
      if (!status[i].ok()) {
        unreachable = status[i].error_code() == grpc::StatusCode::UNAVAILABLE ||
                      status[i].error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
        failed = absl::UnavailableError(
            absl::StrCat("server ", i, " did not answer Stats: ", status[i].error_message()));
      }
    }
    if (failed.ok()) return out;
    if (!unreachable || !backoff.Wait()) return failed;
  }
}

absl::StatusOr<int64_t> Checkpointer::CurrentStep(absl::Time retry_until) {
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = AllStats(retry_until);
  if (!stats.ok()) return stats.status();
  int64_t step = sync() ? 0 : INT64_MAX;
  for (const v1::StatsResponse& s : *stats) {
    if (sync()) {
      step = std::max(step, s.max_version());
    } else {
      for (int64_t c : s.worker_clocks()) step = std::min(step, c);
    }
  }
  return step == INT64_MAX ? start_step_ : step;
}

absl::StatusOr<bool> Checkpointer::Committed(const std::string& name) {
  return root_->Exists(ManifestPath(name));
}

v1::CheckpointResponse Checkpointer::Response(const std::string& name, int64_t step,
                                              bool already) const {
  v1::CheckpointResponse r;
  r.set_uri(absl::StrCat(root_->uri(), "/", name));
  r.set_step(step);
  r.set_already_saved(already);
  return r;
}

absl::Status Checkpointer::Round(const std::string& name, int64_t step, absl::Duration wait,
                                 bool final, std::vector<v1::SaveShardResponse>* responses,
                                 bool* done) {
  const int n = static_cast<int>(addresses_.size());
  // First every server only says what it waits for; the shards are written
  // once none waits (SaveShardRequest.wait_only).
  const bool wait_only = responses->empty();
  // Async and ssp copy every key at once: nothing to wait for. Once no
  // server waits, one that holds no key has nothing to wait for either.
  const bool allow_empty = !sync() || !wait_only;
  std::vector<v1::SaveShardRequest> requests(n);
  std::vector<v1::SaveShardResponse> answers(n);
  std::vector<grpc::Status> status =
      CallEach(wait + options_.save_timeout,
               [&](int i, v1::ParameterServer::Stub* server, grpc::ClientContext* ctx,
                   std::function<void(grpc::Status)> done) {
                 v1::SaveShardRequest& req = requests[i];
                 req.set_root_uri(root_->uri());
                 req.set_name(name);
                 req.set_shard_path(ShardPath(name, i, n));
                 req.set_step(sync() ? step : -1);
                 req.set_wait_s(absl::ToDoubleSeconds(wait));
                 req.set_allow_empty(allow_empty);
                 req.set_final(final);
                 req.set_wait_only(wait_only);
                 server->async()->SaveShard(ctx, &req, &answers[i], std::move(done));
               });
  *done = false;
  for (int i = 0; i < n; ++i) {
    if (!status[i].ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status[i].error_code()),
                          absl::StrCat("server ", i, ": ", status[i].error_message()));
    }
  }
  if (wait_only) {
    int64_t waiting = 0, keys = 0;
    for (const v1::SaveShardResponse& r : answers) {
      waiting += r.keys_waiting();
      keys += r.num_keys();
    }
    // Sync: a job with no key yet has not reached the step either.
    if (waiting == 0 && (keys > 0 || !sync())) *responses = std::move(answers);
    return absl::OkStatus();
  }
  *responses = std::move(answers);
  *done = true;
  for (const v1::SaveShardResponse& r : *responses) *done = *done && r.done();
  return absl::OkStatus();
}

absl::StatusOr<v1::CheckpointResponse> Checkpointer::Commit(
    const std::string& name, int64_t step, const std::vector<v1::SaveShardResponse>& shards,
    absl::Time started) {
  Failpoint("checkpoint.shards_written");
  v1::Manifest m;
  m.set_format_version(kManifestFormatVersion);
  m.set_name(name);
  m.set_step(step);
  m.set_mode(options_.mode);
  m.set_created_unix_s(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  m.set_num_servers(static_cast<int>(shards.size()));
  m.set_partition_bytes(options_.partition_bytes);
  std::map<std::string, const v1::ManifestVariable*> variables;
  double pause = 0;
  int64_t bytes = 0;
  // Assign keys (the mean gradient, buffers, frozen weights) do not follow
  // the step (server/store.cc, FreeRunning).
  // Nor do keys that some worker never registered (SaveShardResponse).
  absl::flat_hash_set<std::string> free_running, stray;
  for (const v1::SaveShardResponse& shard : shards) {
    for (const v1::ManifestVariable& v : shard.variables()) {
      if (v.optimizer().name() == "assign") free_running.insert(v.name());
    }
    stray.insert(shard.stray_keys().begin(), shard.stray_keys().end());
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    *m.add_shards() = shards[i].shard();
    bytes += shards[i].shard().bytes();
    pause = std::max(pause, shards[i].max_pause_s());
    for (const v1::ManifestKey& k : shards[i].keys()) {
      if (sync() && k.version() != step && !free_running.contains(k.variable()) &&
          !stray.contains(absl::StrCat(k.variable(), "#", k.partition()))) {
        return absl::InternalError(absl::StrCat("checkpoint ", name, ": key '", k.variable(), "#",
                                                k.partition(), "' was saved at version ",
                                                k.version(), ", not at the step ", step));
      }
      v1::ManifestKey* mk = m.add_keys();
      *mk = k;
      mk->set_shard(static_cast<int>(i));
    }
    for (const v1::ManifestVariable& v : shards[i].variables()) variables.emplace(v.name(), &v);
  }
  for (const auto& [n, v] : variables) *m.add_variables() = *v;
  if (absl::Status s = CheckManifest(m, name); !s.ok()) return s;
  if (absl::Status s = WriteManifest(root_.get(), m); !s.ok()) return s;
  Failpoint("checkpoint.manifest_written");
  if (absl::Status s = root_->Put(kLatestFile, name + "\n"); !s.ok()) return s;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  saved_->Add();
  seconds_->Observe(seconds);
  last_step_->Set(static_cast<double>(step));
  last_pause_->Set(pause);
  LogInfo("checkpoint ", root_->uri(), "/", name, " committed: ", bytes, " bytes in ",
          shards.size(), " shards, ", m.keys_size(), " keys, ",
          absl::FormatDuration(absl::Seconds(seconds)), "; longest training pause ",
          absl::FormatDuration(absl::Seconds(pause)));
  {
    absl::MutexLock lock(&mu_);
    last_committed_ = Response(name, step, false);
  }
  {
    absl::MutexLock lock(&record_mu_);
    record_.set_checkpoint_uri(absl::StrCat(root_->uri(), "/", name));
    record_.set_checkpoint_step(step);
    if (absl::Status s = PutRecord(); !s.ok()) {
      LogWarning("could not update the job record under ", root_->uri(), ": ", s.message());
    }
  }
  if (absl::Status s = PruneCheckpoints(root_.get(), options_.config.keep(), name); !s.ok()) {
    LogWarning("removing old checkpoints under ", root_->uri(),
               " failed (the next checkpoint tries again): ", s.message());
  }
  return Response(name, step, false);
}

absl::StatusOr<v1::CheckpointResponse> Checkpointer::SaveNow(absl::Time deadline) {
  return Save(deadline, /*final=*/false);
}

absl::StatusOr<v1::CheckpointResponse> Checkpointer::Save(absl::Time deadline, bool final) {
  absl::MutexLock lock(&save_mu_);
  if (addresses_.empty())
    return absl::UnavailableError("the job's servers have not all registered yet");
  absl::Status last;
  const absl::Time retry_until = std::min(deadline, absl::Now() + kUnreachableRetry);
  Backoff backoff(retry_until);
  // Sync: a key may pass the chosen step before it is armed; then try the
  // step it reached. A server that could not be reached: again, a while.
  for (int attempt = 0; attempt < 20 && absl::Now() < deadline; ++attempt) {
    absl::StatusOr<int64_t> step = CurrentStep(retry_until);
    if (!step.ok()) return step.status();
    const std::string name = CheckpointName(*step);
    absl::StatusOr<bool> committed = Committed(name);
    if (!committed.ok()) return committed.status();
    if (*committed) return Response(name, *step, true);
    const absl::Time started = absl::Now();
    std::vector<v1::SaveShardResponse> responses;
    bool done = false;
    while (true) {
      last =
          Round(name, *step,
                std::min(absl::Seconds(1), std::max(absl::ZeroDuration(), deadline - absl::Now())),
                final, &responses, &done);
      if (!last.ok() || done || absl::Now() >= deadline) break;
    }
    if (last.ok() && done) {
      absl::StatusOr<v1::CheckpointResponse> r = Commit(name, *step, responses, started);
      if (!r.ok()) failed_->Add();
      return r;
    }
    if (last.ok()) {
      int64_t waiting = 0;
      for (const auto& r : responses) waiting += r.keys_waiting();
      last = absl::DeadlineExceededError(absl::StrCat(
          "checkpoint ", name, ": ", responses.empty() ? "some" : absl::StrCat(waiting),
          " keys had not reached step ", *step, " by the deadline"));
    }
    if (absl::IsUnavailable(last) && backoff.Wait()) continue;
    if (!absl::IsFailedPrecondition(last)) break;
  }
  failed_->Add();
  return last.ok() ? absl::DeadlineExceededError("checkpoint: no attempt before the deadline")
                   : last;
}

absl::StatusOr<v1::CheckpointResponse> Checkpointer::Finish(
    const std::vector<std::string>& server_addresses) {
  // The triggers first: their loop takes save_mu_ turn after turn, which
  // would keep Retarget waiting.
  Stop();
  {
    absl::MutexLock lock(&mu_);
    finishing_ = true;
    // A failover's Abort just before the end cancelled the old servers'
    // checkpoint, not this one.
    cancelled_ = job_failed_;
  }
  Retarget(server_addresses);
  if (addresses_.empty())
    return absl::FailedPreconditionError("the job ended before its servers registered");
  // A job whose workers registered nothing has nothing to save (a sync
  // checkpoint would wait for keys that never come).
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = AllStats(absl::Now() + kUnreachableRetry);
  if (stats.ok() && std::all_of(stats->begin(), stats->end(),
                                [](const v1::StatsResponse& s) { return s.num_keys() == 0; })) {
    return absl::NotFoundError("the workers registered no variables: nothing to save");
  }
  return Save(absl::Now() + options_.save_timeout, /*final=*/true);
}

void Checkpointer::Loop() {
  const v1::CheckpointConfig& c = options_.config;
  const int64_t every = c.every_steps();
  LoopState state;
  state.target = every > 0 ? (start_step_ / every + 1) * every : -1;
  state.last = absl::Now();
  while (!stopping()) {
    if (c.every_seconds() > 0 && absl::Now() - state.last >= absl::Seconds(c.every_seconds())) {
      absl::StatusOr<v1::CheckpointResponse> r = SaveNow(absl::Now() + options_.save_timeout);
      if (!r.ok() && !stopping()) LogWarning("periodic checkpoint failed: ", r.status().message());
      state.last = absl::Now();
      continue;
    }
    if (every <= 0) {
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    if (!sync()) {
      // Async and ssp have no step boundary: save when every worker is past
      // the next multiple.
      absl::StatusOr<int64_t> step = CurrentStep(absl::Now());
      if (step.ok() && *step >= state.target) {
        absl::StatusOr<v1::CheckpointResponse> r = SaveNow(absl::Now() + options_.save_timeout);
        if (!r.ok() && !stopping())
          LogWarning("periodic checkpoint failed: ", r.status().message());
        state.target = (*step / every + 1) * every;
        state.last = absl::Now();
      } else {
        absl::SleepFor(absl::Milliseconds(50));
      }
      continue;
    }
    absl::SleepFor(SyncTurn(&state));
  }
}

absl::Duration Checkpointer::SyncTurn(LoopState* state) {
  // Sync: the servers are armed ahead for the step, and copy each key the
  // moment it gets there.
  const int64_t every = options_.config.every_steps();
  absl::MutexLock lock(&save_mu_);
  const std::string name = CheckpointName(state->target);
  if (!state->target_checked) {
    absl::StatusOr<bool> committed = Committed(name);
    if (!committed.ok() || *committed) {
      if (committed.ok()) state->target += every;
      return absl::Milliseconds(50);
    }
    state->target_checked = true;
    state->responses.clear();
  }
  // Asked once the job got to the step: a server whose keys all run free
  // (assign; where the optimizer runs on the workers, all but their state's)
  // would otherwise write its shard at once, before the keys that follow
  // the step exist there.
  if (absl::StatusOr<int64_t> now = CurrentStep(absl::Now()); now.ok() && *now < state->target)
    return absl::Milliseconds(50);
  const absl::Time started = absl::Now();
  bool done = false;
  absl::Status s = Round(name, state->target, PollWait(addresses_.size()), /*final=*/false,
                         &state->responses, &done);
  if (s.ok() && done) s = Commit(name, state->target, state->responses, started).status();
  if (s.ok() && !done) return absl::ZeroDuration();
  if (!s.ok() && stopping())
    return absl::ZeroDuration();  // stopped or cancelled on purpose: not news
  if (!s.ok()) {
    failed_->Add();
    if (state->target != state->warned)
      LogWarning("checkpoint at step ", state->target, " failed: ", s.message());
    state->warned = state->target;
  }
  // Done: the next multiple (the servers armed it already). Failed: the
  // next multiple after where training is; with a server out of reach,
  // the same step again a little later, never a step training did not
  // get to.
  absl::StatusOr<int64_t> now = s.ok() ? state->target : CurrentStep(absl::Now());
  if (now.ok()) state->target = std::max(state->target + every, (*now / every + 1) * every);
  state->target_checked = false;
  state->last = absl::Now();
  if (s.ok()) return absl::ZeroDuration();
  return now.ok() ? absl::Milliseconds(50) : absl::Milliseconds(500);
}

}  // namespace psrt
