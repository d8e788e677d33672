#include "server/checkpoint/storage.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace psrt {
namespace {

constexpr char kAcceptedForms[] = "accepted forms: file:///absolute/path, s3://bucket/prefix";

}  // namespace

absl::Status ValidateObjectPath(absl::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError("object path is empty");
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("object path '", absl::CEscape(path), "' contains a NUL byte"));
  }
  if (path.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("object path '", path, "' is absolute; paths are relative to the root"));
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty() || part == "." || part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("object path '", path,
                       "' has an empty, '.' or '..' component; it must stay under the root"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(absl::string_view uri) {
  if (absl::StartsWith(uri, "file://")) {
    absl::string_view path = uri.substr(7);
    // file://host/path names another machine; only the local form is meant.
    if (path.empty() || path.front() != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint URI '", uri,
                       "': a file URI needs an absolute path (three slashes); ", kAcceptedForms));
    }
    for (absl::string_view part : absl::StrSplit(path.substr(1), '/')) {
      if (part == "." || part == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint URI '", uri, "': '.' and '..' are not allowed in the path; ",
                         kAcceptedForms));
      }
    }
    if (path.find('\0') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint URI '", absl::CEscape(uri), "' contains a NUL byte"));
    }
    // Drop trailing slashes so joined paths have no doubled '/'.
    std::string root(path);
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    return NewPosixStorage(std::move(root));
  }
  if (absl::StartsWith(uri, "s3://")) return OpenS3Storage(uri);
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint URI '", uri, "' is not supported; ", kAcceptedForms));
}

}  // namespace psrt
