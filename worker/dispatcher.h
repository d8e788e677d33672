#ifndef PSRT_WORKER_DISPATCHER_H_
#define PSRT_WORKER_DISPATCHER_H_

// The client's dispatcher (Client::Impl): an operation's tensors split into
// one request per server (request_codec), each through its stages: queued
// in its server's window of kWindow requests in flight (Start), encoded
// into a shared-memory slot or a buffer (Send), sent over shared memory, a
// data channel or gRPC (Attempt), answered (Answered: decoded into the
// output tensors, or tried again where the server could not be reached,
// encoded anew where its keys moved) and finished (Finish: its slot and its
// place in the window given back, its operation told). Internal to the
// client library; its members are the client's state.

#include <grpcpp/generic/generic_stub.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/buffer_pool.h"
#include "common/coordinator_link.h"
#include "common/data_channel.h"
#include "common/shared_memory.h"
#include "common/tensor_coding.h"
#include "common/thread_pool.h"
#include "psrt/v1/ps.grpc.pb.h"
#include "worker/client.h"
#include "worker/host_group.h"
#include "worker/op_tracker.h"
#include "worker/request_codec.h"
#include "worker/server_links.h"
#include "worker/shared_slots.h"
#include "worker/timeline.h"

namespace psrt {

// Up to `limit` names as a JSON array, and how many more there were.
std::string JsonNames(const std::vector<std::string>& names, size_t limit = 8);

// The client's calls in flight, so that closing cancels them at once, and
// its data requests not yet finished, so that closing waits for them. Its
// own lock.
class LiveCalls {
 public:
  // Counts a call in flight, cancelled by Close (null: none, only asks):
  // false once closing, and nothing is counted.
  bool Add(grpc::ClientContext* ctx) ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(grpc::ClientContext* ctx) ABSL_LOCKS_EXCLUDED(mu_);
  // A data request begun, and finished.
  void Begin() ABSL_LOCKS_EXCLUDED(mu_);
  void End() ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses new calls, cancels those in flight, runs `also` (under the lock,
  // before any request ends) and waits up to `timeout` for the data
  // requests to finish (cancelled, they end at once).
  void Close(const std::function<void()>& also, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  int requests_ ABSL_GUARDED_BY(mu_) = 0;
};

// What the job's summary says of this process (Stats, asked for by the
// coordinator link): the bytes it pushed and pulled, how long it waited for
// pulls and how long it has been connected. Counted without a lock.
class WorkerCounters {
 public:
  void Pushed(int64_t bytes) { pushed_ += bytes; }
  void Pulled(int64_t bytes) { pulled_ += bytes; }
  void Waited(absl::Duration d) { wait_us_ += absl::ToInt64Microseconds(d); }
  v1::WorkerStats Stats() const;

 private:
  std::atomic<int64_t> pushed_{0}, pulled_{0}, wait_us_{0};
  const absl::Time connected_ = absl::Now();
};

class Dispatcher {
 public:
  using Handle = Client::Handle;
  using Lease = SharedSlots::Lease;

  // Requests in flight to one server at most; more wait their turn, so a
  // huge tensor does not put hundreds of requests on the wire at once (and
  // every request in flight finds a shared slot).
  static constexpr int kWindow = 8;
  static_assert(SharedSlots::kSlots == kWindow);
  // Shards at least this big are encoded and decoded on the pool (in
  // parallel, and off gRPC's threads); smaller ones where they are, which
  // saves a thread hand-off each way.
  static constexpr int64_t kPoolBytes = 256 << 10;

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
    int target = 0;        // the server it goes to: Route(shard.server) when encoded
    int target_moves = 0;  // servers->Moves(target) then
    std::shared_ptr<grpc::GenericStub> stub;  // of the attempt in flight
    std::shared_ptr<DataChannel> channel;     // its data channel (null: gRPC)
    // With a timeline: when it was made and got a place in the window, and
    // the stream (track) it holds meanwhile.
    int64_t queued_us = 0, started_us = 0;
    int stream = -1;
    // An owner's push in a host group: the other local ranks it counts for
    // (PushRequest.also_for), and what it does once it ended (its result:
    // the request's own, or what went wrong after).
    std::vector<int32_t> also_for;
    std::function<absl::Status(const absl::Status&)> finished;
    bool assign_rows = false;  // a table's rows' values (PushRequest.assign_rows)
    // A registration of keys (RegisterKeys), sent as it is over the control
    // connection of shard.server (no slot, no encoding), and its answer.
    std::shared_ptr<const v1::RegisterKeysRequest> keys;
    v1::RegisterKeysResponse registered;
    const char* what() const {
      return keys != nullptr ? "register" : push && pull ? "push-pull" : push ? "push" : "pull";
    }
    const char* kind() const { return push && pull ? "PUSH_PULL" : push ? "PUSH" : "PULL"; }
  };

  // Requests that a part of an operation goes on as (Continue).
  struct Requests {
    std::vector<Shard> shards;
    int64_t version = 0;
    bool push = false, pull = false;
    std::function<void(Request*)> adorn;  // Launch's
  };
  // A stage of local aggregation: a pending part of `op` that waits for the
  // host group where a request waits for a server. Once `ready` holds,
  // `work` runs; with why not (`missing`) at `deadline` or when the job
  // fails, it does not. The part then ends (EndPart) with the result, or,
  // with `next`, goes on as its requests (Continue), made in the
  // operation's turn (`ticket`, Dispatcher::turns) when `in_turn`.
  struct GroupStage {
    std::shared_ptr<Op> op;
    // Small pieces: the work runs on the caller's thread when `ready`
    // holds at once; else on the pool (copies and sums of big tensors
    // leave the caller's thread, as encoding does: pushes overlap backward).
    bool here = false;
    absl::Time deadline;
    std::function<bool()> ready;
    std::function<std::string()> missing;
    std::function<absl::Status()> work;
    std::function<absl::StatusOr<Requests>()> next;
    bool in_turn = false;
    uint64_t ticket = 0;
  };
  // One RegisterKeys request for server `server` (its route's).
  struct Registration {
    int server = 0;
    std::shared_ptr<const v1::RegisterKeysRequest> keys;
  };

  // A client of `options` (its timeline, if any, opened already); Join
  // connects it.
  Dispatcher(ClientOptions options, std::unique_ptr<Timeline> timeline);
  // Cancels calls in flight, so a process that gives up (the job failed, a
  // server is gone) exits at once instead of waiting out their deadlines.
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Joins the job: the coordinator's link and barrier (the job's config and
  // shard map), the servers' links, shared memory and data channels, the
  // pool and, with local aggregation, the host group. Once, before any
  // request.
  absl::Status Join();

  std::vector<int> OnePerServer(const std::vector<char>& holds) const;
  std::shared_ptr<v1::ParameterServer::Stub> Stub(int s) const { return servers->Stub(s); }

  absl::StatusOr<Variable> Find(const std::string& name);

  // Records that `variable`'s partition (a table's: part) `part` was pulled
  // at `version`; `at_least`: unless a pull recorded a later one (a table
  // registered in a running job). The one writer of a registered
  // variable's pulled_versions; unknown variables and parts are skipped.
  void RecordPulled(const std::string& variable, uint32_t part, int64_t version,
                    bool at_least = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // ABORTED with the coordinator's reason once the job has failed.
  absl::Status JobStatus() const;

  // Runs `rpc` against server `s`, retrying while the server is unreachable
  // (the request is resent unchanged, so a push keeps its id).
  absl::Status Call(int s, const char* what,
                    const std::function<grpc::Status(grpc::ClientContext*)>& rpc);

  // The most a request to server `s` carries.
  int64_t RequestBytes(int s);

  // `exact`: pull float32 whatever the variable's pull compression.
  Handle Start(std::vector<TensorRef> tensors, int64_t version, bool push, bool pull,
               bool exact = false);
  Handle Start(absl::StatusOr<std::vector<Shard>> shards, int64_t version, bool push, bool pull);

  // A table's push or pull (worker/table_requests.cc), split by the server
  // each id's row lives on. A
  // sync push goes to every server, with no rows for some: each counts
  // every worker's push for the step. A pull skips the servers with none of
  // its ids, so a worker may not have seen a server reach the step it
  // pushes for (another worker's push of the step before may still be on
  // its way there): that part of the push waits for the step first
  // (Request::await_step).
  Handle StartRows(const std::string& table, const int64_t* ids, int64_t n, const float* grads,
                   float* out, int64_t version, bool push);

  // A table's rows take `values` (float32, n rows) on the servers, before
  // its first step: one request per server and at most kRequestBytes.
  Handle StartAssignRows(const std::string& table, const int64_t* ids, int64_t n,
                         const float* values);

  // One server's part of a table's push or pull.
  static Shard RowsShard(const std::string& table, const Variable& var, int server,
                         std::shared_ptr<RowSet> set, float* out, bool await);

  // An operation ("REGISTER") of `regs` as requests through the stages a
  // push's go through (Send, Attempt, Answered and its retries, Finish; no
  // window: Enqueue), the timeline describing it as `tensors` (a JSON
  // array) of `bytes`. `answered` (if set) reads a server's answer to a
  // request that succeeded; its error ends the request's part.
  Handle StartRegister(
      std::vector<Registration> regs, std::string tensors, int64_t bytes,
      std::function<absl::Status(int server, const v1::RegisterKeysResponse&)> answered = nullptr);

  // Runs a stage of local aggregation (GroupStage).
  void Await(GroupStage stage);

  // Ends one pending part of `op` with `s`: a request's (Finish) or a
  // group stage's. The one place a part ends.
  static void EndPart(Op* op, const absl::Status& s) { OpTracker::Done(op, s); }

  // A Wait call's event, on the waiting thread's track.
  void TraceWait(Handle handle, const Op* op, int64_t start, const absl::Status& s);

  // Waits for the operation `handle` (its Op in *found, when there is one).
  // Each part ends within its RPC deadline and retry budget; the extra
  // margin only guards against a lost wake-up. A job that failed elsewhere
  // ends the wait at once, with the coordinator's reason.
  absl::Status Wait(Handle handle, std::shared_ptr<Op>* found);

 private:
  // Each server's window, its own lock each. With a timeline, a request in
  // flight holds one of its server's kWindow streams (tracks).
  class Windows {
   public:
    Windows(int servers, Timeline* timeline);
    // A place in r's server's window: `send`, to run now, when there is
    // one; else null, and `send` runs once r's turn comes (Leave).
    std::function<void()> Enter(const std::shared_ptr<Request>& r, std::function<void()> send);
    // r leaves its window, its place (and stream) going to the first request
    // waiting: that one's send, to run now (outside the lock), or null.
    std::function<void()> Leave(const Request& r);

   private:
    struct Queue {
      absl::Mutex mu;
      int in_flight ABSL_GUARDED_BY(mu) = 0;
      // Each waiting request and what sends it.
      std::deque<std::pair<std::shared_ptr<Request>, std::function<void()>>> waiting
          ABSL_GUARDED_BY(mu);
      // With a timeline: the streams (tracks) no request in flight holds.
      std::vector<int> free_streams ABSL_GUARDED_BY(mu);
    };
    std::unique_ptr<Queue[]> queues_;  // per server
    Timeline* const timeline_;
  };

  int Route(int s) const { return servers->Route(s); }
  std::string Address(int s) const { return servers->Address(s); }
  void FollowShardMap(const v1::ShardMap& map);

  // Whether a failed call is tried again after `backoff`: only a server that
  // could not be reached, within the retry budget, while the job runs.
  bool Retry(const grpc::Status& st, absl::Time start, absl::Duration backoff) const;

  absl::Status CallError(int s, const char* what, const grpc::Status& st, int attempts,
                         absl::Time start) const;

  // Over a data channel a request carries at most this much (or one key):
  // the server applies one request while the next arrives and the one
  // before's answer leaves, where one big request would take its receipt,
  // update and answer in turn.
  static constexpr int64_t kChannelRequestBytes = 256 << 10;

  // A free slot for a request to `server`, if it shares memory with it.
  Lease Take(int server);

  // Offers each server on this host a shared region (servers elsewhere
  // cannot open it) and says in one line which servers it is used with.
  void ShareMemory();

  // The request for one shard. With a shared-memory slot, values are
  // written into it (converted on the way) and each key reserves room for
  // its answer; otherwise float32 gradients in host memory go out from
  // where they lie and compressed (or GPU) ones through a pooled buffer.
  absl::StatusOr<std::vector<OutKey>> Encode(const Shard& shard, int64_t version, bool push,
                                             bool pull, Lease* lease);

  // Bytes a key takes in a shared slot: its values, and room for the answer
  // (which goes where the values were).
  static int64_t Room(const Shard::Item& it, bool push, bool pull);

  // Writes a pull's answer into the shard's output tensors.
  absl::Status Store(const grpc::ByteBuffer& resp, const Shard& shard, const Lease& lease);

  // Sends `shards` as requests of `op`, which counts one pending part for
  // each already; `adorn` (if set) completes each request first.
  void Launch(std::vector<Shard> shards, const std::shared_ptr<Op>& op, int64_t version, bool push,
              bool pull, const std::function<void(Request*)>& adorn = nullptr);
  // Queues a request in its server's window (Windows::Enter) and sends it
  // in its turn.
  void Enqueue(const std::shared_ptr<Request>& r);

  // A sync push (or push-pull) of dense variables in a host group
  // (worker/local_aggregation.cc): a partition's owner sums the host's
  // gradients and pushes once for all; the others hand their gradients over
  // and copy the weights it pulled.
  Handle StartGrouped(std::vector<TensorRef> tensors, int64_t version, bool pull);
  // A sync push of a table's rows in a host group (worker/local_row_sums.cc):
  // a part's owner sums the host's rows per id and pushes them once for all;
  // the others hand theirs over. `sets` and `await` are StartRows's.
  Handle StartGroupedRows(const std::string& table, const Variable& var, HostGroup::Slots* slots,
                          std::vector<std::shared_ptr<RowSet>> sets, std::vector<bool> await,
                          int64_t version);
  // A sync pull of a table's rows in a host group (worker/local_row_pulls.cc):
  // the host's processes share the rows they pull, each row of a step asked
  // for by one of them.
  Handle StartGroupedPull(const std::string& table, const Variable& var, HostGroup::Slots* slots,
                          const int64_t* ids, int64_t n, float* out, int64_t version);
  // The rest of a stage once its wait ended with `s`.
  void RunStage(const std::shared_ptr<GroupStage>& stage, absl::Status s);
  // A pending part of `op` goes on as `next`'s requests, one part each
  // (none: it ends), or ends with its error.
  void Continue(const std::shared_ptr<Op>& op, absl::StatusOr<Requests> next);

  // Encodes the request and makes its first attempt.
  void Send(const std::shared_ptr<Request>& r);
  // One attempt, over the data channel or on gRPC's callback API: no thread
  // waits for the answer.
  void Attempt(const std::shared_ptr<Request>& r);
  // A registration's attempt, a blocking call on the pool.
  void AttemptRegister(const std::shared_ptr<Request>& r);
  void Answered(const std::shared_ptr<Request>& r, grpc::Status st);
  void Finish(const std::shared_ptr<Request>& r, const absl::Status& s);

  // The timeline's description of an operation, for its WAIT event.
  static void DescribeOp(const std::vector<Shard>& shards, Op* op);
  // A request's event, from its place in the window to its end, on the
  // track of the stream it held.
  void TraceRequest(const Request& r, const absl::Status& s);

  // The state, by what guards it. Declared in the order it may be
  // destroyed in reverse: the timeline last, the servers' links first.
 public:
  // Set by the constructor. The timeline first: destroyed last, once no
  // request can write to it.
  const std::unique_ptr<Timeline> timeline;
  const ClientOptions options;

 private:
  // Their own locks: the calls in flight (before everything a late
  // request touches), and the operations (below).
  LiveCalls calls;

 public:
  OpTracker ops;
  // Without a lock, before `link`, whose heartbeat thread sets them until
  // the link is gone.
  WorkerCounters counters;
  std::atomic<int> active_workers{0};

 private:
  // `servers` once made: the shard maps the link's heartbeats bring go there.
  std::atomic<ServerLinks*> servers_ready{nullptr};
  // Push ids grow across restarts of this rank: they start at the clock.
  std::atomic<uint64_t> next_push_id{static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())) << 20};

 public:
  // Set once by Join, before any request; read without a lock after.
  v1::JobConfig config;
  std::unique_ptr<CoordinatorLink> link;
  int num_servers = 0;
  // This host's group when its gradients are summed here first
  // (worker/local_aggregation.cc); null otherwise. Closed first of all
  // (its waits' ends go to the pool), freed after the pool's last task.
  std::unique_ptr<HostGroup> group;

 private:
  // Made by Join too; each with its own lock (or locks) after.
  std::unique_ptr<Windows> windows;
  // Shared memory with each server on this host: a slot for each request
  // in flight.
  SharedSlots shared;
  std::unique_ptr<ThreadPool> pool;
  BufferPool buffers;  // compressed gradients on their way out
  // An owner's pushes go out in the order of their operations, whenever
  // their sums are ready: a push-pull's pull holds its place in the window
  // until every host pushed the key, so owners on two hosts that sent the
  // same keys in different orders could each fill their window with keys the
  // other has yet to send. A launch only queues requests (and sends the
  // first ones).
  LaunchTurns turns;

 public:
  // Guarded by mu: the registered variables.
  absl::Mutex mu;
  absl::flat_hash_map<std::string, Variable> variables ABSL_GUARDED_BY(mu);

 private:
  // The servers' links, their data channels among them. Last: destroyed
  // first, so the channels' threads' last callbacks find everything else.
  std::unique_ptr<ServerLinks> servers;
};

}  // namespace psrt

#endif  // PSRT_WORKER_DISPATCHER_H_
