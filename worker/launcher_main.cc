// psrt-run: starts a psrt job (coordinator, servers, agents) on this host.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/cluster.h"
#include "common/daemon.h"
#include "common/distribution.h"
#include "common/flags.h"
#include "common/gpus.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/process.h"
#include "worker/launcher.h"

namespace {

// --workers: a count, or "gpus" for one per GPU this host has (as
// torchrun's --nproc-per-node=gpu); 0 when not given.
absl::StatusOr<int> ParseWorkers(const std::string& flag) {
  if (flag.empty()) return 0;
  if (flag == "gpus") {
    const size_t gpus = psrt::VisibleGpus(std::getenv).size();
    if (gpus > 0) return static_cast<int>(std::min<size_t>(gpus, 1024));
    return absl::InvalidArgumentError(
        "--workers=gpus: this host has no GPUs (CUDA_VISIBLE_DEVICES, else the NVIDIA driver's "
        "/proc/driver/nvidia/gpus); give a count");
  }
  int n = 0;
  if (!absl::SimpleAtoi(flag, &n) || n < 1 || n > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers must be a count in 1..1024 or \"gpus\", got '", flag, "'"));
  }
  return n;
}

// The training processes a host runs: --workers, else the distribution's
// workers_per_host, else the GPUs Slurm gave the node, else 1. The choice is
// written into the distribution, which host 0's coordinator hands to every
// host. Returns an error naming a conflict.
absl::Status ChooseWorkers(int flag_workers, const psrt::ClusterSpec& cluster,
                           psrt::LaunchOptions* o) {
  nlohmann::json root = nlohmann::json::parse(o->distribution);  // checked already
  nlohmann::json& ps = root["parameter_server"];
  const bool in_json = ps.contains("workers_per_host");
  int workers = 0;
  if (flag_workers > 0) {
    if (in_json && o->ps.workers_per_host != flag_workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--workers=", flag_workers, " and --distribution's \"workers_per_host\": ",
                       o->ps.workers_per_host, " disagree; give one of them"));
    }
    workers = flag_workers;
  } else if (!in_json && cluster.gpus_per_host > 0) {
    workers = cluster.gpus_per_host;
    psrt::LogNotice(workers, " training processes a host, one per GPU (SLURM_GPUS_ON_NODE)");
  }
  if (workers == 0 || workers == o->ps.workers_per_host) return absl::OkStatus();
  ps["workers_per_host"] = workers;
  o->distribution = root.dump();
  absl::StatusOr<psrt::PsOptions> parsed = psrt::ParseDistribution(o->distribution);
  if (!parsed.ok()) return parsed.status();
  o->ps = *parsed;
  return absl::OkStatus();
}

// The job's hosts and which is this one (--local: simulated here).
absl::Status PlaceHosts(const std::string& hosts, const std::string& current_host,
                        psrt::LaunchOptions* o) {
  if (o->local_hosts > 0) {
    // Started as one of several, each would run a whole job on its machine.
    absl::Status s = psrt::CheckNotOneOfSeveral(std::getenv);
    if (s.ok()) return s;
    return absl::InvalidArgumentError(absl::StrCat(
        "--local runs the whole job on this machine, but ", s.message(), "; drop --local"));
  }
  absl::StatusOr<psrt::ClusterSpec> cluster =
      psrt::ResolveCluster(hosts, current_host, std::getenv);
  if (!cluster.ok()) return cluster.status();
  o->cluster = *cluster;
  // A job of this host alone (a Slurm allocation of one node too) runs as
  // --local=1: loopback, a free coordinator port, a token made up.
  if (o->cluster.hosts.size() == 1 &&
      (o->cluster.hosts[0] == "localhost" || o->cluster.source == "Slurm")) {
    o->local_hosts = 1;
  }
  return absl::OkStatus();
}

// psrt-run's flags as given, before they are checked.
struct RunFlags {
  psrt::LaunchOptions o;  // those that are options as given
  std::string hosts, current_host;
  std::string workers;
  bool bind_gpus = true;
  std::string interface = psrt::EnvOr("PSRT_INTERFACE", "");
  double stop_grace_s = 30;
  bool dry_run = false;
  // Mutual TLS: every process of the job reads these from its environment.
  struct TlsFlag {
    const char* flag;
    const char* env;
    const char* help;
    std::string value;
  };
  TlsFlag tls[4] = {{"tls-ca", "PSRT_TLS_CA",
                     "CA certificate(s), PEM, that signed every process's certificate", ""},
                    {"tls-cert", "PSRT_TLS_CERT", "Certificate, PEM, every process presents", ""},
                    {"tls-key", "PSRT_TLS_KEY", "Private key, PEM, of --tls-cert", ""},
                    {"tls-server-name", "PSRT_TLS_SERVER_NAME",
                     "Name servers' certificates are checked against, not their host", ""}};

  RunFlags() {
    o.distribution = R"({"parameter_server": {"enabled": true}})";
    o.token = psrt::EnvOr("PSRT_JOB_TOKEN", "");
    o.bin_dir = psrt::SelfDirectory();
    o.advertise_address = psrt::EnvOr("PSRT_ADVERTISE_ADDRESS", "");
  }
};

// Defines psrt-run's flags over `f`, in the order --help lists them.
void AddFlags(psrt::Flags* flags, RunFlags* f) {
  psrt::LaunchOptions& o = f->o;
  flags->Add("distribution", &o.distribution,
             "JSON with SageMaker's shape: {\"parameter_server\": {\"enabled\": true, ...}}.");
  flags->Add("workers", &f->workers,
             "Training processes a host runs: a count, or gpus for one per GPU of the host (same "
             "as \"workers_per_host\"; default: that, else Slurm's SLURM_GPUS_ON_NODE, else 1). "
             "Each gets PSRT_LOCAL_RANK 0..N-1 and, with --bind-gpus, a GPU of its own.");
  flags->Add("bind-gpus", &f->bind_gpus,
             "Give each training process of a host its own GPU through CUDA_VISIBLE_DEVICES (its "
             "slice of psrt-run's CUDA_VISIBLE_DEVICES, else of the host's GPUs); false: each "
             "sees every GPU psrt-run sees. A host of one training process keeps every GPU.");
  flags->Add("tag-output", &o.tag_output,
             "Start each line a training process prints with its rank and stream, "
             "[RANK]<stdout>: or [RANK]<stderr>: (as mpirun --tag-output); lines are whole either "
             "way.");
  flags->Add("local", &o.local_hosts,
             "Simulate this many hosts on this machine over loopback (0: off).");
  flags->Add("hosts", &f->hosts,
             "Comma-separated hosts of the job (overrides SM_HOSTS and TF_CONFIG).");
  flags->Add("current-host", &f->current_host, "Which of --hosts this is, by name or index.");
  flags->Add("coordinator-port", &o.coordinator_port,
             "Port of the coordinator on host 0 (multi-host).");
  flags->Add(
      "token", &o.token,
      "Job token (env PSRT_JOB_TOKEN); generated in local mode. Every host must use the same one.");
  flags->Add("interface", &f->interface,
             "Network interface whose IPv4 address this host's servers announce, e.g. eth0 (env "
             "PSRT_INTERFACE); default: the host's name in the host list.");
  flags->Add("advertise-address", &o.advertise_address,
             "Address or name this host's servers announce (env PSRT_ADVERTISE_ADDRESS); "
             "excludes --interface.");
  flags->Add("bin-dir", &o.bin_dir,
             "Directory holding psrt-coordinator, psrt-server and psrt-worker.");
  flags->Add(
      "stop-grace", &f->stop_grace_s,
      "Seconds a SIGTERM or SIGINT (Ctrl-C) leaves the job to write a final checkpoint and end "
      "before its processes are stopped; a second signal stops them at once.");
  flags->Add("summary-json", &o.summary_json,
             "Host 0 also writes the job's summary here as JSON, with each worker's figures.");
  flags->Add(
      "dry-run", &f->dry_run,
      "Print the cluster this would start (hosts, coordinator, servers and ports, workers and "
      "ranks, checkpoint and restore settings) after checking every flag, and exit.");
  flags->Add("metrics-port", &o.metrics_port,
             "Coordinator's Prometheus port (servers then serve /metrics on free ports); -1: off.");
  for (RunFlags::TlsFlag& t : f->tls) {
    flags->Add(t.flag, &t.value, absl::StrCat(t.help, " (env ", t.env, ")."));
  }
}

// What this host's servers announce: --interface's address, else
// --advertise-address (which excludes it), else nothing (their host's name).
absl::Status ChooseAddress(const std::string& interface, psrt::LaunchOptions* o) {
  if (!interface.empty() && !o->advertise_address.empty()) {
    return absl::InvalidArgumentError(
        "give --interface or --advertise-address (PSRT_INTERFACE, PSRT_ADVERTISE_ADDRESS), not "
        "both");
  }
  if (o->local_hosts > 0 && !(interface.empty() && o->advertise_address.empty())) {
    return absl::InvalidArgumentError(
        "--interface and --advertise-address choose what a host announces to other hosts; this job "
        "runs every host on this machine, where servers announce 127.0.0.1");
  }
  if (o->local_hosts > 1 && o->ps.server_port_base > 0) {
    return absl::InvalidArgumentError(
        "--distribution: server_port_base gives every host the same ports, but --local runs " +
        std::to_string(o->local_hosts) + " hosts on this machine; leave it out");
  }
  if (!interface.empty()) {
    absl::StatusOr<std::string> address = psrt::InterfaceAddress(interface);
    if (!address.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--interface: ", address.status().message()));
    }
    o->advertise_address = *address;
  }
  if (o->advertise_address.find_first_of(" ,/") != std::string::npos) {
    return absl::InvalidArgumentError(
        "--advertise-address must be one host name or IP address, without a port");
  }
  return absl::OkStatus();
}

// Checks the flags, in the order a user would fix them, and completes the
// options: the cluster, the training processes a host runs, the address
// servers announce, the token and the GPUs. An error's message is what
// psrt-run prints.
absl::StatusOr<psrt::LaunchOptions> CheckFlags(const RunFlags& f,
                                               const std::vector<std::string>& command) {
  psrt::LaunchOptions o = f.o;
  if (command.empty()) {
    return absl::InvalidArgumentError("no training command; give it after '--' (see --help)");
  }
  o.command = command;
  absl::StatusOr<psrt::PsOptions> ps = psrt::ParseDistribution(o.distribution);
  if (!ps.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--distribution: ", ps.status().message()));
  }
  if (!ps->enabled) {
    return absl::InvalidArgumentError(
        "--distribution: parameter_server.enabled is not true; psrt-run starts parameter-server "
        "jobs only");
  }
  o.ps = *ps;
  if (o.local_hosts < 0 || o.local_hosts > 64) {
    return absl::InvalidArgumentError("--local must be in 0..64");
  }
  absl::StatusOr<int> worker_count = ParseWorkers(f.workers);
  if (!worker_count.ok()) return worker_count.status();
  if (!(f.stop_grace_s >= 0 && f.stop_grace_s <= 86400)) {
    return absl::InvalidArgumentError("--stop-grace must be in 0..86400 seconds");
  }
  o.stop_grace = absl::Seconds(f.stop_grace_s);
  if (o.coordinator_port <= 0 || o.coordinator_port > 65535) {
    return absl::InvalidArgumentError("--coordinator-port must be in 1..65535");
  }
  if (absl::Status s = PlaceHosts(f.hosts, f.current_host, &o); !s.ok()) return s;
  if (absl::Status s = ChooseWorkers(*worker_count, o.cluster, &o); !s.ok()) return s;
  if (absl::Status s = ChooseAddress(f.interface, &o); !s.ok()) return s;
  if (o.token.empty()) {
    if (o.local_hosts > 0) {
      o.token = psrt::RandomToken();
    } else {
      psrt::LogWarning("no job token (--token or PSRT_JOB_TOKEN): RPCs are not authenticated");
    }
  }
  if (f.bind_gpus) o.gpus = psrt::VisibleGpus(std::getenv);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  RunFlags f;
  psrt::Flags flags(
      "psrt-run",
      "--distribution=JSON [--workers=N|gpus] [--local=N | --hosts=H1,H2 --current-host=H] -- "
      "COMMAND [ARGS...]\n\n"
      "Runs the same on every host: each starts its parameter servers and its agent,\n"
      "host 0 also the coordinator. Hosts come from --hosts, else SM_HOSTS and\n"
      "SM_CURRENT_HOST (SageMaker), else TF_CONFIG, else Slurm (srun --ntasks-per-node=1\n"
      "psrt-run ...: SLURM_STEP_NODELIST), else this host alone.\n\n"
      "Distribution keys (inside \"parameter_server\"):\n" +
          psrt::DistributionHelp());
  AddFlags(&flags, &f);
  flags.ParseOrExit(argc, argv);
  for (const RunFlags::TlsFlag& t : f.tls) {
    if (!t.value.empty()) setenv(t.env, t.value.c_str(), 1);
  }
  psrt::InitProcess("psrt-run");
  absl::StatusOr<psrt::LaunchOptions> o = CheckFlags(f, flags.command());
  if (!o.ok()) {
    std::fprintf(stderr, "psrt-run: %s\n", std::string(o.status().message()).c_str());
    return 2;
  }
  if (f.dry_run) {
    std::fputs(psrt::DescribeLaunch(*o).c_str(), stdout);
    return 0;
  }
  // Every process of the job logs at this one's level (an agent, its
  // servers and training processes inherit it).
  setenv("PSRT_LOG_LEVEL", psrt::LogLevelName(psrt::CurrentLogLevel()), 1);
  return psrt::RunLauncher(*o);
}
