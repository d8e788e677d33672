#ifndef PSRT_SERVER_CHECKPOINT_AWS_CREDENTIALS_H_
#define PSRT_SERVER_CHECKPOINT_AWS_CREDENTIALS_H_

// AWS credentials found as the AWS SDKs find them, in their order:
//   1. environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
//      AWS_SESSION_TOKEN;
//   2. web identity (EKS IRSA): AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN
//      [+ AWS_ROLE_SESSION_NAME], STS AssumeRoleWithWebIdentity (unsigned);
//   3. the shared files (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE,
//      AWS_PROFILE): static keys, role_arn with source_profile or
//      credential_source (STS AssumeRole signed with the source's keys), or
//      credential_process (run with a deadline, its JSON read);
//   4. the container endpoint (SageMaker, ECS, EKS Pod Identity):
//      AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (on 169.254.170.2) or
//      AWS_CONTAINER_CREDENTIALS_FULL_URI, with the Authorization header from
//      AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or _TOKEN;
//   5. EC2 instance metadata (IMDSv2: a session token first), at
//      AWS_EC2_METADATA_SERVICE_ENDPOINT or 169.254.169.254; skipped with
//      AWS_EC2_METADATA_DISABLED=true.
// STS is reached at AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL, else
// https://sts.REGION.amazonaws.com.
//
// The first source that is configured answers; when it fails, the search
// ends with its error (as in the SDKs: a broken setup is not papered over by
// another identity). Temporary credentials are refreshed from the same
// source by AwsCredentialsProvider, ahead of their expiry.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/checkpoint/aws_config.h"
#include "server/checkpoint/sigv4.h"

namespace psrt {

// One place credentials come from. Fetch() asks it again each time.
class AwsCredentialSource {
 public:
  virtual ~AwsCredentialSource() = default;
  // "container endpoint http://...", for messages.
  virtual std::string Name() const = 0;
  virtual absl::StatusOr<AwsCredentials> Fetch() const = 0;
};

struct AwsCredentialChainOptions {
  std::string profile;  // empty: AWS_PROFILE, else "default"
  std::string region;   // STS's; empty: ResolveAwsRegion(profile)
  // Each request to STS or the container endpoint.
  absl::Duration http_timeout = absl::Seconds(5);
  // Each request to instance metadata (short: off EC2 nothing answers).
  absl::Duration imds_timeout = absl::Seconds(1);
  absl::Duration process_timeout = absl::Seconds(60);  // credential_process
};

struct FoundAwsCredentials {
  std::unique_ptr<AwsCredentialSource> source;
  AwsCredentials credentials;
};

// Walks the chain. NOT_FOUND, naming every source and why it had nothing,
// when none is configured; else the first configured source's credentials,
// or its error (naming it and why).
absl::StatusOr<FoundAwsCredentials> FindAwsCredentials(const AwsCredentialChainOptions& options);

// FindAwsCredentials' credentials alone, for `profile`.
absl::StatusOr<AwsCredentials> ResolveAwsCredentials(absl::string_view profile);

// Parsers of what the sources answer, exposed for tests.
// RFC 3339 ("2026-12-07T08:00:00Z", fractions and offsets too).
absl::StatusOr<absl::Time> ParseAwsTime(absl::string_view text);
// STS AssumeRole / AssumeRoleWithWebIdentity responses (and their errors).
absl::StatusOr<AwsCredentials> ParseStsCredentials(absl::string_view xml);
// The container endpoint's and instance metadata's JSON: AccessKeyId,
// SecretAccessKey, Token, Expiration (and IMDS's Code, "Success").
absl::StatusOr<AwsCredentials> ParseEndpointCredentials(absl::string_view json);
// credential_process output: Version 1, AccessKeyId, SecretAccessKey,
// SessionToken and Expiration optional.
absl::StatusOr<AwsCredentials> ParseProcessCredentials(absl::string_view json);
// The URL of the container endpoint from the environment; NOT_FOUND when
// neither variable is set, INVALID_ARGUMENT for a FULL_URI the SDKs refuse
// (plain http to a host other than loopback or the ECS/EKS addresses).
absl::StatusOr<std::string> ContainerCredentialsUrl();

// Hands out current credentials, safe to share between threads. Temporary
// ones are refreshed by a thread of its own, `refresh_ahead` before they
// expire (or halfway through their life, when that comes later), so a
// request never waits for a refresh unless the credentials have already
// expired (a refresh that keeps failing); then Get() fetches them itself.
class AwsCredentialsProvider {
 public:
  struct Options {
    absl::Duration refresh_ahead = absl::Minutes(10);
    absl::Duration retry_interval = absl::Seconds(15);  // after a failure
  };

  explicit AwsCredentialsProvider(AwsCredentials fixed);
  AwsCredentialsProvider(std::unique_ptr<AwsCredentialSource> source, AwsCredentials first,
                         Options options);
  ~AwsCredentialsProvider();
  AwsCredentialsProvider(const AwsCredentialsProvider&) = delete;
  AwsCredentialsProvider& operator=(const AwsCredentialsProvider&) = delete;

  // The chain's source and its first credentials.
  static absl::StatusOr<std::shared_ptr<AwsCredentialsProvider>> FromChain(
      const AwsCredentialChainOptions& chain, Options options);

  absl::StatusOr<AwsCredentials> Get() const;
  // Successful refreshes so far.
  int64_t refreshes() const;
  std::string source_name() const;

 private:
  void RefreshLoop();
  // Fetches and installs, unless another thread did so meanwhile (the
  // credentials are no longer expired, or with `expired_only` false, the
  // refresh is no longer due). The fetch runs without mu_ held.
  absl::Status Refresh(bool expired_only) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time NextRefresh(absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<AwsCredentialSource> source_;  // null: fixed
  const Options options_;
  mutable absl::Mutex fetch_mu_;  // one fetch at a time; taken before mu_

  mutable absl::Mutex mu_;
  mutable AwsCredentials current_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time next_refresh_ ABSL_GUARDED_BY(mu_);
  mutable int64_t refreshes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::thread refresher_;  // only for credentials that expire
};

}  // namespace psrt

#endif  // PSRT_SERVER_CHECKPOINT_AWS_CREDENTIALS_H_
