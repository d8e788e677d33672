#include "common/cluster.h"

#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/distribution.h"
#include "common/net.h"
#include "common/slurm.h"

namespace psrt {
namespace {

using Json = nlohmann::json;

// The TF_CONFIG jobs that take part in training, in host-numbering order.
constexpr const char* kTfJobs[] = {"chief", "worker", "ps"};

bool IsTfJob(absl::string_view name) {
  for (const char* job : kTfJobs) {
    if (name == job) return true;
  }
  return false;
}

absl::Status Error(absl::string_view source, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
}

// Empty and whitespace-only values count as unset, as TensorFlow does for
// TF_CONFIG; launchers often export a variable as "" to clear it.
absl::string_view GetEnv(
    const std::function<const char*(const char*)>& getenv_fn,
    const char* name) {
  const char* value = getenv_fn ? getenv_fn(name) : std::getenv(name);
  if (value == nullptr) return "";
  return absl::StripAsciiWhitespace(value);
}

std::string Describe(const Json& v) {
  if (v.is_object() || v.is_array()) return v.type_name();
  return absl::StrCat(
      v.type_name(), " ",
      v.dump(-1, ' ', false, Json::error_handler_t::replace));
}

bool HasWhitespace(absl::string_view s) {
  for (char c : s) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) return true;
  }
  return false;
}

// Shared by --hosts and SM_HOSTS: every host must be a usable, unique name,
// otherwise host indices would disagree between processes.
absl::Status CheckHostName(absl::string_view source, absl::string_view what,
                           absl::string_view host,
                           std::set<std::string>* seen) {
  if (host.empty()) return Error(source, absl::StrCat(what, " is empty"));
  if (HasWhitespace(host)) {
    return Error(source, absl::StrCat(what, " '", host,
                                      "' contains whitespace"));
  }
  if (!seen->insert(std::string(host)).second) {
    return Error(source, absl::StrCat("duplicate host '", host,
                                      "'; each host may appear only once"));
  }
  return absl::OkStatus();
}

int IndexOf(const std::vector<std::string>& hosts, absl::string_view host) {
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i] == host) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<ClusterSpec> FromFlags(absl::string_view flag_hosts,
                                      absl::string_view flag_current) {
  ClusterSpec spec;
  spec.source = "--hosts";
  std::set<std::string> seen;
  int position = 0;
  for (absl::string_view part : absl::StrSplit(flag_hosts, ',')) {
    ++position;
    const absl::string_view host = absl::StripAsciiWhitespace(part);
    absl::Status s = CheckHostName(
        "--hosts",
        absl::StrCat("host name #", position, " in '", flag_hosts, "'"), host,
        &seen);
    if (!s.ok()) return s;
    spec.hosts.emplace_back(host);
  }
  const std::string host_list = absl::StrJoin(spec.hosts, ", ");
  const absl::string_view current = absl::StripAsciiWhitespace(flag_current);
  if (current.empty()) {
    if (spec.hosts.size() == 1) return spec;
    return Error("--hosts", absl::StrCat(
        "lists ", spec.hosts.size(), " hosts (", host_list,
        "), so --current must say which one this is: a host name or an "
        "index 0..", spec.hosts.size() - 1));
  }
  // A name match wins so that numeric host names still work.
  int index = IndexOf(spec.hosts, current);
  if (index < 0) {
    int parsed = -1;
    const bool numeric = absl::ascii_isdigit(current[0]) &&
                         absl::SimpleAtoi(current, &parsed);
    if (!numeric) {
      return Error("--current", absl::StrCat("host '", current,
                                             "' is not in --hosts (",
                                             host_list, ")"));
    }
    if (parsed < 0 || parsed >= static_cast<int>(spec.hosts.size())) {
      return Error("--current", absl::StrCat(
          "index ", current, " is out of range; --hosts lists ",
          spec.hosts.size(), " hosts (valid indices 0..",
          spec.hosts.size() - 1, ")"));
    }
    index = parsed;
  }
  spec.current = index;
  return spec;
}

absl::StatusOr<ClusterSpec> FromSageMaker(absl::string_view sm_hosts,
                                          absl::string_view sm_current) {
  constexpr absl::string_view kSource = "SM_HOSTS";
  Json j;
  absl::Status s = internal::ParseJsonStrict(sm_hosts, kSource, &j);
  if (!s.ok()) return s;
  if (!j.is_array() || j.empty()) {
    return Error(kSource, absl::StrCat(
        "must be a non-empty JSON list of host names such as "
        "[\"algo-1\", \"algo-2\"], got ",
        j.is_array() ? "an empty list" : Describe(j)));
  }
  ClusterSpec spec;
  spec.source = std::string(kSource);
  std::set<std::string> seen;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string what = absl::StrCat("entry ", i);
    if (!j[i].is_string()) {
      return Error(kSource, absl::StrCat(what, " must be a string, got ",
                                         Describe(j[i])));
    }
    const std::string host = j[i].get<std::string>();
    s = CheckHostName(kSource, absl::StrCat(what, " (host name)"), host,
                      &seen);
    if (!s.ok()) return s;
    spec.hosts.push_back(host);
  }
  if (sm_current.empty()) {
    return Error(kSource, "is set but SM_CURRENT_HOST is not; set "
                          "SM_CURRENT_HOST to this host's name");
  }
  const int index = IndexOf(spec.hosts, sm_current);
  if (index < 0) {
    return Error("SM_CURRENT_HOST",
                 absl::StrCat("host '", sm_current, "' is not in SM_HOSTS [",
                              absl::StrJoin(spec.hosts, ", "), "]"));
  }
  spec.current = index;
  return spec;
}

absl::StatusOr<ClusterSpec> FromTfConfig(absl::string_view tf_config) {
  constexpr absl::string_view kSource = "TF_CONFIG";
  const std::string accepted_jobs = absl::StrJoin(kTfJobs, ", ");
  Json j;
  absl::Status s = internal::ParseJsonStrict(tf_config, kSource, &j);
  if (!s.ok()) return s;
  if (!j.is_object()) {
    return Error(kSource, absl::StrCat(
        "must be a JSON object with \"cluster\" and \"task\", got ",
        Describe(j)));
  }
  auto cluster_it = j.find("cluster");
  if (cluster_it == j.end() || !cluster_it->is_object()) {
    return Error(kSource, absl::StrCat(
        "'cluster' must be an object such as {\"worker\": "
        "[\"host1:2222\", \"host2:2222\"]}, got ",
        cluster_it == j.end() ? "nothing" : Describe(*cluster_it)));
  }
  const Json& cluster = *cluster_it;
  for (const auto& item : cluster.items()) {
    if (!IsTfJob(item.key())) {
      return Error(kSource, absl::StrCat("unknown job '", item.key(),
                                         "' in cluster; accepted jobs: ",
                                         accepted_jobs));
    }
  }

  ClusterSpec spec;
  spec.source = std::string(kSource);
  std::set<std::string> addresses;
  for (const char* job : kTfJobs) {
    auto it = cluster.find(job);
    if (it == cluster.end()) continue;
    const std::string where = absl::StrCat("cluster.", job);
    if (!it->is_array()) {
      return Error(kSource, absl::StrCat(where,
                                         " must be a list of \"host:port\" "
                                         "strings, got ",
                                         Describe(*it)));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& entry = (*it)[i];
      const std::string what = absl::StrCat(where, "[", i, "]");
      if (!entry.is_string()) {
        return Error(kSource, absl::StrCat(what, " must be a \"host:port\" "
                                                 "string, got ",
                                           Describe(entry)));
      }
      const std::string address = entry.get<std::string>();
      const std::string host = StripPort(address);
      if (host.empty()) {
        return Error(kSource, absl::StrCat(what, " '", address,
                                           "' has an empty host name"));
      }
      if (HasWhitespace(address)) {
        return Error(kSource, absl::StrCat(what, " '", address,
                                           "' contains whitespace"));
      }
      if (!addresses.insert(address).second) {
        return Error(kSource, absl::StrCat("duplicate address '", address,
                                           "' at ", what));
      }
      // Several tasks may share a host (e.g. a worker and a ps); the host is
      // listed once.
      if (IndexOf(spec.hosts, host) < 0) spec.hosts.push_back(host);
    }
  }
  if (spec.hosts.empty()) {
    return Error(kSource, absl::StrCat("cluster lists no hosts; add at least "
                                       "one of the jobs ",
                                       accepted_jobs));
  }

  auto task_it = j.find("task");
  if (task_it == j.end() || !task_it->is_object()) {
    return Error(kSource, absl::StrCat(
        "'task' must be an object such as {\"type\": \"worker\", "
        "\"index\": 0}, got ",
        task_it == j.end() ? "nothing" : Describe(*task_it)));
  }
  const Json& task = *task_it;
  auto type_it = task.find("type");
  if (type_it == task.end() || !type_it->is_string()) {
    return Error(kSource, absl::StrCat(
        "task.type must be a string, one of ", accepted_jobs, "; got ",
        type_it == task.end() ? "nothing" : Describe(*type_it)));
  }
  const std::string type = type_it->get<std::string>();
  if (!IsTfJob(type)) {
    return Error(kSource, absl::StrCat("task type '", type,
                                       "' is unknown; accepted types: ",
                                       accepted_jobs));
  }
  auto index_it = task.find("index");
  if (index_it == task.end() || !index_it->is_number_integer()) {
    return Error(kSource, absl::StrCat(
        "task.index must be an integer, got ",
        index_it == task.end() ? "nothing" : Describe(*index_it)));
  }
  auto job_it = cluster.find(type);
  const size_t job_size = job_it == cluster.end() ? 0 : job_it->size();
  const bool negative =
      !index_it->is_number_unsigned() && index_it->get<int64_t>() < 0;
  if (negative || index_it->get<uint64_t>() >= job_size) {
    return Error(kSource, absl::StrCat(
        "task index ", index_it->dump(), " is out of range for job '", type,
        "', which has ", job_size, " task(s) in cluster"));
  }
  const std::string address =
      (*job_it)[index_it->get<size_t>()].get<std::string>();
  spec.current = IndexOf(spec.hosts, StripPort(address));
  return spec;
}

}  // namespace

absl::Status CheckNotOneOfSeveral(
    const std::function<const char*(const char*)>& getenv_fn) {
  if (InSlurmJob(getenv_fn)) {
    absl::StatusOr<ClusterSpec> slurm = ClusterFromSlurm(getenv_fn);
    if (!slurm.ok()) return slurm.status();
    if (slurm->hosts.size() > 1) {
      return Error("Slurm", absl::StrCat("this step runs on ", slurm->hosts.size(),
                                         " nodes, each of which would train alone"));
    }
  }
  // mpirun -np N psrt-run: N jobs of one host each.
  for (const char* size_var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    int size = 0;
    if (absl::SimpleAtoi(GetEnv(getenv_fn, size_var), &size) && size > 1) {
      return Error("MPI", absl::StrCat(
          "this process is one of ", size, " that MPI started (", size_var, "=", size,
          "), and nothing says the job's hosts, so each would train alone; run psrt-run once "
          "per host with --hosts and --current-host (or under Slurm's srun)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterSpec> ResolveCluster(
    absl::string_view flag_hosts, absl::string_view flag_current,
    const std::function<const char*(const char*)>& getenv_fn) {
  if (!absl::StripAsciiWhitespace(flag_hosts).empty()) {
    return FromFlags(flag_hosts, flag_current);
  }
  if (!absl::StripAsciiWhitespace(flag_current).empty()) {
    // Applying it to SM_HOSTS/TF_CONFIG would override what the launcher
    // said; ignoring it would hide a mistake.
    return Error("--current", absl::StrCat(
        "'", flag_current, "' was given without --hosts; pass --hosts too, "
        "or drop --current to take the cluster from SM_HOSTS, TF_CONFIG or "
        "Slurm"));
  }
  const absl::string_view sm_hosts = GetEnv(getenv_fn, "SM_HOSTS");
  if (!sm_hosts.empty()) {
    return FromSageMaker(sm_hosts, GetEnv(getenv_fn, "SM_CURRENT_HOST"));
  }
  const absl::string_view tf_config = GetEnv(getenv_fn, "TF_CONFIG");
  if (!tf_config.empty()) return FromTfConfig(tf_config);
  if (InSlurmJob(getenv_fn)) return ClusterFromSlurm(getenv_fn);
  absl::Status s = CheckNotOneOfSeveral(getenv_fn);
  if (!s.ok()) return s;
  ClusterSpec spec;
  spec.hosts = {"localhost"};
  spec.current = 0;
  spec.source = "local";
  return spec;
}

}  // namespace psrt
