#include "worker/client.h"

#include <grpcpp/generic/generic_stub.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/buffer_pool.h"
#include "common/compression.h"
#include "common/optimizer_proto.h"
#include "common/coordinator_link.h"
#include "common/daemon.h"
#include "common/data_channel.h"
#include "common/failpoint.h"
#include "common/grpc_util.h"
#include "common/key_map.h"
#include "common/logging.h"
#include "common/shared_memory.h"
#include "common/tensor_coding.h"
#include "common/thread_pool.h"
#include "kernels/row_optimizer.h"
#ifdef PSRT_HAVE_CUDA
#include "kernels/cuda_kernels.h"
#endif
#include "psrt/v1/ps.grpc.pb.h"
#include "worker/op_tracker.h"
#include "worker/request_codec.h"
#include "worker/server_links.h"
#include "worker/timeline.h"

namespace psrt {

absl::StatusOr<ClientOptions> ClientOptions::FromEnv() {
  ClientOptions o;
  o.coordinator = EnvOr("PSRT_COORDINATOR", "");
  o.token = EnvOr("PSRT_JOB_TOKEN", "");
  o.host = EnvOr("PSRT_HOST", HostName());
  if (o.coordinator.empty()) {
    return absl::FailedPreconditionError(
        "PSRT_COORDINATOR is not set; start training processes with psrt-run");
  }
  // The training process's client logs at the job's level (psrt-run sets it).
  absl::StatusOr<LogLevel> level = LogLevelFromEnv();
  if (!level.ok()) return absl::FailedPreconditionError(level.status().message());
  const std::string rank = EnvOr("PSRT_RANK", "");
  if (!absl::SimpleAtoi(rank, &o.rank) || o.rank < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PSRT_RANK must be a rank >= 0; got '", rank, "'"));
  }
  const std::string timeout = EnvOr("PSRT_RPC_TIMEOUT_S", "");
  double seconds = 0;
  if (!timeout.empty()) {
    if (!absl::SimpleAtod(timeout, &seconds) || seconds <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "PSRT_RPC_TIMEOUT_S must be a number of seconds > 0; got '", timeout, "'"));
    }
    o.rpc_timeout = absl::Seconds(seconds);
  }
  const std::string generation = EnvOr("PSRT_GENERATION", "0");
  if (!absl::SimpleAtoi(generation, &o.generation) || o.generation < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PSRT_GENERATION must be a job generation >= 0 (psrt-worker sets it); got '", generation, "'"));
  }
  const std::string connections = EnvOr("PSRT_CONNECTIONS_PER_SERVER", "");
  if (!connections.empty() && (!absl::SimpleAtoi(connections, &o.connections_per_server) ||
                               o.connections_per_server < 1 || o.connections_per_server > 64)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PSRT_CONNECTIONS_PER_SERVER must be a number of connections in 1..64; got '", connections,
        "'"));
  }
  o.timeline = EnvOr("PSRT_TIMELINE", "");
  SetLogLevel(*level);
  return o;
}

OptimizerConfig DefaultOptimizer(OptimizerKind kind, double lr) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = lr;
  if (kind == OptimizerKind::kAdaGrad) c.eps = 1e-10;
  if (kind == OptimizerKind::kAdamW) c.weight_decay = 1e-2;
  return c;
}

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

// Up to `limit` names as a JSON array, and how many more there were.
std::string JsonNames(const std::vector<std::string>& names, size_t limit = 8) {
  std::string out = "[";
  for (size_t i = 0; i < names.size() && i < limit; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ",", JsonString(names[i]));
  }
  if (names.size() > limit) absl::StrAppend(&out, ",", JsonString(absl::StrCat("... ", names.size() - limit, " more")));
  return out + "]";
}


}  // namespace

class Client::Impl {
 public:
  // Cancels calls in flight, so a process that gives up (the job failed, a
  // server is gone) exits at once instead of waiting out their deadlines.
  ~Impl() {
    absl::MutexLock lock(&calls_mu);
    closing = true;
    for (grpc::ClientContext* ctx : live_calls) ctx->TryCancel();
    // Data calls end asynchronously, on gRPC's threads: wait until none
    // will touch this object again (cancelled, they end at once).
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu) { return requests == 0; };
    // Data channels end their calls on their own threads (CANCELLED).
    if (servers != nullptr) servers->Close();
    calls_mu.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
    calls_mu.Unlock();
    pool.reset();  // joins its threads while everything they use still exists
    link.reset();  // its heartbeat thread follows the shard map into the members below
    calls_mu.Lock();
  }

  // First member: destroyed last, once no request can write to it.
  std::unique_ptr<Timeline> timeline;
  absl::Mutex calls_mu;
  bool closing ABSL_GUARDED_BY(calls_mu) = false;
  absl::flat_hash_set<grpc::ClientContext*> live_calls ABSL_GUARDED_BY(calls_mu);
  int requests ABSL_GUARDED_BY(calls_mu) = 0;  // data requests not yet finished
  ClientOptions options;
  v1::JobConfig config;
  // Before `link`, whose heartbeat thread sets them until the link is gone.
  std::atomic<int> active_workers{0};
  // `servers` once made: the shard maps the link's heartbeats bring go there.
  std::atomic<ServerLinks*> servers_ready{nullptr};
  std::unique_ptr<CoordinatorLink> link;
  int num_servers = 0;
  BufferPool buffers;  // compressed gradients on their way out
  // Requests in flight to one server at most; more wait their turn, so a
  // huge tensor does not put hundreds of requests on the wire at once (and
  // every request in flight finds a shared slot).
  static constexpr int kWindow = 8;
  struct Request;
  struct Queue {
    absl::Mutex mu;
    int in_flight ABSL_GUARDED_BY(mu) = 0;
    // Each waiting request and what sends it.
    std::deque<std::pair<std::shared_ptr<Request>, std::function<void()>>> waiting ABSL_GUARDED_BY(mu);
    // With a timeline: the streams (tracks) no request in flight holds.
    std::vector<int> free_streams ABSL_GUARDED_BY(mu);
  };
  std::unique_ptr<Queue[]> queues;  // per server
  // Shared memory with each server on this host (null: TCP): a region of
  // kSharedSlots slots of kRequestBytes, one per request in flight.
  struct SharedLink {
    std::unique_ptr<SharedRegion> region;
    uint64_t id = 0;
    absl::Mutex mu;
    std::vector<int> free_slots ABSL_GUARDED_BY(mu);
  };
  static constexpr int kSharedSlots = kWindow;
  std::vector<std::unique_ptr<SharedLink>> shared;
  std::unique_ptr<ThreadPool> pool;
  absl::Mutex mu;
  absl::flat_hash_map<std::string, Variable> variables ABSL_GUARDED_BY(mu);
  OpTracker ops;
  // Push ids grow across restarts of this rank: they start at the clock.
  // What the job's summary says of this process (Stats, asked for by the link).
  std::atomic<int64_t> bytes_pushed{0}, bytes_pulled{0}, pull_wait_us{0};
  const absl::Time connected = absl::Now();
  v1::WorkerStats Stats() const {
    v1::WorkerStats stats;
    stats.set_bytes_pushed(bytes_pushed.load());
    stats.set_bytes_pulled(bytes_pulled.load());
    stats.set_wait_seconds(pull_wait_us.load() / 1e6);
    stats.set_seconds(absl::ToDoubleSeconds(absl::Now() - connected));
    return stats;
  }
  std::atomic<uint64_t> next_push_id{static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())) << 20};
  // The servers' links, their data channels among them. Last: destroyed
  // first, so the channels' threads' last callbacks find everything else.
  std::unique_ptr<ServerLinks> servers;


  int Route(int s) const { return servers->Route(s); }
  std::vector<int> OnePerServer(const std::vector<char>& holds) const {
    return servers->OnePerServer(holds);
  }
  std::shared_ptr<v1::ParameterServer::Stub> Stub(int s) const { return servers->Stub(s); }
  std::string Address(int s) const { return servers->Address(s); }
  void FollowShardMap(const v1::ShardMap& map) {
    if (ServerLinks* l = servers_ready.load(std::memory_order_acquire)) l->FollowShardMap(map);
  }

  absl::StatusOr<Variable> Find(const std::string& name) {
    absl::MutexLock lock(&mu);
    auto it = variables.find(name);
    if (it == variables.end()) {
      return absl::NotFoundError(absl::StrCat("variable '", name, "' is not registered"));
    }
    return it->second;
  }

  // ABORTED with the coordinator's reason once the job has failed.
  absl::Status JobStatus() const {
    CoordinatorLink::JobEnd end = link->state();
    if (end.state != v1::JOB_FAILED) return absl::OkStatus();
    return absl::AbortedError(absl::StrCat("the job failed: ", end.reason));
  }

  // Runs `rpc` against server `s`, retrying while the server is unreachable
  // (the request is resent unchanged, so a push keeps its id).
  absl::Status Call(int s, const char* what,
                    const std::function<grpc::Status(grpc::ClientContext*)>& rpc) {
    const absl::Time start = absl::Now();
    absl::Duration backoff = absl::Milliseconds(50);
    int attempts = 0;
    while (true) {
      ++attempts;
      grpc::ClientContext ctx;
      PrepareContext(&ctx, options.token, options.rpc_timeout);
      {
        absl::MutexLock lock(&calls_mu);
        if (closing) return absl::CancelledError("the client is closing");
        live_calls.insert(&ctx);
      }
      grpc::Status st = rpc(&ctx);
      {
        absl::MutexLock lock(&calls_mu);
        live_calls.erase(&ctx);
      }
      if (st.ok()) return absl::OkStatus();
      if (!Retry(st, start, backoff)) return CallError(s, what, st, attempts, start);
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(1));
    }
  }

  // Whether a failed call is tried again after `backoff`: only a server that
  // could not be reached, within the retry budget, while the job runs.
  bool Retry(const grpc::Status& st, absl::Time start, absl::Duration backoff) const {
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
    return st.error_code() == grpc::StatusCode::UNAVAILABLE && absl::Now() - start + backoff < budget &&
           JobStatus().ok();
  }

  absl::Status CallError(int s, const char* what, const grpc::Status& st, int attempts,
                         absl::Time start) const {
    return absl::Status(
        static_cast<absl::StatusCode>(st.error_code()),
        absl::StrCat(what, " to server ", Route(s), " at ", Address(Route(s)), " failed after ", attempts,
                     attempts == 1 ? " attempt" : " attempts", " in ",
                     absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))),
                     ": ", st.error_message(),
                     st.error_code() == grpc::StatusCode::UNAVAILABLE && TlsEnabled() ? kTlsHint : ""));
  }

  // Over a data channel a request carries at most this much (or one key):
  // the server applies one request while the next arrives and the one
  // before's answer leaves, where one big request would take its receipt,
  // update and answer in turn.
  static constexpr int64_t kChannelRequestBytes = 256 << 10;

  // The most a request to server `s` carries.
  int64_t RequestBytes(int s) {
    if (!shared.empty() && shared[s] != nullptr && servers->Moves(s) == 0) return kRequestBytes;
    return servers->HasDataChannel(s) ? kChannelRequestBytes : kRequestBytes;
  }


  // A slot of a server's shared region, held by one request.
  struct Lease {
    SharedLink* link = nullptr;
    int slot = -1;
    char* base() const { return link->region->data() + offset(); }
    int64_t offset() const { return static_cast<int64_t>(slot) * kRequestBytes; }
  };

  // A free slot for a request to `server`, if it shares memory with it.
  Lease Take(int server) {
    Lease l;
    if (servers->Moves(server) > 0) return l;  // not the process the region was given to
    SharedLink* link = shared.empty() ? nullptr : shared[server].get();
    if (link == nullptr) return l;
    absl::MutexLock lock(&link->mu);
    if (link->free_slots.empty()) return l;  // all busy: this one goes by TCP
    l.link = link;
    l.slot = link->free_slots.back();
    link->free_slots.pop_back();
    return l;
  }

  // Gives a slot back after its call ended well. After a failed call the
  // server might still write into it, so it is never used again.
  static void Give(Lease* l, bool ok) {
    if (l->link == nullptr) return;
    if (ok) {
      absl::MutexLock lock(&l->link->mu);
      l->link->free_slots.push_back(l->slot);
    }
    l->link = nullptr;
  }

  // Offers each server on this host a shared region (servers elsewhere
  // cannot open it) and says in one line which servers it is used with.
  void ShareMemory() {
    shared.resize(num_servers);
    std::vector<int> with;
    std::string why_not;
    for (int s = 0; s < num_servers; ++s) {
      if (Address(s).empty()) continue;  // joins later
      absl::StatusOr<std::unique_ptr<SharedRegion>> region =
          SharedRegion::Create(kSharedSlots * kRequestBytes);
      absl::Status st = region.status();
      v1::AttachSharedMemoryResponse resp;
      if (st.ok()) {
        v1::AttachSharedMemoryRequest req;
        req.set_worker_rank(options.rank);
        req.set_name((*region)->name());
        req.set_size(static_cast<int64_t>((*region)->size()));
        st = Call(static_cast<int>(s), "attach-shared-memory", [&](grpc::ClientContext* ctx) {
          return Stub(s)->AttachSharedMemory(ctx, req, &resp);
        });
        Failpoint("shared_memory.offered");  // drills: the name left in /dev/shm
        (*region)->Unlink();  // attached or not, nobody else may open it now
        // Its pages only now: a server on another host cost nothing above.
        if (st.ok()) st = (*region)->Reserve();
      }
      if (!st.ok()) {
        if (why_not.empty()) why_not = std::string(st.message());
        continue;
      }
      auto link = std::make_unique<SharedLink>();
      link->region = *std::move(region);
      link->id = resp.region();
      for (int i = kSharedSlots - 1; i >= 0; --i) link->free_slots.push_back(i);
      shared[s] = std::move(link);
      with.push_back(static_cast<int>(s));
    }
    if (static_cast<int>(with.size()) == num_servers) {
      LogInfo("worker ", options.rank, ": tensors travel through shared memory with every server");
    } else {
      LogInfo("worker ", options.rank, ": ",
              with.empty() ? "TCP with every server"
                           : absl::StrCat("shared memory with servers ", absl::StrJoin(with, ", "),
                                          ", TCP with the others"),
              " (", why_not, ")");
    }
  }


  // The request for one shard. With a shared-memory slot, values are
  // written into it (converted on the way) and each key reserves room for
  // its answer; otherwise float32 gradients in host memory go out from
  // where they lie and compressed (or GPU) ones through a pooled buffer.
  absl::StatusOr<std::vector<OutKey>> Encode(const Shard& shard, int64_t version, bool push,
                                             bool pull, Lease* lease) {
    if (lease->link != nullptr) {
      int64_t room = 0;
      for (const Shard::Item& it : shard.items) room += Room(it, push, pull);
      if (room > kRequestBytes) Give(lease, true);  // one key larger than a slot: TCP
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
      if (lease->link != nullptr) {
        k.has_shared = true;
        k.shared.region = lease->link->id;
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
      const float* grad = it.grad + it.part.offset;
      const int64_t n = it.part.num_elements;
      k.size = n * BytesPerValue(it.push_dtype);
      char* out;
      if (lease->link != nullptr) {
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

  // Bytes a key takes in a shared slot: its values, and room for the answer
  // (which goes where the values were).
  static int64_t Room(const Shard::Item& it, bool push, bool pull) {
    const int64_t n = it.part.num_elements;
    return std::max(push ? n * BytesPerValue(it.push_dtype) : 0,
                    pull ? n * BytesPerValue(it.pull_dtype) : 0);
  }

  // Writes a pull's answer into the shard's output tensors.
  absl::Status Store(const grpc::ByteBuffer& resp, const Shard& shard, const Lease& lease) {
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
      if (lease.link == nullptr || kd.shared.region != lease.link->id ||
          kd.shared.offset < lease.offset() || kd.shared.size < 0 ||
          kd.shared.size > lease.offset() + kRequestBytes - kd.shared.offset) {
        s = absl::InternalError(absl::StrCat("server answered key '", KeyName(kd.variable, kd.partition),
                                             "' in shared memory outside the request's slot"));
        break;
      }
      kd.data.Add(absl::string_view(lease.link->region->data() + kd.shared.offset, kd.shared.size));
    }
    for (size_t i = 0; s.ok() && i < got.keys.size(); ++i) {
      const WireKey& kd = got.keys[i];
      const Shard::Item& it = shard.items[i];
      const int64_t expected = it.part.num_elements * BytesPerValue(kd.dtype);
      if (expected == 0 || kd.data.size() != expected) {
        s = absl::InternalError(absl::StrCat(
            "server sent ", kd.data.size(), " bytes of dtype ", kd.dtype, " for key '",
            KeyName(kd.variable, kd.partition), "'; expected ", expected));
        break;
      }
      if (it.rows == nullptr) {
        s = DecodeWeights(kd, it.out + it.part.offset, it.part.num_elements);
        continue;
      }
      ScatterRows(kd, *it.rows, it.dim, it.out);
    }
    if (s.ok()) {
      absl::MutexLock lock(&mu);
      for (const WireKey& kd : got.keys) {
        auto it = variables.find(kd.variable);
        if (it != variables.end() && kd.partition < it->second.pulled_versions.size()) {
          it->second.pulled_versions[kd.partition] = kd.version;
        }
      }
    }
    got.slices.clear();  // the received buffers go back now
    return s;
  }

  // One shard of an operation on its way: a request to one server.
  struct Request {
    Shard shard;
    std::shared_ptr<Op> op;
    bool push = false, pull = false;
    // A sync table push to a server whose part this worker has not pulled
    // at `version`: first a pull of no rows at `version`, which the server
    // answers once the step before is applied there; then the push (sent
    // earlier, it would be refused as ahead of its key).
    bool await_step = false;
    uint64_t push_id = 0;
    int64_t version = 0;
    Lease lease;
    grpc::ByteBuffer req, resp;
    std::unique_ptr<grpc::ClientContext> ctx;
    absl::Time start;
    absl::Duration backoff = absl::Milliseconds(50);
    int attempts = 0;
    int target = 0;  // the server it goes to: Route(shard.server) when encoded
    int target_moves = 0;  // servers->Moves(target) then
    std::shared_ptr<grpc::GenericStub> stub;  // of the attempt in flight
    std::shared_ptr<DataChannel> channel;      // its data channel (null: gRPC)
    // With a timeline: when it was made and got a place in the window, and
    // the stream (track) it holds meanwhile.
    int64_t queued_us = 0, started_us = 0;
    int stream = -1;
    const char* what() const { return push && pull ? "push-pull" : push ? "push" : "pull"; }
    const char* kind() const { return push && pull ? "PUSH_PULL" : push ? "PUSH" : "PULL"; }
  };

  // Shards at least this big are encoded and decoded on the pool (in
  // parallel, and off gRPC's threads); smaller ones where they are, which
  // saves a thread hand-off each way.
  static constexpr int64_t kPoolBytes = 256 << 10;

  // `exact`: pull float32 whatever the variable's pull compression.
  Handle Start(std::vector<TensorRef> tensors, int64_t version, bool push, bool pull,
               bool exact = false) {
    std::vector<int64_t> limits(num_servers);
    for (int s = 0; s < num_servers; ++s) limits[s] = RequestBytes(s);
    return Start(SplitTensors(
                     tensors, [this](const std::string& name) { return Find(name); }, limits, push,
                     pull, exact),
                 version, push, pull);
  }

  // A table's push or pull, split by the server each id's row lives on. A
  // sync push goes to every server, with no rows for some: each counts
  // every worker's push for the step. A pull skips the servers with none of
  // its ids, so a worker may not have seen a server reach the step it
  // pushes for (another worker's push of the step before may still be on
  // its way there): that part of the push waits for the step first
  // (Request::await_step).
  Handle StartRows(const std::string& table, const int64_t* ids, int64_t n, const float* grads,
                   float* out, int64_t version, bool push) {
    absl::StatusOr<Variable> var = Find(table);
    if (!var.ok()) return ops.New(0, var.status()).first;
    if (var->dim == 0) {
      return ops.New(0, absl::InvalidArgumentError(absl::StrCat("variable '", table, "' is not a table"))).first;
    }
    if (n < 0 || (n > 0 && (ids == nullptr || (push ? grads == nullptr : out == nullptr)))) {
      return ops.New(0, absl::InvalidArgumentError(absl::StrCat("table '", table, "': ", n,
                                                               " ids without their buffers")))
          .first;
    }
    const int64_t dim = var->dim;
    std::vector<std::shared_ptr<RowSet>> sets(num_servers);
    for (auto& set : sets) set = std::make_shared<RowSet>();
    for (int64_t i = 0; i < n; ++i) {
      RowSet& set = *sets[RowShard(ids[i], num_servers)];
      set.ids.push_back(ids[i]);
      set.at.push_back(i);
      if (push) set.grads.insert(set.grads.end(), grads + i * dim, grads + (i + 1) * dim);
    }
    std::vector<bool> await(num_servers, false);
    if (push && config.mode() == "sync") {
      absl::MutexLock lock(&mu);
      auto found = variables.find(table);
      for (int s = 0; s < num_servers; ++s) {
        await[s] = found == variables.end() ||
                   s >= static_cast<int>(found->second.pulled_versions.size()) ||
                   found->second.pulled_versions[s] < version;
      }
    }
    std::vector<Shard> shards;
    for (int s = 0; s < num_servers; ++s) {
      const RowSet& set = *sets[s];
      if (!push && set.ids.empty()) continue;  // nothing to get there
      Shard& shard = shards.emplace_back();
      shard.server = s;
      Shard::Item& it = shard.items.emplace_back();
      it.variable = table;
      it.part.index = static_cast<uint32_t>(s);
      it.part.server = s;
      it.part.num_elements = static_cast<int64_t>(set.ids.size()) * dim;
      shard.bytes = it.part.num_elements * 4;
      it.grad = set.grads.data();
      it.out = out;
      it.push_dtype = var->push_dtype;
      it.pull_dtype = var->pull_dtype;
      it.rows = sets[s];
      it.dim = dim;
      shard.await_step = await[s];
    }
    return Start(std::move(shards), version, push, !push);
  }

  Handle Start(absl::StatusOr<std::vector<Shard>> shards, int64_t version, bool push, bool pull) {
    const char* kind = push && pull ? "PUSH_PULL" : push ? "PUSH" : "PULL";
    if (!shards.ok()) return ops.New(0, shards.status(), kind).first;
    auto [handle, op] = ops.New(static_cast<int>(shards->size()), absl::OkStatus(), kind);
    if (timeline != nullptr) DescribeOp(*shards, op.get());
    for (const Shard& shard : *shards) {
      for (const Shard::Item& it : shard.items) {
        if (push) bytes_pushed += it.part.num_elements * BytesPerValue(it.push_dtype);
        if (pull) bytes_pulled += it.part.num_elements * BytesPerValue(it.pull_dtype);
      }
    }
    const uint64_t push_id = push ? next_push_id.fetch_add(1) : 0;
    for (Shard& shard : *shards) {
      auto r = std::make_shared<Request>();
      r->shard = std::move(shard);
      r->op = op;
      r->push = push;
      r->pull = pull;
      r->push_id = push_id;
      r->version = version;
      r->await_step = r->shard.await_step;
      {
        absl::MutexLock lock(&calls_mu);
        ++requests;
      }
      std::function<void()> send = [this, r] { Send(r); };
      if (push && r->shard.bytes >= kPoolBytes) send = [this, r] { pool->Schedule([this, r] { Send(r); }); };
      Queue& q = queues[r->shard.server];
      if (timeline != nullptr) r->queued_us = timeline->NowMicros();
      {
        absl::MutexLock lock(&q.mu);
        if (q.in_flight == kWindow) {
          q.waiting.emplace_back(r, std::move(send));
          continue;
        }
        ++q.in_flight;
        if (timeline != nullptr) {
          r->stream = q.free_streams.back();
          q.free_streams.pop_back();
          r->started_us = timeline->NowMicros();
        }
      }
      send();
    }
    return handle;
  }

  // Encodes the request and makes its first attempt.
  void Send(const std::shared_ptr<Request>& r) {
    r->target = Route(r->shard.server);
    r->target_moves = servers->Moves(r->target);
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
    absl::StatusOr<std::vector<OutKey>> keys = Encode(r->shard, r->version, r->push, r->pull, &r->lease);
    if (!keys.ok()) {
      Give(&r->lease, true);  // nothing was sent
      return Finish(r, keys.status());
    }
    const int rank = options.rank;
    r->req = r->push && r->pull ? EncodePushPullRequest(rank, r->push_id, *keys)
             : r->push          ? EncodePushRequest(rank, r->push_id, *keys)
                                : EncodePullRequest(rank, *keys);
    if (r->attempts == 0) r->start = absl::Now();
    Attempt(r);
  }

  // One attempt, over the data channel or on gRPC's callback API: no thread
  // waits for the answer.
  void Attempt(const std::shared_ptr<Request>& r) {
    ++r->attempts;
    {
      absl::MutexLock lock(&calls_mu);
      if (closing) return Finish(r, absl::CancelledError("the client is closing"));
    }
    const FrameKind kind = r->await_step        ? FrameKind::kPull
                           : r->push && r->pull ? FrameKind::kPushPull
                           : r->push            ? FrameKind::kPush
                                                : FrameKind::kPull;
    r->resp.Clear();
    r->ctx.reset();
    r->stub = servers->DataStub(r->target, r->target_moves, &r->channel);
    if (r->stub == nullptr) {
      Give(&r->lease, false);
      return Send(r);
    }
    if (r->channel != nullptr) {
      return r->channel->Call(kind, r->req, options.rpc_timeout, &r->resp,
                              [this, r](grpc::Status st) { Answered(r, std::move(st)); });
    }
    r->ctx = std::make_unique<grpc::ClientContext>();
    PrepareContext(r->ctx.get(), options.token, options.rpc_timeout);
    {
      absl::MutexLock lock(&calls_mu);
      if (closing) return Finish(r, absl::CancelledError("the client is closing"));
      live_calls.insert(r->ctx.get());
    }
    const std::string& method = kind == FrameKind::kPushPull ? kPushPullMethod
                                : kind == FrameKind::kPush   ? kPushMethod
                                                             : kPullMethod;
    r->stub->UnaryCall(r->ctx.get(), method, grpc::StubOptions(), &r->req, &r->resp,
                    [this, r](grpc::Status st) { Answered(r, std::move(st)); });
  }

  void Answered(const std::shared_ptr<Request>& r, grpc::Status st) {
    if (r->ctx != nullptr) {
      absl::MutexLock lock(&calls_mu);
      live_calls.erase(r->ctx.get());
    }
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
      Give(&r->lease, false);
      Send(r);
    });
  }

  void Finish(const std::shared_ptr<Request>& r, const absl::Status& s) {
    Give(&r->lease, s.ok());
    if (timeline != nullptr) TraceRequest(*r, s);
    OpTracker::Done(r->op.get(), s);
    std::function<void()> next;
    {
      Queue& q = queues[r->shard.server];
      absl::MutexLock lock(&q.mu);
      if (q.waiting.empty()) {
        --q.in_flight;
        if (timeline != nullptr) q.free_streams.push_back(r->stream);
      } else {
        auto& [waiting, send] = q.waiting.front();
        if (timeline != nullptr) {
          waiting->stream = r->stream;
          waiting->started_us = timeline->NowMicros();
        }
        next = std::move(send);
        q.waiting.pop_front();
      }
    }
    if (next) next();  // its turn: this one's place in the window
    absl::MutexLock lock(&calls_mu);
    --requests;
  }

  // The timeline's description of an operation, for its WAIT event.
  static void DescribeOp(const std::vector<Shard>& shards, Op* op) {
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

  // A request's event, from its place in the window to its end, on the
  // track of the stream it held.
  void TraceRequest(const Request& r, const absl::Status& s) {
    const int64_t end = timeline->NowMicros();
    const int64_t track = kStreamTrackBase + int64_t{r.shard.server} * kWindow + r.stream;
    timeline->NameTrack(track, absl::StrCat("server ", r.shard.server, " stream ", r.stream));
    std::vector<std::string> keys;
    keys.reserve(r.shard.items.size());
    for (const Shard::Item& it : r.shard.items) keys.push_back(KeyName(it.variable, it.part.index));
    timeline->Complete(
        r.kind(), track, r.started_us, end,
        absl::StrCat("\"handle\":", r.op->handle, ",\"server\":", r.target, ",\"keys\":", JsonNames(keys),
                     ",\"bytes\":", r.shard.bytes, ",\"request_bytes\":", r.req.Length(),
                     ",\"response_bytes\":", r.resp.Length(), ",\"version\":", r.version,
                     ",\"attempts\":", r.attempts, ",\"queued_us\":", r.started_us - r.queued_us,
                     ",\"status\":", JsonString(s.ok() ? "OK" : s.ToString())));
  }

  // A Wait call's event, on the waiting thread's track.
  void TraceWait(Handle handle, const Op* op, int64_t start, const absl::Status& s) {
    const int64_t end = timeline->NowMicros();
    const int64_t track = ThisThreadId();
    timeline->NameTrack(track, absl::StrCat("waits (thread ", track, ")"));
    std::string args = absl::StrCat("\"handle\":", handle);
    if (op != nullptr) {
      absl::StrAppend(&args, ",\"op\":", JsonString(op->kind));
      if (!op->tensors.empty()) absl::StrAppend(&args, ",\"tensors\":", op->tensors, ",\"bytes\":", op->bytes);
    }
    absl::StrAppend(&args, ",\"status\":", JsonString(s.ok() ? "OK" : s.ToString()));
    timeline->Complete("WAIT", track, start, end, args);
  }

  // Waits for the operation `handle` (its Op in *found, when there is one).
  // Each part ends within its RPC deadline and retry budget; the extra
  // margin only guards against a lost wake-up. A job that failed elsewhere
  // ends the wait at once, with the coordinator's reason.
  absl::Status Wait(Handle handle, std::shared_ptr<Op>* found) {
    const absl::Duration expected = options.rpc_timeout + options.retry_budget;
    return ops.Wait(handle, absl::Now() + expected + absl::Seconds(5), expected,
                    [this] { return JobStatus(); }, found);
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

void Client::Finish() { impl_->link->SendStats(); }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.coordinator.empty()) return absl::InvalidArgumentError("no coordinator address");
  if (options.rank < 0) return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " < 0"));
  if (options.connections_per_server < 1 || options.connections_per_server > 64) {
    return absl::InvalidArgumentError(absl::StrCat("connections_per_server must be 1..64; got ",
                                                   options.connections_per_server));
  }
  TuneForDataPath();
  if (absl::Status s = InitTransportSecurity(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("TLS: ", s.message()));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (!options.timeline.empty()) {
    absl::StatusOr<std::unique_ptr<Timeline>> timeline = Timeline::Open(options.timeline, options.rank);
    if (!timeline.ok()) return timeline.status();
    impl->timeline = *std::move(timeline);
  }
  CoordinatorLink::Options lo;
  lo.coordinator = options.coordinator;
  lo.token = options.token;
  lo.id.set_role(v1::ROLE_WORKER);
  lo.id.set_index(options.rank);
  lo.host = options.host;
  lo.generation = options.generation;
  lo.connect_timeout = options.connect_timeout;
  lo.on_membership = [impl = impl.get()](const v1::Membership& m) {
    impl->active_workers.store(m.active_workers_size(), std::memory_order_relaxed);
  };
  lo.on_shard_map = [impl = impl.get()](const v1::ShardMap& m) { impl->FollowShardMap(m); };
  lo.stats = [impl = impl.get()] { return impl->Stats(); };
  absl::StatusOr<std::unique_ptr<CoordinatorLink>> link = CoordinatorLink::Connect(lo);
  if (!link.ok()) return link.status();
  impl->link = std::move(*link);
  absl::StatusOr<v1::BarrierResponse> barrier = impl->link->Barrier();
  if (!barrier.ok()) return barrier.status();
  impl->config = barrier->config();
  impl->active_workers.store(barrier->membership().active_workers_size(), std::memory_order_relaxed);
  const int n = barrier->shard_map().server_addresses_size();
  if (n == 0) return absl::FailedPreconditionError("the shard map lists no servers");
  ServerLinks::Options links;
  links.rank = options.rank;
  links.token = options.token;
  links.connections = options.connections_per_server;
  links.rpc_timeout = options.rpc_timeout;
  links.data_channels = impl->config.transport() != "grpc" && !TlsEnabled();
  impl->servers = std::make_unique<ServerLinks>(links, barrier->shard_map());
  impl->servers_ready.store(impl->servers.get(), std::memory_order_release);
  impl->num_servers = n;
  impl->queues = std::make_unique<Impl::Queue[]>(n);
  if (impl->timeline != nullptr) {
    for (int s = 0; s < n; ++s) {
      absl::MutexLock lock(&impl->queues[s].mu);
      for (int k = Impl::kWindow - 1; k >= 0; --k) impl->queues[s].free_streams.push_back(k);
    }
  }
  if (impl->config.transport() == "auto") impl->ShareMemory();
  impl->servers->OpenDataChannels();
  // Enough threads for a request in flight on every connection.
  impl->pool = std::make_unique<ThreadPool>(
      std::max<int>(4, 2 * options.connections_per_server * n));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

int Client::rank() const { return impl_->options.rank; }
int Client::num_workers() const { return impl_->config.num_workers(); }
int Client::active_workers() const { return impl_->active_workers.load(std::memory_order_relaxed); }
int Client::num_servers() const { return impl_->num_servers; }
bool Client::sync() const { return impl_->config.mode() == "sync"; }
int64_t Client::restored_step() const { return impl_->config.restored_step(); }

absl::Status Client::RegisterVariable(const std::string& name, std::vector<int64_t> shape,
                                      float* data, const OptimizerConfig& optimizer,
                                      Compression push, Compression pull) {
  v1::DType push_dtype, pull_dtype;
  if (absl::Status s = WireDType(push, impl_->config.compression(), &push_dtype); !s.ok()) return s;
  if (absl::Status s = WireDType(pull, impl_->config.pull_compression(), &pull_dtype); !s.ok()) return s;
  if (data == nullptr) return absl::InvalidArgumentError(absl::StrCat("variable '", name, "' has no buffer"));
  if (absl::Status s = ValidateOptimizerConfig(optimizer); !s.ok()) return s;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("variable '", name, "' has a negative dimension"));
    n *= d;
  }
  absl::StatusOr<std::vector<Partition>> parts = PartitionVariable(
      name, n, 4, impl_->config.partition_bytes(), num_servers());
  if (!parts.ok()) return parts.status();
  {
    absl::MutexLock lock(&impl_->mu);
    auto [it, inserted] = impl_->variables.try_emplace(name);
    if (!inserted && it->second.num_elements != n) {
      return absl::AlreadyExistsError(absl::StrCat("variable '", name, "' is already registered with ",
                                                   it->second.num_elements, " elements"));
    }
    it->second.num_elements = n;
    it->second.parts = *parts;
    it->second.pulled_versions.assign(parts->size(), 0);
    it->second.push_dtype = push_dtype;
    it->second.pull_dtype = pull_dtype;
  }
  struct Batch {
    int server = 0;
    int64_t bytes = 0;
    std::shared_ptr<v1::RegisterKeysRequest> req = std::make_shared<v1::RegisterKeysRequest>();
  };
  std::vector<Batch> batches;
  std::map<int, size_t> open;
  const v1::OptimizerConfig opt = OptimizerToProto(optimizer);
  for (const Partition& p : *parts) {
    Batch& b = BatchFor(&batches, &open, p.server, rank() == 0 ? p.num_elements * 4 : 0);
    b.req->set_worker_rank(rank());
    // Keys may move between servers: each says whose it is by the key map.
    if (impl_->config.started_servers() > 0) b.req->set_owner(p.server);
    v1::KeySpec* spec = b.req->add_keys();
    spec->set_variable(name);
    spec->set_partition(p.index);
    spec->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : shape) spec->add_shape(d);
    spec->set_offset(p.offset);
    spec->set_num_elements(p.num_elements);
    *spec->mutable_optimizer() = opt;
    if (rank() == 0) spec->set_init(reinterpret_cast<const char*>(data + p.offset), p.num_elements * 4);
  }
  // "replicas": 1: the backup of each server keeps copies of its keys
  // (with "max_servers", copies its server builds once the job runs).
  const int copies = impl_->config.replicas() > 0 && impl_->config.started_servers() == 0 ? 2 : 1;
  auto [handle, op] = impl_->ops.New(static_cast<int>(batches.size()) * copies, absl::OkStatus(), "REGISTER");
  if (impl_->timeline != nullptr) {
    op->tensors = JsonNames({name});
    op->bytes = n * 4;
  }
  for (const Batch& b : batches) {
    for (int c = 0; c < copies; ++c) {
      int server = b.server;
      std::shared_ptr<v1::RegisterKeysRequest> req = b.req;
      if (c == 1) {
        server = BackupServer(b.server, num_servers(),
                              num_servers() / std::max(1, impl_->config.num_hosts()));
        req = std::make_shared<v1::RegisterKeysRequest>(*b.req);
        req->set_replica(true);
        req->set_primary(b.server);
      }
      impl_->pool->Schedule([this, server, req, op = op] {
        v1::RegisterKeysResponse resp;
        OpTracker::Done(op.get(), impl_->Call(server, "register", [&](grpc::ClientContext* ctx) {
          return impl_->Stub(server)->RegisterKeys(ctx, *req, &resp);
        }));
      });
    }
  }
  if (absl::Status s = Wait(handle); !s.ok()) return s;
  // The starting weights travel exactly, whatever the pull compression.
  return Wait(impl_->Start({{name, nullptr, data}}, 0, false, true, /*exact=*/true));
}

absl::Status Client::RegisterTable(const std::string& name, const TableOptions& options) {
  v1::DType push_dtype, pull_dtype;
  if (absl::Status s = WireDType(options.push, impl_->config.compression(), &push_dtype); !s.ok()) return s;
  if (absl::Status s = WireDType(options.pull, impl_->config.pull_compression(), &pull_dtype); !s.ok()) return s;
  if (absl::Status s = ValidateRowOptimizer(options.optimizer); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("table '", name, "': ", s.message()));
  }
  if (impl_->config.replicas() > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("table '", name, "': tables are not replicated; this job has \"replicas\": ",
                     impl_->config.replicas()));
  }
  v1::KeySpec spec;
  spec.set_variable(name);
  spec.set_dtype(v1::DTYPE_FLOAT32);
  spec.add_shape(options.vocab);
  spec.add_shape(options.dim);
  *spec.mutable_optimizer() = OptimizerToProto(options.optimizer);
  v1::TableSpec* t = spec.mutable_table();
  t->set_dim(options.dim);
  t->set_vocab(options.vocab);
  t->set_seed(options.seed);
  t->set_init_std(options.init_std);
  t->set_max_rows(options.max_rows);
  t->set_evict_after_steps(options.evict_after_steps);
  t->set_evict_min_count(options.evict_min_count);
  t->set_num_shards(num_servers());
  {
    absl::MutexLock lock(&impl_->mu);
    auto [it, inserted] = impl_->variables.try_emplace(name);
    if (!inserted && it->second.dim != options.dim) {
      return absl::AlreadyExistsError(absl::StrCat("variable '", name, "' is already registered"));
    }
    it->second.dim = options.dim;
    it->second.pulled_versions.assign(num_servers(), 0);
    it->second.push_dtype = push_dtype;
    it->second.pull_dtype = pull_dtype;
  }
  auto [handle, op] = impl_->ops.New(num_servers(), absl::OkStatus(), "REGISTER");
  if (impl_->timeline != nullptr) op->tensors = JsonNames({name});
  for (int s = 0; s < num_servers(); ++s) {
    auto req = std::make_shared<v1::RegisterKeysRequest>();
    req->set_worker_rank(rank());
    v1::KeySpec* k = req->add_keys();
    *k = spec;
    k->set_partition(static_cast<uint32_t>(s));
    // Part s is server s's ("max_servers": served elsewhere until it joins).
    if (impl_->config.started_servers() > 0) req->set_owner(s);
    impl_->pool->Schedule([this, s, req, op = op] {
      v1::RegisterKeysResponse resp;
      OpTracker::Done(op.get(), impl_->Call(s, "register", [&](grpc::ClientContext* ctx) {
        return impl_->Stub(s)->RegisterKeys(ctx, *req, &resp);
      }));
    });
  }
  return Wait(handle);
}

Client::Handle Client::PullRows(const std::string& table, const int64_t* ids, int64_t n, float* out,
                                int64_t min_version) {
  return impl_->StartRows(table, ids, n, nullptr, out, min_version, false);
}

Client::Handle Client::PushRows(const std::string& table, const int64_t* ids, int64_t n, const float* grads,
                                int64_t version) {
  impl_->link->SetProgress(version);
  return impl_->StartRows(table, ids, n, grads, nullptr, version, true);
}

Client::Handle Client::Push(std::vector<TensorRef> tensors, int64_t version) {
  impl_->link->SetProgress(version);
  return impl_->Start(std::move(tensors), version, true, false);
}
Client::Handle Client::Pull(std::vector<TensorRef> tensors, int64_t min_version) {
  return impl_->Start(std::move(tensors), min_version, false, true);
}
Client::Handle Client::PushPull(std::vector<TensorRef> tensors, int64_t version) {
  impl_->link->SetProgress(version);
  return impl_->Start(std::move(tensors), version, true, true);
}

absl::Status Client::Wait(Handle handle) {
  std::shared_ptr<Op> op;
  Timeline* timeline = impl_->timeline.get();
  const int64_t trace_start = timeline != nullptr ? timeline->NowMicros() : 0;
  const absl::Time start = absl::Now();
  absl::Status s = impl_->Wait(handle, &op);
  const absl::Time end = absl::Now();
  if (timeline != nullptr) impl_->TraceWait(handle, op.get(), trace_start, s);
  if (op != nullptr && absl::StrContains(op->kind, "PULL")) {
    impl_->pull_wait_us += absl::ToInt64Microseconds(end - start);
  }
  return s;
}

absl::StatusOr<int64_t> Client::PulledVersion(const std::string& name) const {
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->variables.find(name);
  if (it == impl_->variables.end()) {
    return absl::NotFoundError(absl::StrCat("variable '", name, "' is not registered"));
  }
  return *std::min_element(it->second.pulled_versions.begin(), it->second.pulled_versions.end());
}

absl::Status Client::SetLearningRate(double lr, const std::string& variable) {
  v1::SetLearningRateRequest req;
  req.set_worker_rank(rank());
  req.set_lr(lr);
  req.set_variable(variable);
  // A variable's rate goes to the servers holding its keys (the others
  // would answer NOT_FOUND); every variable's to every server.
  std::vector<char> holds(num_servers(), variable.empty());
  if (!variable.empty()) {
    absl::StatusOr<Variable> var = impl_->Find(variable);
    if (!var.ok()) return var.status();
    for (const Partition& p : var->parts) holds[p.server] = 1;
    if (var->dim > 0) holds.assign(num_servers(), 1);  // a table has a part on every server
  }
  for (int s : impl_->OnePerServer(holds)) {
    v1::SetLearningRateResponse resp;
    absl::Status st = impl_->Call(s, "set-learning-rate", [&](grpc::ClientContext* ctx) {
      return impl_->Stub(s)->SetLearningRate(ctx, req, &resp);
    });
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> Client::WorkerClocks() {
  std::vector<int64_t> clocks(num_workers(), INT64_MAX);
  for (int s : impl_->OnePerServer(std::vector<char>(num_servers(), 1))) {
    v1::StatsResponse resp;
    absl::Status st = impl_->Call(s, "stats", [&](grpc::ClientContext* ctx) {
      return impl_->Stub(s)->Stats(ctx, v1::StatsRequest(), &resp);
    });
    if (!st.ok()) return st;
    for (int w = 0; w < resp.worker_clocks_size() && w < num_workers(); ++w) {
      clocks[w] = std::min(clocks[w], resp.worker_clocks(w));
    }
  }
  for (int64_t& c : clocks) {
    if (c == INT64_MAX) c = 0;  // no server holds a key yet
  }
  return clocks;
}

absl::StatusOr<double> Client::ServerMetric(const std::string& name) {
  double total = 0;
  for (int s : impl_->OnePerServer(std::vector<char>(num_servers(), 1))) {
    v1::StatsResponse resp;
    absl::Status st = impl_->Call(s, "stats", [&](grpc::ClientContext* ctx) {
      return impl_->Stub(s)->Stats(ctx, v1::StatsRequest(), &resp);
    });
    if (!st.ok()) return st;
    auto it = resp.metrics().find(name);
    if (it == resp.metrics().end()) return absl::NotFoundError(absl::StrCat("server ", s, " has no metric '", name, "'"));
    total += it->second;
  }
  return total;
}

}  // namespace psrt
