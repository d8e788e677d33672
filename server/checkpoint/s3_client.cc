#include "server/checkpoint/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/failpoint.h"
#include "common/logging.h"
#include "server/checkpoint/aws_http.h"

namespace psrt {
namespace {

absl::StatusCode CodeForHttp(long http, absl::string_view s3_code) {
  if (s3_code == "BucketAlreadyOwnedByYou" || s3_code == "BucketAlreadyExists") {
    return absl::StatusCode::kAlreadyExists;
  }
  if (s3_code == "SlowDown" || s3_code == "RequestTimeout") {
    return absl::StatusCode::kUnavailable;
  }
  switch (http) {
    case 400:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 409:
      return absl::StatusCode::kFailedPrecondition;
    case 412:
      return absl::StatusCode::kFailedPrecondition;
    case 416:
      return absl::StatusCode::kOutOfRange;
    case 429:
      return absl::StatusCode::kUnavailable;
    case 501:
      return absl::StatusCode::kUnimplemented;
    case 503:
      return absl::StatusCode::kUnavailable;
    default:
      return http >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnknown;
  }
}

bool Retryable(long http, absl::string_view s3_code) {
  return http >= 500 || http == 429 || s3_code == "SlowDown" || s3_code == "RequestTimeout" ||
         s3_code == "InternalError";
}

size_t WriteBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

size_t WriteHeader(char* data, size_t size, size_t n, void* user) {
  auto* headers = static_cast<std::vector<std::pair<std::string, std::string>>*>(user);
  absl::string_view line(data, size * n);
  const size_t colon = line.find(':');
  if (absl::StartsWith(line, "HTTP/")) {
    headers->clear();  // a new response (after 100 Continue or a redirect)
  } else if (colon != absl::string_view::npos) {
    headers->emplace_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon))),
                          std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  }
  return size * n;
}

std::string Describe(absl::string_view bucket, absl::string_view key) {
  if (key.empty()) return absl::StrCat("s3://", bucket);
  return absl::StrCat("s3://", bucket, "/", key);
}

}  // namespace

std::string S3Client::Response::Header(absl::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return "";
}

S3Client::S3Client(S3ClientOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options) {
  if (options.region.empty()) options.region = ResolveAwsRegion(options.profile);
  std::shared_ptr<AwsCredentialsProvider> credentials = options.credentials_provider;
  if (options.credentials) {
    credentials = std::make_shared<AwsCredentialsProvider>(*options.credentials);
  } else if (credentials == nullptr) {
    AwsCredentialChainOptions chain;
    chain.profile = options.profile;
    chain.region = options.region;
    absl::StatusOr<std::shared_ptr<AwsCredentialsProvider>> found =
        AwsCredentialsProvider::FromChain(chain, options.credential_refresh);
    if (!found.ok()) return found.status();
    credentials = *std::move(found);
  }
  if (options.part_size < kS3MinPartSize && !options.allow_small_parts_for_testing) {
    return absl::InvalidArgumentError(absl::StrCat("S3 part_size ", options.part_size,
                                                   " is below S3's minimum of ", kS3MinPartSize,
                                                   " bytes"));
  }
  if (options.part_size == 0) {
    return absl::InvalidArgumentError("S3 part_size must be positive");
  }
  if (options.parallel_parts < 1 || options.parallel_parts > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 parallel_parts ", options.parallel_parts, " is not in 1..64"));
  }
  if (options.list_page_size < 1 || options.list_page_size > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 list_page_size ", options.list_page_size, " is not in 1..1000"));
  }
  if (options.max_attempts < 1) options.max_attempts = 1;
  bool virtual_hosted = false;
  if (options.endpoint.empty()) {
    options.endpoint = absl::StrCat("https://s3.", options.region, ".amazonaws.com");
    virtual_hosted = true;
  }
  absl::string_view rest = options.endpoint;
  std::string scheme;
  if (absl::ConsumePrefix(&rest, "https://")) {
    scheme = "https";
  } else if (absl::ConsumePrefix(&rest, "http://")) {
    scheme = "http";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 endpoint '", options.endpoint, "' is not http:// or https://"));
  }
  while (absl::ConsumeSuffix(&rest, "/")) {
  }
  if (rest.empty() || rest.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 endpoint '", options.endpoint, "' must be scheme://host[:port]"));
  }
  // Default ports are left out of Host (and so of the signature), as curl does.
  if (scheme == "http") absl::ConsumeSuffix(&rest, ":80");
  if (scheme == "https") absl::ConsumeSuffix(&rest, ":443");
  CurlGlobalInit();
  std::unique_ptr<S3Client> client(new S3Client(std::move(options)));
  client->credentials_ = std::move(credentials);
  client->virtual_hosted_ = virtual_hosted;
  client->scheme_ = scheme;
  client->hostport_ = std::string(rest);
  return client;
}

S3Client::Response S3Client::SendOnce(const Request& request, std::string* transport_error,
                                      absl::Duration timeout) const {
  Response response;
  // Virtual-hosted style unless the bucket name cannot be a DNS label in a
  // TLS wildcard (dots); path style for custom endpoints.
  const bool hosted =
      virtual_hosted_ && !request.bucket.empty() && request.bucket.find('.') == std::string::npos;
  SigV4Request sign;
  sign.method = request.method;
  if (hosted) {
    sign.host = absl::StrCat(request.bucket, ".", hostport_);
    sign.path = absl::StrCat("/", request.key);
  } else {
    sign.host = hostport_;
    sign.path = request.bucket.empty() ? "/" : absl::StrCat("/", request.bucket);
    if (!request.key.empty()) absl::StrAppend(&sign.path, "/", request.key);
  }
  sign.query = request.query;
  sign.headers = request.headers;
  sign.payload_sha256 = Sha256Hex(request.body);
  absl::StatusOr<AwsCredentials> credentials = credentials_->Get();
  if (!credentials.ok()) {
    *transport_error = std::string(credentials.status().message());
    return response;
  }
  SigV4Signature signature = SignV4(sign, *credentials, options_.region, "s3", absl::Now());

  std::string url = absl::StrCat(scheme_, "://", sign.host, S3UriEncode(sign.path, false));
  if (!sign.query.empty()) {
    absl::StrAppend(&url, "?", CanonicalQueryString(sign.query));
  }

  curl_slist* headers = nullptr;
  auto add = [&headers](absl::string_view name, absl::string_view value) {
    headers = curl_slist_append(headers, absl::StrCat(name, ": ", value).c_str());
  };
  add("Host", sign.host);
  for (const auto& [name, value] : request.headers) add(name, value);
  for (const auto& [name, value] : signature.headers) add(name, value);
  headers = curl_slist_append(headers, "Expect:");
  if (request.method == "PUT" || request.method == "POST") {
    bool has_type = false;
    for (const auto& [name, value] : request.headers) {
      has_type |= absl::EqualsIgnoreCase(name, "content-type");
    }
    if (!has_type) add("Content-Type", "application/octet-stream");
  }

  CURL* curl = curl_easy_init();
  if (curl == nullptr) {
    curl_slist_free_all(headers);
    *transport_error = "curl_easy_init failed";
    return response;
  }
  char error_buffer[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, std::max<long>(1, absl::ToInt64Milliseconds(timeout)));
  curl_easy_setopt(
      curl, CURLOPT_CONNECTTIMEOUT_MS,
      std::max<long>(1, absl::ToInt64Milliseconds(std::min(timeout, options_.connect_timeout))));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, WriteHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &response.headers);
  if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT" || request.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    // Never NULL: curl would then read the body from stdin.
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.empty() ? "" : request.body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  } else if (request.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  const CURLcode rc = curl_easy_perform(curl);
  if (rc != CURLE_OK) {
    *transport_error =
        absl::StrCat(curl_easy_strerror(rc), error_buffer[0] ? ": " : "", error_buffer);
  } else {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.http_status);
  }
  curl_easy_cleanup(curl);
  curl_slist_free_all(headers);
  return response;
}

absl::StatusOr<S3Client::Response> S3Client::Send(const Request& request) const {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.retry_deadline;
  const std::string what =
      absl::StrCat("S3 ", request.operation, " ", Describe(request.bucket, request.key), " at ",
                   options_.endpoint);
  std::mt19937_64 rng(std::random_device{}());
  absl::Duration backoff = options_.initial_backoff;
  absl::Status last;
  int attempt = 0;
  while (true) {
    ++attempt;
    const absl::Duration left = deadline - absl::Now();
    std::string transport_error;
    Response response =
        SendOnce(request, &transport_error,
                 std::min(options_.request_timeout, std::max(left, absl::Milliseconds(1))));
    bool retry = false;
    if (!transport_error.empty()) {
      last = absl::UnavailableError(absl::StrCat(what, ": ", transport_error));
      retry = true;
    } else if (response.http_status >= 200 && response.http_status < 300) {
      // CompleteMultipartUpload can report an error in a 200 response.
      if (absl::string_view(request.operation) != "CompleteMultipartUpload" ||
          !absl::StrContains(response.body, "<Error>")) {
        return response;
      }
      const std::string code = XmlTagText(response.body, "Code").value_or("");
      const std::string message = XmlTagText(response.body, "Message").value_or("");
      last = absl::Status(
          code == "InternalError" || code == "SlowDown" ? absl::StatusCode::kUnavailable
                                                        : absl::StatusCode::kInternal,
          absl::StrCat(what, ": HTTP ", response.http_status, " ", code, ": ", message));
      retry = Retryable(500, code);
    } else {
      const std::string code = XmlTagText(response.body, "Code").value_or("");
      const std::string message = XmlTagText(response.body, "Message").value_or("");
      std::string text = absl::StrCat(what, ": HTTP ", response.http_status);
      if (!code.empty()) absl::StrAppend(&text, " ", code);
      if (!message.empty()) absl::StrAppend(&text, ": ", message);
      const std::string request_id = response.Header("x-amz-request-id");
      if (!request_id.empty()) {
        absl::StrAppend(&text, " (request id ", request_id, ")");
      }
      last = absl::Status(CodeForHttp(response.http_status, code), text);
      retry = Retryable(response.http_status, code);
    }
    if (!retry) return last;
    // Full jitter in [backoff/2, backoff].
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    const absl::Duration sleep = backoff * jitter(rng);
    if (attempt >= options_.max_attempts || absl::Now() + sleep >= deadline) {
      return absl::Status(
          last.code(),
          absl::StrCat(
              last.message(), " (gave up after ", attempt,
              attempt == 1 ? " attempt in " : " attempts in ",
              absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))), ")"));
    }
    LogWarning(last.message(), "; retrying in ",
               absl::FormatDuration(absl::Trunc(sleep, absl::Milliseconds(1))));
    absl::SleepFor(sleep);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status S3Client::CreateBucket(absl::string_view bucket) const {
  std::string body;
  if (options_.region != "us-east-1") {
    body = absl::StrCat(
        "<CreateBucketConfiguration "
        "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/"
        "\"><LocationConstraint>",
        XmlEscape(options_.region), "</LocationConstraint></CreateBucketConfiguration>");
  }
  Request request{"CreateBucket", "PUT", std::string(bucket), "", {}, {}, body};
  if (!body.empty()) request.headers.emplace_back("content-type", "application/xml");
  return Send(request).status();
}

absl::Status S3Client::Put(absl::string_view bucket, absl::string_view key,
                           absl::string_view data) const {
  if (data.size() <= options_.part_size) return PutObject(bucket, key, data);
  uint64_t part_size = options_.part_size;
  // Stay within S3's part count.
  const uint64_t min_part = (data.size() + kS3MaxParts - 1) / kS3MaxParts;
  if (part_size < min_part) part_size = min_part;

  absl::StatusOr<std::string> upload_id = CreateMultipartUpload(bucket, key);
  if (!upload_id.ok()) return upload_id.status();
  const int num_parts = static_cast<int>((data.size() + part_size - 1) / part_size);
  std::vector<S3CompletedPart> parts(num_parts);
  std::atomic<int> next{0};
  std::mutex mu;
  absl::Status status;  // the first failure; the other uploaders stop
  auto upload = [&] {
    for (int i = next++; i < num_parts; i = next++) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!status.ok()) return;
      }
      absl::StatusOr<std::string> etag =
          UploadPart(bucket, key, *upload_id, i + 1, data.substr(i * part_size, part_size));
      if (!etag.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (status.ok()) status = etag.status();
        return;
      }
      parts[i] = {i + 1, *std::move(etag)};
      Failpoint("storage.half_written");  // crash drills: parts sent, none visible
    }
  };
  std::vector<std::thread> uploaders;
  const int threads = std::clamp(options_.parallel_parts, 1, num_parts);
  for (int t = 1; t < threads; ++t) uploaders.emplace_back(upload);
  upload();
  for (std::thread& t : uploaders) t.join();
  if (status.ok()) {
    status = CompleteMultipartUpload(bucket, key, *upload_id, parts);
  }
  if (!status.ok()) {
    absl::Status abort = AbortMultipartUpload(bucket, key, *upload_id);
    if (!abort.ok()) {
      LogWarning("aborting multipart upload ", *upload_id, " of ", Describe(bucket, key),
                 " failed: ", abort.message());
    }
  }
  return status;
}

absl::Status S3Client::PutObject(absl::string_view bucket, absl::string_view key,
                                 absl::string_view data) const {
  Request request{"PutObject", "PUT", std::string(bucket), std::string(key), {}, {}, data};
  return Send(request).status();
}

absl::StatusOr<std::string> S3Client::GetObject(absl::string_view bucket,
                                                absl::string_view key) const {
  Request request{"GetObject", "GET", std::string(bucket), std::string(key), {}, {}, {}};
  absl::StatusOr<Response> response = Send(request);
  if (!response.ok()) return response.status();
  const std::string length = response->Header("content-length");
  uint64_t expected = 0;
  if (!length.empty() && absl::SimpleAtoi(length, &expected) && expected != response->body.size()) {
    return absl::DataLossError(absl::StrCat("S3 GetObject ", Describe(bucket, key), ": got ",
                                            response->body.size(), " bytes of ", expected));
  }
  return std::move(response->body);
}

absl::StatusOr<S3ObjectInfo> S3Client::HeadObject(absl::string_view bucket,
                                                  absl::string_view key) const {
  Request request{"HeadObject", "HEAD", std::string(bucket), std::string(key), {}, {}, {}};
  absl::StatusOr<Response> response = Send(request);
  if (!response.ok()) return response.status();
  S3ObjectInfo info;
  info.key = std::string(key);
  (void)absl::SimpleAtoi(response->Header("content-length"), &info.size);
  info.etag = response->Header("etag");
  info.last_modified = response->Header("last-modified");
  return info;
}

absl::Status S3Client::DeleteObject(absl::string_view bucket, absl::string_view key) const {
  Request request{"DeleteObject", "DELETE", std::string(bucket), std::string(key), {}, {}, {}};
  return Send(request).status();
}

absl::StatusOr<std::vector<S3ObjectInfo>> S3Client::ListObjectsV2(absl::string_view bucket,
                                                                  absl::string_view prefix) const {
  std::vector<S3ObjectInfo> objects;
  std::string token;
  while (true) {
    Request request{"ListObjectsV2", "GET", std::string(bucket), "", {}, {}, {}};
    request.query = {{"list-type", "2"}, {"max-keys", absl::StrCat(options_.list_page_size)}};
    if (!prefix.empty()) request.query.emplace_back("prefix", std::string(prefix));
    if (!token.empty()) request.query.emplace_back("continuation-token", token);
    absl::StatusOr<Response> response = Send(request);
    if (!response.ok()) return response.status();
    absl::StatusOr<S3ListPage> page = ParseListObjectsPage(response->body);
    if (!page.ok()) {
      return absl::Status(page.status().code(),
                          absl::StrCat("S3 ListObjectsV2 ", Describe(bucket, prefix), ": ",
                                       page.status().message()));
    }
    for (S3ObjectInfo& info : page->objects) objects.push_back(std::move(info));
    token = page->next_token;
    if (token.empty()) break;
  }
  return objects;
}

absl::StatusOr<S3ListPage> ParseListObjectsPage(absl::string_view xml) {
  S3ListPage page;
  for (absl::string_view block : XmlBlocks(xml, "Contents")) {
    S3ObjectInfo info;
    info.key = XmlTagText(block, "Key").value_or("");
    (void)absl::SimpleAtoi(XmlTagText(block, "Size").value_or("0"), &info.size);
    info.etag = XmlTagText(block, "ETag").value_or("");
    info.last_modified = XmlTagText(block, "LastModified").value_or("");
    page.objects.push_back(std::move(info));
  }
  if (XmlTagText(xml, "IsTruncated").value_or("false") != "true") return page;
  page.next_token = XmlTagText(xml, "NextContinuationToken").value_or("");
  if (page.next_token.empty()) {
    return absl::InternalError("truncated listing without a NextContinuationToken");
  }
  return page;
}

absl::StatusOr<std::vector<S3Client::Upload>> S3Client::ListMultipartUploads(
    absl::string_view bucket, absl::string_view prefix) const {
  std::vector<Upload> uploads;
  std::string key_marker, id_marker;
  while (true) {
    Request request{"ListMultipartUploads", "GET", std::string(bucket), "", {}, {}, {}};
    request.query = {{"uploads", ""}, {"max-uploads", absl::StrCat(options_.list_page_size)}};
    if (!prefix.empty()) request.query.emplace_back("prefix", std::string(prefix));
    if (!key_marker.empty()) request.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) request.query.emplace_back("upload-id-marker", id_marker);
    absl::StatusOr<Response> response = Send(request);
    if (!response.ok()) return response.status();
    for (absl::string_view block : XmlBlocks(response->body, "Upload")) {
      uploads.push_back(
          {XmlTagText(block, "Key").value_or(""), XmlTagText(block, "UploadId").value_or("")});
    }
    if (XmlTagText(response->body, "IsTruncated").value_or("false") != "true") break;
    key_marker = XmlTagText(response->body, "NextKeyMarker").value_or("");
    id_marker = XmlTagText(response->body, "NextUploadIdMarker").value_or("");
    if (key_marker.empty()) {
      return absl::InternalError(absl::StrCat("S3 ListMultipartUploads ", Describe(bucket, prefix),
                                              ": truncated listing without a NextKeyMarker"));
    }
  }
  return uploads;
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(absl::string_view bucket,
                                                            absl::string_view key) const {
  Request request{"CreateMultipartUpload",
                  "POST",
                  std::string(bucket),
                  std::string(key),
                  {{"uploads", ""}},
                  {},
                  {}};
  absl::StatusOr<Response> response = Send(request);
  if (!response.ok()) return response.status();
  std::optional<std::string> id = XmlTagText(response->body, "UploadId");
  if (!id || id->empty()) {
    return absl::InternalError(absl::StrCat("S3 CreateMultipartUpload ", Describe(bucket, key),
                                            ": no UploadId in the response"));
  }
  return *id;
}

absl::StatusOr<std::string> S3Client::UploadPart(absl::string_view bucket, absl::string_view key,
                                                 absl::string_view upload_id, int part_number,
                                                 absl::string_view data) const {
  Request request{"UploadPart",
                  "PUT",
                  std::string(bucket),
                  std::string(key),
                  {{"partNumber", absl::StrCat(part_number)}, {"uploadId", std::string(upload_id)}},
                  {},
                  data};
  absl::StatusOr<Response> response = Send(request);
  if (!response.ok()) return response.status();
  std::string etag = response->Header("etag");
  if (etag.empty()) {
    return absl::InternalError(absl::StrCat("S3 UploadPart ", part_number, " of ",
                                            Describe(bucket, key), ": no ETag in the response"));
  }
  return etag;
}

absl::Status S3Client::CompleteMultipartUpload(absl::string_view bucket, absl::string_view key,
                                               absl::string_view upload_id,
                                               const std::vector<S3CompletedPart>& parts) const {
  std::string body =
      "<CompleteMultipartUpload "
      "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (const S3CompletedPart& part : parts) {
    absl::StrAppend(&body, "<Part><PartNumber>", part.part_number, "</PartNumber><ETag>",
                    XmlEscape(part.etag), "</ETag></Part>");
  }
  body += "</CompleteMultipartUpload>";
  Request request{"CompleteMultipartUpload",
                  "POST",
                  std::string(bucket),
                  std::string(key),
                  {{"uploadId", std::string(upload_id)}},
                  {{"content-type", "application/xml"}},
                  body};
  return Send(request).status();
}

absl::Status S3Client::AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                            absl::string_view upload_id) const {
  Request request{"AbortMultipartUpload",
                  "DELETE",
                  std::string(bucket),
                  std::string(key),
                  {{"uploadId", std::string(upload_id)}},
                  {},
                  {}};
  return Send(request).status();
}

}  // namespace psrt
