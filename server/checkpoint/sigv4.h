#ifndef PSRT_SERVER_CHECKPOINT_SIGV4_H_
#define PSRT_SERVER_CHECKPOINT_SIGV4_H_

// AWS Signature Version 4 for S3 requests (header-based authorization):
// https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace psrt {

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty when the credentials are long-lived
  // When temporary credentials stop working; long-lived ones never do.
  absl::Time expiration = absl::InfiniteFuture();
};

// One request to sign. Names and values are unencoded; the signer encodes
// them (S3UriEncode) exactly as the request must send them.
struct SigV4Request {
  std::string method;  // "GET", "PUT", ...
  std::string host;    // the Host header: "bucket.s3.us-east-1.amazonaws.com",
                       // "127.0.0.1:9000" (port only when not the default)
  std::string path;    // "/", "/bucket/dir/key" (unencoded, starts with '/')
  std::vector<std::pair<std::string, std::string>> query;
  // Further headers to sign and send ("range", "content-type", ...).
  std::vector<std::pair<std::string, std::string>> headers;
  // Hex SHA-256 of the body; empty means the empty body.
  std::string payload_sha256;
};

struct SigV4Signature {
  std::string amz_date;           // "20130524T000000Z"
  std::string canonical_request;  // for debugging and tests
  std::string string_to_sign;
  std::string signature;      // hex
  std::string authorization;  // the Authorization header's value
  // Headers the request must carry besides Host and SigV4Request::headers:
  // x-amz-content-sha256, x-amz-date, x-amz-security-token (with a session
  // token) and Authorization.
  std::vector<std::pair<std::string, std::string>> headers;
};

// Lower-case hex SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);

// Raw (binary) HMAC-SHA256 of `data` under `key`.
std::string HmacSha256(absl::string_view key, absl::string_view data);

std::string HexEncode(absl::string_view bytes);

// URI-encodes per S3's rules: every byte except A-Z a-z 0-9 - . _ ~ becomes
// %XX (upper-case hex); '/' is kept unless `encode_slash`.
std::string S3UriEncode(absl::string_view s, bool encode_slash);

// "a=1&b=&c=x%2Fy": each name and value encoded (slashes too), sorted by name
// then value. Also the query string a request must send.
std::string CanonicalQueryString(
    const std::vector<std::pair<std::string, std::string>>& query);

// Signs `request` for `service` ("s3") in `region` at time `now`.
SigV4Signature SignV4(const SigV4Request& request,
                      const AwsCredentials& credentials,
                      absl::string_view region, absl::string_view service,
                      absl::Time now);

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_SIGV4_H_
