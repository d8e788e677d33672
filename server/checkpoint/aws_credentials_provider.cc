// AwsCredentialsProvider: current credentials for every request, refreshed
// by a thread of its own ahead of their expiry.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/checkpoint/aws_credentials.h"

namespace psrt {
namespace {

std::string FormatExpiry(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

}  // namespace

AwsCredentialsProvider::AwsCredentialsProvider(AwsCredentials fixed) : options_{} {
  current_ = std::move(fixed);
  next_refresh_ = absl::InfiniteFuture();
}

AwsCredentialsProvider::AwsCredentialsProvider(std::unique_ptr<AwsCredentialSource> source,
                                               AwsCredentials first, Options options)
    : source_(std::move(source)), options_(options) {
  absl::MutexLock lock(&mu_);
  current_ = std::move(first);
  next_refresh_ = NextRefresh(absl::Now());
  if (current_.expiration != absl::InfiniteFuture()) {
    refresher_ = std::thread([this] { RefreshLoop(); });
  }
}

AwsCredentialsProvider::~AwsCredentialsProvider() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (refresher_.joinable()) refresher_.join();
}

absl::StatusOr<std::shared_ptr<AwsCredentialsProvider>> AwsCredentialsProvider::FromChain(
    const AwsCredentialChainOptions& chain, Options options) {
  absl::StatusOr<FoundAwsCredentials> found = FindAwsCredentials(chain);
  if (!found.ok()) return found.status();
  if (found->credentials.expiration <= absl::Now()) {
    return absl::FailedPreconditionError(absl::StrCat(found->source->Name(),
                                                      " gave credentials that expired at ",
                                                      FormatExpiry(found->credentials.expiration)));
  }
  if (found->credentials.expiration != absl::InfiniteFuture()) {
    LogInfo("AWS credentials from ", found->source->Name(), ", valid until ",
            FormatExpiry(found->credentials.expiration));
  }
  return std::make_shared<AwsCredentialsProvider>(std::move(found->source),
                                                  std::move(found->credentials), options);
}

absl::Time AwsCredentialsProvider::NextRefresh(absl::Time now) const {
  const absl::Time expiry = current_.expiration;
  if (expiry == absl::InfiniteFuture()) return expiry;
  // Halfway through a short life, else refresh_ahead before the end.
  return std::max(now + (expiry - now) / 2, expiry - options_.refresh_ahead);
}

absl::StatusOr<AwsCredentials> AwsCredentialsProvider::Get() const {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Now() < current_.expiration) return current_;
  }
  // Expired (the refreshes failed, or the machine slept): fetch now.
  absl::Status status = Refresh(/*expired_only=*/true);
  absl::MutexLock lock(&mu_);
  if (absl::Now() < current_.expiration) return current_;
  return absl::UnavailableError(
      absl::StrCat("AWS credentials from ", source_name(), " expired at ",
                   FormatExpiry(current_.expiration), " and refreshing them failed: ",
                   status.ok() ? "the new ones were expired too" : status.message()));
}

absl::Status AwsCredentialsProvider::Refresh(bool expired_only) const {
  if (source_ == nullptr) return absl::OkStatus();
  absl::MutexLock fetch(&fetch_mu_);
  {
    // Another thread may have refreshed while this one waited.
    absl::MutexLock lock(&mu_);
    const absl::Time due = expired_only ? current_.expiration : next_refresh_;
    if (absl::Now() < due) return absl::OkStatus();
  }
  absl::StatusOr<AwsCredentials> fetched = source_->Fetch();
  const absl::Time now = absl::Now();
  if (fetched.ok() && fetched->expiration <= now) {
    fetched = absl::FailedPreconditionError(
        absl::StrCat("they expired at ", FormatExpiry(fetched->expiration)));
  }
  absl::MutexLock lock(&mu_);
  if (!fetched.ok()) {
    // Try again soon, but before the current ones run out.
    const absl::Duration left = current_.expiration - now;
    next_refresh_ =
        now + std::max(std::min(options_.retry_interval, left / 2), absl::Milliseconds(200));
    return absl::Status(fetched.status().code(),
                        absl::StrCat(source_->Name(), ": ", fetched.status().message()));
  }
  current_ = *std::move(fetched);
  next_refresh_ = NextRefresh(now);
  ++refreshes_;
  LogInfo("AWS credentials refreshed from ", source_->Name(), ", valid until ",
          FormatExpiry(current_.expiration));
  return absl::OkStatus();
}

void AwsCredentialsProvider::RefreshLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(&stop_), next_refresh_);
      if (stop_) return;
      if (absl::Now() < next_refresh_) continue;
    }
    absl::Status status = Refresh(/*expired_only=*/false);
    if (!status.ok()) {
      LogWarning(
          "refreshing AWS credentials failed (the current ones stay in "
          "use until they expire): ",
          status.message());
    }
  }
}

int64_t AwsCredentialsProvider::refreshes() const {
  absl::MutexLock lock(&mu_);
  return refreshes_;
}

std::string AwsCredentialsProvider::source_name() const {
  return source_ == nullptr ? "the options" : source_->Name();
}

}  // namespace psrt
