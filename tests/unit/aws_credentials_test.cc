// The AWS credential chain without a network: what STS, the endpoints and
// credential_process answer, the shared files' profiles, the chain's order
// and its errors. The sources that need servers are tested against real ones
// in tests/integration/aws_credentials_test.cc.
#include "server/checkpoint/aws_credentials.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "gtest/gtest.h"
#include "tests/unit/aws_env.h"

namespace psrt {
namespace {

constexpr char kAssumeRoleXml[] =
    R"(<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <AssumedRoleUser>
      <AssumedRoleId>AROA3XFRBF535PLBIFPI4:s3-access-example</AssumedRoleId>
      <Arn>arn:aws:sts::123456789012:assumed-role/demo/psrt</Arn>
    </AssumedRoleUser>
    <Credentials>
      <AccessKeyId>ASIAJEXAMPLEXEG2JICEA</AccessKeyId>
      <SecretAccessKey>9drTJvcXLB89EXAMPLELB8923FB892xMFI</SecretAccessKey>
      <SessionToken>AQoXdzELDDY//////////wEaoAK1wvx&amp;more</SessionToken>
      <Expiration>2026-12-07T10:15:30Z</Expiration>
    </Credentials>
  </AssumeRoleResult>
</AssumeRoleResponse>)";

absl::Time Utc(int y, int mo, int d, int h, int mi, int s) {
  return absl::FromCivil(absl::CivilSecond(y, mo, d, h, mi, s), absl::UTCTimeZone());
}

TEST(AwsCredentialParsingTest, StsAnswersAndErrors) {
  absl::StatusOr<AwsCredentials> c = ParseStsCredentials(kAssumeRoleXml);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "ASIAJEXAMPLEXEG2JICEA");
  EXPECT_EQ(c->secret_access_key, "9drTJvcXLB89EXAMPLELB8923FB892xMFI");
  EXPECT_EQ(c->session_token, "AQoXdzELDDY//////////wEaoAK1wvx&more");
  EXPECT_EQ(c->expiration, Utc(2026, 12, 7, 10, 15, 30));

  absl::StatusOr<AwsCredentials> denied = ParseStsCredentials(
      "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>"
      "<Message>not authorized to perform sts:AssumeRole</Message></Error>"
      "</ErrorResponse>");
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(denied.status().message(), "AccessDenied: not authorized"))
      << denied.status();

  std::string no_token = kAssumeRoleXml;
  no_token.replace(no_token.find("<SessionToken>"),
                   no_token.find("</SessionToken>") + 15 - no_token.find("<SessionToken>"), "");
  EXPECT_EQ(ParseStsCredentials(no_token).status().code(), absl::StatusCode::kInvalidArgument);
  std::string bad_time = kAssumeRoleXml;
  bad_time.replace(bad_time.find("2026-12-07T10:15:30Z"), 20, "next tuesday");
  absl::StatusOr<AwsCredentials> t = ParseStsCredentials(bad_time);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(t.status().message(), "next tuesday")) << t.status();
  EXPECT_FALSE(ParseStsCredentials("<html>proxy login</html>").ok());
}

TEST(AwsCredentialParsingTest, EndpointJson) {
  // The container endpoint's answer.
  absl::StatusOr<AwsCredentials> c =
      ParseEndpointCredentials(R"({"AccessKeyId":"ASIAC","SecretAccessKey":"s","Token":"t",)"
                               R"("Expiration":"2026-12-07T08:00:00.500+01:00","RoleArn":"arn"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "ASIAC");
  EXPECT_EQ(c->session_token, "t");
  EXPECT_EQ(c->expiration, Utc(2026, 12, 7, 7, 0, 0) + absl::Milliseconds(500));
  // Instance metadata's, with its Code.
  c = ParseEndpointCredentials(
      R"({"Code":"Success","LastUpdated":"2026-12-07T06:00:00Z","Type":"AWS-HMAC",)"
      R"("AccessKeyId":"ASIAI","SecretAccessKey":"s","Token":"t","Expiration":"2026-12-07T12:00:00Z"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "ASIAI");

  absl::StatusOr<AwsCredentials> failed =
      ParseEndpointCredentials(R"({"Code":"AssumeRoleUnauthorizedAccess","Message":"role gone"})");
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(failed.status().message(), "role gone"));
  EXPECT_EQ(ParseEndpointCredentials("<html>").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<AwsCredentials> number =
      ParseEndpointCredentials(R"({"AccessKeyId":7,"SecretAccessKey":"s"})");
  EXPECT_TRUE(absl::StrContains(number.status().message(), "AccessKeyId")) << number.status();
  EXPECT_EQ(ParseEndpointCredentials(R"({"AccessKeyId":"A"})").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AwsCredentialParsingTest, CredentialProcessJson) {
  absl::StatusOr<AwsCredentials> c =
      ParseProcessCredentials(R"({"Version":1,"AccessKeyId":"AKIAP","SecretAccessKey":"s"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->session_token, "");
  EXPECT_EQ(c->expiration, absl::InfiniteFuture());  // long-lived keys
  c = ParseProcessCredentials(R"({"Version":1,"AccessKeyId":"ASIAP","SecretAccessKey":"s",)"
                              R"("SessionToken":"t","Expiration":"2026-12-07T09:00:00Z"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->session_token, "t");
  EXPECT_EQ(c->expiration, Utc(2026, 12, 7, 9, 0, 0));
  absl::StatusOr<AwsCredentials> v2 =
      ParseProcessCredentials(R"({"Version":2,"AccessKeyId":"A","SecretAccessKey":"s"})");
  EXPECT_TRUE(absl::StrContains(v2.status().message(), "Version")) << v2.status();
  EXPECT_FALSE(ParseProcessCredentials("").ok());
  EXPECT_FALSE(ParseProcessCredentials("[1]").ok());
}

TEST(AwsCredentialParsingTest, ContainerUrlRules) {
  AwsTestEnv env(::testing::TempDir());
  EXPECT_EQ(ContainerCredentialsUrl().status().code(), absl::StatusCode::kNotFound);
  env.Set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/abc");
  EXPECT_EQ(ContainerCredentialsUrl().value_or(""), "http://169.254.170.2/v2/credentials/abc");
  env.Set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "v2/credentials");
  EXPECT_EQ(ContainerCredentialsUrl().status().code(), absl::StatusCode::kInvalidArgument);
  env.Unset("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  for (const char* ok : {"http://127.0.0.1:8080/creds", "http://[::1]:9/x", "http://localhost/x",
                         "http://169.254.170.23/v1/credentials", "https://creds.example.com/x"}) {
    env.Set("AWS_CONTAINER_CREDENTIALS_FULL_URI", ok);
    EXPECT_EQ(ContainerCredentialsUrl().value_or(""), ok);
  }
  env.Set("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://creds.example.com/x");
  absl::StatusOr<std::string> refused = ContainerCredentialsUrl();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "'creds.example.com'"))
      << refused.status();
}

class AwsChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = env_.UseFilesIn("aws_chain_test");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }

  std::string dir_;
  AwsTestEnv env_{::testing::TempDir()};
};

TEST_F(AwsChainTest, NothingConfiguredNamesEverySourceAndWhy) {
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials({});
  ASSERT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  const std::string m(found.status().message());
  for (const char* part : {"environment: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY unset",
                           "web identity: AWS_WEB_IDENTITY_TOKEN_FILE unset",
                           "shared files: profile [default] of", "no such profile",
                           "container endpoint: AWS_CONTAINER_CREDENTIALS_RELATIVE_URI and "
                           "_FULL_URI are unset",
                           "instance metadata: AWS_EC2_METADATA_DISABLED=true"}) {
    EXPECT_TRUE(absl::StrContains(m, part)) << part << " not in: " << m;
  }
}

TEST_F(AwsChainTest, EnvironmentComesFirstAndMustBeWhole) {
  Write("credentials",
        "[default]\naws_access_key_id=FILEKEY\n"
        "aws_secret_access_key=FILESECRET\n");
  env_.Set("AWS_ACCESS_KEY_ID", "ENVKEY");
  env_.Set("AWS_SECRET_ACCESS_KEY", "ENVSECRET");
  env_.Set("AWS_SESSION_TOKEN", "ENVTOKEN");
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials({});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->credentials.access_key_id, "ENVKEY");
  EXPECT_EQ(found->credentials.session_token, "ENVTOKEN");
  EXPECT_TRUE(absl::StrContains(found->source->Name(), "environment"));

  env_.Unset("AWS_SECRET_ACCESS_KEY");  // half a key pair is a mistake
  found = FindAwsCredentials({});
  EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(found.status().message(), "AWS_SECRET_ACCESS_KEY must be set together"))
      << found.status();

  env_.Unset("AWS_ACCESS_KEY_ID");
  found = FindAwsCredentials({});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->credentials.access_key_id, "FILEKEY");
  EXPECT_TRUE(absl::StrContains(found->source->Name(), "profile [default]"));
}

TEST_F(AwsChainTest, ProfilesFromBothFiles) {
  Write("config",
        "[default]\nregion = eu-west-1\n"
        "[profile ckpt]\nregion = ap-south-1\ns3 =\n  max_concurrent_requests = 4\n"
        "[profile half]\naws_access_key_id = ONLYKEY\n");
  Write("credentials",
        "[ckpt]\naws_access_key_id = CKPTKEY\n"
        "aws_secret_access_key = CKPTSECRET\n");
  env_.Set("AWS_PROFILE", "ckpt");
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials({});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->credentials.access_key_id, "CKPTKEY");
  EXPECT_EQ(ResolveAwsRegion(""), "ap-south-1");
  EXPECT_EQ(ResolveAwsRegion("default"), "eu-west-1");
  EXPECT_EQ(ReadAwsProfile("ckpt").Get("max_concurrent_requests"), "");

  AwsCredentialChainOptions half;
  half.profile = "half";
  found = FindAwsCredentials(half);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(found.status().message(), "profile [half]")) << found.status();
}

TEST_F(AwsChainTest, CredentialProcessRunsWithADeadline) {
  Write("config",
        "[default]\ncredential_process = printf '%s' "
        "'{\"Version\": 1, \"AccessKeyId\": \"ASIAPROC\", \"SecretAccessKey\": "
        "\"s\", \"SessionToken\": \"t\", \"Expiration\": "
        "\"2099-01-01T00:00:00Z\"}'\n"
        "[profile broken]\ncredential_process = sh -c 'echo no SSO session >&2; "
        "exit 3'\n"
        "[profile slow]\ncredential_process = sleep 30\n"
        "[profile garbage]\ncredential_process = echo hello\n");
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials({});
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->credentials.access_key_id, "ASIAPROC");
  EXPECT_EQ(found->credentials.expiration, Utc(2099, 1, 1, 0, 0, 0));
  EXPECT_TRUE(absl::StrContains(found->source->Name(), "credential_process 'printf"));

  AwsCredentialChainOptions options;
  options.profile = "broken";
  found = FindAwsCredentials(options);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(found.status().message(), "exit code 3"));
  EXPECT_TRUE(absl::StrContains(found.status().message(), "no SSO session")) << found.status();

  options.profile = "slow";
  options.process_timeout = absl::Milliseconds(300);
  found = FindAwsCredentials(options);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(found.status().message(), "'sleep 30'")) << found.status();

  options.profile = "garbage";
  found = FindAwsCredentials(options);
  EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(found.status().message(), "hello")) << found.status();
}

TEST_F(AwsChainTest, RoleProfilesMustNameASourceWithoutLoops) {
  Write("config",
        "[profile a]\nrole_arn = arn:aws:iam::123456789012:role/a\n"
        "source_profile = b\n"
        "[profile b]\nrole_arn = arn:aws:iam::123456789012:role/b\n"
        "source_profile = a\n"
        "[profile orphan]\nrole_arn = arn:aws:iam::123456789012:role/o\n"
        "[profile odd]\nrole_arn = arn:aws:iam::123456789012:role/o\n"
        "credential_source = Floppy\n"
        "[profile missing]\nrole_arn = arn:aws:iam::123456789012:role/m\n"
        "source_profile = nowhere\n");
  AwsCredentialChainOptions options;
  for (const auto& [profile, why] :
       {std::pair<const char*, const char*>{"a", "its own source_profile"},
        {"orphan", "no source_profile or credential_source"},
        {"odd", "credential_source 'Floppy'"},
        {"missing", "profile [nowhere]"}}) {
    options.profile = profile;
    absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials(options);
    EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument) << profile;
    EXPECT_TRUE(absl::StrContains(found.status().message(), why))
        << profile << ": " << found.status();
  }
}

TEST_F(AwsChainTest, ConfiguredButBrokenSourcesStopTheSearchNamingThemselves) {
  // A static key further down must not hide a broken web identity setup.
  Write("credentials", "[default]\naws_access_key_id=K\naws_secret_access_key=S\n");
  env_.Set("AWS_WEB_IDENTITY_TOKEN_FILE", dir_ + "/token");
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials({});
  EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(found.status().message(), "AWS_ROLE_ARN is not")) << found.status();
  env_.Set("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/psrt");
  found = FindAwsCredentials({});
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(found.status().message(),
                                "cannot read AWS_WEB_IDENTITY_TOKEN_FILE " + dir_ + "/token"))
      << found.status();
  EXPECT_TRUE(absl::StrContains(found.status().message(), "web identity (role ")) << found.status();

  env_.Unset("AWS_WEB_IDENTITY_TOKEN_FILE");
  std::filesystem::remove(dir_ + "/credentials");
  env_.Set("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://10.0.0.8/creds");
  found = FindAwsCredentials({});
  EXPECT_EQ(found.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(found.status().message(),
                                "container endpoint: AWS_CONTAINER_CREDENTIALS_FULL_URI"))
      << found.status();
}

TEST(AwsCredentialsProviderTest, FixedCredentialsNeverRefresh) {
  AwsCredentialsProvider provider(AwsCredentials{"AKIAFIXED", "s", ""});
  absl::StatusOr<AwsCredentials> got = provider.Get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->access_key_id, "AKIAFIXED");
  EXPECT_EQ(provider.refreshes(), 0);
}

}  // namespace
}  // namespace psrt
