// multihost_bench: what crossing hosts costs a training job.
//
// The same job, psrt-example-linreg on 3 hosts with one server and one
// worker each over TCP, runs on three hosts made of network namespaces
// (tests/multihost/netns_hosts.h) and, taking turns with it, on one host over
// loopback (psrt-run --local=3): the baseline, measured in the same run.
// First over plain veth links, then over links shaped to --rate (plus --delay
// where the kernel has netem). Reported: samples/s of each job, the median
// per phase, and the ratio of the hosts' median to the baseline's. With
// --torch, each phase also trains torch_bench.py's large MLP (25.2M
// parameters: communication-bound) on 2 of the hosts through psrt and with
// DDP-gloo, and reports both and their ratio. With --scan-hosts, the linreg
// job also runs on that many hosts (1 server and 1 worker each, plain veth,
// or with --scan-rate each host's sending limited by tbf): seconds from the
// launch to rank 0's first step (registration and the readiness barrier), to
// the end, and the steady samples/s, against the host count
// (benchmarks/scaling/validate.py checks its model against these). With
// --rounds=0 only the scan runs. With --per-host=N, 2 fresh hosts of N
// workers each, their sending limited by tbf to --per-host-rate, run the
// linreg job (--per-host-dim) with each host's workers summing first and
// pushing on their own, in turns (docs/runtime.md, "Local aggregation"),
// and with --per-host-torch-steps (and --torch) the large MLP the same two
// ways and with DDP-gloo.
//
// Namespaces need root; elsewhere it says why and writes {"skipped": why}.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmarks/bench_util.h"
#include "common/flags.h"
#include "common/process.h"
#include "tests/multihost/linreg_rate.h"
#include "tests/multihost/netns_hosts.h"

namespace psrt {
namespace {

constexpr char kProgram[] = "multihost_bench";
constexpr int kHosts = 3;
constexpr int kBatch = 64;
constexpr int kSkipSteps = 50;  // start-up: registration and the first pulls

struct Settings {
  int steps = 400;
  int rounds = 3;
  int dim = 2048;
  int partition_bytes = 4096;
  double lr = 0.1;
  std::string rate = "1gbit", delay = "2ms";
  int timeout_s = 300;
  // PyTorch through psrt against DDP-gloo on 2 of the hosts (--torch).
  std::string torch_python, torch_bench;
  int torch_steps = 10;
  std::vector<int> scan_hosts;  // --scan-hosts
  std::string scan_rate, scan_burst = "32kb";  // --scan-rate: tbf on the scan's links
  int per_host = 0;  // --per-host: workers a host, local aggregation on and off
  std::string per_host_rate = "500mbit";
  int per_host_dim = 262143;
  int per_host_batch = 4;  // little compute: the links, not this VM's 2 cores, bound the step
  int per_host_torch_steps = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Runs the bench's jobs, one at a time, with their logs in one directory.
class JobRunner {
 public:
  JobRunner(const Settings& settings, std::string dir)
      : settings_(settings), dir_(std::move(dir)), bin_(SelfDirectory()) {}

  const std::string& bin() const { return bin_; }

  // The psrt-run flags and training command shared by both kinds of job;
  // `ps` adds distribution keys, and `dim` > 0 replaces --dim.
  std::string Job(const std::string& name, const std::string& ps = "", int dim = 0,
                  int batch = kBatch) const {
    const std::string distribution =
        absl::StrCat(R"({"parameter_server":{"enabled":true,"transport":"tcp","partition_bytes":)",
                     settings_.partition_bytes, ps, "}}");
    return absl::StrCat(
        "--token=bench-", getpid(), "-", name, " --distribution='", distribution, "' -- ", bin_,
        "/psrt-example-linreg --dim=", dim > 0 ? dim : settings_.dim, " --batch=", batch,
        " --log-every=10 --lr=", dim > 0 ? 0.1 / dim : settings_.lr, " --steps=", settings_.steps,
        " --result=", dir_, "/", name, " --loss-log=", LossLog(name));
  }
  std::string LossLog(const std::string& name) const { return dir_ + "/" + name + ".loss"; }

  // When a job's first step and its end came, from its launch.
  struct Timing {
    absl::Duration first_step = absl::InfiniteDuration(), end;
  };

  // Runs the linreg job `name` of `workers` workers: `commands` (one per
  // host). Returns rank 0's steady-state samples/s.
  absl::StatusOr<double> Run(const std::string& name, const std::vector<std::string>& commands,
                             int workers, Timing* timing = nullptr, int batch = kBatch) {
    std::remove(LossLog(name).c_str());
    if (absl::Status s = RunCommands(name, commands, timing); !s.ok()) return s;
    const double rate = LinregSamplesPerSecond(LossLog(name), kSkipSteps, batch * workers);
    if (rate <= 0) {
      return absl::InternalError(absl::StrCat("job ", name, ": no steps past ", kSkipSteps, " in ",
                                              LossLog(name), " (--steps=", settings_.steps, ")"));
    }
    return rate;
  }

  // Runs a torch_bench job `name` (one command per host); returns the
  // samples/s its rank 0 printed (on host 0) as "RESULT x".
  absl::StatusOr<double> RunTorch(const std::string& name, const std::vector<std::string>& commands) {
    if (absl::Status s = RunCommands(name, commands); !s.ok()) return s;
    const std::string log = ReadFile(HostLog(name, 0));
    const size_t at = log.find("RESULT ");
    if (at == std::string::npos) {
      return absl::InternalError(
          absl::StrCat("job ", name, ": rank 0 printed no RESULT:\n", Tail(log, 2000)));
    }
    return std::atof(log.c_str() + at + 7);
  }

  std::string HostLog(const std::string& name, size_t host) const {
    return absl::StrCat(dir_, "/", name, ".host", host, ".log");
  }

  // Runs `commands` (one per host, through the shell), each with its output
  // in HostLog; an error says which host failed, with its log's tail. With
  // `timing`, notes when rank 0 logged its first step (to within the 50 ms
  // this polls at) and when the last host ended.
  absl::Status RunCommands(const std::string& name, const std::vector<std::string>& commands,
                           Timing* timing = nullptr) {
    const absl::Time launch = absl::Now();
    std::vector<pid_t> pids;
    std::vector<std::string> logs;
    for (size_t h = 0; h < commands.size(); ++h) {
      logs.push_back(HostLog(name, h));
      absl::StatusOr<pid_t> pid =
          Spawn({"/bin/sh", "-c", absl::StrCat("exec ", commands[h], " >", logs[h], " 2>&1")}, {});
      if (!pid.ok()) {
        Terminate(pids, absl::Seconds(5));
        return pid.status();
      }
      pids.push_back(*pid);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(settings_.timeout_s);
    std::vector<pid_t> running = pids;
    std::string failed;
    while (!running.empty() && absl::Now() < deadline) {
      if (timing != nullptr && timing->first_step == absl::InfiniteDuration() &&
          std::filesystem::exists(LossLog(name)) && std::filesystem::file_size(LossLog(name)) > 0) {
        timing->first_step = absl::Now() - launch;
      }
      for (const Exit& e : ReapExited()) {
        auto it = std::find(running.begin(), running.end(), e.pid);
        if (it == running.end()) continue;
        running.erase(it);
        const size_t h = std::find(pids.begin(), pids.end(), e.pid) - pids.begin();
        if (e.code != 0) {
          absl::StrAppend(&failed, "\nhost ", h, " ", e.description, ":\n",
                          Tail(ReadFile(logs[h]), 2000));
        }
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (!running.empty()) {
      Terminate(running, absl::Seconds(10));
      return absl::DeadlineExceededError(
          absl::StrCat("job ", name, ": ", running.size(), " of ", pids.size(),
                       " hosts' psrt-run still running after ", settings_.timeout_s,
                       "s (--timeout); logs in ", dir_));
    }
    if (!failed.empty()) return absl::InternalError(absl::StrCat("job ", name, " failed:", failed));
    if (timing != nullptr) timing->end = absl::Now() - launch;
    return absl::OkStatus();
  }

 private:
  const Settings settings_;
  const std::string dir_, bin_;
};

struct Phase {
  std::string name, links;
  std::vector<double> hosts, baseline;  // samples/s per round
  double torch_psrt = 0, torch_ddp = 0;  // --torch: samples/s on 2 hosts
};

// torch_bench's large MLP (25.2M parameters, communication-bound) on hosts 0
// and 1, one worker each: through psrt (a server on each host) and with
// DDP-gloo, in turns. psrt over TCP, as the linreg jobs: the namespaces
// share one /dev/shm, through which "auto" would pass the links by.
absl::Status RunTorch(JobRunner& runner, const NetnsHosts& hosts, const Settings& settings,
                      Phase* phase) {
  const std::string model =
      absl::StrCat(" --model large --batch 32 --warmup 3 --steps ", settings.torch_steps);
  std::vector<std::string> psrt, ddp;
  for (int h = 0; h < 2; ++h) {
    psrt.push_back(absl::StrCat(
        hosts.Exec(h), runner.bin(), "/psrt-run --hosts=", hosts.address(0), ",",
        hosts.address(1), " --current-host=", h, " --token=bench-", getpid(), "-", phase->name,
        R"(-torch --distribution='{"parameter_server":{"enabled":true,"transport":"tcp"}}' -- )",
        "env PYTHONPATH=",
        runner.bin(), "/../python ", settings.torch_python, " ", settings.torch_bench,
        " --role psrt", model));
    // gloo finds its interface by name: each host's one link.
    ddp.push_back(absl::StrCat(hosts.Exec(h), "env GLOO_SOCKET_IFNAME=eth", h, " ",
                               settings.torch_python, " ", settings.torch_bench,
                               " --role ddp-rank --rank ", h, " --master ", hosts.address(0),
                               ":29531", model));
  }
  absl::StatusOr<double> d = runner.RunTorch(phase->name + "-torch-ddp", ddp);
  if (!d.ok()) return d.status();
  absl::StatusOr<double> p = runner.RunTorch(phase->name + "-torch-psrt", psrt);
  if (!p.ok()) return p.status();
  phase->torch_ddp = *d;
  phase->torch_psrt = *p;
  std::printf("  %-7s torch large MLP on 2 hosts: psrt %8.1f samples/s, DDP-gloo %8.1f (x%.2f)\n",
              phase->name.c_str(), *p, *d, *p / *d);
  std::fflush(stdout);
  return absl::OkStatus();
}

// --per-host: 2 hosts of N workers over links limited to --per-host-rate;
// linreg with and without local aggregation in turns, then (--torch) the
// large MLP both ways and with DDP-gloo on the same 2N processes.
struct PerHost {
  std::string links;
  std::vector<double> summed, alone;  // linreg samples/s per round
  double torch_summed = 0, torch_alone = 0, torch_ddp = 0;
};

absl::Status RunPerHost(JobRunner& runner, const Settings& settings, PerHost* out) {
  absl::StatusOr<std::unique_ptr<NetnsHosts>> hosts = NetnsHosts::Create(2);
  if (!hosts.ok()) return hosts.status();
  absl::StatusOr<std::string> tbf =
      (*hosts)->LimitRate(settings.per_host_rate, settings.scan_burst);
  if (!tbf.ok()) return tbf.status();
  out->links = *tbf;
  const int n = settings.per_host;
  const std::string both = absl::StrCat((*hosts)->address(0), ",", (*hosts)->address(1));
  auto ps = [n](bool summed) {
    return absl::StrCat(R"(,"workers_per_host":)", n, R"(,"local_aggregation":)",
                        summed ? "true" : "false");
  };
  for (int r = 0; r < std::max(1, settings.rounds); ++r) {
    for (bool summed : {false, true}) {
      const std::string name = absl::StrCat("perhost-", summed ? "summed" : "alone", r);
      std::vector<std::string> commands;
      for (int h = 0; h < 2; ++h) {
        commands.push_back(absl::StrCat(
            (*hosts)->Exec(h), runner.bin(), "/psrt-run --hosts=", both, " --current-host=", h, " ",
            runner.Job(name, ps(summed), settings.per_host_dim, settings.per_host_batch)));
      }
      absl::StatusOr<double> rate =
          runner.Run(name, commands, 2 * n, nullptr, settings.per_host_batch);
      if (!rate.ok()) return rate.status();
      (summed ? out->summed : out->alone).push_back(*rate);
      std::printf("  per-host round %d: %d x %d workers, %s: %8.0f samples/s\n", r, 2, n,
                  summed ? "summing on each host" : "each pushing alone    ", *rate);
      std::fflush(stdout);
    }
  }
  if (settings.torch_python.empty() || settings.per_host_torch_steps == 0) return absl::OkStatus();
  const std::string model =
      absl::StrCat(" --model large --batch 32 --warmup 2 --steps ", settings.per_host_torch_steps);
  for (int kind = 0; kind < 3; ++kind) {  // alone, summed, DDP-gloo
    std::vector<std::string> commands;
    for (int h = 0; h < 2; ++h) {
      if (kind < 2) {
        commands.push_back(absl::StrCat(
            (*hosts)->Exec(h), runner.bin(), "/psrt-run --hosts=", both, " --current-host=", h,
            " --token=bench-", getpid(), "-perhost-torch", kind,
            R"( --distribution='{"parameter_server":{"enabled":true,"transport":"tcp")",
            ps(kind == 1), "}}' -- env PYTHONPATH=", runner.bin(), "/../python ",
            settings.torch_python, " ", settings.torch_bench, " --role psrt", model));
        continue;
      }
      std::string ranks;
      for (int i = 0; i < n; ++i) {
        absl::StrAppend(&ranks, "env GLOO_SOCKET_IFNAME=eth", h, " ", settings.torch_python, " ",
                        settings.torch_bench, " --role ddp-rank --rank ", h * n + i, " --world ",
                        2 * n, " --master ", (*hosts)->address(0), ":29532", model, " & ");
      }
      commands.push_back(absl::StrCat((*hosts)->Exec(h), "sh -c '", ranks, "wait'"));
    }
    absl::StatusOr<double> rate = runner.RunTorch(absl::StrCat("perhost-torch", kind), commands);
    if (!rate.ok()) return rate.status();
    (kind == 0 ? out->torch_alone : kind == 1 ? out->torch_summed : out->torch_ddp) = *rate;
  }
  std::printf(
      "  per-host torch large MLP, 2 x %d workers: psrt summing %.1f, alone %.1f, DDP-gloo "
      "%.1f samples/s\n",
      n, out->torch_summed, out->torch_alone, out->torch_ddp);
  return absl::OkStatus();
}

// `rounds` turns of: the job on the namespace hosts, then on loopback.
absl::Status RunPhase(JobRunner& runner, const NetnsHosts& hosts, const Settings& settings,
                      Phase* phase) {
  std::vector<std::string> addresses;
  for (int h = 0; h < kHosts; ++h) addresses.push_back(hosts.address(h));
  for (int r = 0; r < settings.rounds; ++r) {
    const std::string name = absl::StrCat(phase->name, r);
    std::vector<std::string> commands;
    for (int h = 0; h < kHosts; ++h) {
      commands.push_back(absl::StrCat(hosts.Exec(h), runner.bin(),
                                      "/psrt-run --hosts=", absl::StrJoin(addresses, ","),
                                      " --current-host=", h, " ", runner.Job(name + "hosts")));
    }
    absl::StatusOr<double> on_hosts = runner.Run(name + "hosts", commands, kHosts);
    if (!on_hosts.ok()) return on_hosts.status();
    absl::StatusOr<double> on_loopback =
        runner.Run(name + "loopback", {absl::StrCat(runner.bin(), "/psrt-run --local=", kHosts, " ",
                                                    runner.Job(name + "loopback"))},
                   kHosts);
    if (!on_loopback.ok()) return on_loopback.status();
    phase->hosts.push_back(*on_hosts);
    phase->baseline.push_back(*on_loopback);
    std::printf("  %-7s round %d: %3d hosts %8.0f samples/s, loopback %8.0f samples/s\n",
                phase->name.c_str(), r, kHosts, *on_hosts, *on_loopback);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// The linreg job on `n` fresh hosts (veth, limited to --scan-rate), once.
struct ScanPoint {
  int hosts = 0;
  double first_step_s = 0, end_s = 0, samples_per_second = 0;
  std::string links;
};

absl::StatusOr<ScanPoint> RunOnHosts(JobRunner& runner, const Settings& settings, int n) {
  absl::StatusOr<std::unique_ptr<NetnsHosts>> hosts = NetnsHosts::Create(n);
  if (!hosts.ok()) return hosts.status();
  std::string links = "veth, unshaped";
  if (!settings.scan_rate.empty()) {
    absl::StatusOr<std::string> tbf = (*hosts)->LimitRate(settings.scan_rate, settings.scan_burst);
    if (!tbf.ok()) return tbf.status();
    links = *tbf;
  }
  std::vector<std::string> addresses, commands;
  for (int h = 0; h < n; ++h) addresses.push_back((*hosts)->address(h));
  const std::string name = absl::StrCat("scan", n);
  for (int h = 0; h < n; ++h) {
    commands.push_back(absl::StrCat((*hosts)->Exec(h), runner.bin(), "/psrt-run --hosts=",
                                    absl::StrJoin(addresses, ","), " --current-host=", h, " ",
                                    runner.Job(name)));
  }
  JobRunner::Timing timing;
  absl::StatusOr<double> rate = runner.Run(name, commands, n, &timing);
  if (!rate.ok()) return rate.status();
  return ScanPoint{n, absl::ToDoubleSeconds(timing.first_step), absl::ToDoubleSeconds(timing.end),
                   *rate, links};
}

nlohmann::json PhaseJson(const Phase& p) {
  nlohmann::json torch = nullptr;
  if (p.torch_ddp > 0) {
    torch = {{"model", "torch_bench large MLP (25.2M parameters), 2 hosts, batch 32 each"},
             {"psrt_samples_per_second", p.torch_psrt},
             {"ddp_gloo_samples_per_second", p.torch_ddp},
             {"psrt_vs_ddp_gloo", p.torch_psrt / p.torch_ddp}};
  }
  return {{"torch", torch},
          {"links", p.links},
          {"hosts_samples_per_second", p.hosts},
          {"loopback_samples_per_second", p.baseline},
          {"hosts_median", Median(p.hosts)},
          {"loopback_median", Median(p.baseline)},
          {"ratio", Median(p.hosts) / Median(p.baseline)}};
}

int Main(int argc, char** argv) {
  Settings settings;
  std::string json_path;
  Flags flags(kProgram,
              "[--steps=400] [--rounds=3] [--rate=1gbit] [--delay=2ms] [--torch=PYTHON] "
              "[--scan-hosts=4,8,16 [--scan-rate=20mbit]] [--json=PATH]");
  flags.Add("steps", &settings.steps, "Training steps per job (the first 50 are not timed).");
  flags.Add("rounds", &settings.rounds,
            "Jobs per phase on the 3 hosts, each followed by the baseline; 0: only the scan.");
  flags.Add("dim", &settings.dim,
            "Features of the linear model (its weight has this many floats).");
  flags.Add("partition-bytes", &settings.partition_bytes, "The jobs' partition_bytes (key size).");
  flags.Add("rate", &settings.rate, "The shaped links' rate, as tc writes it.");
  flags.Add("delay", &settings.delay, "The shaped links' added delay (netem; ignored without it).");
  flags.Add("lr", &settings.lr, "The trainer's learning rate (a wider model needs a smaller one).");
  flags.Add("timeout", &settings.timeout_s, "Give up on a job after this many seconds.");
  flags.Add("json", &json_path, "Write the results as JSON here.");
  flags.Add("torch", &settings.torch_python,
            "Also train torch_bench's large MLP on 2 of the hosts through psrt and with DDP-gloo, "
            "with this Python (torch installed, as .venv's); empty: not run.");
  flags.Add("torch-bench", &settings.torch_bench,
            "torch_bench.py (default: the source tree's, beside this build).");
  flags.Add("torch-steps", &settings.torch_steps, "Timed steps of each torch job.");
  std::string scan_hosts;
  flags.Add("scan-hosts", &scan_hosts,
            "Comma-separated host counts (1..200) to also run the linreg job on, once each: "
            "start-up, end and samples/s against the count; empty: not run.");
  flags.Add("scan-rate", &settings.scan_rate,
            "Limit what each of the scan's hosts sends to this rate (tc tbf, as tc writes it, "
            "queue long enough to drop nothing); empty: unshaped veth.");
  flags.Add("scan-burst", &settings.scan_burst, "The scan's tbf bucket, as tc writes it.");
  flags.Add("per-host", &settings.per_host,
            "Also run 2 hosts of this many workers with and without local aggregation; 0: not "
            "run.");
  flags.Add("per-host-rate", &settings.per_host_rate,
            "Limit what each of those 2 hosts sends to this rate (tc tbf).");
  flags.Add("per-host-dim", &settings.per_host_dim, "Their linreg job's --dim.");
  flags.Add("per-host-batch", &settings.per_host_batch, "Their linreg job's --batch.");
  flags.Add("per-host-torch-steps", &settings.per_host_torch_steps,
            "With --torch: timed steps of the large MLP on those hosts (summing, alone, "
            "DDP-gloo); 0: not run.");
  flags.ParseOrExit(argc, argv);
  absl::StatusOr<std::vector<int>> counts = ParseCounts(scan_hosts, 1, 200);
  if (!counts.ok()) {
    std::fprintf(stderr, "%s: --scan-hosts: %s\n", kProgram,
                 std::string(counts.status().message()).c_str());
    return 2;
  }
  settings.scan_hosts = *std::move(counts);
  if (settings.steps <= kSkipSteps + 10 || settings.rounds < 0 || settings.dim < 1 ||
      settings.timeout_s < 1 || settings.torch_steps < 1 || settings.partition_bytes < 4 ||
      settings.per_host < 0 || settings.per_host_dim < 1 || settings.per_host_batch < 1 ||
      settings.per_host_torch_steps < 0 ||
      (settings.rounds == 0 && settings.scan_hosts.empty() && settings.per_host == 0)) {
    std::fprintf(stderr,
                 "%s: --steps must be above %d, --rounds at least 0 (0 with --scan-hosts), --dim, "
                 "--timeout and --torch-steps at least 1, --partition-bytes at least 4\n",
                 kProgram, kSkipSteps + 10);
    return 2;
  }
  auto write_json = [&](const nlohmann::json& j) {
    if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  };

  absl::StatusOr<std::unique_ptr<NetnsHosts>> hosts = NetnsHosts::Create(kHosts);
  if (!hosts.ok()) {
    std::printf("%s: skipped: %s\n", kProgram, std::string(hosts.status().message()).c_str());
    write_json({{"skipped", std::string(hosts.status().message())}});
    return 0;
  }
  char dir_template[] = "/tmp/psrt-multihost-bench-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  if (settings.torch_bench.empty()) {
    settings.torch_bench = SelfDirectory() + "/../../benchmarks/torch_bench.py";
  }
  JobRunner runner(settings, dir_template);
  const std::string load_before = LoadAverage();
  std::printf(
      "%s: %d hosts (network namespaces) of 1 server and 1 worker, linreg dim %d batch %d, "
      "%d steps, TCP; baseline: the same job on loopback (--local=%d); nproc %ld, load %s\n",
      kProgram, kHosts, settings.dim, kBatch, settings.steps, kHosts, sysconf(_SC_NPROCESSORS_ONLN),
      load_before.c_str());

  std::vector<Phase> phases;
  if (settings.rounds > 0) phases = {{"plain", "veth, unshaped", {}, {}}, {"shaped", "", {}, {}}};
  for (Phase& phase : phases) {
    if (phase.name == "shaped") {
      absl::StatusOr<std::string> shape = (*hosts)->Shape(settings.delay, settings.rate);
      if (!shape.ok()) {
        std::fprintf(stderr, "%s: cannot shape the links: %s\n", kProgram,
                     std::string(shape.status().message()).c_str());
        return 1;
      }
      phase.links = *shape;
    }
    std::printf("%s: %s links (%s)\n", kProgram, phase.name.c_str(), phase.links.c_str());
    absl::Status s = RunPhase(runner, **hosts, settings, &phase);
    if (s.ok() && !settings.torch_python.empty()) s = RunTorch(runner, **hosts, settings, &phase);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", kProgram, std::string(s.message()).c_str());
      return 1;
    }
  }

  nlohmann::json results = nlohmann::json::object();
  if (!phases.empty()) {
    std::printf("\n%-8s %12s %12s %7s  %s\n", "phase", "hosts", "loopback", "ratio", "links");
    for (const Phase& p : phases) {
      std::printf("%-8s %12.0f %12.0f %7.2f  %s\n", p.name.c_str(), Median(p.hosts),
                  Median(p.baseline), Median(p.hosts) / Median(p.baseline), p.links.c_str());
      results[p.name] = PhaseJson(p);
    }
    std::printf("(median samples/s of %d rounds; ratio: hosts / loopback)\n", settings.rounds);
  }
  if (!settings.torch_python.empty() && !phases.empty()) {
    std::printf("\n%-8s %14s %14s %7s  (torch_bench's large MLP, 2 hosts)\n", "phase", "psrt",
                "DDP-gloo", "ratio");
    for (const Phase& p : phases) {
      std::printf("%-8s %14.1f %14.1f %7.2f\n", p.name.c_str(), p.torch_psrt, p.torch_ddp,
                  p.torch_psrt / p.torch_ddp);
    }
  }
  // The host count scan, on fresh namespaces (the 3 hosts' go first).
  hosts->reset();
  nlohmann::json scan = nlohmann::json::array();
  if (!settings.scan_hosts.empty()) {
    std::printf("\n%6s %16s %10s %12s  (linreg dim %d, 1 server and 1 worker a host, %s)\n",
                "hosts", "first step (s)", "end (s)", "samples/s", settings.dim,
                settings.scan_rate.empty() ? "veth" : ("tbf " + settings.scan_rate).c_str());
  }
  for (int n : settings.scan_hosts) {
    absl::StatusOr<ScanPoint> p = RunOnHosts(runner, settings, n);
    if (!p.ok()) {
      std::fprintf(stderr, "%s: %d hosts: %s\n", kProgram, n, std::string(p.status().message()).c_str());
      return 1;
    }
    std::printf("%6d %16.2f %10.2f %12.0f\n", p->hosts, p->first_step_s, p->end_s,
                p->samples_per_second);
    std::fflush(stdout);
    scan.push_back({{"hosts", p->hosts},
                    {"seconds_to_first_step", p->first_step_s},
                    {"seconds_to_end", p->end_s},
                    {"samples_per_second", p->samples_per_second},
                    {"links", p->links}});
  }
  nlohmann::json per_host = nullptr;
  if (settings.per_host > 0) {
    std::printf("\n%s: 2 hosts of %d workers, linreg dim %d\n", kProgram, settings.per_host,
                settings.per_host_dim);
    PerHost p;
    if (absl::Status s = RunPerHost(runner, settings, &p); !s.ok()) {
      std::fprintf(stderr, "%s: per host: %s\n", kProgram, std::string(s.message()).c_str());
      return 1;
    }
    const double ratio = Median(p.summed) / Median(p.alone);
    std::printf("per host: summing first / alone = %.2f (median samples/s %.0f / %.0f; %s)\n",
                ratio, Median(p.summed), Median(p.alone), p.links.c_str());
    if (p.torch_ddp > 0) {
      std::printf("per host, torch large MLP: summing / alone = %.2f, summing / DDP-gloo = %.2f\n",
                  p.torch_summed / p.torch_alone, p.torch_summed / p.torch_ddp);
    }
    per_host = {{"workers_per_host", settings.per_host},
                {"links", p.links},
                {"dim", settings.per_host_dim},
                {"summed_samples_per_second", p.summed},
                {"alone_samples_per_second", p.alone},
                {"summed_vs_alone", ratio},
                {"torch", p.torch_ddp > 0 ? nlohmann::json{{"summed", p.torch_summed},
                                                           {"alone", p.torch_alone},
                                                           {"ddp_gloo", p.torch_ddp}}
                                          : nlohmann::json(nullptr)}};
  }
  std::filesystem::remove_all(dir_template);  // the jobs' logs; kept when a job fails
  write_json({{"benchmark", kProgram},
              {"date", absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone())},
              {"machine",
               {{"nproc", sysconf(_SC_NPROCESSORS_ONLN)},
                {"loadavg_before", load_before},
                {"loadavg_after", LoadAverage()}}},
              {"settings",
               {{"hosts", kHosts},
                {"steps", settings.steps},
                {"rounds", settings.rounds},
                {"dim", settings.dim},
                {"partition_bytes", settings.partition_bytes},
                {"batch", kBatch},
                {"rate", settings.rate},
                {"delay", settings.delay}}},
              {"phases", results},
              {"host_scan", scan},
              {"per_host", per_host}});
  return 0;
}

}  // namespace
}  // namespace psrt

int main(int argc, char** argv) { return psrt::Main(argc, argv); }
