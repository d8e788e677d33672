// moto's standalone S3 server as a child process on loopback, for tests
// that need a real S3-protocol endpoint. `scripts/setup.sh s3` (run by
// `make test`) installs it into .venv; PSRT_MOTO_SERVER overrides the path.
#ifndef PSRT_TESTS_INTEGRATION_MOTO_SERVER_H_
#define PSRT_TESTS_INTEGRATION_MOTO_SERVER_H_

#include <sys/types.h>

#include <map>
#include <string>

namespace psrt {

// A loopback port nothing listens on right now.
int FreePort();

class MotoServer {
 public:
  ~MotoServer();
  // Empty when it runs; else why not (the caller skips or fails).
  std::string Start(const std::map<std::string, std::string>& env = {});
  std::string endpoint() const;  // http://127.0.0.1:PORT

 private:
  pid_t pid_ = 0;
  int port_ = 0;
};

}  // namespace psrt

#endif  // PSRT_TESTS_INTEGRATION_MOTO_SERVER_H_
