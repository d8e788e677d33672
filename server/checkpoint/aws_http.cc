#include "server/checkpoint/aws_http.h"

#include <curl/curl.h>

#include <algorithm>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace psrt {
namespace {

size_t AppendBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

}  // namespace

void CurlGlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

absl::StatusOr<HttpReply> HttpExchange(const HttpCall& call) {
  CurlGlobalInit();
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  curl_slist* headers = nullptr;
  for (const auto& [name, value] : call.headers) {
    headers = curl_slist_append(headers, absl::StrCat(name, ": ", value).c_str());
  }
  headers = curl_slist_append(headers, "Expect:");
  HttpReply reply;
  char error[CURL_ERROR_SIZE] = {0};
  const long timeout_ms = std::max<long>(1, absl::ToInt64Milliseconds(call.timeout));
  curl_easy_setopt(curl, CURLOPT_URL, call.url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  // Credentials never follow a redirect to somewhere else.
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, AppendBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply.body);
  if (call.method == "PUT" || call.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, call.body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(call.body.size()));
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, call.method.c_str());
  }
  const CURLcode rc = curl_easy_perform(curl);
  curl_off_t connected_us = 0;
  if (rc == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &reply.status);
  } else {
    curl_easy_getinfo(curl, CURLINFO_CONNECT_TIME_T, &connected_us);
  }
  curl_easy_cleanup(curl);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    const bool no_answer = rc == CURLE_OPERATION_TIMEDOUT && connected_us > 0;
    return absl::Status(
        no_answer ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
        absl::StrCat(call.method, " ", call.url, ": ", curl_easy_strerror(rc), error[0] ? ": " : "",
                     error, " (deadline ", absl::FormatDuration(call.timeout), ")"));
  }
  return reply;
}

}  // namespace psrt
