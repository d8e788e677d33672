// What psrt reads from an S3 endpoint and what it signs for it, on
// arbitrary input: ListObjectsV2 pages and error documents (XML), and the
// SigV4 canonicalization of requests with arbitrary paths, queries and
// headers, which must be deterministic.

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "server/checkpoint/s3_client.h"
#include "server/checkpoint/sigv4.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)psrt::ParseListObjectsPage(text);
  (void)psrt::XmlTagText(text, "Code");
  (void)psrt::XmlTagText(text, "Message");

  // NUL-separated: method, host, path, then query and header pairs.
  std::vector<std::string> parts = absl::StrSplit(text, '\0');
  if (parts.size() > 40) parts.resize(40);
  parts.resize(std::max<size_t>(parts.size(), 3));
  psrt::SigV4Request request;
  request.method = parts[0];
  request.host = parts[1];
  request.path = "/" + parts[2];
  for (size_t i = 3; i + 1 < parts.size(); i += 2) {
    ((i / 2) % 2 == 0 ? request.query : request.headers).emplace_back(parts[i], parts[i + 1]);
  }
  const psrt::AwsCredentials credentials{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
  const absl::Time now = absl::FromUnixSeconds(1369353600);
  const psrt::SigV4Signature a = psrt::SignV4(request, credentials, "us-east-1", "s3", now);
  const psrt::SigV4Signature b = psrt::SignV4(request, credentials, "us-east-1", "s3", now);
  if (a.canonical_request != b.canonical_request || a.string_to_sign != b.string_to_sign) std::abort();
  (void)psrt::CanonicalQueryString(request.query);
  return 0;
}
