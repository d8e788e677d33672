#include "server/checkpoint/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace psrt {
namespace {

constexpr char kAlgorithm[] = "AWS4-HMAC-SHA256";

// Trims and collapses runs of spaces, as the canonical headers require.
std::string CanonicalHeaderValue(absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  std::string out;
  out.reserve(value.size());
  bool space = false;
  for (char c : value) {
    if (c == ' ' || c == '\t') {
      space = true;
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::string HexEncode(absl::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr);
  return HexEncode(absl::string_view(reinterpret_cast<char*>(digest), length));
}

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest,
       &length);
  return std::string(reinterpret_cast<char*>(digest), length);
}

std::string S3UriEncode(absl::string_view s, bool encode_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' ||
        c == '~' || (c == '/' && !encode_slash)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string CanonicalQueryString(
    const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query) {
    encoded.emplace_back(S3UriEncode(name, true), S3UriEncode(value, true));
  }
  std::sort(encoded.begin(), encoded.end());
  return absl::StrJoin(encoded, "&", [](std::string* out, const auto& kv) {
    absl::StrAppend(out, kv.first, "=", kv.second);
  });
}

SigV4Signature SignV4(const SigV4Request& request,
                      const AwsCredentials& credentials,
                      absl::string_view region, absl::string_view service,
                      absl::Time now) {
  SigV4Signature sig;
  sig.amz_date = absl::FormatTime("%Y%m%dT%H%M%SZ", now, absl::UTCTimeZone());
  const std::string date = sig.amz_date.substr(0, 8);
  const std::string payload_hash =
      request.payload_sha256.empty() ? Sha256Hex("") : request.payload_sha256;

  sig.headers.emplace_back("x-amz-content-sha256", payload_hash);
  sig.headers.emplace_back("x-amz-date", sig.amz_date);
  if (!credentials.session_token.empty()) {
    sig.headers.emplace_back("x-amz-security-token", credentials.session_token);
  }

  std::vector<std::pair<std::string, std::string>> signed_headers;
  signed_headers.emplace_back("host", request.host);
  for (const auto& [name, value] : request.headers) {
    signed_headers.emplace_back(absl::AsciiStrToLower(name),
                                CanonicalHeaderValue(value));
  }
  for (const auto& [name, value] : sig.headers) {
    signed_headers.emplace_back(name, CanonicalHeaderValue(value));
  }
  std::sort(signed_headers.begin(), signed_headers.end());

  std::string canonical_headers;
  std::vector<absl::string_view> names;
  for (const auto& [name, value] : signed_headers) {
    absl::StrAppend(&canonical_headers, name, ":", value, "\n");
    names.push_back(name);
  }
  const std::string signed_names = absl::StrJoin(names, ";");

  sig.canonical_request =
      absl::StrCat(request.method, "\n", S3UriEncode(request.path, false), "\n",
                   CanonicalQueryString(request.query), "\n", canonical_headers,
                   "\n", signed_names, "\n", payload_hash);

  const std::string scope =
      absl::StrCat(date, "/", region, "/", service, "/aws4_request");
  sig.string_to_sign = absl::StrCat(kAlgorithm, "\n", sig.amz_date, "\n", scope,
                                    "\n", Sha256Hex(sig.canonical_request));

  std::string key =
      HmacSha256(absl::StrCat("AWS4", credentials.secret_access_key), date);
  key = HmacSha256(key, region);
  key = HmacSha256(key, service);
  key = HmacSha256(key, "aws4_request");
  sig.signature = HexEncode(HmacSha256(key, sig.string_to_sign));

  sig.authorization = absl::StrCat(
      kAlgorithm, " Credential=", credentials.access_key_id, "/", scope,
      ",SignedHeaders=", signed_names, ",Signature=", sig.signature);
  sig.headers.emplace_back("Authorization", sig.authorization);
  return sig;
}

}  // namespace psrt
