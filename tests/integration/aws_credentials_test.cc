// The AWS credential sources against real servers on loopback: moto's STS
// (AssumeRole, AssumeRoleWithWebIdentity), instance metadata and S3; a
// container-credentials endpoint and a strict IMDSv2 server this test runs;
// and the provider's refreshes.
#include "server/checkpoint/aws_credentials.h"

#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/checkpoint/s3_client.h"
#include "tests/integration/credentials_endpoint.h"
#include "tests/integration/moto_server.h"
#include "tests/unit/aws_env.h"

namespace psrt {
namespace {

// Waits (bounded) for `done`; false at the deadline.
template <typename F>
bool WaitFor(F done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

class AwsSourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = env_.UseFilesIn("aws_sources_test");
    env_.Set("AWS_REGION", "us-east-1");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }
  // moto on loopback as STS, S3 and instance metadata; false: skipped.
  bool StartMoto() {
    const std::string why = moto_.Start();
    if (!why.empty()) {
      skip_ = why;
      return false;
    }
    return true;
  }

  std::string dir_, skip_;
  AwsTestEnv env_{::testing::TempDir()};
  MotoServer moto_;
};

// S3 through the client as a job builds it (credentials from the chain).
void ExpectS3Works(const std::string& endpoint) {
  S3ClientOptions options;
  options.endpoint = endpoint;
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->CreateBucket("psrt-creds").ok());
  ASSERT_TRUE((*client)->Put("psrt-creds", "k", "v").ok());
  EXPECT_EQ((*client)->GetObject("psrt-creds", "k").value_or(""), "v");
}

TEST_F(AwsSourcesTest, WebIdentityThroughMotoSts) {
  if (!StartMoto()) GTEST_SKIP() << skip_;
  Write("token", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJwc3J0In0.c2lnbmF0dXJl\n");
  env_.Set("AWS_WEB_IDENTITY_TOKEN_FILE", dir_ + "/token");
  env_.Set("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/psrt-irsa");
  env_.Set("AWS_ROLE_SESSION_NAME", "psrt-test");
  env_.Set("AWS_ENDPOINT_URL_STS", moto_.endpoint());
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials({});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(absl::StrContains(found->source->Name(), "web identity"));
  EXPECT_FALSE(found->credentials.access_key_id.empty());
  EXPECT_FALSE(found->credentials.session_token.empty());
  EXPECT_GT(found->credentials.expiration, absl::Now());
  EXPECT_LT(found->credentials.expiration, absl::Now() + absl::Hours(13));
  ExpectS3Works(moto_.endpoint());

  // An empty token file is named.
  Write("token", "");
  found = FindAwsCredentials({});
  EXPECT_TRUE(absl::StrContains(found.status().message(), "is empty")) << found.status();
}

TEST_F(AwsSourcesTest, ProfileRoleThroughMotoAssumeRole) {
  if (!StartMoto()) GTEST_SKIP() << skip_;
  Write("credentials",
        "[base]\naws_access_key_id = AKIABASEKEY0000000\n"
        "aws_secret_access_key = base-secret\n");
  Write("config",
        "[profile ckpt]\nrole_arn = arn:aws:iam::123456789012:role/ckpt\n"
        "source_profile = base\nrole_session_name = psrt-ckpt\n"
        "duration_seconds = 900\n");
  env_.Set("AWS_PROFILE", "ckpt");
  env_.Set("AWS_ENDPOINT_URL", moto_.endpoint());  // S3 and STS alike
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials({});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(
      absl::StrContains(found->source->Name(), "role_arn arn:aws:iam::123456789012:role/ckpt"))
      << found->source->Name();
  EXPECT_NE(found->credentials.access_key_id, "AKIABASEKEY0000000");
  EXPECT_FALSE(found->credentials.session_token.empty());
  // moto honours DurationSeconds.
  EXPECT_LT(found->credentials.expiration, absl::Now() + absl::Minutes(16));
  EXPECT_GT(found->credentials.expiration, absl::Now() + absl::Minutes(14));
  ExpectS3Works(moto_.endpoint());

  // A profile with keys that names itself as its source: its keys sign.
  Write("credentials",
        "[self]\naws_access_key_id = AKIASELFKEY0000000\n"
        "aws_secret_access_key = self-secret\n"
        "role_arn = arn:aws:iam::123456789012:role/self\nsource_profile = self\n");
  env_.Set("AWS_PROFILE", "self");
  found = FindAwsCredentials({});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(absl::StrContains(found->source->Name(), "role/self (from profile [self]"))
      << found->source->Name();
  EXPECT_NE(found->credentials.access_key_id, "AKIASELFKEY0000000");
}

TEST_F(AwsSourcesTest, InstanceMetadataFromMoto) {
  if (!StartMoto()) GTEST_SKIP() << skip_;
  env_.Unset("AWS_EC2_METADATA_DISABLED");
  env_.Set("AWS_EC2_METADATA_SERVICE_ENDPOINT", moto_.endpoint() + "/");
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials({});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->credentials.access_key_id, "test-key");  // moto's role
  EXPECT_EQ(found->credentials.session_token, "test-session-token");
  EXPECT_TRUE(absl::StrContains(found->source->Name(), "instance metadata"));
  ExpectS3Works(moto_.endpoint());
}

TEST_F(AwsSourcesTest, ContainerEndpointWithItsAuthorizationToken) {
  CredentialsEndpoint endpoint(absl::Hours(1), "Bearer pod-identity-token");
  env_.Set("AWS_CONTAINER_CREDENTIALS_FULL_URI", endpoint.url());
  Write("token", "Bearer pod-identity-token\n");
  env_.Set("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", dir_ + "/token");
  env_.Set("AWS_CONTAINER_AUTHORIZATION_TOKEN", "Bearer stale");  // file wins
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials({});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->credentials.access_key_id, CredentialsEndpoint::AccessKey(1));
  EXPECT_EQ(found->credentials.session_token, "session-1");
  EXPECT_EQ(endpoint.refused(), 0);

  env_.Unset("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  found = FindAwsCredentials({});
  EXPECT_EQ(found.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(found.status().message(), "HTTP 401"));
  EXPECT_TRUE(absl::StrContains(found.status().message(), endpoint.url())) << found.status();
  env_.Set("AWS_CONTAINER_AUTHORIZATION_TOKEN", "Bearer pod-identity-token");
  found = FindAwsCredentials({});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->credentials.access_key_id, CredentialsEndpoint::AccessKey(2));

  // A dead endpoint is named with why.
  env_.Set("AWS_CONTAINER_CREDENTIALS_FULL_URI",
           absl::StrCat("http://127.0.0.1:", FreePort(), "/creds"));
  found = FindAwsCredentials({});
  EXPECT_EQ(found.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(found.status().message(), "container endpoint")) << found.status();
}

// Instance metadata that insists on IMDSv2 (as EC2 can be set to), answers
// only IMDSv1, or whose token answers never arrive (a container behind a
// hop limit of 1: here, they come after the client's deadline).
enum class Imds { kV2, kV1, kTokenLost };

class ImdsServer {
 public:
  explicit ImdsServer(Imds mode) {
    const bool v2 = mode == Imds::kV2;
    server_.Put("/latest/api/token", [this, mode](const httplib::Request& r, httplib::Response& w) {
      if (mode == Imds::kTokenLost) absl::SleepFor(absl::Seconds(1));
      absl::MutexLock lock(&mu_);
      ++puts_;
      if (mode != Imds::kV2) {
        w.status = 403;
      } else if (r.get_header_value("X-aws-ec2-metadata-token-ttl-seconds").empty()) {
        w.status = 400;
      } else {
        w.set_content("imds-session-token", "text/plain");
      }
    });
    server_.Get(R"(/latest/meta-data/iam/security-credentials/(.*))", [this, v2](
                                                                          const httplib::Request& r,
                                                                          httplib::Response& w) {
      absl::MutexLock lock(&mu_);
      if (v2 && r.get_header_value("X-aws-ec2-metadata-token") != "imds-session-token") {
        ++refused_;
        w.status = 401;
        return;
      }
      ++gets_;
      if (r.matches[1].str().empty()) {
        w.set_content("psrt-instance-role\n", "text/plain");
      } else if (r.matches[1].str() == "psrt-instance-role") {
        w.set_content(R"({"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"ASIAIMDS",)"
                      R"("SecretAccessKey":"s","Token":"t","Expiration":"2099-01-01T00:00:00Z"})",
                      "application/json");
      } else {
        w.status = 404;
      }
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~ImdsServer() {
    server_.stop();
    thread_.join();
  }
  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }
  int puts() const {
    absl::MutexLock lock(&mu_);
    return puts_;
  }
  int gets() const {
    absl::MutexLock lock(&mu_);
    return gets_;
  }
  int refused() const {
    absl::MutexLock lock(&mu_);
    return refused_;
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  mutable absl::Mutex mu_;
  int puts_ = 0, gets_ = 0, refused_ = 0;
};

TEST_F(AwsSourcesTest, InstanceMetadataTokenFirstOrV1WhereRefused) {
  env_.Unset("AWS_EC2_METADATA_DISABLED");
  AwsCredentialChainOptions options;
  options.imds_timeout = absl::Milliseconds(300);
  for (Imds mode : {Imds::kV2, Imds::kV1, Imds::kTokenLost}) {
    const int m = static_cast<int>(mode);
    ImdsServer imds(mode);
    env_.Set("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint());
    absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials(options);
    ASSERT_TRUE(found.ok()) << m << ": " << found.status();
    EXPECT_EQ(found->credentials.access_key_id, "ASIAIMDS");
    if (mode != Imds::kTokenLost) EXPECT_EQ(imds.puts(), 1) << m;  // the token asked for once
    EXPECT_EQ(imds.gets(), 2) << m;                                // the role, its credentials
    EXPECT_EQ(imds.refused(), 0) << m;
  }
  // Nothing listening: instance metadata is "not there", and the error
  // lists every source.
  env_.Set("AWS_EC2_METADATA_SERVICE_ENDPOINT", absl::StrCat("http://127.0.0.1:", FreePort()));
  absl::StatusOr<FoundAwsCredentials> none = FindAwsCredentials({});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(
      absl::StrContains(none.status().message(), "instance metadata: instance metadata http"))
      << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(), "environment: ")) << none.status();
}

TEST_F(AwsSourcesTest, ProviderRefreshesBeforeExpiry) {
  CredentialsEndpoint endpoint(absl::Seconds(2), "");
  env_.Set("AWS_CONTAINER_CREDENTIALS_FULL_URI", endpoint.url());
  absl::StatusOr<std::shared_ptr<AwsCredentialsProvider>> provider =
      AwsCredentialsProvider::FromChain({}, {});
  ASSERT_TRUE(provider.ok()) << provider.status();
  // Two-second credentials are refreshed halfway, ten minutes of
  // refresh_ahead notwithstanding.
  ASSERT_TRUE(WaitFor([&] { return (*provider)->refreshes() >= 2; }, absl::Seconds(20)))
      << "refreshes: " << (*provider)->refreshes();
  absl::StatusOr<AwsCredentials> now = (*provider)->Get();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_NE(now->access_key_id, CredentialsEndpoint::AccessKey(1));
  EXPECT_GT(now->expiration, absl::Now());
}

TEST_F(AwsSourcesTest, ARefreshInFlightNeverHoldsUpARequest) {
  // Refreshed at 3 s, expiring at 6 s: the request below comes in between.
  CredentialsEndpoint endpoint(absl::Seconds(6), "");
  env_.Set("AWS_CONTAINER_CREDENTIALS_FULL_URI", endpoint.url());
  AwsCredentialChainOptions chain;
  chain.http_timeout = absl::Seconds(30);  // the held refresh waits
  absl::StatusOr<std::shared_ptr<AwsCredentialsProvider>> provider =
      AwsCredentialsProvider::FromChain(chain, {});
  ASSERT_TRUE(provider.ok()) << provider.status();
  endpoint.Hold();
  ASSERT_TRUE(WaitFor([&] { return endpoint.held() == 1; }, absl::Seconds(10)))
      << "no refresh started";
  // The refresh hangs; requests go on with the current credentials.
  auto get = std::async(std::launch::async, [&] { return (*provider)->Get(); });
  const bool answered = get.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  endpoint.Release();
  ASSERT_TRUE(answered) << "Get() waited for the refresh";
  absl::StatusOr<AwsCredentials> during = get.get();
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_EQ(during->access_key_id, CredentialsEndpoint::AccessKey(1));
  ASSERT_TRUE(WaitFor([&] { return (*provider)->refreshes() >= 1; }, absl::Seconds(10)));
  EXPECT_EQ((*provider)->Get().value_or(AwsCredentials{}).access_key_id,
            CredentialsEndpoint::AccessKey(2));
}

TEST_F(AwsSourcesTest, ExpiredAndUnrefreshableCredentialsFailNamingTheSource) {
  CredentialsEndpoint endpoint(absl::Seconds(1), "");
  env_.Set("AWS_CONTAINER_CREDENTIALS_FULL_URI", endpoint.url());
  AwsCredentialsProvider::Options options;
  options.retry_interval = absl::Milliseconds(100);
  absl::StatusOr<std::shared_ptr<AwsCredentialsProvider>> provider =
      AwsCredentialsProvider::FromChain({}, options);
  ASSERT_TRUE(provider.ok()) << provider.status();
  endpoint.SetFailing(true);
  absl::StatusOr<AwsCredentials> first = (*provider)->Get();
  ASSERT_TRUE(first.ok());
  absl::SleepFor(first->expiration - absl::Now() + absl::Milliseconds(50));
  absl::StatusOr<AwsCredentials> expired = (*provider)->Get();
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kUnavailable);
  const std::string m(expired.status().message());
  EXPECT_TRUE(absl::StrContains(m, "container endpoint " + endpoint.url())) << m;
  EXPECT_TRUE(absl::StrContains(m, "expired at")) << m;
  EXPECT_TRUE(absl::StrContains(m, "HTTP 500")) << m;
  // The agent is back: the next request fetches for itself.
  endpoint.SetFailing(false);
  absl::StatusOr<AwsCredentials> back = (*provider)->Get();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_GT(back->expiration, absl::Now());
}

}  // namespace
}  // namespace psrt
