// push_pull_bench: PushPull goodput of real local psrt jobs, over gRPC, over
// the data channel and over shared memory, against raw loopback TCP.
//
// The benchmark starts, per transport, psrt-coordinator and --servers
// psrt-server processes on 127.0.0.1 and is itself worker 0 of a one-worker
// sync job ("transport": "grpc", "tcp" (the data channel), and "auto",
// which on one host is shared memory). For each tensor size it registers one float32 variable and times
// PushPull rounds (push the gradient, pull the next version), buffers
// allocated once, the transports taking turns. The baseline moves the same
// bytes the same way over one loopback TCP connection between two threads
// of this process: send `bytes`, the peer receives them all and sends
// `bytes` back. All report
//
//   goodput = 2 * bytes * iterations / seconds   (push + pull payload)
//
// so the ratio psrt/TCP says how much of the wire speed psrt's framing,
// copies, optimizer step and server hop leave. Then each job runs
// --rss-steps more rounds and the servers' resident memory before and
// after is reported: with pooled buffers it does not grow.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#ifdef PSRT_HAVE_ZMQ
#include <zmq.h>
#endif

#include "benchmarks/bench_util.h"
#include "common/daemon.h"
#include "common/flags.h"
#include "common/grpc_util.h"
#include "common/process.h"
#include "worker/client.h"

namespace psrt {
namespace {

constexpr char kProgram[] = "push_pull_bench";

std::string HumanBytes(int64_t b) {
  if (b >= (1ll << 30) && b % (1ll << 30) == 0) return absl::StrCat(b >> 30, " GiB");
  if (b >= (1ll << 20) && b % (1ll << 20) == 0) return absl::StrCat(b >> 20, " MiB");
  if (b >= (1ll << 10) && b % (1ll << 10) == 0) return absl::StrCat(b >> 10, " KiB");
  return absl::StrCat(b, " B");
}

// "4K", "64KiB", "1M", "256MiB", "1048576".
absl::StatusOr<int64_t> ParseSize(absl::string_view text) {
  std::string t = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  absl::string_view v = t;
  int64_t mult = 1;
  if (!absl::ConsumeSuffix(&v, "IB")) absl::ConsumeSuffix(&v, "B");
  if (absl::ConsumeSuffix(&v, "K")) {
    mult = 1ll << 10;
  } else if (absl::ConsumeSuffix(&v, "M")) {
    mult = 1ll << 20;
  } else if (absl::ConsumeSuffix(&v, "G")) {
    mult = 1ll << 30;
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(v, &n) || n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size (e.g. 4K, 64K, 1M, 4096)"));
  }
  return n * mult;
}

// One measured transport at one size.
struct Measurement {
  int64_t iterations = 0;
  double seconds = 0;
  double cpu_seconds = -1;  // of the bench and the job's servers while timed; -1: not read
  double Goodput(int64_t bytes) const { return 2.0 * bytes * iterations / seconds; }  // bytes/s
  double Latency() const { return seconds / iterations; }                              // s
};

// Runs `iteration` (which returns OK or the error) untimed for ~0.1 s (at
// least once: connections, page faults, allocator), then timed until
// `target` seconds and `min_iterations` calls have both passed.
absl::StatusOr<Measurement> Measure(const std::function<absl::Status()>& iteration, double target,
                                    int64_t min_iterations,
                                    const std::function<double()>& cpu_now = nullptr) {
  const absl::Time warm_start = absl::Now();
  do {
    if (absl::Status s = iteration(); !s.ok()) return s;
  } while (absl::Now() - warm_start < absl::Milliseconds(100));
  const absl::Duration wanted = absl::Seconds(target);
  Measurement m;
  const double cpu_start = cpu_now ? cpu_now() : 0;
  const absl::Time start = absl::Now();
  absl::Duration elapsed;
  do {
    if (absl::Status s = iteration(); !s.ok()) return s;
    ++m.iterations;
    elapsed = absl::Now() - start;
  } while (m.iterations < min_iterations || elapsed < wanted);
  m.seconds = absl::ToDoubleSeconds(elapsed);
  if (cpu_now) m.cpu_seconds = cpu_now() - cpu_start;
  return m;
}

// ---------------------------------------------------------------------------
// The local psrt job.

// Children of this process; the signal thread and the watchdog stop them too.
// Set once a signal or the watchdog is stopping the job: the errors that
// follow in the main thread are consequences, not news.
std::atomic<bool> stopping{false};
absl::Mutex children_mu;
std::vector<pid_t>* children = new std::vector<pid_t>;

void StopChildren() {
  std::vector<pid_t> pids;
  {
    absl::MutexLock lock(&children_mu);
    pids.swap(*children);
  }
  if (!pids.empty()) Terminate(pids, absl::Seconds(3));
}

class LocalJob {
 public:
  ~LocalJob() { StopChildren(); }

  absl::Status Start(int servers, int64_t partition_bytes, const std::string& transport, int replicas,
                     const std::string& log_dir, bool verbose) {
    log_dir_ = log_dir;
    token_ = RandomToken();
    const std::string bin = SelfDirectory();
    const std::string port_file = log_dir + "/coordinator.port";
    const std::string distribution = absl::StrCat(
        R"({"parameter_server": {"enabled": true, "mode": "sync", "servers_per_host": )", servers,
        R"(, "workers_per_host": 1, "transport": ")", transport, R"(", "partition_bytes": )",
        partition_bytes, R"(, "replicas": )", replicas,
        // A loaded 2-core machine can stall a heartbeat for a while; the
        // benchmark is about throughput, not failure detection.
        R"(, "heartbeat_timeout_s": 60}})");
    const std::map<std::string, std::string> env = {{"PSRT_JOB_TOKEN", token_}};
    pid_t coordinator = 0;
    if (absl::Status s = SpawnLogged("coordinator",
                                     {bin + "/psrt-coordinator", "--bind=127.0.0.1", "--port=0",
                                      "--port-file=" + port_file, "--hosts=local0",
                                      "--distribution=" + distribution},
                                     env, verbose, &coordinator);
        !s.ok()) {
      return s;
    }
    // Wait for the port file, or the coordinator's early exit.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    int port = 0;
    while (true) {
      std::ifstream in(port_file);
      if (in >> port && port > 0) break;
      for (const Exit& e : ReapExited()) {
        if (e.pid == coordinator) {
          Forget(e.pid);
          return absl::FailedPreconditionError(
              absl::StrCat("psrt-coordinator ", e.description, " before listening", Logs()));
        }
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("psrt-coordinator did not write ", port_file, " within 30s", Logs()));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    coordinator_ = absl::StrCat("127.0.0.1:", port);
    for (int i = 0; i < servers; ++i) {
      pid_t& pid = server_pids_.emplace_back();
      if (absl::Status s = SpawnLogged(absl::StrCat("server", i),
                                       {bin + "/psrt-server", "--coordinator=" + coordinator_,
                                        absl::StrCat("--index=", i), "--host=127.0.0.1",
                                        "--bind=127.0.0.1", "--connect-timeout=30"},
                                       env, verbose, &pid);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  // Any child that ended early, as an error naming it; OK while all run.
  absl::Status CheckChildren() {
    for (const Exit& e : ReapExited()) {
      Forget(e.pid);
      auto it = names_.find(e.pid);
      const std::string name = it == names_.end() ? "a job process" : it->second;
      return absl::AbortedError(absl::StrCat(name, " (pid ", e.pid, ") ", e.description, Logs()));
    }
    return absl::OkStatus();
  }

  // The children's output, for error messages.
  std::string Logs() const {
    std::string out;
    for (const std::string& name : log_names_) {
      const std::string text = ReadFile(log_dir_ + "/" + name + ".log");
      if (!text.empty()) absl::StrAppend(&out, "\n--- ", name, ".log ---\n", Tail(text, 3000));
    }
    return out;
  }

  const std::string& coordinator() const { return coordinator_; }
  const std::string& token() const { return token_; }
  // CPU seconds (user and system) this process and the servers have used:
  // where a path's time goes, when it is bound by the machine's cores.
  double CpuSeconds() const {
    rusage self;
    getrusage(RUSAGE_SELF, &self);
    double total = self.ru_utime.tv_sec + self.ru_stime.tv_sec +
                   (self.ru_utime.tv_usec + self.ru_stime.tv_usec) / 1e6;
    for (pid_t pid : server_pids_) {
      std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      // After the command's ")": state is field 3, utime and stime 14 and 15.
      std::vector<std::string> fields = absl::StrSplit(stat.substr(stat.rfind(')') + 2), ' ');
      int64_t utime = 0, stime = 0;
      if (fields.size() > 12 && absl::SimpleAtoi(fields[11], &utime) &&
          absl::SimpleAtoi(fields[12], &stime)) {
        total += static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
      }
    }
    return total;
  }

  // Resident memory of all servers together, in KiB.
  int64_t ServerRssKib() const {
    int64_t total = 0;
    for (pid_t pid : server_pids_) {
      std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
      std::string line;
      int64_t kib = 0;
      while (std::getline(in, line)) {
        if (absl::StartsWith(line, "VmRSS:") &&
            absl::SimpleAtoi(absl::StripSuffix(absl::StripAsciiWhitespace(line.substr(6)), " kB"), &kib)) {
          total += kib;
        }
      }
    }
    return total;
  }

 private:
  // Starts `argv` with stdout and stderr in LOG_DIR/NAME.log (inherited
  // from this process across the fork) unless `verbose`.
  absl::Status SpawnLogged(const std::string& name, const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& env, bool verbose, pid_t* pid) {
    int saved_out = -1, saved_err = -1, log = -1;
    if (!verbose) {
      const std::string path = log_dir_ + "/" + name + ".log";
      log = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (log < 0) return absl::InternalError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
      std::fflush(stdout);
      std::fflush(stderr);
      saved_out = dup(1);
      saved_err = dup(2);
      dup2(log, 1);
      dup2(log, 2);
      log_names_.push_back(name);
    }
    absl::StatusOr<pid_t> started = Spawn(argv, env);
    if (!verbose) {
      dup2(saved_out, 1);
      dup2(saved_err, 2);
      close(saved_out);
      close(saved_err);
      close(log);
    }
    if (!started.ok()) return started.status();
    *pid = *started;
    names_[*pid] = absl::StrCat(argv[0].substr(argv[0].rfind('/') + 1),
                                name == "coordinator" ? "" : absl::StrCat("[", name.substr(6), "]"));
    absl::MutexLock lock(&children_mu);
    children->push_back(*pid);
    return absl::OkStatus();
  }

  static void Forget(pid_t pid) {
    absl::MutexLock lock(&children_mu);
    children->erase(std::remove(children->begin(), children->end(), pid), children->end());
  }

  std::string log_dir_;
  std::string token_;
  std::string coordinator_;
  std::vector<pid_t> server_pids_;
  std::vector<std::string> log_names_;
  std::map<pid_t, std::string> names_;
};

absl::StatusOr<Measurement> MeasurePsrt(Client* client, LocalJob* job, int64_t bytes, float* grad,
                                        float* out, double target, int64_t min_iterations,
                                        const std::string& prefix = "bench_") {
  const std::string name = absl::StrCat(prefix, bytes);
  const int64_t n = bytes / 4;
  std::fill(out, out + n, 0.5f);
  if (absl::Status s = client->RegisterVariable(name, {n}, out, DefaultOptimizer(OptimizerKind::kSgd, 0.0));
      !s.ok()) {
    return s;
  }
  std::fill(out, out + n, 0.0f);
  const std::vector<TensorRef> refs = {{name, grad, out}};
  int64_t version = 0;
  absl::StatusOr<Measurement> m = Measure(
      [&]() -> absl::Status {
        absl::Status s = client->Wait(client->PushPull(refs, version));
        ++version;
        if (s.ok()) return s;
        absl::Status children = job->CheckChildren();  // a dead server explains more
        return children.ok() ? s : children;
      },
      target, min_iterations, [job] { return job->CpuSeconds(); });
  if (!m.ok()) return m;
  // lr 0: the pulled weights are the registered ones.
  if (out[0] != 0.5f || out[n / 2] != 0.5f || out[n - 1] != 0.5f) {
    return absl::InternalError(absl::StrCat("pulled weights of ", name, " are not the registered 0.5 (got ",
                                            out[0], ", ", out[n / 2], ", ", out[n - 1], ")"));
  }
  return m;
}

// ---------------------------------------------------------------------------
// The TCP baseline.

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

absl::Status SetSocketOptions(int fd, absl::Duration timeout) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) return Errno("TCP_NODELAY");
  timeval tv{};
  tv.tv_sec = absl::ToInt64Seconds(timeout);
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) return Errno("SO_RCVTIMEO");
  if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) return Errno("SO_SNDTIMEO");
  return absl::OkStatus();
}

// Both end within the sockets' timeouts.
absl::Status SendAll(int fd, const char* p, int64_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return Errno("send");
    p += k;
    n -= k;
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, char* p, int64_t n) {
  while (n > 0) {
    ssize_t k = recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) return absl::UnavailableError("recv: the peer closed the connection");
    if (k < 0) return Errno("recv");
    p += k;
    n -= k;
  }
  return absl::OkStatus();
}

// A connected pair of loopback sockets with an echo thread on one end.
class TcpEcho {
 public:
  ~TcpEcho() {
    if (client_ >= 0) shutdown(client_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    if (client_ >= 0) close(client_);
  }

  absl::Status Start(int64_t max_bytes, absl::Duration timeout) {
    server_buf_.assign(max_bytes, 0);
    const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return Errno("socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      absl::Status s = Errno("listen on 127.0.0.1");
      close(listener);
      return s;
    }
    client_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (client_ < 0 || connect(client_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      absl::Status s = Errno("connect to 127.0.0.1");
      close(listener);
      return s;
    }
    pollfd pfd{listener, POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
    const int server = ready == 1 ? accept4(listener, nullptr, nullptr, SOCK_CLOEXEC) : -1;
    close(listener);
    if (server < 0) return ready == 1 ? Errno("accept") : absl::DeadlineExceededError("accept timed out");
    if (absl::Status s = SetSocketOptions(server, timeout); !s.ok()) {
      close(server);
      return s;
    }
    if (absl::Status s = SetSocketOptions(client_, timeout); !s.ok()) {
      close(server);
      return s;
    }
    // Echo: 8-byte length, then that many bytes in, then as many back.
    thread_ = std::thread([this, server] {
      while (true) {
        int64_t n = 0;
        if (!RecvAll(server, reinterpret_cast<char*>(&n), sizeof(n)).ok() || n <= 0 ||
            n > static_cast<int64_t>(server_buf_.size())) {
          break;
        }
        if (!RecvAll(server, server_buf_.data(), n).ok()) break;
        if (!SendAll(server, server_buf_.data(), n).ok()) break;
      }
      close(server);
    });
    return absl::OkStatus();
  }

  // One round: `bytes` out, `bytes` back.
  absl::Status RoundTrip(const char* out, char* in, int64_t bytes) {
    if (absl::Status s = SendAll(client_, reinterpret_cast<const char*>(&bytes), sizeof(bytes)); !s.ok()) {
      return s;
    }
    if (absl::Status s = SendAll(client_, out, bytes); !s.ok()) return s;
    return RecvAll(client_, in, bytes);
  }

 private:
  int client_ = -1;
  std::vector<char> server_buf_;
  std::thread thread_;
};

#ifdef PSRT_HAVE_ZMQ
// A ps-lite-style parameter server in this process, for the baseline
// ps-lite's users know: its van is ZeroMQ (DEALER/ROUTER, multipart
// messages whose values go zero-copy). One server thread holds a float32
// store; a push-pull sends [key, values] (zero-copy from the gradient), the
// server applies w -= lr * g and answers [key, weights] (zero-copy from the
// store), and the worker copies them into its output, as ps-lite's KVWorker
// copies a pull's answer. One round trip per push-pull, like psrt's
// PushPull; ps-lite's ZPush then ZPull would be two.
class ZmqPs {
 public:
  ~ZmqPs() {
    if (server_ctx_ != nullptr) zmq_ctx_shutdown(server_ctx_);  // ends the server's recv
    if (thread_.joinable()) thread_.join();
    if (dealer_ != nullptr) zmq_close(dealer_);
    if (client_ctx_ != nullptr) zmq_ctx_term(client_ctx_);
    if (server_ctx_ != nullptr) zmq_ctx_term(server_ctx_);
  }

  absl::Status Start(int64_t max_bytes) {
    store_.assign(max_bytes / 4, 0.0f);
    server_ctx_ = zmq_ctx_new();
    client_ctx_ = zmq_ctx_new();
    router_ = zmq_socket(server_ctx_, ZMQ_ROUTER);
    dealer_ = zmq_socket(client_ctx_, ZMQ_DEALER);
    if (router_ == nullptr || dealer_ == nullptr || zmq_bind(router_, "tcp://127.0.0.1:*") != 0) {
      return absl::UnavailableError(absl::StrCat("ZeroMQ: ", zmq_strerror(zmq_errno())));
    }
    char endpoint[256];
    size_t len = sizeof(endpoint);
    zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, endpoint, &len);
    if (zmq_connect(dealer_, endpoint) != 0) {
      return absl::UnavailableError(absl::StrCat("ZeroMQ: ", zmq_strerror(zmq_errno())));
    }
    thread_ = std::thread([this] { Serve(); });
    return absl::OkStatus();
  }

  absl::Status PushPull(const float* grad, float* out, int64_t bytes) {
    zmq_msg_t values;
    zmq_msg_init_data(&values, const_cast<float*>(grad), bytes, nullptr, nullptr);
    if (zmq_send(dealer_, "w", 1, ZMQ_SNDMORE) < 0 || zmq_msg_send(&values, dealer_, 0) < 0) {
      zmq_msg_close(&values);
      return absl::UnavailableError(absl::StrCat("ZeroMQ send: ", zmq_strerror(zmq_errno())));
    }
    char key[8];
    zmq_msg_t answer;
    zmq_msg_init(&answer);
    if (zmq_recv(dealer_, key, sizeof(key), 0) < 0 || zmq_msg_recv(&answer, dealer_, 0) < 0 ||
        static_cast<int64_t>(zmq_msg_size(&answer)) != bytes) {
      zmq_msg_close(&answer);
      return absl::UnavailableError(absl::StrCat("ZeroMQ receive: ", zmq_strerror(zmq_errno())));
    }
    std::memcpy(out, zmq_msg_data(&answer), bytes);
    zmq_msg_close(&answer);
    return absl::OkStatus();
  }

 private:
  void Serve() {
    while (true) {
      zmq_msg_t id, key, grad;
      zmq_msg_init(&id);
      zmq_msg_init(&key);
      zmq_msg_init(&grad);
      if (zmq_msg_recv(&id, router_, 0) < 0 || zmq_msg_recv(&key, router_, 0) < 0 ||
          zmq_msg_recv(&grad, router_, 0) < 0) {
        zmq_msg_close(&id);
        zmq_msg_close(&key);
        zmq_msg_close(&grad);
        break;  // ETERM: the benchmark is done
      }
      const int64_t n = std::min<int64_t>(zmq_msg_size(&grad) / 4, store_.size());
      const float* g = static_cast<const float*>(zmq_msg_data(&grad));
      for (int64_t i = 0; i < n; ++i) store_[i] -= 0.01f * g[i];
      zmq_msg_close(&grad);
      zmq_msg_t weights;
      zmq_msg_init_data(&weights, store_.data(), n * 4, nullptr, nullptr);
      zmq_msg_send(&id, router_, ZMQ_SNDMORE);
      zmq_msg_send(&key, router_, ZMQ_SNDMORE);
      zmq_msg_send(&weights, router_, 0);
    }
    zmq_close(router_);
  }

  void* server_ctx_ = nullptr;
  void* client_ctx_ = nullptr;
  void* router_ = nullptr;
  void* dealer_ = nullptr;
  std::vector<float> store_;
  std::thread thread_;
};
#endif  // PSRT_HAVE_ZMQ

// ---------------------------------------------------------------------------

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name")) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  return "";
}

// Removes a directory of files and directories (the jobs' logs).
void RemoveDirectory(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        const std::string path = dir + "/" + e->d_name;
        if (e->d_type == DT_DIR) {
          RemoveDirectory(path);
        } else {
          unlink(path.c_str());
        }
      }
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

// The psrt jobs measured, one per transport: gRPC, the data channel over
// TCP, and on one host shared memory.
constexpr int kNumTransports = 3;
const char* const kTransports[kNumTransports] = {"grpc", "tcp", "auto"};
const char* TransportName(const std::string& t) { return t == "auto" ? "shm" : t.c_str(); }

struct Row {
  int64_t bytes = 0;
  Measurement psrt[kNumTransports];  // per kTransports
  Measurement tcp;
  Measurement zmq;  // iterations 0: not measured (built without ZeroMQ)
};

struct Rss {
  int64_t before_kib = 0;
  int64_t after_kib = 0;
  int64_t steps = 0;
};

int Run(int argc, char** argv) {
  int servers = 2, replicas = 0;
  int64_t max_bytes = 256ll << 20, partition_bytes = 4 << 20, min_iterations = 3;
  double seconds = 1.0, timeout_s = 600;
  int64_t rss_steps = 1000;
  std::string sizes_flag = "4K,64K,1M,16M,64M,256M", json_path;
  bool verbose = false;
  Flags flags(kProgram, "[--servers=2] [--sizes=4K,64K,...] [--max-bytes=N] [--json=PATH]");
  flags.Add("servers", &servers, "psrt-server processes of the local job.");
  flags.Add("replicas", &replicas, "The job's \"replicas\": 1 keeps a copy of every key on another server.");
  flags.Add("sizes", &sizes_flag, "Comma-separated tensor sizes in bytes (suffixes K, M, G: binary).");
  flags.Add("max-bytes", &max_bytes, "Skip sizes above this many bytes.");
  flags.Add("partition-bytes", &partition_bytes, "The job's partition_bytes (key size).");
  flags.Add("seconds", &seconds, "Least timed seconds per size and transport (after a warm-up).");
  flags.Add("min-iterations", &min_iterations, "Fewest timed iterations per size and transport.");
  flags.Add("timeout", &timeout_s, "Give up (and stop the job) after this many seconds in all.");
  flags.Add("rss-steps", &rss_steps, "Rounds of 1 MiB between the two readings of the servers' memory.");
  flags.Add("json", &json_path, "Write the results as JSON here.");
  flags.Add("job-logs-here", &verbose, "Let the job's processes log to this terminal instead of files.");
  flags.ParseOrExit(argc, argv);
  if (servers < 1 || replicas < 0 || replicas >= servers || max_bytes < 4 || seconds <= 0 || min_iterations < 1 || timeout_s <= 0 ||
      rss_steps < 0) {
    std::fprintf(stderr, "%s: need --servers >= 1, --replicas in 0..servers-1, --max-bytes >= 4, --seconds > 0, --min-iterations >= 1, --timeout > 0, --rss-steps >= 0\n",
                 kProgram);
    return 2;
  }
  std::vector<int64_t> sizes;
  for (absl::string_view part : absl::StrSplit(sizes_flag, ',', absl::SkipWhitespace())) {
    absl::StatusOr<int64_t> b = ParseSize(part);
    if (!b.ok() || *b % 4 != 0) {
      std::fprintf(stderr, "%s: --sizes: %s\n", kProgram,
                   b.ok() ? absl::StrCat(*b, " is not a whole number of float32s").c_str()
                          : std::string(b.status().message()).c_str());
      return 2;
    }
    if (*b <= max_bytes) sizes.push_back(*b);
  }
  if (sizes.empty()) {
    std::fprintf(stderr, "%s: no size in --sizes is at most --max-bytes=%lld\n", kProgram,
                 static_cast<long long>(max_bytes));
    return 2;
  }
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());

  char dir_template[] = "/tmp/psrt-bench-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::fprintf(stderr, "%s: cannot make a temporary directory: %s\n", kProgram, strerror(errno));
    return 1;
  }
  const std::string log_dir = dir_template;
  auto fail = [&](const absl::Status& s) {
    if (stopping) absl::SleepFor(absl::Seconds(10));  // the stopping thread exits the process
    std::fprintf(stderr, "%s: %s\n(job logs kept in %s)\n", kProgram, s.ToString().c_str(), log_dir.c_str());
    return 1;
  };

  // Stop the job on SIGINT/SIGTERM/SIGHUP and when the whole run overruns.
  // (Before any thread starts, so every thread leaves these signals to it.)
  HandleSignals([log_dir](int sig) {
    stopping = true;
    std::fprintf(stderr, "%s: got signal %d; stopping the job\n", kProgram, sig);
    StopChildren();
    RemoveDirectory(log_dir);
    _exit(128 + sig);
  });
  std::thread([timeout_s, log_dir] {
    absl::SleepFor(absl::Seconds(timeout_s));
    stopping = true;
    std::fprintf(stderr, "%s: still running after --timeout=%gs; stopping the job (logs in %s)\n", kProgram,
                 timeout_s, log_dir.c_str());
    StopChildren();
    _exit(1);
  }).detach();

  const std::string date = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  const int nproc = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  const std::string load_before = LoadAverage();
  std::printf("push_pull_bench: %d psrt-server(s), 1 worker (sync), partition_bytes %s; %d CPUs, load %s\n",
              servers, HumanBytes(partition_bytes).c_str(), nproc, load_before.c_str());
  std::fflush(stdout);

  // Buffers for every size, allocated and touched once.
  std::vector<float> grad(largest / 4, 1.0f), out(largest / 4, 0.0f);
  std::vector<char> tcp_out(largest, 1), tcp_in(largest, 0);

  std::vector<Row> rows;
  Rss rss[kNumTransports];
  {
    LocalJob jobs[kNumTransports];
    std::unique_ptr<Client> clients[kNumTransports];
    for (int t = 0; t < kNumTransports; ++t) {
      LocalJob& job = jobs[t];
      const std::string dir = absl::StrCat(log_dir, "/", TransportName(kTransports[t]));
      mkdir(dir.c_str(), 0755);
      if (absl::Status s = job.Start(servers, partition_bytes, kTransports[t], replicas, dir, verbose); !s.ok()) {
        return fail(s);
      }
      ClientOptions options;
      options.coordinator = job.coordinator();
      options.token = job.token();
      options.rank = 0;
      options.host = "local0";
      options.connect_timeout = absl::Seconds(60);
      options.rpc_timeout = absl::Seconds(60);
      absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
      if (!client.ok()) {
        absl::Status children = job.CheckChildren();
        return fail(children.ok() ? absl::Status(client.status().code(),
                                                 absl::StrCat(client.status().message(), job.Logs()))
                                  : children);
      }
      clients[t] = *std::move(client);
    }
    TcpEcho tcp;
    if (absl::Status s = tcp.Start(largest, absl::Seconds(60)); !s.ok()) return fail(s);
#ifdef PSRT_HAVE_ZMQ
    ZmqPs zmq;
    if (absl::Status s = zmq.Start(largest); !s.ok()) return fail(s);
#endif

    for (int64_t bytes : sizes) {
      Row row;
      row.bytes = bytes;
      for (int t = 0; t < kNumTransports; ++t) {
        absl::StatusOr<Measurement> m = MeasurePsrt(clients[t].get(), &jobs[t], bytes, grad.data(),
                                                    out.data(), seconds, min_iterations);
        if (!m.ok()) {
          return fail(absl::Status(m.status().code(),
                                   absl::StrCat("psrt (", TransportName(kTransports[t]), ") at ",
                                                HumanBytes(bytes), ": ", m.status().message())));
        }
        row.psrt[t] = *m;
      }
      absl::StatusOr<Measurement> t = Measure(
          [&] { return tcp.RoundTrip(tcp_out.data(), tcp_in.data(), bytes); }, seconds, min_iterations);
      if (!t.ok()) {
        return fail(absl::Status(t.status().code(),
                                 absl::StrCat("TCP at ", HumanBytes(bytes), ": ", t.status().message())));
      }
      row.tcp = *t;
#ifdef PSRT_HAVE_ZMQ
      absl::StatusOr<Measurement> z = Measure(
          [&] { return zmq.PushPull(grad.data(), out.data(), bytes); }, seconds, min_iterations);
      if (!z.ok()) return fail(z.status());
      row.zmq = *z;
#endif
      rows.push_back(row);
      std::fprintf(stderr, "  %s done (psrt grpc %lld iterations, tcp %lld, shm %lld; TCP %lld)\n",
                   HumanBytes(bytes).c_str(), static_cast<long long>(row.psrt[0].iterations),
                   static_cast<long long>(row.psrt[1].iterations),
                   static_cast<long long>(row.psrt[2].iterations),
                   static_cast<long long>(row.tcp.iterations));
    }
    // Server memory across rss_steps rounds of 1 MiB, after a warm-up of
    // 50 (the variable is new: its buffers are made then).
    const int64_t rss_bytes = std::min<int64_t>(largest, 1 << 20) & ~int64_t{3};
    for (int t = 0; t < kNumTransports && rss_steps > 0; ++t) {
      absl::StatusOr<Measurement> warm =
          MeasurePsrt(clients[t].get(), &jobs[t], rss_bytes, grad.data(), out.data(), 1e-9, 50, "rss_");
      rss[t].before_kib = jobs[t].ServerRssKib();
      absl::StatusOr<Measurement> m = warm.ok() ? MeasurePsrt(clients[t].get(), &jobs[t], rss_bytes, grad.data(),
                                                              out.data(), 1e-9, rss_steps, "rss_again_")
                                                : warm;
      if (!m.ok()) return fail(m.status());
      rss[t].after_kib = jobs[t].ServerRssKib();
      rss[t].steps = m->iterations;
    }
    for (auto& c : clients) c.reset();  // stop heartbeats before the jobs go
  }  // stops the jobs
  const std::string load_after = LoadAverage();

  std::printf("\n%10s  %9s  %9s  %9s  %9s  %9s  %9s  %9s  %9s  %9s  %9s\n", "size", "grpc GB/s",
              "tcp GB/s", "shm GB/s", "TCP GB/s", "grpc/TCP", "tcp/TCP", "shm/TCP", "grpc ms",
              "tcp ms", "TCP ms");
  for (const Row& r : rows) {
    const double base = r.tcp.Goodput(r.bytes);
    std::printf("%10s  %9.3f  %9.3f  %9.3f  %9.3f  %9.3f  %9.3f  %9.3f  %9.3f  %9.3f  %9.3f\n",
                HumanBytes(r.bytes).c_str(), r.psrt[0].Goodput(r.bytes) / 1e9,
                r.psrt[1].Goodput(r.bytes) / 1e9, r.psrt[2].Goodput(r.bytes) / 1e9, base / 1e9,
                r.psrt[0].Goodput(r.bytes) / base, r.psrt[1].Goodput(r.bytes) / base,
                r.psrt[2].Goodput(r.bytes) / base, r.psrt[0].Latency() * 1e3,
                r.psrt[1].Latency() * 1e3, r.tcp.Latency() * 1e3);
  }
  std::printf("GB/s = 1e9 bytes/s of payload, 2 * size per iteration (push + pull; send + echo);\n"
              "grpc, tcp, shm: psrt over gRPC, over its data channel (TCP) and over shared memory;\n"
              "TCP: one raw loopback connection.\n");
  if (!rows.empty() && rows[0].zmq.iterations > 0) {
    std::printf("\n%10s  %12s  %12s  %12s  %12s\n", "size", "ZeroMQ GB/s", "tcp/ZeroMQ",
                "shm/ZeroMQ", "ZeroMQ ms");
    for (const Row& r : rows) {
      const double z = r.zmq.Goodput(r.bytes);
      std::printf("%10s  %12.3f  %12.3f  %12.3f  %12.3f\n", HumanBytes(r.bytes).c_str(), z / 1e9,
                  r.psrt[1].Goodput(r.bytes) / z, r.psrt[2].Goodput(r.bytes) / z,
                  r.zmq.Latency() * 1e3);
    }
    std::printf("ZeroMQ: a ps-lite-style server (DEALER/ROUTER, zero-copy values, one round trip\n"
                "per push-pull) in this process, over loopback TCP.\n");
  }
  for (int t = 0; t < kNumTransports && rss_steps > 0; ++t) {
    std::printf("servers' resident memory (%s): %.1f MiB before %lld rounds of 1 MiB, %.1f MiB after (x%.3f)\n",
                TransportName(kTransports[t]), rss[t].before_kib / 1024.0,
                static_cast<long long>(rss[t].steps), rss[t].after_kib / 1024.0,
                static_cast<double>(rss[t].after_kib) / std::max<int64_t>(1, rss[t].before_kib));
  }

  if (!json_path.empty()) {
    nlohmann::json j;
    j["benchmark"] = "push_pull";
    j["date"] = date;
    j["machine"] = {{"nproc", nproc},
                    {"cpu", CpuModel()},
                    {"hostname", HostName()},
                    {"loadavg_before", load_before},
                    {"loadavg_after", load_after}};
    j["config"] = {{"servers", servers},
                   {"replicas", replicas},
                   {"workers", 1},
                   {"mode", "sync"},
                   {"partition_bytes", partition_bytes},
                   {"target_seconds", seconds},
                   {"min_iterations", min_iterations},
                   {"goodput", "2 * bytes * iterations / seconds; GB = 1e9 bytes"}};
    nlohmann::json results = nlohmann::json::array();
    for (const Row& r : rows) {
      nlohmann::json e;
      e["bytes"] = r.bytes;
      e["size"] = HumanBytes(r.bytes);
      e["tcp"] = {{"iterations", r.tcp.iterations},
                  {"seconds", r.tcp.seconds},
                  {"gbps", r.tcp.Goodput(r.bytes) / 1e9},
                  {"latency_ms", r.tcp.Latency() * 1e3}};
      if (r.zmq.iterations > 0) {
        e["pslite_zmq"] = {{"iterations", r.zmq.iterations},
                           {"seconds", r.zmq.seconds},
                           {"gbps", r.zmq.Goodput(r.bytes) / 1e9},
                           {"latency_ms", r.zmq.Latency() * 1e3}};
      }
      for (int t = 0; t < kNumTransports; ++t) {
        const std::string name = absl::StrCat("psrt_", TransportName(kTransports[t]));
        e[name] = {{"iterations", r.psrt[t].iterations},
                   {"seconds", r.psrt[t].seconds},
                   {"gbps", r.psrt[t].Goodput(r.bytes) / 1e9},
                   {"latency_ms", r.psrt[t].Latency() * 1e3},
                   {"cpu_ms_per_round", r.psrt[t].cpu_seconds / r.psrt[t].iterations * 1e3},
                   {"busy_cores", r.psrt[t].cpu_seconds / r.psrt[t].seconds},
                   {"ratio_to_tcp", r.psrt[t].Goodput(r.bytes) / r.tcp.Goodput(r.bytes)}};
      }
      results.push_back(e);
    }
    j["results"] = results;
    for (int t = 0; t < kNumTransports && rss_steps > 0; ++t) {
      j["server_rss"][TransportName(kTransports[t])] = {
          {"before_kib", rss[t].before_kib},
          {"after_kib", rss[t].after_kib},
          {"rounds", rss[t].steps},
          {"round_bytes", 1 << 20},
          {"growth", static_cast<double>(rss[t].after_kib) / std::max<int64_t>(1, rss[t].before_kib)}};
    }
    std::ofstream f(json_path);
    f << j.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "%s: cannot write %s\n", kProgram, json_path.c_str());
      return 1;
    }
    std::printf("wrote %s\n", json_path.c_str());
  }
  RemoveDirectory(log_dir);  // success: the job's logs are of no further use
  return 0;
}

}  // namespace
}  // namespace psrt

int main(int argc, char** argv) { return psrt::Run(argc, argv); }
