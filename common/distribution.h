// Parsing of the launcher's --distribution JSON.
//
// The accepted shape mirrors Amazon SageMaker's `distribution` argument so a
// job definition written for SageMaker runs unchanged under psrt:
//
//   {"parameter_server": {"enabled": true, "mode": "ssp", "staleness": 2}}
//
// Parsing is strict: unknown keys, wrong types and out-of-range values are
// rejected with a message naming the key and the accepted values, because a
// silently ignored typo (e.g. "stalenes") would change training semantics.

#ifndef PSRT_COMMON_DISTRIBUTION_H_
#define PSRT_COMMON_DISTRIBUTION_H_

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace psrt {

// Where and how often the parameter servers write checkpoints.
// JSON: "checkpoint": {"uri": ..., "every_steps": ..., "every_seconds": ...,
// "keep": ...}. Zero means "never" for the intervals and "keep all" for keep.
struct CheckpointOptions {
  std::string uri;
  int64_t every_steps = 0;
  double every_seconds = 0;
  int keep = 0;
};

struct PsOptions {
  bool enabled = false;
  std::string mode = "sync";            // "sync" | "async" | "ssp"
  int staleness = 0;                    // ssp only, >= 0
  int backup_workers = 0;               // sync only, >= 0
  std::string compression = "none";     // "none" | "fp16" | "bf16"
  std::string pull_compression = "none";
  std::string transport = "auto";       // "auto" | "tcp"
  int servers_per_host = 1;             // >= 1
  // The most servers the job can have: servers past those psrt-run starts
  // join while it runs (docs/runtime.md, "Servers joining and leaving");
  // 0: as many as it starts.
  int max_servers = 0;
  // > 0: a host's servers listen on ports base, base + 1, ... (one per
  // server on the host); 0: each picks a free port.
  int server_port_base = 0;
  int workers_per_host = 1;             // training processes per host, >= 1
  int64_t partition_bytes = 256 << 10;  // 4 KiB .. 64 MiB, multiple of 4
  std::string gradient_aggregation = "mean";  // "mean" (Horovod) | "sum"
                                              // (MXNet)
  std::string on_worker_failure = "fail";     // "fail" | "continue"
  int restart_workers = 0;
  std::string nonfinite = "skip";       // "skip" | "fail"
  int replicas = 0;                     // 0 | 1: a backup copy of every key
  std::string on_failure = "fail";      // "fail" | "recover"
  int max_recoveries = 3;               // recover only, >= 0
  double host_wait_s = 60;              // recover only, > 0
  // Elastic workers (sync): from key "elastic": {"min_workers": m,
  // "max_workers": M}; 0 and 0 when the job is not elastic.
  int elastic_min_workers = 0;
  int elastic_max_workers = 0;
  // From key "limits": what one token holder can make a server hold or do.
  struct Limits {
    int64_t max_server_bytes = 0;       // 0: 90% of the server's memory
    int max_variables = 100000;         // per server
    int max_keys_per_variable = 1 << 20;
    int max_calls_per_worker = 64;      // per server
    double max_pull_wait_s = 600;
  } limits;
  double heartbeat_timeout_s = 10;      // > 0
  double barrier_timeout_s = 60;        // > 0
  std::string restore;                  // "" | "latest" | step number | uri
  CheckpointOptions checkpoint;         // from key "checkpoint"
  // A host's training processes sum their gradients before the network,
  // where it applies (LocalAggregationOff).
  bool local_aggregation = true;
};

// Why a host's processes do not sum their gradients first in a job with
// these options ("" when they do): one process per host, or a setting that
// needs each worker's own push (async, ssp, backup workers, elastic
// workers, workers going on without a lost one or restarted alone).
std::string LocalAggregationOff(const PsOptions& o);

// Parses `json` (the value of --distribution). `{}` and
// `{"parameter_server": {"enabled": false}}` both yield enabled == false; all
// keys are validated even when disabled so typos surface early. As in
// SageMaker, a missing "enabled" means false.
// Errors are absl::InvalidArgumentError with an actionable message.
absl::StatusOr<PsOptions> ParseDistribution(absl::string_view json);

// One line per accepted key: name, type, default, meaning. Intended for
// --help output and for appending to parse errors.
std::string DistributionHelp();

namespace internal {

// Parses `text` as strict JSON without exceptions. Unlike
// nlohmann::json::parse(s, nullptr, false) this keeps nlohmann's error message
// and rejects duplicate object keys (nlohmann would silently keep the last,
// hiding a conflicting setting). On error returns InvalidArgumentError whose
// message starts with `what` (e.g. "SM_HOSTS").
absl::Status ParseJsonStrict(absl::string_view text, absl::string_view what,
                             nlohmann::json* out);

}  // namespace internal
}  // namespace psrt

#endif  // PSRT_COMMON_DISTRIBUTION_H_
