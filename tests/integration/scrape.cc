// Copyright 2024 The psrt Authors.

#include "tests/integration/scrape.h"

#include <curl/curl.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace psrt {
namespace {

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

}  // namespace

ScrapeResult Scrape(const std::string& url, const ScrapeTls& tls) {
  static const bool initialized = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  ScrapeResult result;
  CURL* curl = initialized ? curl_easy_init() : nullptr;
  if (curl == nullptr) {
    result.error = "curl_easy_init failed";
    return result;
  }
  char error[CURL_ERROR_SIZE] = {};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &result.body);
  // Prometheus asks for gzip; the answer is then decoded as it would be.
  curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, "gzip");
  if (!tls.ca.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, tls.ca.c_str());
  if (!tls.cert.empty()) curl_easy_setopt(curl, CURLOPT_SSLCERT, tls.cert.c_str());
  if (!tls.key.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, tls.key.c_str());
  curl_slist* resolve = nullptr;
  if (!tls.server_name.empty()) {
    // The name, resolved to the URL's address, as Prometheus' server_name.
    const std::string rest(absl::StripPrefix(url, "https://"));
    const std::string host_port = rest.substr(0, rest.find('/'));
    const std::vector<std::string> parts = absl::StrSplit(host_port, ':');
    if (parts.size() == 2) {
      resolve = curl_slist_append(
          nullptr, absl::StrCat(tls.server_name, ":", parts[1], ":", parts[0]).c_str());
      curl_easy_setopt(curl, CURLOPT_RESOLVE, resolve);
      curl_easy_setopt(
          curl, CURLOPT_URL,
          absl::StrCat("https://", tls.server_name, ":", parts[1], rest.substr(host_port.size()))
              .c_str());
    }
  }
  const CURLcode rc = curl_easy_perform(curl);
  if (rc == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &result.status);
  } else {
    result.error = absl::StrCat(curl_easy_strerror(rc), ": ", error);
  }
  curl_slist_free_all(resolve);
  curl_easy_cleanup(curl);
  return result;
}

std::map<std::string, double> ParseSamples(const std::string& text) {
  std::map<std::string, double> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "#")) continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    // strtod reads prometheus-cpp's "Nan" and "+Inf" too.
    const std::string value(line.substr(space + 1));
    samples[std::string(line.substr(0, space))] = std::strtod(value.c_str(), nullptr);
  }
  return samples;
}

double SampleValue(const std::string& text, const std::string& name) {
  const std::map<std::string, double> samples = ParseSamples(text);
  auto it = samples.find(name);
  return it == samples.end() ? -1 : it->second;
}

}  // namespace psrt
