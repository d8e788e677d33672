#include "tests/integration/moto_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/process.h"

namespace psrt {
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

namespace {

bool Accepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok =
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

std::string MotoServerPath() {
  const char* path = std::getenv("PSRT_MOTO_SERVER");
  if (path != nullptr && *path != '\0') return path;
  return std::string(PSRT_SOURCE_DIR) + "/.venv/bin/moto_server";
}

}  // namespace

MotoServer::~MotoServer() {
  if (pid_ > 0) Terminate({pid_}, absl::Seconds(5));
}

std::string MotoServer::Start(const std::map<std::string, std::string>& env) {
  const std::string path = MotoServerPath();
  if (access(path.c_str(), X_OK) != 0) {
    return absl::StrCat("moto_server not found at ", path,
                        "; run `scripts/setup.sh s3` (make test does) or set "
                        "PSRT_MOTO_SERVER");
  }
  port_ = FreePort();
  absl::StatusOr<pid_t> pid =
      Spawn({path, "-H", "127.0.0.1", "-p", absl::StrCat(port_)}, env);
  if (!pid.ok()) return std::string(pid.status().message());
  pid_ = *pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    if (Accepts(port_)) return "";
    for (const Exit& exit : ReapExited()) {
      if (exit.pid == pid_) {
        pid_ = 0;
        return absl::StrCat(path, " ", exit.description);
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::StrCat(path, " did not listen on port ", port_, " within 60s");
}

std::string MotoServer::endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }

}  // namespace psrt
