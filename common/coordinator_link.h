#ifndef PSRT_COMMON_COORDINATOR_LINK_H_
#define PSRT_COMMON_COORDINATOR_LINK_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "psrt/v1/coordinator.grpc.pb.h"

namespace psrt {

// A process's link to the coordinator: registration, the readiness barrier,
// heartbeats, and learning how the job ended. Servers, agents and training
// processes all use it.
class CoordinatorLink {
 public:
  struct Options {
    std::string coordinator;  // host:port
    std::string token;
    v1::ProcessId id;
    std::string address;  // where this process serves (servers)
    std::string host;
    // The generation this process was started for (PSRT_GENERATION, set by
    // its agent); 0: none, as for agents and processes started by hand.
    int64_t generation = 0;
    absl::Duration connect_timeout = absl::Seconds(60);
    absl::Duration rpc_timeout = absl::Seconds(10);
    // Called from the heartbeat thread whenever the membership epoch changes.
    std::function<void(const v1::Membership&)> on_membership;
    // Called from the heartbeat thread whenever the shard map changes (a
    // server's backup took over its keys).
    std::function<void(const v1::ShardMap&)> on_shard_map;
    // Training processes: their totals, asked for at each heartbeat, by
    // SendStats and once more when the link closes (the job's summary takes
    // the last).
    std::function<v1::WorkerStats()> stats;
    // Servers: the owners whose keys they copy to a new holder now, asked
    // for at each heartbeat. While there are any, or `moving` says keys
    // move, heartbeats come every 50 ms: each step of a move waits for the
    // coordinator to hear that the last one was taken.
    std::function<std::vector<int>()> copies_building;
    std::function<bool()> moving;
  };
  struct JobEnd {
    v1::JobState state = v1::JOB_RUNNING;
    std::string reason;
    // Servers: the job goes on without this one (its keys moved away); the
    // state is JOB_SUCCEEDED for this process.
    bool left = false;
  };

  // Registers, retrying while the coordinator is not up yet, until
  // connect_timeout. Starts heartbeats.
  static absl::StatusOr<std::unique_ptr<CoordinatorLink>> Connect(Options options);
  ~CoordinatorLink();

  const v1::JobConfig& config() const { return config_; }
  // Servers: registered as a spare ("replicas": 1): its keys are served
  // elsewhere since it was lost; it starts empty and keeps copies only.
  bool spare() const { return spare_; }
  absl::StatusOr<v1::BarrierResponse> Barrier();
  // `generation`: the exited process's (0: this link's own for its own
  // exit, else the current one).
  absl::Status ReportExit(const v1::ProcessId& id, int exit_code, const std::string& message,
                          bool restarting = false, int64_t generation = 0);
  absl::StatusOr<v1::JobStatusResponse> GetJobStatus();

  // The job's state as last heard. A coordinator silent for longer than the
  // heartbeat timeout counts as a failed job.
  JobEnd state() const;
  // The job's generation as last heard. A process of an older generation
  // sees its job end ("replaced"): a recovery started its successor.
  int64_t generation() const;
  // Agents: the job's settings and this host's index in the job, as last
  // heard (they change when a host leaves the job; index -1: this one left).
  v1::JobConfig current_config() const;
  int host_index() const;
  // Training processes: the furthest step pushed, sent with each heartbeat.
  void SetProgress(int64_t step);
  // Sends the totals (Options::stats) now, in a heartbeat of its own (best effort, within a
  // second): a training process that ends says how far it got.
  void SendStats();

  // Sends the next heartbeat now rather than at its interval: a client
  // whose server answered that a key moved learns the new shard map soon.
  void Wake();

  // Blocks until the job has ended (or the coordinator was lost).
  JobEnd WaitForEnd() const;
  // Blocks at most `timeout`; returns the state then.
  JobEnd WaitForEnd(absl::Duration timeout) const;

 private:
  explicit CoordinatorLink(Options options);
  void HeartbeatLoop();

  const Options options_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  v1::JobConfig config_;
  bool spare_ = false;
  mutable absl::Mutex mu_;
  JobEnd end_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  v1::JobConfig current_config_ ABSL_GUARDED_BY(mu_);
  int host_index_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> progress_{0};
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::thread heartbeats_;
};

// Reads the job's settings, waiting up to `timeout` for the coordinator to
// come up (servers need them before they can serve and register).
absl::StatusOr<v1::JobConfig> FetchJobConfig(const std::string& coordinator,
                                             const std::string& token, absl::Duration timeout);

// Reads a job's status from a coordinator once (launcher, tools, tests).
absl::StatusOr<v1::JobStatusResponse> QueryJobStatus(const std::string& coordinator,
                                                     const std::string& token,
                                                     absl::Duration timeout);

}  // namespace psrt

#endif  // PSRT_COMMON_COORDINATOR_LINK_H_
