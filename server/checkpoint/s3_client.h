#ifndef PSRT_SERVER_CHECKPOINT_S3_CLIENT_H_
#define PSRT_SERVER_CHECKPOINT_S3_CLIENT_H_

// A small S3 client (libcurl + SigV4) for checkpoints: put/get/head/delete,
// ListObjectsV2 and multipart upload, with bounded retries and timeouts.
// Errors are absl::Status values naming the bucket/key, the HTTP status and
// S3's error code and message. Thread-compatible; a const S3Client may be
// shared by threads (every request uses its own curl handle).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/checkpoint/aws_credentials.h"
#include "server/checkpoint/aws_xml.h"
#include "server/checkpoint/sigv4.h"

namespace psrt {

inline constexpr uint64_t kS3MinPartSize = uint64_t{5} << 20;  // S3's minimum
inline constexpr int kS3MaxParts = 10000;

struct S3ClientOptions {
  // "https://s3.<region>.amazonaws.com" (virtual-hosted-style addressing)
  // when empty; anything else ("http://127.0.0.1:9000") is an S3-compatible
  // store addressed path-style.
  std::string endpoint;
  // Empty: AWS_REGION, AWS_DEFAULT_REGION, the profile's region in
  // ~/.aws/config (AWS_CONFIG_FILE), else us-east-1.
  std::string region;
  // Fixed credentials; unset: `credentials_provider`, else the AWS SDKs'
  // chain (server/checkpoint/aws_credentials.h), refreshed ahead of expiry
  // as `credential_refresh` says.
  std::optional<AwsCredentials> credentials;
  std::shared_ptr<AwsCredentialsProvider> credentials_provider;
  AwsCredentialsProvider::Options credential_refresh;
  // Empty: AWS_PROFILE, else "default".
  std::string profile;

  // Put() uploads objects larger than this in parts of this size, up to
  // `parallel_parts` at once (each on its own connection).
  uint64_t part_size = uint64_t{8} << 20;
  int parallel_parts = 4;
  // Permits part_size below S3's 5 MiB minimum (tests against fakes only).
  bool allow_small_parts_for_testing = false;
  // ListObjectsV2 page size (max-keys), 1..1000.
  int list_page_size = 1000;

  // Every attempt of every request is bounded by request_timeout (and by
  // connect_timeout to connect); a request's attempts, with their backoff,
  // by max_attempts and retry_deadline.
  absl::Duration request_timeout = absl::Seconds(120);
  absl::Duration connect_timeout = absl::Seconds(10);
  int max_attempts = 6;
  absl::Duration retry_deadline = absl::Seconds(300);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
};

struct S3ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;           // as S3 returns it, quotes included
  std::string last_modified;  // as S3 returns it
};

struct S3CompletedPart {
  int part_number = 0;
  std::string etag;
};

class S3Client {
 public:
  // Resolves the region and credentials and checks the options.
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3ClientOptions options);

  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const std::string& region() const { return options_.region; }
  const std::string& endpoint() const { return options_.endpoint; }
  const AwsCredentialsProvider& credentials() const { return *credentials_; }

  // ALREADY_EXISTS when the bucket exists (owned by anyone).
  absl::Status CreateBucket(absl::string_view bucket) const;

  // Stores `data` at bucket/key: one PutObject up to part_size, else a
  // multipart upload (aborted when a step fails).
  absl::Status Put(absl::string_view bucket, absl::string_view key, absl::string_view data) const;

  absl::Status PutObject(absl::string_view bucket, absl::string_view key,
                         absl::string_view data) const;
  // NOT_FOUND naming bucket/key when there is no such object.
  absl::StatusOr<std::string> GetObject(absl::string_view bucket, absl::string_view key) const;
  absl::StatusOr<S3ObjectInfo> HeadObject(absl::string_view bucket, absl::string_view key) const;
  // OK also when the key does not exist (as S3 itself).
  absl::Status DeleteObject(absl::string_view bucket, absl::string_view key) const;
  // Every object whose key starts with `prefix`, in key order, following
  // continuation tokens.
  absl::StatusOr<std::vector<S3ObjectInfo>> ListObjectsV2(absl::string_view bucket,
                                                          absl::string_view prefix) const;

  // Multipart upload steps; Put() uses them.
  absl::StatusOr<std::string> CreateMultipartUpload(absl::string_view bucket,
                                                    absl::string_view key) const;
  absl::StatusOr<std::string> UploadPart(absl::string_view bucket, absl::string_view key,
                                         absl::string_view upload_id, int part_number,
                                         absl::string_view data) const;
  absl::Status CompleteMultipartUpload(absl::string_view bucket, absl::string_view key,
                                       absl::string_view upload_id,
                                       const std::vector<S3CompletedPart>& parts) const;
  absl::Status AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                    absl::string_view upload_id) const;
  // Multipart uploads begun and neither completed nor aborted, of keys
  // starting with `prefix`: what a writer that died left behind.
  struct Upload {
    std::string key;
    std::string upload_id;
  };
  absl::StatusOr<std::vector<Upload>> ListMultipartUploads(absl::string_view bucket,
                                                           absl::string_view prefix) const;

  struct Response {
    long http_status = 0;
    std::string body;
    std::vector<std::pair<std::string, std::string>> headers;  // lower-case
    std::string Header(absl::string_view name) const;
  };

 private:
  struct Request {
    const char* operation;  // "GetObject", for messages
    std::string method;
    std::string bucket;  // empty: the service itself
    std::string key;
    std::vector<std::pair<std::string, std::string>> query;
    std::vector<std::pair<std::string, std::string>> headers;
    absl::string_view body;
  };

  explicit S3Client(S3ClientOptions options);

  // Sends `request` with retries; a Response for any HTTP status < 300,
  // otherwise the error as a Status.
  absl::StatusOr<Response> Send(const Request& request) const;
  // One attempt; a transport failure sets `transport_error`.
  Response SendOnce(const Request& request, std::string* transport_error,
                    absl::Duration timeout) const;

  S3ClientOptions options_;
  std::shared_ptr<AwsCredentialsProvider> credentials_;
  bool virtual_hosted_ = false;
  std::string scheme_;    // "https"
  std::string hostport_;  // "s3.us-east-1.amazonaws.com", "127.0.0.1:9000"
};

// One page of a ListObjectsV2 answer: its objects, and the token of the
// next page (empty: the last one). A truncated page without a token is an
// error.
struct S3ListPage {
  std::vector<S3ObjectInfo> objects;
  std::string next_token;
};
absl::StatusOr<S3ListPage> ParseListObjectsPage(absl::string_view xml);

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_S3_CLIENT_H_
