#include "worker/dispatcher.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/buffer_pool.h"
#include "common/compression.h"
#include "common/coordinator_link.h"
#include "common/data_channel.h"
#include "common/failpoint.h"
#include "common/grpc_util.h"
#include "common/key_map.h"
#include "common/logging.h"
#include "common/shared_memory.h"
#include "common/tensor_coding.h"
#include "common/thread_pool.h"
#ifdef PSRT_HAVE_CUDA
#include "kernels/cuda_kernels.h"
#endif
#include "psrt/v1/ps.grpc.pb.h"
#include "worker/op_tracker.h"
#include "worker/request_codec.h"
#include "worker/server_links.h"
#include "worker/timeline.h"

namespace psrt {
namespace {

const std::string kPushMethod = "/psrt.v1.ParameterServer/Push";
const std::string kPullMethod = "/psrt.v1.ParameterServer/Pull";
const std::string kPushPullMethod = "/psrt.v1.ParameterServer/PushPull";

// Timeline tracks: a worker's requests in flight to server s take turns on
// the server's kWindow streams, each its own track; waits go on the track of
// the thread that waits (its Linux thread id, far below this).
constexpr int64_t kStreamTrackBase = int64_t{1} << 30;

int64_t ThisThreadId() {
  thread_local const int64_t tid = static_cast<int64_t>(syscall(SYS_gettid));
  return tid;
}

}  // namespace

// Up to `limit` names as a JSON array, and how many more there were.
std::string JsonNames(const std::vector<std::string>& names, size_t limit) {
  std::string out = "[";
  for (size_t i = 0; i < names.size() && i < limit; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ",", JsonString(names[i]));
  }
  if (names.size() > limit)
    absl::StrAppend(&out, ",", JsonString(absl::StrCat("... ", names.size() - limit, " more")));
  return out + "]";
}

bool LiveCalls::Add(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  if (closing_) return false;
  if (ctx != nullptr) calls_.insert(ctx);
  return true;
}

void LiveCalls::Remove(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  calls_.erase(ctx);
}

void LiveCalls::Begin() {
  absl::MutexLock lock(&mu_);
  ++requests_;
}

void LiveCalls::End() {
  absl::MutexLock lock(&mu_);
  --requests_;
}

void LiveCalls::Close(const std::function<void()>& also, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
  also();
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return requests_ == 0; };
  mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

Dispatcher::Dispatcher(ClientOptions options, std::unique_ptr<Timeline> timeline)
    : timeline(std::move(timeline)), options(std::move(options)) {}

absl::Status Dispatcher::Join() {
  CoordinatorLink::Options lo;
  lo.coordinator = options.coordinator;
  lo.token = options.token;
  lo.id.set_role(v1::ROLE_WORKER);
  lo.id.set_index(options.rank);
  lo.host = options.host;
  lo.generation = options.generation;
  lo.connect_timeout = options.connect_timeout;
  lo.on_membership = [this](const v1::Membership& m) {
    active_workers.store(m.active_workers_size(), std::memory_order_relaxed);
  };
  lo.on_shard_map = [this](const v1::ShardMap& m) { FollowShardMap(m); };
  lo.stats = [this] { return counters.Stats(); };
  absl::StatusOr<std::unique_ptr<CoordinatorLink>> joined = CoordinatorLink::Connect(lo);
  if (!joined.ok()) return joined.status();
  link = *std::move(joined);
  absl::StatusOr<v1::BarrierResponse> barrier = link->Barrier();
  if (!barrier.ok()) return barrier.status();
  config = barrier->config();
  active_workers.store(barrier->membership().active_workers_size(), std::memory_order_relaxed);
  const int n = barrier->shard_map().server_addresses_size();
  if (n == 0) return absl::FailedPreconditionError("the shard map lists no servers");
  ServerLinks::Options links;
  links.rank = options.rank;
  links.token = options.token;
  links.connections = options.connections_per_server;
  links.rpc_timeout = options.rpc_timeout;
  links.data_channels = config.transport() != "grpc" && !TlsEnabled();
  servers = std::make_unique<ServerLinks>(links, barrier->shard_map());
  servers_ready.store(servers.get(), std::memory_order_release);
  num_servers = n;
  windows = std::make_unique<Windows>(n, timeline.get());
  if (config.transport() == "auto") ShareMemory();
  servers->OpenDataChannels();
  // Enough threads for a request in flight on every connection.
  pool = std::make_unique<ThreadPool>(std::max<int>(4, 2 * options.connections_per_server * n));
  if (config.local_aggregation() && !options.host_group.empty()) {
    absl::StatusOr<std::unique_ptr<HostGroup>> joined_group = HostGroup::Join(
        options.host_group, options.local_rank, options.rank, [this] { return JobStatus(); });
    if (!joined_group.ok()) return joined_group.status();
    group = *std::move(joined_group);
  }
  return absl::OkStatus();
}

Dispatcher::~Dispatcher() {
  if (group != nullptr) group->Close();
  // Data calls end asynchronously, on gRPC's threads (data channels' on
  // their own, CANCELLED): wait until none will touch this object again.
  calls.Close(
      [this] {
        if (servers != nullptr) servers->Close();
      },
      absl::Seconds(10));
  pool.reset();  // joins its threads while everything they use still exists
  link.reset();  // its heartbeat thread follows the shard map into the members below
}

v1::WorkerStats WorkerCounters::Stats() const {
  v1::WorkerStats stats;
  stats.set_bytes_pushed(pushed_.load());
  stats.set_bytes_pulled(pulled_.load());
  stats.set_wait_seconds(wait_us_.load() / 1e6);
  stats.set_seconds(absl::ToDoubleSeconds(absl::Now() - connected_));
  return stats;
}

std::vector<int> Dispatcher::OnePerServer(const std::vector<char>& holds) const {
  return servers->OnePerServer(holds);
}

void Dispatcher::FollowShardMap(const v1::ShardMap& map) {
  if (ServerLinks* l = servers_ready.load(std::memory_order_acquire)) l->FollowShardMap(map);
}

absl::StatusOr<Variable> Dispatcher::Find(const std::string& name) {
  absl::MutexLock lock(&mu);
  auto it = variables.find(name);
  if (it == variables.end()) {
    return absl::NotFoundError(absl::StrCat("variable '", name, "' is not registered"));
  }
  return it->second;
}

void Dispatcher::RecordPulled(const std::string& variable, uint32_t part, int64_t version,
                              bool at_least) {
  auto it = variables.find(variable);
  if (it == variables.end() || part >= it->second.pulled_versions.size()) return;
  int64_t& pulled = it->second.pulled_versions[part];
  pulled = at_least ? std::max(pulled, version) : version;
}

absl::Status Dispatcher::JobStatus() const {
  CoordinatorLink::JobEnd end = link->state();
  if (end.state != v1::JOB_FAILED) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat("the job failed: ", end.reason));
}

absl::Status Dispatcher::Call(int s, const char* what,
                              const std::function<grpc::Status(grpc::ClientContext*)>& rpc) {
  const absl::Time start = absl::Now();
  absl::Duration backoff = absl::Milliseconds(50);
  int attempts = 0;
  while (true) {
    ++attempts;
    grpc::ClientContext ctx;
    PrepareContext(&ctx, options.token, options.rpc_timeout);
    if (!calls.Add(&ctx)) return absl::CancelledError("the client is closing");
    grpc::Status st = rpc(&ctx);
    calls.Remove(&ctx);
    if (st.ok()) return absl::OkStatus();
    if (!Retry(st, start, backoff)) return CallError(s, what, st, attempts, start);
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

bool Dispatcher::Retry(const grpc::Status& st, absl::Time start, absl::Duration backoff) const {
  // With replicas a lost server's keys move to its backup once the
  // coordinator notices (within its heartbeat timeout): wait that long.
  // So too where keys move between servers ("max_servers"); the shard map
  // that says where is asked for at once.
  const bool moves = config.replicas() > 0 || config.started_servers() > 0;
  if (moves && st.error_code() == grpc::StatusCode::UNAVAILABLE) link->Wake();
  const absl::Duration budget =
      moves ? std::max(options.retry_budget,
                       absl::Seconds(config.heartbeat_timeout_s()) + absl::Seconds(5))
            : options.retry_budget;
  return st.error_code() == grpc::StatusCode::UNAVAILABLE &&
         absl::Now() - start + backoff < budget && JobStatus().ok();
}

absl::Status Dispatcher::CallError(int s, const char* what, const grpc::Status& st, int attempts,
                                   absl::Time start) const {
  return absl::Status(
      static_cast<absl::StatusCode>(st.error_code()),
      absl::StrCat(
          what, " to server ", Route(s), " at ", Address(Route(s)), " failed after ", attempts,
          attempts == 1 ? " attempt" : " attempts", " in ",
          absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))), ": ",
          st.error_message(),
          st.error_code() == grpc::StatusCode::UNAVAILABLE && TlsEnabled() ? kTlsHint : ""));
}

int64_t Dispatcher::RequestBytes(int s) {
  if (shared.Has(s) && servers->Moves(s) == 0) return kRequestBytes;
  return servers->HasDataChannel(s) ? kChannelRequestBytes : kRequestBytes;
}

Dispatcher::Lease Dispatcher::Take(int server) {
  if (servers->Moves(server) > 0) return Lease();  // not the process the region was given to
  return shared.Take(server);
}

void Dispatcher::ShareMemory() {
  shared.Offer(
      options.rank, num_servers, [this](int s) { return Address(s).empty(); },
      [this](int s, const std::string& name, int64_t size) -> absl::StatusOr<uint64_t> {
        v1::AttachSharedMemoryRequest req;
        req.set_worker_rank(options.rank);
        req.set_name(name);
        req.set_size(size);
        v1::AttachSharedMemoryResponse resp;
        absl::Status st = Call(s, "attach-shared-memory", [&](grpc::ClientContext* ctx) {
          return Stub(s)->AttachSharedMemory(ctx, req, &resp);
        });
        if (!st.ok()) return st;
        return resp.region();
      });
}

absl::StatusOr<std::vector<OutKey>> Dispatcher::Encode(const Shard& shard, int64_t version,
                                                       bool push, bool pull, Lease* lease) {
  if (lease->held()) {
    int64_t room = 0;
    for (const Shard::Item& it : shard.items) room += Room(it, push, pull);
    if (room > kRequestBytes) SharedSlots::Give(lease, true);  // one key larger than a slot: TCP
  }
  std::vector<OutKey> keys(shard.items.size());
  int64_t at = 0;  // within the slot
  for (size_t i = 0; i < keys.size(); ++i) {
    const Shard::Item& it = shard.items[i];
    OutKey& k = keys[i];
    k.variable = it.variable;
    k.partition = it.part.index;
    k.version = version;
    if (it.rows != nullptr) {
      k.ids = it.rows->ids.data();
      k.num_ids = static_cast<int64_t>(it.rows->ids.size());
    }
    if (lease->held()) {
      k.has_shared = true;
      k.shared.region = lease->region();
      k.shared.offset = lease->offset() + at;
      k.shared.capacity = pull ? Room(it, push, pull) : 0;
    }
    if (!push) {
      k.dtype = it.pull_dtype;
      at += Room(it, push, pull);
      continue;
    }
    k.dtype = it.push_dtype;
    k.pull_dtype = it.pull_dtype;
    if (it.grad == nullptr) {
      // No gradient this step: the push says so and carries no values.
      k.no_gradient = true;
      if (lease->held()) at += Room(it, push, pull);
      continue;
    }
    const float* grad = it.grad + it.part.offset;
    const int64_t n = it.part.num_elements;
    k.size = n * BytesPerValue(it.push_dtype);
    char* out;
    if (lease->held()) {
      out = lease->base() + at;
      k.shared.size = k.size;
      at += Room(it, push, pull);
    } else if (SendInPlace(grad, it.push_dtype)) {
      k.data = reinterpret_cast<const char*>(grad);
      continue;
    } else {
      k.owner = buffers.Get(k.size);
      k.data = out = k.owner.data();
    }
    absl::StatusOr<EncodeInfo> info = EncodeGradient(grad, n, it.push_dtype, out);
    if (!info.ok()) return info.status();
    if (info->scale != 1) k.scale = info->scale;
    k.nonfinite = info->nonfinite;
  }
  return keys;
}

int64_t Dispatcher::Room(const Shard::Item& it, bool push, bool pull) {
  const int64_t n = it.part.num_elements;
  return std::max(push ? n * BytesPerValue(it.push_dtype) : 0,
                  pull ? n * BytesPerValue(it.pull_dtype) : 0);
}

absl::Status Dispatcher::Store(const grpc::ByteBuffer& resp, const Shard& shard,
                               const Lease& lease) {
  thread_local WireMessage got;  // reused: parsing allocates nothing once warm
  absl::Status s = ParseKeysResponse(resp, &got);
  if (s.ok() && got.keys.size() != shard.items.size()) {
    s = absl::InternalError(absl::StrCat("server answered ", got.keys.size(), " keys for ",
                                         shard.items.size(), " asked"));
  }
  // Answers in shared memory must lie in this request's slot.
  for (size_t i = 0; s.ok() && i < got.keys.size(); ++i) {
    WireKey& kd = got.keys[i];
    if (!kd.has_shared) continue;
    if (!lease.held() || kd.shared.region != lease.region() || kd.shared.offset < lease.offset() ||
        kd.shared.size < 0 || kd.shared.size > lease.offset() + kRequestBytes - kd.shared.offset) {
      s = absl::InternalError(absl::StrCat("server answered key '",
                                           KeyName(kd.variable, kd.partition),
                                           "' in shared memory outside the request's slot"));
      break;
    }
    kd.data.Add(absl::string_view(lease.at(kd.shared.offset), kd.shared.size));
  }
  for (size_t i = 0; s.ok() && i < got.keys.size(); ++i) {
    const WireKey& kd = got.keys[i];
    const Shard::Item& it = shard.items[i];
    const int64_t expected = it.part.num_elements * BytesPerValue(kd.dtype);
    if (expected == 0 || kd.data.size() != expected) {
      s = absl::InternalError(
          absl::StrCat("server sent ", kd.data.size(), " bytes of dtype ", kd.dtype, " for key '",
                       KeyName(kd.variable, kd.partition), "'; expected ", expected));
      break;
    }
    if (it.rows == nullptr) {
      s = DecodeWeights(kd, it.out + it.part.offset, it.part.num_elements);
      continue;
    }
    ScatterRows(kd, *it.rows, it.dim, it.out);
    it.rows->version = kd.version;
  }
  if (s.ok()) {
    absl::MutexLock lock(&mu);
    for (const WireKey& kd : got.keys) RecordPulled(kd.variable, kd.partition, kd.version);
  }
  got.slices.clear();  // the received buffers go back now
  return s;
}

Dispatcher::Handle Dispatcher::Start(std::vector<TensorRef> tensors, int64_t version, bool push,
                                     bool pull, bool exact) {
  if (group != nullptr && push) return StartGrouped(std::move(tensors), version, pull);
  std::vector<int64_t> limits(num_servers);
  for (int s = 0; s < num_servers; ++s) limits[s] = RequestBytes(s);
  return Start(SplitTensors(
                   tensors, [this](const std::string& name) { return Find(name); }, limits, push,
                   pull, exact),
               version, push, pull);
}

Dispatcher::Handle Dispatcher::Start(absl::StatusOr<std::vector<Shard>> shards, int64_t version,
                                     bool push, bool pull) {
  const char* kind = push && pull ? "PUSH_PULL" : push ? "PUSH" : "PULL";
  if (!shards.ok()) return ops.New(0, shards.status(), kind).first;
  auto [handle, op] = ops.New(static_cast<int>(shards->size()), absl::OkStatus(), kind);
  if (timeline != nullptr) DescribeOp(*shards, op.get());
  Launch(*std::move(shards), op, version, push, pull);
  return handle;
}

void Dispatcher::Launch(std::vector<Shard> shards, const std::shared_ptr<Op>& op, int64_t version,
                        bool push, bool pull, const std::function<void(Request*)>& adorn) {
  for (const Shard& shard : shards) {
    for (const Shard::Item& it : shard.items) {
      if (push) counters.Pushed(it.part.num_elements * BytesPerValue(it.push_dtype));
      if (pull) counters.Pulled(it.part.num_elements * BytesPerValue(it.pull_dtype));
    }
  }
  const uint64_t push_id = push ? next_push_id.fetch_add(1) : 0;
  for (Shard& shard : shards) {
    auto r = std::make_shared<Request>();
    r->shard = std::move(shard);
    r->op = op;
    r->push = push;
    r->pull = pull;
    r->push_id = push_id;
    r->version = version;
    r->await_step = r->shard.await_step;
    if (adorn) adorn(r.get());
    Enqueue(r);
  }
}

void Dispatcher::Enqueue(const std::shared_ptr<Request>& r) {
  calls.Begin();
  // A registration holds no place in a window: it goes out at once, never
  // behind a sync push-pull whose pull waits for workers that may wait for
  // this registration.
  if (r->keys != nullptr) return Send(r);
  std::function<void()> send = [this, r] { Send(r); };
  if (r->push && r->shard.bytes >= kPoolBytes)
    send = [this, r] { pool->Schedule([this, r] { Send(r); }); };
  if (timeline != nullptr) r->queued_us = timeline->NowMicros();
  if (std::function<void()> now = windows->Enter(r, std::move(send))) now();
}

Dispatcher::Handle Dispatcher::StartRegister(
    std::vector<Registration> regs, std::string tensors, int64_t bytes,
    std::function<absl::Status(int server, const v1::RegisterKeysResponse&)> answered) {
  auto [handle, op] = ops.New(static_cast<int>(regs.size()), absl::OkStatus(), "REGISTER");
  if (timeline != nullptr) {
    op->tensors = std::move(tensors);
    op->bytes = bytes;
  }
  for (Registration& reg : regs) {
    auto r = std::make_shared<Request>();
    r->shard.server = reg.server;
    r->op = op;
    r->keys = std::move(reg.keys);
    if (answered) {
      const Request* self = r.get();  // not the shared pointer: r would hold itself
      r->finished = [answered, self](const absl::Status& s) {
        return s.ok() ? answered(self->shard.server, self->registered) : s;
      };
    }
    Enqueue(r);
  }
  return handle;
}

Dispatcher::Windows::Windows(int servers, Timeline* timeline)
    : queues_(std::make_unique<Queue[]>(servers)), timeline_(timeline) {
  if (timeline_ == nullptr) return;
  for (int s = 0; s < servers; ++s) {
    absl::MutexLock lock(&queues_[s].mu);
    for (int k = kWindow - 1; k >= 0; --k) queues_[s].free_streams.push_back(k);
  }
}

std::function<void()> Dispatcher::Windows::Enter(const std::shared_ptr<Request>& r,
                                                 std::function<void()> send) {
  Queue& q = queues_[r->shard.server];
  absl::MutexLock lock(&q.mu);
  if (q.in_flight == kWindow) {
    q.waiting.emplace_back(r, std::move(send));
    return nullptr;
  }
  ++q.in_flight;
  if (timeline_ != nullptr) {
    r->stream = q.free_streams.back();
    q.free_streams.pop_back();
    r->started_us = timeline_->NowMicros();
  }
  return send;
}

std::function<void()> Dispatcher::Windows::Leave(const Request& r) {
  Queue& q = queues_[r.shard.server];
  absl::MutexLock lock(&q.mu);
  if (q.waiting.empty()) {
    --q.in_flight;
    if (timeline_ != nullptr) q.free_streams.push_back(r.stream);
    return nullptr;
  }
  auto [waiting, send] = std::move(q.waiting.front());
  q.waiting.pop_front();
  if (timeline_ != nullptr) {
    waiting->stream = r.stream;
    waiting->started_us = timeline_->NowMicros();
  }
  return send;
}

void Dispatcher::Send(const std::shared_ptr<Request>& r) {
  r->target = Route(r->shard.server);
  r->target_moves = servers->Moves(r->target);
  if (r->keys != nullptr) {
    if (r->attempts == 0) r->start = absl::Now();
    return Attempt(r);
  }
  if (r->await_step) {
    const Shard::Item& it = r->shard.items.front();
    OutKey k;
    k.variable = it.variable;
    k.partition = it.part.index;
    k.version = r->version;
    k.dtype = it.pull_dtype;
    r->req = EncodePullRequest(options.rank, {k});
    if (r->attempts == 0) r->start = absl::Now();
    return Attempt(r);
  }
  r->lease = Take(r->target);
  absl::StatusOr<std::vector<OutKey>> keys =
      Encode(r->shard, r->version, r->push, r->pull, &r->lease);
  if (!keys.ok()) {
    SharedSlots::Give(&r->lease, true);  // nothing was sent
    return Finish(r, keys.status());
  }
  const int rank = options.rank;
  r->req = r->push && r->pull ? EncodePushPullRequest(rank, r->push_id, *keys, r->also_for)
           : r->push ? EncodePushRequest(rank, r->push_id, *keys, r->also_for, r->assign_rows)
                     : EncodePullRequest(rank, *keys);
  if (r->attempts == 0) r->start = absl::Now();
  Attempt(r);
}

void Dispatcher::Attempt(const std::shared_ptr<Request>& r) {
  ++r->attempts;
  if (!calls.Add(nullptr)) return Finish(r, absl::CancelledError("the client is closing"));
  if (r->keys != nullptr) return AttemptRegister(r);
  const FrameKind kind = r->await_step        ? FrameKind::kPull
                         : r->push && r->pull ? FrameKind::kPushPull
                         : r->push            ? FrameKind::kPush
                                              : FrameKind::kPull;
  r->resp.Clear();
  r->ctx.reset();
  r->stub = servers->DataStub(r->target, r->target_moves, &r->channel);
  if (r->stub == nullptr) {
    SharedSlots::Give(&r->lease, false);
    return Send(r);
  }
  if (r->channel != nullptr) {
    return r->channel->Call(kind, r->req, options.rpc_timeout, &r->resp,
                            [this, r](grpc::Status st) { Answered(r, std::move(st)); });
  }
  r->ctx = std::make_unique<grpc::ClientContext>();
  PrepareContext(r->ctx.get(), options.token, options.rpc_timeout);
  if (!calls.Add(r->ctx.get())) return Finish(r, absl::CancelledError("the client is closing"));
  const std::string& method = kind == FrameKind::kPushPull ? kPushPullMethod
                              : kind == FrameKind::kPush   ? kPushMethod
                                                           : kPullMethod;
  r->stub->UnaryCall(r->ctx.get(), method, grpc::StubOptions(), &r->req, &r->resp,
                     [this, r](grpc::Status st) { Answered(r, std::move(st)); });
}

void Dispatcher::AttemptRegister(const std::shared_ptr<Request>& r) {
  // A blocking call on the pool: on gRPC's callback API the control
  // channel's last release could hold the process's exit for seconds after
  // its heartbeats stopped, past the coordinator's heartbeat timeout.
  pool->Schedule([this, r] {
    r->registered.Clear();
    r->ctx = std::make_unique<grpc::ClientContext>();
    PrepareContext(r->ctx.get(), options.token, options.rpc_timeout);
    if (!calls.Add(r->ctx.get())) return Finish(r, absl::CancelledError("the client is closing"));
    grpc::Status st = Stub(r->shard.server)->RegisterKeys(r->ctx.get(), *r->keys, &r->registered);
    Answered(r, std::move(st));
  });
}

void Dispatcher::Answered(const std::shared_ptr<Request>& r, grpc::Status st) {
  if (r->ctx != nullptr) calls.Remove(r->ctx.get());
  if (st.ok()) {
    if (r->await_step) {
      // The server has applied the step before: now the push itself.
      r->await_step = false;
      r->attempts = 0;
      r->backoff = absl::Milliseconds(50);
      if (r->shard.bytes >= kPoolBytes) return pool->Schedule([this, r] { Send(r); });
      return Send(r);
    }
    if (!r->pull) return Finish(r, absl::OkStatus());
    if (r->shard.bytes >= kPoolBytes) {
      return pool->Schedule([this, r] { Finish(r, Store(r->resp, r->shard, r->lease)); });
    }
    return Finish(r, Store(r->resp, r->shard, r->lease));
  }
  if (!Retry(st, r->start, r->backoff)) {
    return Finish(r, CallError(r->shard.server, r->what(), st, r->attempts, r->start));
  }
  pool->Schedule([this, r] {
    // Sooner when its keys move meanwhile (a failover, or a server that
    // joins or leaves): the new route is tried at once.
    const absl::Time until = absl::Now() + r->backoff;
    while (absl::Now() < until && Route(r->shard.server) == r->target) {
      absl::SleepFor(std::min(absl::Milliseconds(10), until - absl::Now()));
    }
    r->backoff = std::min(r->backoff * 2, absl::Seconds(1));
    // The same request again (a push keeps its id), unless its keys moved
    // to the backup: then encoded again for it (Attempt does the same when
    // the server moved to a new process).
    if (Route(r->shard.server) == r->target) return Attempt(r);
    SharedSlots::Give(&r->lease, false);
    Send(r);
  });
}

void Dispatcher::Finish(const std::shared_ptr<Request>& r, const absl::Status& s) {
  SharedSlots::Give(&r->lease, s.ok());
  // A registration shows as its operation's WAIT alone.
  if (timeline != nullptr && r->keys == nullptr) TraceRequest(*r, s);
  EndPart(r->op.get(), r->finished ? r->finished(s) : s);
  // Its turn: this one's place in the window (a registration held none).
  if (r->keys != nullptr) return calls.End();
  if (std::function<void()> next = windows->Leave(*r)) next();
  calls.End();
}

void Dispatcher::Continue(const std::shared_ptr<Op>& op, absl::StatusOr<Requests> next) {
  if (!next.ok()) return EndPart(op.get(), next.status());
  OpTracker::Add(op.get(), static_cast<int>(next->shards.size()));
  Launch(std::move(next->shards), op, next->version, next->push, next->pull, next->adorn);
  EndPart(op.get(), absl::OkStatus());
}

void Dispatcher::DescribeOp(const std::vector<Shard>& shards, Op* op) {
  std::vector<std::string> names;
  for (const Shard& shard : shards) {
    op->bytes += shard.bytes;
    for (const Shard::Item& it : shard.items) {
      if (names.empty() || names.back() != it.variable) names.push_back(it.variable);
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  op->tensors = JsonNames(names);
}

void Dispatcher::TraceRequest(const Request& r, const absl::Status& s) {
  const int64_t end = timeline->NowMicros();
  const int64_t track = kStreamTrackBase + int64_t{r.shard.server} * kWindow + r.stream;
  timeline->NameTrack(track, absl::StrCat("server ", r.shard.server, " stream ", r.stream));
  std::vector<std::string> keys;
  keys.reserve(r.shard.items.size());
  for (const Shard::Item& it : r.shard.items) keys.push_back(KeyName(it.variable, it.part.index));
  timeline->Complete(
      r.kind(), track, r.started_us, end,
      absl::StrCat("\"handle\":", r.op->handle, ",\"server\":", r.target,
                   ",\"keys\":", JsonNames(keys), ",\"bytes\":", r.shard.bytes,
                   ",\"request_bytes\":", r.req.Length(), ",\"response_bytes\":", r.resp.Length(),
                   ",\"version\":", r.version, ",\"attempts\":", r.attempts,
                   ",\"queued_us\":", r.started_us - r.queued_us,
                   ",\"status\":", JsonString(s.ok() ? "OK" : s.ToString())));
}

void Dispatcher::TraceWait(Handle handle, const Op* op, int64_t start, const absl::Status& s) {
  const int64_t end = timeline->NowMicros();
  const int64_t track = ThisThreadId();
  timeline->NameTrack(track, absl::StrCat("waits (thread ", track, ")"));
  std::string args = absl::StrCat("\"handle\":", handle);
  if (op != nullptr) {
    absl::StrAppend(&args, ",\"op\":", JsonString(op->kind));
    if (!op->tensors.empty())
      absl::StrAppend(&args, ",\"tensors\":", op->tensors, ",\"bytes\":", op->bytes);
  }
  absl::StrAppend(&args, ",\"status\":", JsonString(s.ok() ? "OK" : s.ToString()));
  timeline->Complete("WAIT", track, start, end, args);
}

absl::Status Dispatcher::Wait(Handle handle, std::shared_ptr<Op>* found) {
  const absl::Duration expected = options.rpc_timeout + options.retry_budget;
  return ops.Wait(
      handle, absl::Now() + expected + absl::Seconds(5), expected, [this] { return JobStatus(); },
      found);
}

}  // namespace psrt
