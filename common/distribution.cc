#include "common/distribution.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace psrt {
namespace {

using Json = nlohmann::json;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kMinPartitionBytes = 4 << 10;
constexpr int64_t kMaxPartitionBytes = 64 << 20;

// Rejects duplicate keys and captures nlohmann's parse error text; the DOM
// parser with exceptions disabled only reports "discarded".
class StrictSax : public Json::json_sax_t {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(Json::number_integer_t) override { return true; }
  bool number_unsigned(Json::number_unsigned_t) override { return true; }
  bool number_float(Json::number_float_t, const Json::string_t&) override {
    return true;
  }
  bool string(Json::string_t&) override { return true; }
  bool binary(Json::binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return true;
  }
  bool key(Json::string_t& key) override {
    if (!keys_.back().insert(key).second) {
      error_ = absl::StrCat("duplicate key '", key,
                            "' (each key may appear only once per object)");
      return false;
    }
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&,
                   const Json::exception& ex) override {
    error_ = ex.what();
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  std::vector<std::set<std::string>> keys_;
  std::string error_;
};

// "string \"2\"", "number 2.5", "object": what the user actually wrote, so
// a type error shows e.g. that a number was quoted.
std::string Describe(const Json& v) {
  if (v.is_object() || v.is_array()) return v.type_name();
  std::string text = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  constexpr size_t kMaxShown = 60;
  if (text.size() > kMaxShown) {
    text = absl::StrCat(text.substr(0, kMaxShown), "...");
  }
  return absl::StrCat(v.type_name(), " ", text);
}

absl::Status TypeError(absl::string_view key, absl::string_view want,
                       const Json& v) {
  return absl::InvalidArgumentError(
      absl::StrCat("'", key, "' must be ", want, ", got ", Describe(v)));
}

std::string RangeText(int64_t lo, int64_t hi) {
  if (hi == kIntMax || hi == kInt64Max) return absl::StrCat(">= ", lo);
  return absl::StrCat("between ", lo, " and ", hi);
}

template <typename T>
absl::Status SetInt(const Json& v, absl::string_view key, int64_t lo,
                    int64_t hi, T* out) {
  if (!v.is_number_integer()) return TypeError(key, "an integer", v);
  // Values beyond the type's range get an upper-bound message; saying ">= 1"
  // about 3000000000 would be confusing.
  if ((v.is_number_unsigned() &&
       v.get<uint64_t>() > static_cast<uint64_t>(hi)) ||
      (hi == kIntMax && v.get<int64_t>() > hi)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", key, "' must be at most ", hi, "; got ", v.dump()));
  }
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", key, "' must be ", RangeText(lo, hi), "; got ", x));
  }
  *out = static_cast<T>(x);
  return absl::OkStatus();
}

// Timeouts/intervals: integers are accepted too ("10" seconds is natural).
absl::Status SetSeconds(const Json& v, absl::string_view key,
                        bool allow_zero, double* out) {
  if (!v.is_number()) return TypeError(key, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0 || (!allow_zero && x == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", key, "' must be ", allow_zero ? ">= 0" : "> 0",
                     " seconds; got ", v.dump()));
  }
  *out = x;
  return absl::OkStatus();
}

absl::Status SetBool(const Json& v, absl::string_view key, bool* out) {
  if (!v.is_boolean()) return TypeError(key, "a boolean (true or false)", v);
  *out = v.get<bool>();
  return absl::OkStatus();
}

absl::Status SetString(const Json& v, absl::string_view key, std::string* out) {
  if (!v.is_string()) return TypeError(key, "a string", v);
  *out = v.get<std::string>();
  return absl::OkStatus();
}

absl::Status SetEnum(const Json& v, absl::string_view key,
                     const std::vector<absl::string_view>& choices,
                     std::string* out) {
  const std::string choice_list = absl::StrJoin(choices, ", ");
  if (!v.is_string()) {
    return TypeError(key, absl::StrCat("a string, one of ", choice_list), v);
  }
  const std::string s = v.get<std::string>();
  for (absl::string_view c : choices) {
    if (s == c) {
      *out = s;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", key, "' must be one of ", choice_list, "; got '", s, "'"));
}

// "latest", a step number or a URI; anything else is most likely a typo of
// "latest" or a relative path, which would resolve differently per host.
absl::Status SetRestore(const Json& v, std::string* out) {
  constexpr absl::string_view kWant =
      "\"latest\", a step number, or a checkpoint URI (scheme://... or "
      "/absolute/path)";
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() || v.get<int64_t>() >= 0) {
      *out = v.dump();
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat("'restore' step number must be >= 0; got ", v.dump()));
  }
  if (!v.is_string()) {
    return TypeError("restore", absl::StrCat("a string: ", kWant), v);
  }
  const std::string s = v.get<std::string>();
  int64_t step = 0;
  const bool is_step = !s.empty() && absl::ascii_isdigit(s[0]) &&
                       absl::SimpleAtoi(s, &step) && step >= 0;
  if (s.empty() || s == "latest" || is_step || absl::StrContains(s, "://") ||
      absl::StartsWith(s, "/")) {
    *out = s;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'restore' must be ", kWant, "; got '", s, "'"));
}

// Used only to suggest a likely intended key for a typo.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

absl::Status UnknownKey(absl::string_view key, absl::string_view where,
                        const std::vector<absl::string_view>& accepted) {
  std::string msg = absl::StrCat("unknown key '", key, "' in ", where,
                                 "; accepted keys: ",
                                 absl::StrJoin(accepted, ", "));
  absl::string_view best;
  size_t best_distance = 3;  // Suggest only close matches.
  for (absl::string_view candidate : accepted) {
    const size_t d = EditDistance(key, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  if (!best.empty()) absl::StrAppend(&msg, ". Did you mean '", best, "'?");
  return absl::InvalidArgumentError(msg);
}

// A table keeps parsing, the accepted-key lists and --help in agreement.
struct KeySpec {
  const char* name;
  const char* type;
  const char* default_value;
  const char* meaning;
  absl::Status (*apply)(const Json& v, PsOptions* out);
};

absl::Status ApplyCheckpoint(const Json& v, PsOptions* out);
absl::Status ApplyElastic(const Json& v, PsOptions* out);
absl::Status ApplyLimits(const Json& v, PsOptions* out);

const std::vector<KeySpec>& ParameterServerKeys() {
  static const auto* const kKeys = new std::vector<KeySpec>{
      {"enabled", "bool", "false", "turn on the parameter-server runtime",
       [](const Json& v, PsOptions* o) { return SetBool(v, "enabled", &o->enabled); }},
      {"mode", "string", "\"sync\"",
       "sync: wait for all workers each step; async: apply each push at once; "
       "ssp: stale-synchronous, bounded by 'staleness'",
       [](const Json& v, PsOptions* o) {
         return SetEnum(v, "mode", {"sync", "async", "ssp"}, &o->mode);
       }},
      {"staleness", "int", "0",
       "ssp only: steps the fastest worker may run ahead of the slowest (>= 0)",
       [](const Json& v, PsOptions* o) {
         return SetInt(v, "staleness", 0, kIntMax, &o->staleness);
       }},
      {"backup_workers", "int", "0",
       "sync only: finish a step without the slowest N workers' gradients "
       "(>= 0)",
       [](const Json& v, PsOptions* o) {
         return SetInt(v, "backup_workers", 0, kIntMax, &o->backup_workers);
       }},
      {"compression", "string", "\"none\"", "encoding of pushed gradients: none, fp16, bf16",
       [](const Json& v, PsOptions* o) {
         return SetEnum(v, "compression", {"none", "fp16", "bf16"},
                        &o->compression);
       }},
      {"pull_compression", "string", "\"none\"", "encoding of pulled parameters: none, fp16, bf16",
       [](const Json& v, PsOptions* o) {
         return SetEnum(v, "pull_compression", {"none", "fp16", "bf16"},
                        &o->pull_compression);
       }},
      {"transport", "string", "\"auto\"",
       "how tensors travel: auto (shared memory with servers on the same host, "
       "the data channel over TCP with the others), tcp (the data channel "
       "everywhere) or grpc (gRPC everywhere, updates to replicas too)",
       [](const Json& v, PsOptions* o) {
         return SetEnum(v, "transport", {"auto", "tcp", "grpc"}, &o->transport);
       }},
      {"servers_per_host", "int", "1", "parameter-server processes per host (>= 1)",
       [](const Json& v, PsOptions* o) {
         return SetInt(v, "servers_per_host", 1, kIntMax, &o->servers_per_host);
       }},
      {"max_servers", "int", "0",
       "the most servers the job can have: the key map has this many, those "
       "past the started ones join while the job runs (psrt-server --index) "
       "and any can be removed (psrt-ckpt remove-server); 0: the started ones",
       [](const Json& v, PsOptions* o) {
         return SetInt(v, "max_servers", 0, 4096, &o->max_servers);
       }},
      {"server_port_base", "int", "0",
       "fixed ports for firewalls and Kubernetes Services: a host's servers "
       "listen on this port, the next, ... and their data channels on the "
       "ports after those (1..65535); 0: free ports",
       [](const Json& v, PsOptions* o) {
         return SetInt(v, "server_port_base", 0, 65535, &o->server_port_base);
       }},
      {"workers_per_host", "int", "1", "training processes per host (>= 1)",
       [](const Json& v, PsOptions* o) {
         return SetInt(v, "workers_per_host", 1, kIntMax, &o->workers_per_host);
       }},
      {"local_aggregation", "bool", "true",
       "sum a host's gradients there first and push once per key per host "
       "(sync jobs with workers_per_host > 1; docs/runtime.md)",
       [](const Json& v, PsOptions* o) {
         return SetBool(v, "local_aggregation", &o->local_aggregation);
       }},
      {"partition_bytes", "int", "262144",
       "largest slice of a tensor placed on one server; 4096..67108864, "
       "multiple of 4",
       [](const Json& v, PsOptions* o) {
         int64_t bytes = 0;
         absl::Status s = SetInt(v, "partition_bytes", kMinPartitionBytes,
                                 kMaxPartitionBytes, &bytes);
         if (!s.ok()) return s;
         if (bytes % 4 != 0) {
           return absl::InvalidArgumentError(absl::StrCat(
               "'partition_bytes' must be a multiple of 4 (whole float32 "
               "values); got ",
               bytes));
         }
         o->partition_bytes = bytes;
         return absl::OkStatus();
       }},
      {"gradient_aggregation", "string", "\"mean\"",
       "combine workers' gradients by mean (as Horovod) or sum (as MXNet)",
       [](const Json& v, PsOptions* o) {
         return SetEnum(v, "gradient_aggregation", {"mean", "sum"},
                        &o->gradient_aggregation);
       }},
      {"on_worker_failure", "string", "\"fail\"",
       "fail: stop the job when a worker dies; continue: carry on with the "
       "remaining workers",
       [](const Json& v, PsOptions* o) {
         return SetEnum(v, "on_worker_failure", {"fail", "continue"},
                        &o->on_worker_failure);
       }},
      {"restart_workers", "int", "0",
       "times a failed worker is restarted before on_worker_failure applies "
       "(>= 0)",
       [](const Json& v, PsOptions* o) {
         return SetInt(v, "restart_workers", 0, kIntMax, &o->restart_workers);
       }},
      {"replicas", "int", "0",
       "1: every key also lives on a backup server, which serves it when its "
       "server is lost (sync: no step lost)",
       [](const Json& v, PsOptions* o) { return SetInt(v, "replicas", 0, 1, &o->replicas); }},
      {"nonfinite", "string", "\"skip\"",
       "an update whose gradient holds NaN or Inf: skip it (as AMP's "
       "GradScaler) or fail (the key stops and its pushes and pulls say why)",
       [](const Json& v, PsOptions* o) {
         return SetEnum(v, "nonfinite", {"skip", "fail"}, &o->nonfinite);
       }},
      {"on_failure", "string", "\"fail\"",
       "fail: a lost server, host or worker ends the job; recover: roll back "
       "to the last committed checkpoint and go on",
       [](const Json& v, PsOptions* o) {
         return SetEnum(v, "on_failure", {"fail", "recover"}, &o->on_failure);
       }},
      {"max_recoveries", "int", "3", "recoveries a job may make before a failure ends it (>= 0)",
       [](const Json& v, PsOptions* o) {
         return SetInt(v, "max_recoveries", 0, kIntMax, &o->max_recoveries);
       }},
      {"host_wait_s", "number", "60",
       "recover: seconds a lost host's agent may take to come back (> 0)",
       [](const Json& v, PsOptions* o) {
         return SetSeconds(v, "host_wait_s", false, &o->host_wait_s);
       }},
      {"heartbeat_timeout_s", "number", "10",
       "seconds without a heartbeat before a process is declared dead (> 0)",
       [](const Json& v, PsOptions* o) {
         return SetSeconds(v, "heartbeat_timeout_s", false,
                           &o->heartbeat_timeout_s);
       }},
      {"barrier_timeout_s", "number", "60",
       "seconds to wait for all processes at a barrier before failing (> 0)",
       [](const Json& v, PsOptions* o) {
         return SetSeconds(v, "barrier_timeout_s", false,
                           &o->barrier_timeout_s);
       }},
      {"restore", "string", "\"\"",
       "resume from \"latest\" or a step number under checkpoint.uri, or from "
       "a checkpoint URI; empty starts fresh",
       [](const Json& v, PsOptions* o) { return SetRestore(v, &o->restore); }},
      {"checkpoint", "object", "{}", "checkpoint settings: uri, every_steps, every_seconds, keep",
       &ApplyCheckpoint},
      {"elastic", "object", "{}",
       "sync: {\"min_workers\": m, \"max_workers\": M}: start with m of the "
       "M workers, let the others join, go on while m remain",
       &ApplyElastic},
      {"limits", "object", "{}",
       "max_server_bytes (0: 90% of memory), max_variables (100000), "
       "max_keys_per_variable (1048576), max_calls_per_worker (64), "
       "max_pull_wait_s (600)",
       &ApplyLimits},
  };
  return *kKeys;
}

struct CheckpointKeySpec {
  const char* name;
  const char* type;
  const char* default_value;
  const char* meaning;
  absl::Status (*apply)(const Json& v, CheckpointOptions* out);
};

const std::vector<CheckpointKeySpec>& CheckpointKeys() {
  static const auto* const kKeys = new std::vector<CheckpointKeySpec>{
      {"uri", "string", "\"\"",
       "where checkpoints are written, e.g. s3://bucket/prefix or /path",
       [](const Json& v, CheckpointOptions* o) {
         return SetString(v, "checkpoint.uri", &o->uri);
       }},
      {"every_steps", "int", "0", "checkpoint every N steps; 0 disables",
       [](const Json& v, CheckpointOptions* o) {
         return SetInt(v, "checkpoint.every_steps", 0, kInt64Max,
                       &o->every_steps);
       }},
      {"every_seconds", "number", "0",
       "checkpoint every N seconds; 0 disables",
       [](const Json& v, CheckpointOptions* o) {
         return SetSeconds(v, "checkpoint.every_seconds", true,
                           &o->every_seconds);
       }},
      {"keep", "int", "0", "keep the newest N checkpoints; 0 keeps all",
       [](const Json& v, CheckpointOptions* o) {
         return SetInt(v, "checkpoint.keep", 0, kIntMax, &o->keep);
       }},
  };
  return *kKeys;
}

template <typename Spec>
std::vector<absl::string_view> Names(const std::vector<Spec>& specs) {
  std::vector<absl::string_view> names;
  names.reserve(specs.size());
  for (const Spec& s : specs) names.push_back(s.name);
  return names;
}

template <typename Spec>
const Spec* FindKey(const std::vector<Spec>& specs, absl::string_view name) {
  for (const Spec& s : specs) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

absl::Status ApplyCheckpoint(const Json& v, PsOptions* out) {
  if (!v.is_object()) return TypeError("checkpoint", "an object", v);
  const auto& specs = CheckpointKeys();
  for (const auto& item : v.items()) {
    if (FindKey(specs, item.key()) == nullptr) {
      return UnknownKey(item.key(), "checkpoint", Names(specs));
    }
  }
  // Table order, so the first error reported does not depend on key order.
  for (const CheckpointKeySpec& spec : specs) {
    auto it = v.find(spec.name);
    if (it == v.end()) continue;
    absl::Status s = spec.apply(*it, &out->checkpoint);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ApplyElastic(const Json& v, PsOptions* out) {
  if (!v.is_object()) {
    return TypeError("elastic", "an object such as {\"min_workers\": 2, \"max_workers\": 4}", v);
  }
  for (const auto& item : v.items()) {
    if (item.key() != "min_workers" && item.key() != "max_workers") {
      return UnknownKey(item.key(), "elastic", {"min_workers", "max_workers"});
    }
  }
  if (!v.contains("min_workers") || !v.contains("max_workers")) {
    return absl::InvalidArgumentError(
        "'elastic' needs both 'min_workers' and 'max_workers'");
  }
  absl::Status s = SetInt(v["min_workers"], "elastic.min_workers", 1, kIntMax,
                          &out->elastic_min_workers);
  if (s.ok()) {
    s = SetInt(v["max_workers"], "elastic.max_workers", 1, kIntMax,
               &out->elastic_max_workers);
  }
  if (s.ok() && out->elastic_max_workers < out->elastic_min_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'elastic.max_workers' (", out->elastic_max_workers,
        ") must be at least 'elastic.min_workers' (", out->elastic_min_workers,
        ")"));
  }
  return s;
}

absl::Status ApplyLimits(const Json& v, PsOptions* out) {
  if (!v.is_object()) {
    return TypeError("limits", "an object such as {\"max_server_bytes\": 8589934592}", v);
  }
  PsOptions::Limits& l = out->limits;
  for (const auto& item : v.items()) {
    const std::string& k = item.key();
    const Json& x = item.value();
    absl::Status s;
    if (k == "max_server_bytes") {
      s = SetInt(x, "limits.max_server_bytes", 0, kInt64Max, &l.max_server_bytes);
    } else if (k == "max_variables") {
      s = SetInt(x, "limits.max_variables", 1, kIntMax, &l.max_variables);
    } else if (k == "max_keys_per_variable") {
      s = SetInt(x, "limits.max_keys_per_variable", 1, kIntMax, &l.max_keys_per_variable);
    } else if (k == "max_calls_per_worker") {
      s = SetInt(x, "limits.max_calls_per_worker", 1, kIntMax, &l.max_calls_per_worker);
    } else if (k == "max_pull_wait_s") {
      s = SetSeconds(x, "limits.max_pull_wait_s", false, &l.max_pull_wait_s);
    } else {
      return UnknownKey(k, "limits",
                        {"max_server_bytes", "max_variables", "max_keys_per_variable",
                         "max_calls_per_worker", "max_pull_wait_s"});
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Checks that involve more than one key.
absl::Status ValidateCombination(const Json& ps, const PsOptions& o) {
  const std::string mode_text = absl::StrCat(
      "'", o.mode, "'", ps.contains("mode") ? "" : " (the default)");
  if (ps.contains("staleness") && o.mode != "ssp") {
    return absl::InvalidArgumentError(absl::StrCat(
        "'staleness' only applies when 'mode' is 'ssp', but mode is ",
        mode_text, "; remove 'staleness' or set \"mode\": \"ssp\""));
  }
  if (ps.contains("backup_workers") && o.mode != "sync") {
    return absl::InvalidArgumentError(absl::StrCat(
        "'backup_workers' only applies when 'mode' is 'sync', but mode is ",
        mode_text, "; remove 'backup_workers' or set \"mode\": \"sync\""));
  }
  if (ps.contains("elastic") && o.mode != "sync") {
    return absl::InvalidArgumentError(absl::StrCat(
        "'elastic' applies when 'mode' is 'sync', but mode is ", mode_text,
        "; remove 'elastic' or set \"mode\": \"sync\""));
  }
  if (ps.contains("elastic") &&
      (ps.contains("on_worker_failure") || ps.contains("backup_workers"))) {
    return absl::InvalidArgumentError(
        "with 'elastic', a worker that fails leaves the job (while "
        "min_workers remain) and every active worker's push counts; remove "
        "'on_worker_failure' and 'backup_workers'");
  }
  if (o.server_port_base > 0 &&
      o.server_port_base + 2 * o.servers_per_host - 1 > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'server_port_base' ", o.server_port_base, " with ", o.servers_per_host,
        " servers per host runs past port 65535; lower server_port_base"));
  }
  const CheckpointOptions& c = o.checkpoint;
  if ((c.every_steps > 0 || c.every_seconds > 0) && c.uri.empty()) {
    return absl::InvalidArgumentError(
        "'checkpoint.every_steps'/'checkpoint.every_seconds' are set but "
        "'checkpoint.uri' is empty; set checkpoint.uri to where checkpoints "
        "should be written");
  }
  if (o.on_failure == "recover" && c.uri.empty() && o.replicas == 0) {
    return absl::InvalidArgumentError(
        "'on_failure' is 'recover', which rolls back to the last committed "
        "checkpoint, but 'checkpoint.uri' is empty and 'replicas' is 0; set "
        "checkpoint.uri (and checkpoint.every_steps or every_seconds), or "
        "\"replicas\": 1, or use \"on_failure\": \"fail\"");
  }
  if ((ps.contains("max_recoveries") || ps.contains("host_wait_s")) &&
      o.on_failure != "recover") {
    return absl::InvalidArgumentError(
        "'max_recoveries' and 'host_wait_s' only apply when 'on_failure' is "
        "'recover'; remove them or set \"on_failure\": \"recover\"");
  }
  const bool restore_from_checkpoint_dir =
      !o.restore.empty() && !absl::StrContains(o.restore, "://") &&
      !absl::StartsWith(o.restore, "/");
  if (restore_from_checkpoint_dir && c.uri.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'restore' is '", o.restore,
        "', which is looked up under 'checkpoint.uri', but checkpoint.uri is "
        "empty; set checkpoint.uri or give restore a full URI"));
  }
  if (ps.contains("local_aggregation") && o.local_aggregation && o.workers_per_host > 1) {
    if (const std::string off = LocalAggregationOff(o); !off.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'local_aggregation' sums a host's gradients of a sync step into one push, which does "
          "not fit here: ",
          off, "; remove 'local_aggregation' or set it to false"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string LocalAggregationOff(const PsOptions& o) {
  if (!o.local_aggregation) return "\"local_aggregation\": false";
  if (o.workers_per_host < 2) return "one training process per host";
  if (o.mode != "sync") {
    return absl::StrCat("mode ", o.mode, " applies each worker's own push");
  }
  if (o.backup_workers > 0) return "backup workers: a step goes on without the slowest pushes";
  if (o.elastic_max_workers > 0) return "elastic workers join and leave one by one";
  if (o.on_worker_failure == "continue") {
    return "on_worker_failure continue: the others go on without a lost worker";
  }
  if (o.restart_workers > 0) return "restart_workers: a worker restarts on its own";
  return "";
}

namespace internal {

absl::Status ParseJsonStrict(absl::string_view text, absl::string_view what,
                             Json* out) {
  StrictSax sax;
  if (!Json::sax_parse(text.begin(), text.end(), &sax)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid ", what, " JSON: ",
        sax.error().empty() ? "parse failed" : sax.error()));
  }
  *out = Json::parse(text.begin(), text.end(), nullptr,
                     /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", what, " JSON: parse failed"));
  }
  return absl::OkStatus();
}

}  // namespace internal

absl::StatusOr<PsOptions> ParseDistribution(absl::string_view json) {
  Json root;
  absl::Status s = internal::ParseJsonStrict(json, "--distribution", &root);
  if (!s.ok()) return s;
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--distribution must be a JSON object such as "
        "{\"parameter_server\": {\"enabled\": true}}, got ",
        Describe(root)));
  }
  for (const auto& item : root.items()) {
    if (item.key() != "parameter_server") {
      // SageMaker also knows "mpi", "smdistributed", ...; psrt only
      // implements the parameter-server strategy.
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown top-level key '", item.key(),
          "' in --distribution; accepted keys: parameter_server"));
    }
  }
  PsOptions options;
  auto ps_it = root.find("parameter_server");
  if (ps_it == root.end()) return options;
  const Json& ps = *ps_it;
  if (!ps.is_object()) {
    return TypeError("parameter_server",
                     "an object such as {\"enabled\": true}", ps);
  }
  const auto& specs = ParameterServerKeys();
  for (const auto& item : ps.items()) {
    if (FindKey(specs, item.key()) == nullptr) {
      return UnknownKey(item.key(), "parameter_server", Names(specs));
    }
  }
  for (const KeySpec& spec : specs) {
    auto it = ps.find(spec.name);
    if (it == ps.end()) continue;
    s = spec.apply(*it, &options);
    if (!s.ok()) return s;
  }
  s = ValidateCombination(ps, options);
  if (!s.ok()) return s;
  return options;
}

std::string DistributionHelp() {
  std::string help;
  const auto add = [&help](absl::string_view name, absl::string_view type,
                           absl::string_view default_value,
                           absl::string_view meaning) {
    absl::StrAppendFormat(&help, "  %-26s %-7s default %-10s %s\n", name, type,
                          default_value, meaning);
  };
  add("parameter_server", "object", "{}",
      "the only top-level key; the keys below go inside it");
  for (const KeySpec& k : ParameterServerKeys()) {
    add(k.name, k.type, k.default_value, k.meaning);
  }
  for (const CheckpointKeySpec& k : CheckpointKeys()) {
    add(absl::StrCat("checkpoint.", k.name), k.type, k.default_value,
        k.meaning);
  }
  return help;
}

}  // namespace psrt
