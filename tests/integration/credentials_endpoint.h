// A container-credentials endpoint (what SageMaker, ECS and EKS Pod Identity
// run for a container) on loopback, for tests: each answer is a fresh set of
// temporary credentials with a short life, so the tests see refreshes.
#ifndef PSRT_TESTS_INTEGRATION_CREDENTIALS_ENDPOINT_H_
#define PSRT_TESTS_INTEGRATION_CREDENTIALS_ENDPOINT_H_

#include <memory>
#include <string>

#include "absl/time/time.h"

namespace psrt {

class CredentialsEndpoint {
 public:
  // Answers GET /v2/credentials/psrt with credentials valid for `lifetime`;
  // with a non-empty `token`, only requests whose Authorization header is
  // that token (else 401).
  CredentialsEndpoint(absl::Duration lifetime, std::string token);
  ~CredentialsEndpoint();  // stops the server

  std::string url() const;  // http://127.0.0.1:PORT/v2/credentials/psrt
  // Credential sets handed out so far; the n-th has access key
  // AccessKey(n) (1-based).
  int served() const;
  static std::string AccessKey(int n);
  // Requests refused (wrong or no Authorization).
  int refused() const;
  // From now on answer 500 (a broken agent), or again normally.
  void SetFailing(bool failing);
  // Hold every answer until Release(); `held()` counts requests waiting.
  void Hold();
  void Release();
  int held() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace psrt

#endif  // PSRT_TESTS_INTEGRATION_CREDENTIALS_ENDPOINT_H_
