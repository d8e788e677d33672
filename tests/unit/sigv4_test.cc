// SigV4 against the examples AWS publishes for S3 ("Examples: Signature
// Calculations in AWS Signature Version 4", header-based authentication), and
// the S3 client's credential and XML helpers.

#include "server/checkpoint/sigv4.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/checkpoint/s3_client.h"

namespace psrt {
namespace {

AwsCredentials ExampleCredentials() {
  return {"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
          ""};
}

absl::Time ExampleTime() {
  return absl::FromCivil(absl::CivilSecond(2013, 5, 24, 0, 0, 0),
                         absl::UTCTimeZone());
}

TEST(SigV4Test, HashesAndHmac) {
  EXPECT_EQ(Sha256Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // RFC 4231 test case 2.
  EXPECT_EQ(HexEncode(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(SigV4Test, UriEncoding) {
  EXPECT_EQ(S3UriEncode("a b/c~d_e.f-g", false), "a%20b/c~d_e.f-g");
  EXPECT_EQ(S3UriEncode("a b/c", true), "a%20b%2Fc");
  EXPECT_EQ(S3UriEncode("test$file.text", false), "test%24file.text");
  EXPECT_EQ(S3UriEncode("\xC3\xA9+=", false), "%C3%A9%2B%3D");
  EXPECT_EQ(CanonicalQueryString({{"prefix", "J"}, {"max-keys", "2"}}),
            "max-keys=2&prefix=J");
  EXPECT_EQ(CanonicalQueryString({{"uploads", ""}}), "uploads=");
}

// The "GET Object" example: a range GET of examplebucket/test.txt.
TEST(SigV4Test, AwsGetObjectExample) {
  SigV4Request request;
  request.method = "GET";
  request.host = "examplebucket.s3.amazonaws.com";
  request.path = "/test.txt";
  request.headers = {{"Range", "bytes=0-9"}};
  SigV4Signature sig =
      SignV4(request, ExampleCredentials(), "us-east-1", "s3", ExampleTime());
  EXPECT_EQ(sig.canonical_request,
            "GET\n"
            "/test.txt\n"
            "\n"
            "host:examplebucket.s3.amazonaws.com\n"
            "range:bytes=0-9\n"
            "x-amz-content-sha256:"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n"
            "\n"
            "host;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sig.string_to_sign,
            "AWS4-HMAC-SHA256\n"
            "20130524T000000Z\n"
            "20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(sig.signature,
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(
      sig.authorization,
      "AWS4-HMAC-SHA256 "
      "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
      "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
      "Signature="
      "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

// The "GET Bucket (List Objects)" example: ?max-keys=2&prefix=J.
TEST(SigV4Test, AwsListObjectsExample) {
  SigV4Request request;
  request.method = "GET";
  request.host = "examplebucket.s3.amazonaws.com";
  request.path = "/";
  request.query = {{"prefix", "J"}, {"max-keys", "2"}};
  SigV4Signature sig =
      SignV4(request, ExampleCredentials(), "us-east-1", "s3", ExampleTime());
  EXPECT_EQ(sig.signature,
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

// The "PUT Object" example: test$file.text with a body and extra headers.
TEST(SigV4Test, AwsPutObjectExample) {
  SigV4Request request;
  request.method = "PUT";
  request.host = "examplebucket.s3.amazonaws.com";
  request.path = "/test$file.text";
  request.headers = {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                     {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
  request.payload_sha256 = Sha256Hex("Welcome to Amazon S3.");
  EXPECT_EQ(request.payload_sha256,
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  SigV4Signature sig =
      SignV4(request, ExampleCredentials(), "us-east-1", "s3", ExampleTime());
  EXPECT_EQ(sig.signature,
            "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4Test, SessionTokenIsSigned) {
  AwsCredentials credentials = ExampleCredentials();
  credentials.session_token = "token123";
  SigV4Request request;
  request.method = "GET";
  request.host = "127.0.0.1:9000";
  request.path = "/bucket/a b";
  SigV4Signature sig =
      SignV4(request, credentials, "us-east-1", "s3", ExampleTime());
  EXPECT_TRUE(absl::StrContains(sig.canonical_request, "\n/bucket/a%20b\n"));
  EXPECT_TRUE(absl::StrContains(sig.canonical_request,
                                "x-amz-security-token:token123\n"));
  EXPECT_TRUE(absl::StrContains(sig.authorization,
                                "SignedHeaders=host;x-amz-content-sha256;x-amz-"
                                "date;x-amz-security-token,"));
  bool sent = false;
  for (const auto& [name, value] : sig.headers) {
    sent |= name == "x-amz-security-token" && value == "token123";
  }
  EXPECT_TRUE(sent);
}

TEST(S3HelpersTest, XmlTagText) {
  const std::string xml =
      "<Error><Code>NoSuchKey</Code><Message>a &amp; b &lt;c&gt; &#65;"
      "</Message></Error>";
  EXPECT_EQ(XmlTagText(xml, "Code").value_or(""), "NoSuchKey");
  EXPECT_EQ(XmlTagText(xml, "Message").value_or(""), "a & b <c> A");
  EXPECT_FALSE(XmlTagText(xml, "RequestId").has_value());
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(S3HelpersTest, CredentialsAndRegionFromFiles) {
  const std::string dir = ::testing::TempDir();
  const std::string credentials_file = dir + "/sigv4_test_credentials";
  const std::string config_file = dir + "/sigv4_test_config";
  std::ofstream(credentials_file)
      << "[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = "
         "DEFSECRET\n"
         "\n[ckpt]\naws_access_key_id=CKPTKEY\naws_secret_access_key="
         "CKPTSECRET\n"
         "aws_session_token=CKPTTOKEN\n";
  std::ofstream(config_file) << "[default]\nregion = eu-west-1\n"
                                "[profile ckpt]\nregion = ap-south-1\n";
  ScopedEnv a("AWS_ACCESS_KEY_ID", nullptr),
      b("AWS_SECRET_ACCESS_KEY", nullptr), c("AWS_SESSION_TOKEN", nullptr),
      d("AWS_REGION", nullptr), e("AWS_DEFAULT_REGION", nullptr),
      f("AWS_PROFILE", nullptr),
      g("AWS_SHARED_CREDENTIALS_FILE", credentials_file.c_str()),
      h("AWS_CONFIG_FILE", config_file.c_str()),
      // Nothing beyond the files: no web identity, container or EC2.
      i("AWS_WEB_IDENTITY_TOKEN_FILE", nullptr),
      j("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", nullptr),
      k("AWS_CONTAINER_CREDENTIALS_FULL_URI", nullptr),
      l("AWS_EC2_METADATA_DISABLED", "true");

  absl::StatusOr<AwsCredentials> def = ResolveAwsCredentials("");
  ASSERT_TRUE(def.ok()) << def.status();
  EXPECT_EQ(def->access_key_id, "DEFKEY");
  EXPECT_EQ(def->secret_access_key, "DEFSECRET");
  EXPECT_EQ(def->session_token, "");
  EXPECT_EQ(ResolveAwsRegion(""), "eu-west-1");

  {
    ScopedEnv profile("AWS_PROFILE", "ckpt");
    absl::StatusOr<AwsCredentials> ckpt = ResolveAwsCredentials("");
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_EQ(ckpt->access_key_id, "CKPTKEY");
    EXPECT_EQ(ckpt->session_token, "CKPTTOKEN");
    EXPECT_EQ(ResolveAwsRegion(""), "ap-south-1");
  }

  absl::StatusOr<AwsCredentials> missing = ResolveAwsCredentials("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "[nope]"))
      << missing.status();

  {
    ScopedEnv key("AWS_ACCESS_KEY_ID", "ENVKEY");
    ScopedEnv secret("AWS_SECRET_ACCESS_KEY", "ENVSECRET");
    ScopedEnv region("AWS_REGION", "us-west-2");
    absl::StatusOr<AwsCredentials> env = ResolveAwsCredentials("ckpt");
    ASSERT_TRUE(env.ok()) << env.status();
    EXPECT_EQ(env->access_key_id, "ENVKEY");
    EXPECT_EQ(ResolveAwsRegion("ckpt"), "us-west-2");
  }
  std::remove(credentials_file.c_str());
  std::remove(config_file.c_str());
}

TEST(S3HelpersTest, OptionsAreChecked) {
  S3ClientOptions options;
  options.region = "us-east-1";
  options.credentials = ExampleCredentials();
  options.part_size = 1 << 20;
  EXPECT_EQ(S3Client::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.allow_small_parts_for_testing = true;
  EXPECT_TRUE(S3Client::Create(options).ok());
  options.endpoint = "ftp://x";
  EXPECT_EQ(S3Client::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.endpoint = "";
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->endpoint(), "https://s3.us-east-1.amazonaws.com");
}

}  // namespace
}  // namespace psrt
