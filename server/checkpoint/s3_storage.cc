// Checkpoint storage on S3 or an S3-compatible store: s3://bucket/prefix.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/daemon.h"
#include "server/checkpoint/s3_client.h"
#include "server/checkpoint/storage.h"

namespace psrt {
namespace {

// S3 makes a PUT visible whole or not at all (multipart included), which is
// the atomicity Storage promises.
class S3Storage final : public Storage {
 public:
  S3Storage(std::unique_ptr<S3Client> client, std::string bucket, std::string prefix, std::string uri)
      : client_(std::move(client)), bucket_(std::move(bucket)), prefix_(std::move(prefix)), uri_(std::move(uri)) {}

  absl::Status Put(absl::string_view path, absl::string_view data) override {
    if (absl::Status s = ValidateObjectPath(path); !s.ok()) return s;
    return client_->Put(bucket_, Key(path), data);
  }
  absl::StatusOr<std::string> Get(absl::string_view path) override {
    if (absl::Status s = ValidateObjectPath(path); !s.ok()) return s;
    return client_->GetObject(bucket_, Key(path));
  }
  absl::StatusOr<std::vector<std::string>> List(absl::string_view prefix) override {
    absl::StatusOr<std::vector<S3ObjectInfo>> objects = client_->ListObjectsV2(bucket_, Key(prefix));
    if (!objects.ok()) return objects.status();
    std::vector<std::string> out;
    for (const S3ObjectInfo& o : *objects) out.emplace_back(absl::StripPrefix(o.key, prefix_));
    std::sort(out.begin(), out.end());
    return out;
  }
  absl::Status Delete(absl::string_view path) override {
    if (absl::Status s = ValidateObjectPath(path); !s.ok()) return s;
    return client_->DeleteObject(bucket_, Key(path));
  }
  absl::StatusOr<bool> Exists(absl::string_view path) override {
    if (absl::Status s = ValidateObjectPath(path); !s.ok()) return s;
    absl::StatusOr<S3ObjectInfo> info = client_->HeadObject(bucket_, Key(path));
    if (info.ok()) return true;
    if (absl::IsNotFound(info.status())) return false;
    return info.status();
  }
  absl::Status RemoveUnfinished(absl::string_view prefix) override {
    absl::StatusOr<std::vector<S3Client::Upload>> uploads = client_->ListMultipartUploads(bucket_, Key(prefix));
    if (!uploads.ok()) return uploads.status();
    for (const S3Client::Upload& u : *uploads) {
      if (absl::Status s = client_->AbortMultipartUpload(bucket_, u.key, u.upload_id); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::string uri() const override { return uri_; }

 private:
  std::string Key(absl::string_view path) const { return absl::StrCat(prefix_, path); }

  std::unique_ptr<S3Client> client_;
  const std::string bucket_;
  const std::string prefix_;  // "" or ending in '/'
  const std::string uri_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Storage>> OpenS3Storage(absl::string_view uri) {
  absl::string_view rest = uri;
  if (!absl::ConsumePrefix(&rest, "s3://")) {
    return absl::InvalidArgumentError(absl::StrCat("'", uri, "' is not an s3:// URI"));
  }
  const size_t slash = rest.find('/');
  const std::string bucket(rest.substr(0, slash));
  std::string prefix(slash == absl::string_view::npos ? "" : rest.substr(slash + 1));
  if (bucket.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint URI '", uri, "' names no bucket"));
  }
  if (!prefix.empty() && prefix.back() != '/') prefix.push_back('/');
  S3ClientOptions options;
  // The AWS SDKs' names for an S3-compatible endpoint.
  options.endpoint = EnvOr("AWS_ENDPOINT_URL_S3", EnvOr("AWS_ENDPOINT_URL", ""));
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  if (!client.ok()) return client.status();
  return std::unique_ptr<Storage>(
      new S3Storage(std::move(*client), bucket, std::move(prefix), std::string(uri)));
}

}  // namespace psrt
