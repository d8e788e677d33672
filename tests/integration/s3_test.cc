// The S3 client against a real S3-protocol server on loopback: moto's
// standalone server (`scripts/setup.sh s3` installs it into .venv; `make test`
// does that). Without it every test here reports itself skipped.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/process.h"
#include "gtest/gtest.h"
#include "server/checkpoint/s3_client.h"
#include "server/checkpoint/storage.h"
#include "tests/integration/moto_server.h"

namespace psrt {
namespace {

S3ClientOptions TestOptions(const std::string& endpoint) {
  S3ClientOptions options;
  options.endpoint = endpoint;
  options.region = "us-east-1";
  options.credentials = AwsCredentials{"testing", "testing", ""};
  options.request_timeout = absl::Seconds(30);
  options.retry_deadline = absl::Seconds(60);
  return options;
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string data(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j)
      data[i + j] = static_cast<char>(v >> (8 * j));
  }
  return data;
}

TEST(S3ClientOptionsTest, BadOptionsAreRefusedNamingThem) {
  auto refused = [](void (*change)(S3ClientOptions*), const std::string& why) {
    S3ClientOptions options = TestOptions("http://127.0.0.1:1");
    change(&options);
    absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
    ASSERT_FALSE(client.ok()) << why;
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(client.status().message(), why)) << client.status();
  };
  refused([](S3ClientOptions* o) { o->part_size = 1 << 20; }, "below S3's minimum");
  refused([](S3ClientOptions* o) { o->parallel_parts = 0; }, "parallel_parts 0 is not in 1..64");
  refused([](S3ClientOptions* o) { o->list_page_size = 1001; }, "list_page_size 1001");
  EXPECT_TRUE(S3Client::Create(TestOptions("http://127.0.0.1:1")).ok());
}

class S3Test : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = moto_.Start();
    if (!why.empty()) GTEST_SKIP() << why;
    S3ClientOptions options = TestOptions(moto_.endpoint());
    options.part_size = kS3MinPartSize;
    options.list_page_size = 2;  // exercise continuation tokens
    absl::StatusOr<std::unique_ptr<S3Client>> client =
        S3Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    ASSERT_TRUE(client_->CreateBucket(kBucket).ok());
  }

  static constexpr char kBucket[] = "psrt-ckpt";
  MotoServer moto_;
  std::unique_ptr<S3Client> client_;
};

TEST_F(S3Test, PutGetHeadDeleteSmallObject) {
  const std::string key = "ckpt/step-1/dir name/shard+0=é";
  const std::string data = "hello, checkpoint";
  ASSERT_TRUE(client_->Put(kBucket, key, data).ok());
  absl::StatusOr<std::string> got = client_->GetObject(kBucket, key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, data);

  absl::StatusOr<S3ObjectInfo> head = client_->HeadObject(kBucket, key);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, data.size());
  EXPECT_FALSE(head->etag.empty());

  ASSERT_TRUE(client_->PutObject(kBucket, "empty", "").ok());
  got = client_->GetObject(kBucket, "empty");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");

  ASSERT_TRUE(client_->DeleteObject(kBucket, key).ok());
  got = client_->GetObject(kBucket, key);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  head = client_->HeadObject(kBucket, key);
  EXPECT_EQ(head.status().code(), absl::StatusCode::kNotFound) << head.status();
  // Deleting what is not there is fine, as in S3.
  EXPECT_TRUE(client_->DeleteObject(kBucket, key).ok());
}

TEST_F(S3Test, MissingKeyIsNotFoundNamingIt) {
  absl::StatusOr<std::string> got = client_->GetObject(kBucket, "no/such/key");
  ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  const std::string message(got.status().message());
  EXPECT_TRUE(absl::StrContains(message, "s3://psrt-ckpt/no/such/key"))
      << message;
  EXPECT_TRUE(absl::StrContains(message, "HTTP 404")) << message;
  EXPECT_TRUE(absl::StrContains(message, "NoSuchKey")) << message;

  got = client_->GetObject("no-such-bucket", "k");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "NoSuchBucket"))
      << got.status();

  // Re-creating one's own bucket: 200 in us-east-1 (S3's legacy behaviour,
  // which moto copies), BucketAlreadyOwnedByYou elsewhere.
  const absl::Status again = client_->CreateBucket(kBucket);
  EXPECT_TRUE(again.ok() || again.code() == absl::StatusCode::kAlreadyExists)
      << again;
}

TEST_F(S3Test, MultipartPutAboveThePartSize) {
  const std::string data = RandomBytes(12 << 20, 42);  // parts 5, 5, 2 MiB
  ASSERT_TRUE(client_->Put(kBucket, "ckpt/big", data).ok());
  absl::StatusOr<S3ObjectInfo> head = client_->HeadObject(kBucket, "ckpt/big");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->size, data.size());
  // A multipart object's ETag ends in -<number of parts>.
  EXPECT_TRUE(absl::StrContains(head->etag, "-3")) << head->etag;
  absl::StatusOr<std::string> got = client_->GetObject(kBucket, "ckpt/big");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), data.size());
  EXPECT_TRUE(*got == data) << "12 MiB object came back different";
}

TEST_F(S3Test, PutIntoAMissingBucketFailsNamingIt) {
  const std::string big(kS3MinPartSize + 1, 'x');  // the multipart path
  absl::Status status = client_->Put("no-such-bucket", "ckpt/big", big);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_TRUE(
      absl::StrContains(status.message(), "s3://no-such-bucket/ckpt/big"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "NoSuchBucket")) << status;
  status = client_->Put("no-such-bucket", "small", "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
}

TEST_F(S3Test, MultipartStepsAndAbort) {
  absl::StatusOr<std::string> id =
      client_->CreateMultipartUpload(kBucket, "mp");
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::string> etag =
      client_->UploadPart(kBucket, "mp", *id, 1, "only part");
  ASSERT_TRUE(etag.ok()) << etag.status();
  ASSERT_TRUE(client_->AbortMultipartUpload(kBucket, "mp", *id).ok());
  // Completing an aborted upload fails, naming the key.
  absl::Status complete =
      client_->CompleteMultipartUpload(kBucket, "mp", *id, {{1, *etag}});
  EXPECT_FALSE(complete.ok());
  EXPECT_TRUE(absl::StrContains(complete.message(), "s3://psrt-ckpt/mp"))
      << complete;
  EXPECT_EQ(client_->GetObject(kBucket, "mp").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(S3Test, ListWithPrefixFollowsContinuation) {
  for (const char* key : {"ckpt/1/a", "ckpt/1/b", "ckpt/1/c", "ckpt/10/a",
                          "ckpt/2/a", "other/a"}) {
    ASSERT_TRUE(client_->Put(kBucket, key, key).ok()) << key;
  }
  absl::StatusOr<std::vector<S3ObjectInfo>> listed =
      client_->ListObjectsV2(kBucket, "ckpt/1");
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<std::string> keys;
  for (const S3ObjectInfo& info : *listed) {
    keys.push_back(info.key);
    EXPECT_EQ(info.size, info.key.size());
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"ckpt/1/a", "ckpt/1/b", "ckpt/1/c",
                                            "ckpt/10/a"}));
  listed = client_->ListObjectsV2(kBucket, "");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 6u);
  listed = client_->ListObjectsV2(kBucket, "nothing/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(client_->ListObjectsV2("no-such-bucket", "").status().code(),
            absl::StatusCode::kNotFound);
}

// moto checks signatures and access keys only with INITIAL_NO_AUTH_ACTION_COUNT
// set; then keys it never issued are refused.
TEST_F(S3Test, CheckpointStorageOnS3ByUri) {
  // As a job finds it: the URI, with the endpoint and credentials in the
  // standard AWS variables.
  setenv("AWS_ENDPOINT_URL", moto_.endpoint().c_str(), 1);
  setenv("AWS_ACCESS_KEY_ID", "testing", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "testing", 1);
  setenv("AWS_REGION", "us-east-1", 1);
  absl::StatusOr<std::unique_ptr<Storage>> storage = OpenStorage("s3://psrt-ckpt/jobs/x");
  unsetenv("AWS_ENDPOINT_URL");
  ASSERT_TRUE(storage.ok()) << storage.status();
  Storage& st = **storage;
  EXPECT_EQ(st.uri(), "s3://psrt-ckpt/jobs/x");
  ASSERT_TRUE(st.Put("step-10/shard-0", "weights").ok());
  ASSERT_TRUE(st.Put("step-10/MANIFEST", "manifest").ok());
  ASSERT_TRUE(st.Put("LATEST", "step-10").ok());
  auto got = st.Get("step-10/shard-0");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "weights");
  auto listed = st.List("step-10/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(*listed, (std::vector<std::string>{"step-10/MANIFEST", "step-10/shard-0"}));
  // The prefix keeps jobs apart: the bucket holds "jobs/x/...".
  auto raw = client_->ListObjectsV2(kBucket, "jobs/x/");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->size(), 3u);
  EXPECT_TRUE(st.Exists("LATEST").value_or(false));
  ASSERT_TRUE(st.Delete("LATEST").ok());
  EXPECT_FALSE(st.Exists("LATEST").value_or(true));
  EXPECT_TRUE(st.Delete("LATEST").ok());  // deleting a missing object is fine
  EXPECT_EQ(st.Get("LATEST").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.Put("../escape", "x").code(), absl::StatusCode::kInvalidArgument);

  // Uploads a writer that died left (one with a part), under this prefix and
  // another job's: only this prefix's are aborted.
  absl::StatusOr<std::string> dead = client_->CreateMultipartUpload(kBucket, "jobs/x/step-20/shard-0");
  ASSERT_TRUE(dead.ok()) << dead.status();
  ASSERT_TRUE(client_->UploadPart(kBucket, "jobs/x/step-20/shard-0", *dead, 1, "part").ok());
  ASSERT_TRUE(client_->CreateMultipartUpload(kBucket, "jobs/x/step-20/shard-1").ok());
  ASSERT_TRUE(client_->CreateMultipartUpload(kBucket, "jobs/y/step-20/shard-0").ok());
  // Three uploads, pages of two.
  absl::StatusOr<std::vector<S3Client::Upload>> open = client_->ListMultipartUploads(kBucket, "jobs/");
  ASSERT_TRUE(open.ok()) << open.status();
  ASSERT_EQ(open->size(), 3u);
  EXPECT_EQ((*open)[0].key, "jobs/x/step-20/shard-0");
  EXPECT_EQ((*open)[0].upload_id, *dead);
  ASSERT_TRUE(st.RemoveUnfinished("").ok());
  open = client_->ListMultipartUploads(kBucket, "jobs/");
  ASSERT_TRUE(open.ok()) << open.status();
  ASSERT_EQ(open->size(), 1u);
  EXPECT_EQ((*open)[0].key, "jobs/y/step-20/shard-0");
  EXPECT_EQ(st.List("step-20/").value_or(std::vector<std::string>{"?"}), std::vector<std::string>{});
}

TEST(S3AuthTest, BadCredentialsAreRefused) {
  MotoServer moto;
  const std::string why = moto.Start({{"INITIAL_NO_AUTH_ACTION_COUNT", "0"}});
  if (!why.empty()) GTEST_SKIP() << why;
  S3ClientOptions options = TestOptions(moto.endpoint());
  options.credentials =
      AwsCredentials{"AKIANOTAKEY00000000", "not-the-secret", ""};
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status status = (*client)->CreateBucket("psrt-auth");
  if (status.ok()) GTEST_SKIP() << "this moto does not enforce credentials";
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "HTTP 403")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "s3://psrt-auth")) << status;
}

TEST(S3DeadEndpointTest, FailsWithinTheRetryDeadline) {
  const std::string endpoint = absl::StrCat("http://127.0.0.1:", FreePort());
  S3ClientOptions options = TestOptions(endpoint);
  options.max_attempts = 100;
  options.retry_deadline = absl::Seconds(2);
  options.initial_backoff = absl::Milliseconds(50);
  options.max_backoff = absl::Milliseconds(400);
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = (*client)->GetObject("bucket", "key");
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(got.status().code(), absl::StatusCode::kUnavailable)
      << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), endpoint))
      << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "s3://bucket/key"))
      << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "attempts"))
      << got.status();
  EXPECT_LT(took, absl::Seconds(4)) << got.status();

  // A bounded attempt count ends it sooner.
  options.max_attempts = 2;
  options.retry_deadline = absl::Seconds(60);
  client = S3Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::Time start2 = absl::Now();
  EXPECT_EQ((*client)->PutObject("bucket", "key", "x").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start2, absl::Seconds(5));
}

}  // namespace
}  // namespace psrt
