#include "tests/integration/credentials_endpoint.h"

#include <httplib.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace psrt {

struct CredentialsEndpoint::State {
  absl::Duration lifetime;
  std::string token;
  httplib::Server server;
  std::thread thread;
  int port = 0;

  mutable absl::Mutex mu;
  int served ABSL_GUARDED_BY(mu) = 0;
  int refused ABSL_GUARDED_BY(mu) = 0;
  int held ABSL_GUARDED_BY(mu) = 0;
  bool failing ABSL_GUARDED_BY(mu) = false;
  bool holding ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;

  static bool Released(State* state) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !state->holding || state->stopping;
  }

  void Answer(const httplib::Request& request, httplib::Response& response) {
    if (!token.empty() && request.get_header_value("Authorization") != token) {
      absl::MutexLock lock(&mu);
      ++refused;
      response.status = 401;
      response.set_content("{\"message\":\"bad token\"}", "application/json");
      return;
    }
    absl::MutexLock lock(&mu);
    ++held;
    // Bounded: a test that forgets Release() still ends.
    mu.AwaitWithTimeout(absl::Condition(&Released, this), absl::Seconds(60));
    --held;
    if (failing) {
      response.status = 500;
      response.set_content("agent broken", "text/plain");
      return;
    }
    const int n = ++served;
    const std::string expiration =
        absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now() + lifetime, absl::UTCTimeZone());
    response.set_content(
        absl::StrCat("{\"AccessKeyId\":\"", AccessKey(n), "\",\"SecretAccessKey\":\"secret-", n,
                     "\",\"Token\":\"session-", n, "\",\"Expiration\":\"", expiration,
                     "\",\"RoleArn\":\"arn:aws:iam::123456789012:"
                     "role/psrt\"}"),
        "application/json");
  }
};

CredentialsEndpoint::CredentialsEndpoint(absl::Duration lifetime, std::string token)
    : state_(std::make_unique<State>()) {
  state_->lifetime = lifetime;
  state_->token = std::move(token);
  State* state = state_.get();
  state_->server.Get("/v2/credentials/psrt",
                     [state](const httplib::Request& request, httplib::Response& response) {
                       state->Answer(request, response);
                     });
  state_->port = state_->server.bind_to_any_port("127.0.0.1");
  state_->thread = std::thread([state] { state->server.listen_after_bind(); });
  // Bound and listening: connections queue until the thread accepts them.
}

CredentialsEndpoint::~CredentialsEndpoint() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
  }
  state_->server.stop();
  state_->thread.join();
}

std::string CredentialsEndpoint::url() const {
  return absl::StrCat("http://127.0.0.1:", state_->port, "/v2/credentials/psrt");
}

std::string CredentialsEndpoint::AccessKey(int n) { return absl::StrCat("ASIAPSRTTEST", n); }

int CredentialsEndpoint::served() const {
  absl::MutexLock lock(&state_->mu);
  return state_->served;
}

int CredentialsEndpoint::refused() const {
  absl::MutexLock lock(&state_->mu);
  return state_->refused;
}

int CredentialsEndpoint::held() const {
  absl::MutexLock lock(&state_->mu);
  return state_->held;
}

void CredentialsEndpoint::SetFailing(bool failing) {
  absl::MutexLock lock(&state_->mu);
  state_->failing = failing;
}

void CredentialsEndpoint::Hold() {
  absl::MutexLock lock(&state_->mu);
  state_->holding = true;
}

void CredentialsEndpoint::Release() {
  absl::MutexLock lock(&state_->mu);
  state_->holding = false;
}

}  // namespace psrt
