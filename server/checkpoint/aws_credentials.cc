// The credential chain: each source as a small class, and the walk over
// them in the AWS SDKs' order.
#include "server/checkpoint/aws_credentials.h"

#include <unistd.h>

#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "server/checkpoint/aws_credential_process.h"
#include "server/checkpoint/aws_http.h"
#include "server/checkpoint/aws_xml.h"

namespace psrt {
namespace {

using Params = std::vector<std::pair<std::string, std::string>>;

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read ", what, " ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(text.str()));
}

// "psrt-<host>-<pid>": tells the job's sessions apart in CloudTrail.
std::string DefaultSessionName() {
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string name = absl::StrCat("psrt-", host, "-", getpid());
  for (char& c : name) {
    if (!absl::ascii_isalnum(c) && std::string("+=,.@_-").find(c) == std::string::npos) {
      c = '-';
    }
  }
  return name.substr(0, 64);
}

// STS's query API (POST, form-encoded), at AWS_ENDPOINT_URL_STS,
// AWS_ENDPOINT_URL or the regional endpoint.
struct Sts {
  std::string endpoint;
  std::string region;
  absl::Duration timeout;

  static Sts For(const AwsCredentialChainOptions& options) {
    Sts sts;
    sts.region = options.region.empty() ? ResolveAwsRegion(options.profile) : options.region;
    sts.endpoint = AwsEnv("AWS_ENDPOINT_URL_STS");
    if (sts.endpoint.empty()) sts.endpoint = AwsEnv("AWS_ENDPOINT_URL");
    if (sts.endpoint.empty()) {
      sts.endpoint = absl::StrCat("https://sts.", sts.region, ".amazonaws.com");
    }
    while (!sts.endpoint.empty() && sts.endpoint.back() == '/') {
      sts.endpoint.pop_back();
    }
    sts.timeout = options.http_timeout;
    return sts;
  }

  // Signed with `signer` unless null (AssumeRoleWithWebIdentity is not).
  absl::StatusOr<AwsCredentials> Call(Params params, const AwsCredentials* signer) const {
    const std::string action = params.front().second;
    params.emplace_back("Version", "2011-06-15");
    HttpCall call;
    call.method = "POST";
    call.url = endpoint + "/";
    call.body = CanonicalQueryString(params);
    call.timeout = timeout;
    call.headers.emplace_back("Content-Type", "application/x-www-form-urlencoded");
    if (signer != nullptr) {
      SigV4Request request;
      request.method = "POST";
      request.host =
          std::string(absl::StripPrefix(absl::StripPrefix(endpoint, "https://"), "http://"));
      request.path = "/";
      request.headers = call.headers;
      request.payload_sha256 = Sha256Hex(call.body);
      SigV4Signature sig = SignV4(request, *signer, region, "sts", absl::Now());
      for (auto& header : sig.headers) call.headers.push_back(header);
    }
    const std::string what = absl::StrCat("STS ", action, " at ", endpoint);
    absl::StatusOr<HttpReply> reply = HttpExchange(call);
    if (!reply.ok()) {
      return absl::Status(reply.status().code(),
                          absl::StrCat(what, ": ", reply.status().message()));
    }
    absl::StatusOr<AwsCredentials> credentials = ParseStsCredentials(reply->body);
    if (!credentials.ok()) {
      return absl::Status(
          credentials.status().code(),
          absl::StrCat(what, ": HTTP ", reply->status, " ", credentials.status().message()));
    }
    return credentials;
  }
};

class EnvironmentSource final : public AwsCredentialSource {
 public:
  std::string Name() const override { return "environment (AWS_ACCESS_KEY_ID)"; }
  absl::StatusOr<AwsCredentials> Fetch() const override {
    AwsCredentials credentials;
    credentials.access_key_id = AwsEnv("AWS_ACCESS_KEY_ID");
    credentials.secret_access_key = AwsEnv("AWS_SECRET_ACCESS_KEY");
    credentials.session_token = AwsEnv("AWS_SESSION_TOKEN");
    if (credentials.access_key_id.empty() || credentials.secret_access_key.empty()) {
      return absl::InvalidArgumentError(
          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together");
    }
    return credentials;
  }
};

class WebIdentitySource final : public AwsCredentialSource {
 public:
  WebIdentitySource(std::string token_file, std::string role_arn, std::string session_name, Sts sts)
      : token_file_(std::move(token_file)),
        role_arn_(std::move(role_arn)),
        session_name_(std::move(session_name)),
        sts_(std::move(sts)) {}
  std::string Name() const override {
    return absl::StrCat("web identity (role ", role_arn_, ", token ", token_file_, ")");
  }
  absl::StatusOr<AwsCredentials> Fetch() const override {
    // Read each time: the orchestrator rotates the token.
    absl::StatusOr<std::string> token = ReadSmallFile(token_file_, "AWS_WEB_IDENTITY_TOKEN_FILE");
    if (!token.ok()) return token.status();
    if (token->empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("AWS_WEB_IDENTITY_TOKEN_FILE ", token_file_, " is empty"));
    }
    return sts_.Call({{"Action", "AssumeRoleWithWebIdentity"},
                      {"RoleArn", role_arn_},
                      {"RoleSessionName", session_name_},
                      {"WebIdentityToken", *token}},
                     nullptr);
  }

 private:
  const std::string token_file_, role_arn_, session_name_;
  const Sts sts_;
};

class StaticProfileSource final : public AwsCredentialSource {
 public:
  StaticProfileSource(std::string where, AwsCredentials credentials)
      : where_(std::move(where)), credentials_(std::move(credentials)) {}
  std::string Name() const override { return where_; }
  absl::StatusOr<AwsCredentials> Fetch() const override { return credentials_; }

 private:
  const std::string where_;
  const AwsCredentials credentials_;
};

class ProcessSource final : public AwsCredentialSource {
 public:
  ProcessSource(std::string where, std::string command, absl::Duration timeout)
      : where_(std::move(where)), command_(std::move(command)), timeout_(timeout) {}
  std::string Name() const override {
    return absl::StrCat(where_, " credential_process '", command_, "'");
  }
  absl::StatusOr<AwsCredentials> Fetch() const override {
    absl::StatusOr<std::string> out = RunCredentialProcess(command_, timeout_);
    if (!out.ok()) return out.status();
    return ParseProcessCredentials(*out);
  }

 private:
  const std::string where_, command_;
  const absl::Duration timeout_;
};

// role_arn: STS AssumeRole signed with the base source's credentials.
class AssumeRoleSource final : public AwsCredentialSource {
 public:
  AssumeRoleSource(std::string where, std::unique_ptr<AwsCredentialSource> base, Params params,
                   Sts sts)
      : where_(std::move(where)),
        base_(std::move(base)),
        params_(std::move(params)),
        sts_(std::move(sts)) {}
  std::string Name() const override {
    return absl::StrCat(where_, " role_arn ", params_[1].second, " (from ", base_->Name(), ")");
  }
  absl::StatusOr<AwsCredentials> Fetch() const override {
    absl::StatusOr<AwsCredentials> base = base_->Fetch();
    if (!base.ok()) return base.status();
    return sts_.Call(params_, &*base);
  }

 private:
  const std::string where_;
  const std::unique_ptr<AwsCredentialSource> base_;
  const Params params_;  // Action, RoleArn, ...
  const Sts sts_;
};

class EndpointSource final : public AwsCredentialSource {
 public:
  // Container endpoint when `imds` is false, else instance metadata at
  // `url` (scheme://host[:port]).
  EndpointSource(std::string url, bool imds, absl::Duration timeout)
      : url_(std::move(url)), imds_(imds), timeout_(timeout) {}
  std::string Name() const override {
    return absl::StrCat(imds_ ? "instance metadata " : "container endpoint ", url_);
  }
  absl::StatusOr<AwsCredentials> Fetch() const override {
    return imds_ ? FetchImds() : FetchContainer();
  }

 private:
  absl::StatusOr<AwsCredentials> FetchContainer() const;
  absl::StatusOr<AwsCredentials> FetchImds() const;
  absl::StatusOr<std::string> Get(const std::string& url, const std::string& header,
                                  const std::string& value) const;

  const std::string url_;
  const bool imds_;
  const absl::Duration timeout_;
};

absl::StatusOr<std::string> EndpointSource::Get(const std::string& url, const std::string& header,
                                                const std::string& value) const {
  HttpCall call;
  call.url = url;
  call.timeout = timeout_;
  if (!value.empty()) call.headers.emplace_back(header, value);
  absl::StatusOr<HttpReply> reply;
  // Two tries, as the SDKs do, for a transport failure or a 5xx.
  for (int attempt = 0; attempt < 2; ++attempt) {
    reply = HttpExchange(call);
    if (reply.ok() && reply->status < 500) break;
  }
  if (!reply.ok()) return reply.status();
  if (reply->status != 200) {
    return absl::Status(
        reply->status == 404                           ? absl::StatusCode::kNotFound
        : reply->status == 401 || reply->status == 403 ? absl::StatusCode::kPermissionDenied
                                                       : absl::StatusCode::kUnavailable,
        absl::StrCat("GET ", url, ": HTTP ", reply->status, " ", reply->body.substr(0, 200)));
  }
  return std::move(reply->body);
}

absl::StatusOr<AwsCredentials> EndpointSource::FetchContainer() const {
  std::string token;
  const std::string token_file = AwsEnv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  if (!token_file.empty()) {
    absl::StatusOr<std::string> read =
        ReadSmallFile(token_file, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
    if (!read.ok()) return read.status();
    token = *std::move(read);
  } else {
    token = AwsEnv("AWS_CONTAINER_AUTHORIZATION_TOKEN");
  }
  if (token.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError("the container authorization token holds a line break");
  }
  absl::StatusOr<std::string> body = Get(url_, "Authorization", token);
  if (!body.ok()) return body.status();
  return ParseEndpointCredentials(*body);
}

absl::StatusOr<AwsCredentials> EndpointSource::FetchImds() const {
  // IMDSv2: a session token first. 403/404/405 or no answer mean an
  // IMDSv1-only service; the SDKs then go on without one.
  HttpCall put;
  put.method = "PUT";
  put.url = url_ + "/latest/api/token";
  put.headers.emplace_back("X-aws-ec2-metadata-token-ttl-seconds", "21600");
  put.timeout = timeout_;
  std::string token;
  absl::StatusOr<HttpReply> reply = HttpExchange(put);
  if (absl::IsDeadlineExceeded(reply.status())) {
    // Connected, but the answer never came back: a container behind a hop
    // limit of 1, where only IMDSv1 answers (the SDKs go on without a token).
  } else if (!reply.ok()) {
    return reply.status();  // nothing there: not on EC2
  } else if (reply->status == 200) {
    token = std::string(absl::StripAsciiWhitespace(reply->body));
  } else if (reply->status != 403 && reply->status != 404 && reply->status != 405) {
    return absl::UnavailableError(
        absl::StrCat("PUT ", put.url, ": HTTP ", reply->status, " ", reply->body.substr(0, 200)));
  }
  const std::string base = url_ + "/latest/meta-data/iam/security-credentials/";
  const char* header = "X-aws-ec2-metadata-token";
  absl::StatusOr<std::string> roles = Get(base, header, token);
  if (absl::IsNotFound(roles.status())) {
    return absl::NotFoundError(
        absl::StrCat("the instance has no IAM role (", roles.status().message(), ")"));
  }
  if (!roles.ok()) return roles.status();
  const std::string role(
      absl::StripAsciiWhitespace(absl::string_view(*roles).substr(0, roles->find('\n'))));
  if (role.empty()) {
    return absl::NotFoundError(absl::StrCat("GET ", base, " named no role"));
  }
  absl::StatusOr<std::string> body = Get(base + role, header, token);
  if (!body.ok()) return body.status();
  return ParseEndpointCredentials(*body);
}

}  // namespace

absl::StatusOr<std::string> ContainerCredentialsUrl() {
  const std::string relative = AwsEnv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  if (!relative.empty()) {
    if (relative[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI '",
                                                     relative, "' does not start with '/'"));
    }
    return absl::StrCat("http://169.254.170.2", relative);
  }
  const std::string full = AwsEnv("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  if (full.empty()) {
    return absl::NotFoundError("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI and _FULL_URI are unset");
  }
  absl::string_view rest = full;
  if (absl::ConsumePrefix(&rest, "https://")) return full;
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("AWS_CONTAINER_CREDENTIALS_FULL_URI '", full, "' is not http:// or https://"));
  }
  std::string host(rest.substr(0, rest.find('/')));
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') - 1);
  } else {
    host = host.substr(0, host.find(':'));
  }
  // Plain http only to this host or to the ECS/EKS agents, as the SDKs.
  const bool allowed = absl::StartsWith(host, "127.") || host == "::1" || host == "localhost" ||
                       host == "169.254.170.2" || host == "169.254.170.23" ||
                       host == "fd00:ec2::23";
  if (!allowed) {
    return absl::InvalidArgumentError(
        absl::StrCat("AWS_CONTAINER_CREDENTIALS_FULL_URI '", full, "': host '", host,
                     "' is not loopback, 169.254.170.2, 169.254.170.23 or fd00:ec2::23 "
                     "(plain http is allowed only there; use https)"));
  }
  return full;
}

namespace {

// NOT_FOUND: not configured (why); another error: configured but wrong.
using Probe = absl::StatusOr<std::unique_ptr<AwsCredentialSource>>;

Probe ProbeEnvironment() {
  if (AwsEnv("AWS_ACCESS_KEY_ID").empty() && AwsEnv("AWS_SECRET_ACCESS_KEY").empty()) {
    return absl::NotFoundError("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY unset");
  }
  return std::make_unique<EnvironmentSource>();
}

Probe ProbeWebIdentity(const AwsCredentialChainOptions& options) {
  const std::string file = AwsEnv("AWS_WEB_IDENTITY_TOKEN_FILE");
  const std::string role = AwsEnv("AWS_ROLE_ARN");
  if (file.empty()) {
    return absl::NotFoundError("AWS_WEB_IDENTITY_TOKEN_FILE unset");
  }
  if (role.empty()) {
    return absl::InvalidArgumentError("AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not");
  }
  std::string session = AwsEnv("AWS_ROLE_SESSION_NAME");
  if (session.empty()) session = DefaultSessionName();
  return std::make_unique<WebIdentitySource>(file, role, session, Sts::For(options));
}

// The profile's static keys; NOT_FOUND when it has none.
Probe ProfileKeys(const AwsProfile& profile) {
  AwsCredentials keys{profile.Get("aws_access_key_id"), profile.Get("aws_secret_access_key"),
                      profile.Get("aws_session_token")};
  if (keys.access_key_id.empty() && keys.secret_access_key.empty()) {
    return absl::NotFoundError(absl::StrCat(profile.Describe(), " has no keys"));
  }
  if (keys.access_key_id.empty() || keys.secret_access_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        profile.Describe(), " must have both aws_access_key_id and aws_secret_access_key"));
  }
  return std::make_unique<StaticProfileSource>(profile.Describe(), keys);
}

Probe ProfileSource(const AwsCredentialChainOptions& options, const std::string& name,
                    std::set<std::string>* seen);

// role_arn's credentials: source_profile's, or credential_source's.
Probe RoleBase(const AwsCredentialChainOptions& options, const AwsProfile& profile,
               std::set<std::string>* seen) {
  const std::string source_profile = profile.Get("source_profile");
  const std::string credential_source = profile.Get("credential_source");
  if (!source_profile.empty() && !credential_source.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(profile.Describe(), " sets both source_profile and credential_source"));
  }
  if (!source_profile.empty()) {
    if (source_profile == profile.name) {
      // A profile with keys and a role names itself: its keys sign.
      Probe keys = ProfileKeys(profile);
      if (absl::IsNotFound(keys.status())) {
        return absl::InvalidArgumentError(
            absl::StrCat(profile.Describe(), " is its own source_profile but has no keys"));
      }
      return keys;
    }
    Probe base = ProfileSource(options, source_profile, seen);
    if (absl::IsNotFound(base.status())) {
      return absl::InvalidArgumentError(
          absl::StrCat(profile.Describe(), ": source_profile: ", base.status().message()));
    }
    return base;
  }
  if (credential_source == "Environment") return ProbeEnvironment();
  if (credential_source == "EcsContainer") {
    absl::StatusOr<std::string> url = ContainerCredentialsUrl();
    if (!url.ok()) return url.status();
    return std::make_unique<EndpointSource>(*url, false, options.http_timeout);
  }
  if (credential_source == "Ec2InstanceMetadata") {
    std::string endpoint = AwsEnv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    if (endpoint.empty()) endpoint = "http://169.254.169.254";
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    return std::make_unique<EndpointSource>(endpoint, true, options.imds_timeout);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      profile.Describe(), " has role_arn but ",
      credential_source.empty() ? std::string("no source_profile or credential_source")
                                : absl::StrCat("credential_source '", credential_source,
                                               "' (known: Environment, EcsContainer, "
                                               "Ec2InstanceMetadata)")));
}

Probe AssumeRoleFromProfile(const AwsCredentialChainOptions& options, const AwsProfile& profile,
                            std::set<std::string>* seen) {
  Probe base = RoleBase(options, profile, seen);
  if (!base.ok()) return base.status();
  std::string session = profile.Get("role_session_name");
  Params params = {{"Action", "AssumeRole"},
                   {"RoleArn", profile.Get("role_arn")},
                   {"RoleSessionName", session.empty() ? DefaultSessionName() : session}};
  if (!profile.Get("external_id").empty()) {
    params.emplace_back("ExternalId", profile.Get("external_id"));
  }
  if (!profile.Get("duration_seconds").empty()) {
    params.emplace_back("DurationSeconds", profile.Get("duration_seconds"));
  }
  AwsCredentialChainOptions sts_options = options;
  sts_options.profile = profile.name;
  return std::make_unique<AssumeRoleSource>(profile.Describe(), *std::move(base), std::move(params),
                                            Sts::For(sts_options));
}

Probe ProfileSource(const AwsCredentialChainOptions& options, const std::string& name,
                    std::set<std::string>* seen) {
  if (!seen->insert(name).second) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile [", name, "] is its own source_profile through ", absl::StrJoin(*seen, ", ")));
  }
  const AwsProfile profile = ReadAwsProfile(name);
  if (!profile.found) {
    return absl::NotFoundError(absl::StrCat(profile.Describe(), ": no such profile"));
  }
  // As the SDKs: a role first, then static keys, then a process.
  if (!profile.Get("role_arn").empty()) {
    return AssumeRoleFromProfile(options, profile, seen);
  }
  Probe keys = ProfileKeys(profile);
  if (!absl::IsNotFound(keys.status())) return keys;
  if (!profile.Get("credential_process").empty()) {
    return std::make_unique<ProcessSource>(profile.Describe(), profile.Get("credential_process"),
                                           options.process_timeout);
  }
  return absl::NotFoundError(absl::StrCat(
      profile.Describe(), " has no aws_access_key_id, role_arn or credential_process"));
}

Probe ProbeContainer(const AwsCredentialChainOptions& options) {
  absl::StatusOr<std::string> url = ContainerCredentialsUrl();
  if (!url.ok()) return url.status();
  return std::make_unique<EndpointSource>(*url, false, options.http_timeout);
}

Probe ProbeImds(const AwsCredentialChainOptions& options) {
  if (absl::AsciiStrToLower(AwsEnv("AWS_EC2_METADATA_DISABLED")) == "true") {
    return absl::NotFoundError("AWS_EC2_METADATA_DISABLED=true");
  }
  std::string endpoint = AwsEnv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (endpoint.empty()) {
    endpoint = absl::AsciiStrToLower(AwsEnv("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE")) == "ipv6"
                   ? "http://[fd00:ec2::254]"
                   : "http://169.254.169.254";
  }
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return std::make_unique<EndpointSource>(endpoint, true, options.imds_timeout);
}

}  // namespace

absl::StatusOr<FoundAwsCredentials> FindAwsCredentials(const AwsCredentialChainOptions& options) {
  std::vector<std::string> tried;
  const std::string profile = AwsProfileName(options.profile);
  std::set<std::string> seen;
  const std::pair<const char*, std::function<Probe()>> chain[] = {
      {"environment", [] { return ProbeEnvironment(); }},
      {"web identity", [&] { return ProbeWebIdentity(options); }},
      {"shared files", [&] { return ProfileSource(options, profile, &seen); }},
      {"container endpoint", [&] { return ProbeContainer(options); }},
      {"instance metadata", [&] { return ProbeImds(options); }},
  };
  for (const auto& [what, probe] : chain) {
    Probe source = probe();
    if (absl::IsNotFound(source.status())) {
      tried.push_back(absl::StrCat(what, ": ", source.status().message()));
      continue;
    }
    absl::Status status = source.status();
    if (source.ok()) {
      absl::StatusOr<AwsCredentials> credentials = (*source)->Fetch();
      if (credentials.ok()) {
        return FoundAwsCredentials{*std::move(source), *std::move(credentials)};
      }
      status = absl::Status(credentials.status().code(),
                            absl::StrCat((*source)->Name(), ": ", credentials.status().message()));
      // Off EC2 nothing answers at 169.254.169.254: that is "none there".
      if (std::string(what) == "instance metadata") {
        tried.push_back(absl::StrCat(what, ": ", status.message()));
        break;
      }
    } else {
      status = absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
    }
    tried.push_back(std::string(status.message()));
    return absl::Status(status.code(),
                        absl::StrCat("AWS credentials: ", absl::StrJoin(tried, "; ")));
  }
  return absl::NotFoundError(absl::StrCat("no AWS credentials: ", absl::StrJoin(tried, "; ")));
}

absl::StatusOr<AwsCredentials> ResolveAwsCredentials(absl::string_view profile) {
  AwsCredentialChainOptions options;
  options.profile = std::string(profile);
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials(options);
  if (!found.ok()) return found.status();
  return std::move(found->credentials);
}

}  // namespace psrt
