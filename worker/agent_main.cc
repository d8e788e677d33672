// psrt-worker: the per-host agent that runs and supervises training processes.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/daemon.h"
#include "common/flags.h"
#include "worker/agent.h"

int main(int argc, char** argv) {
  psrt::AgentOptions options;
  options.coordinator = psrt::EnvOr("PSRT_COORDINATOR", "");
  options.token = psrt::EnvOr("PSRT_JOB_TOKEN", "");
  options.host = psrt::HostName();
  options.host_index = -1;
  double connect_timeout_s = 60, kill_grace_s = 5;
  std::string gpus;
  psrt::Flags flags("psrt-worker",
                    "--coordinator=HOST:PORT --host-index=N [flags] -- COMMAND [ARGS...]");
  flags.Add("coordinator", &options.coordinator,
            "Address of psrt-coordinator (env PSRT_COORDINATOR).");
  flags.Add("host-index", &options.host_index,
            "Index of this host in the job (required); its training processes get ranks "
            "host_index*workers_per_host + local_rank.");
  flags.Add("host", &options.host, "This host's name, as shown in logs and errors.");
  flags.Add("token", &options.token,
            "Job token (env PSRT_JOB_TOKEN), passed to training processes.");
  flags.Add("connect-timeout", &connect_timeout_s, "Seconds to wait for the coordinator at start.");
  flags.Add("kill-grace", &kill_grace_s,
            "Seconds training processes get to exit after SIGTERM before SIGKILL.");
  flags.Add("servers", &options.servers,
            "Also run this host's psrt-servers (from this program's directory), so that a "
            "recovery can restart them.");
  flags.Add("server-host", &options.server_host,
            "With --servers: the host name servers announce (default --host).");
  flags.Add("server-bind", &options.server_bind, "With --servers: the address servers listen on.");
  flags.Add("server-metrics-port", &options.server_metrics_port,
            "With --servers: their /metrics port; 0 picks one, -1 disables.");
  flags.Add("gpus", &gpus,
            "Comma-separated GPUs (CUDA_VISIBLE_DEVICES entries) for the training processes, one "
            "each by local rank (round-robin when fewer); empty: they keep the environment's.");
  flags.Add("tag-output", &options.tag_output,
            "Start each line a training process prints with [RANK]<stdout>: or [RANK]<stderr>:.");
  flags.ParseOrExit(argc, argv);
  if (!gpus.empty()) options.gpus = absl::StrSplit(gpus, ',', absl::SkipEmpty());
  if (options.coordinator.empty() || options.host_index < 0 || flags.command().empty() ||
      connect_timeout_s <= 0 || kill_grace_s < 0 || options.server_metrics_port < -1 ||
      options.server_metrics_port > 65535) {
    std::fprintf(stderr,
                 "psrt-worker: need --coordinator, --host-index >= 0, a command after '--', "
                 "--connect-timeout > 0, --kill-grace >= 0 and --server-metrics-port in -1..65535 "
                 "(see --help)\n");
    return 2;
  }
  options.command = flags.command();
  options.connect_timeout = absl::Seconds(connect_timeout_s);
  options.kill_grace = absl::Seconds(kill_grace_s);
  psrt::InitProcess(absl::StrCat("psrt-worker[", options.host_index, "]"));
  return psrt::RunAgent(options);
}
