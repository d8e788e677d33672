#ifndef PSRT_SERVER_CHECKPOINT_AWS_HTTP_H_
#define PSRT_SERVER_CHECKPOINT_AWS_HTTP_H_

// One HTTP exchange over libcurl with a deadline, for the small requests of
// the AWS credential sources (STS, the container endpoint, instance
// metadata). The S3 client has its own, signed and retried, sender.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace psrt {

// curl_global_init, once per process.
void CurlGlobalInit();

struct HttpReply {
  long status = 0;
  std::string body;
};

struct HttpCall {
  std::string method = "GET";  // GET, PUT, POST
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  absl::Duration timeout = absl::Seconds(5);  // the whole exchange
};

// Any HTTP status is a reply. Else curl's reason, the URL and the deadline:
// DEADLINE_EXCEEDED when connected but no answer came in time, UNAVAILABLE
// when no connection was made (refused, unreachable, timed out).
absl::StatusOr<HttpReply> HttpExchange(const HttpCall& call);

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_AWS_HTTP_H_
