// What the credential sources answer: STS's XML, the endpoints' and
// credential_process's JSON.
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/checkpoint/aws_credentials.h"
#include "server/checkpoint/aws_xml.h"

namespace psrt {
namespace {

// A string member, or "" when absent; an error when it is not a string.
absl::StatusOr<std::string> Member(const nlohmann::json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("credentials JSON: ", name, " is not a string"));
  }
  return it->get<std::string>();
}

// The members named by `token_name` and the fixed key names; `expiration`
// required or not.
absl::StatusOr<AwsCredentials> FromJson(absl::string_view text, const char* token_name,
                                        bool expiration_required) {
  nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("credentials are not a JSON object: '", text.substr(0, 120), "'"));
  }
  AwsCredentials credentials;
  std::string expiration;
  for (auto [name, out] :
       {std::pair<const char*, std::string*>{"AccessKeyId", &credentials.access_key_id},
        {"SecretAccessKey", &credentials.secret_access_key},
        {token_name, &credentials.session_token},
        {"Expiration", &expiration}}) {
    absl::StatusOr<std::string> value = Member(json, name);
    if (!value.ok()) return value.status();
    *out = *std::move(value);
  }
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
    return absl::InvalidArgumentError("credentials JSON lacks AccessKeyId or SecretAccessKey");
  }
  if (expiration.empty()) {
    if (expiration_required) {
      return absl::InvalidArgumentError("credentials JSON lacks Expiration");
    }
    return credentials;
  }
  absl::StatusOr<absl::Time> time = ParseAwsTime(expiration);
  if (!time.ok()) return time.status();
  credentials.expiration = *time;
  return credentials;
}

}  // namespace

absl::StatusOr<absl::Time> ParseAwsTime(absl::string_view text) {
  absl::Time time;
  std::string error;
  const std::string trimmed(absl::StripAsciiWhitespace(text));
  if (!absl::ParseTime(absl::RFC3339_full, trimmed, &time, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expiration '", trimmed, "' is not an RFC 3339 time: ", error));
  }
  return time;
}

absl::StatusOr<AwsCredentials> ParseStsCredentials(absl::string_view xml) {
  if (XmlTagText(xml, "Error")) {
    const std::string code = XmlTagText(xml, "Code").value_or("");
    const std::string message = XmlTagText(xml, "Message").value_or("");
    return absl::Status(code == "AccessDenied" || code == "InvalidIdentityToken"
                            ? absl::StatusCode::kPermissionDenied
                            : absl::StatusCode::kFailedPrecondition,
                        absl::StrCat(code, ": ", message));
  }
  auto block = XmlBlocks(xml, "Credentials");
  if (block.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no <Credentials> in the answer: '", xml.substr(0, 200), "'"));
  }
  AwsCredentials credentials;
  credentials.access_key_id = XmlTagText(block[0], "AccessKeyId").value_or("");
  credentials.secret_access_key = XmlTagText(block[0], "SecretAccessKey").value_or("");
  credentials.session_token = XmlTagText(block[0], "SessionToken").value_or("");
  if (credentials.access_key_id.empty() || credentials.secret_access_key.empty() ||
      credentials.session_token.empty()) {
    return absl::InvalidArgumentError(
        "<Credentials> lacks AccessKeyId, SecretAccessKey or SessionToken");
  }
  absl::StatusOr<absl::Time> expiration =
      ParseAwsTime(XmlTagText(block[0], "Expiration").value_or(""));
  if (!expiration.ok()) return expiration.status();
  credentials.expiration = *expiration;
  return credentials;
}

absl::StatusOr<AwsCredentials> ParseEndpointCredentials(absl::string_view json) {
  nlohmann::json parsed = nlohmann::json::parse(json, nullptr, false);
  if (parsed.is_object()) {
    auto code = parsed.find("Code");
    if (code != parsed.end() && code->is_string() && code->get<std::string>() != "Success") {
      std::string message;
      auto m = parsed.find("Message");
      if (m != parsed.end() && m->is_string()) message = m->get<std::string>();
      return absl::FailedPreconditionError(
          absl::StrCat("credentials answer Code ", code->get<std::string>(), ": ", message));
    }
  }
  return FromJson(json, "Token", /*expiration_required=*/false);
}

absl::StatusOr<AwsCredentials> ParseProcessCredentials(absl::string_view json) {
  nlohmann::json parsed = nlohmann::json::parse(json, nullptr, false);
  if (!parsed.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "credential_process output is not a JSON object: '", json.substr(0, 120), "'"));
  }
  auto version = parsed.find("Version");
  if (version == parsed.end() || !version->is_number_integer() || version->get<int64_t>() != 1) {
    return absl::InvalidArgumentError("credential_process output must have \"Version\": 1");
  }
  return FromJson(json, "SessionToken", /*expiration_required=*/false);
}

}  // namespace psrt
