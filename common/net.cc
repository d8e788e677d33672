#include "common/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/backoff.h"
#include "common/logging.h"

namespace psrt {

absl::StatusOr<std::string> InterfaceAddress(absl::string_view name) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InternalError(absl::StrCat("cannot list network interfaces (getifaddrs)"));
  }
  std::set<std::string> names;
  bool exists = false;
  std::string address;
  for (struct ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_name == nullptr) continue;
    names.insert(i->ifa_name);
    if (name != i->ifa_name) continue;
    exists = true;
    if (address.empty() && i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET) {
      char text[INET_ADDRSTRLEN];
      const auto* in = reinterpret_cast<const struct sockaddr_in*>(i->ifa_addr);
      if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) address = text;
    }
  }
  freeifaddrs(list);
  if (!exists) {
    return absl::NotFoundError(absl::StrCat("no network interface '", name, "' on this host (it has ",
                                            absl::StrJoin(names, ", "), ")"));
  }
  if (address.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("network interface '", name, "' has no IPv4 address"));
  }
  return address;
}

std::string StripPort(absl::string_view address) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close != absl::string_view::npos) return std::string(address.substr(0, close + 1));
    return std::string(address);
  }
  const size_t colon = address.rfind(':');
  // More than one colon and no brackets: a bare IPv6 address.
  if (colon == absl::string_view::npos || address.find(':') != colon) return std::string(address);
  return std::string(address.substr(0, colon));
}

std::string HostOf(absl::string_view address) {
  const std::string host = StripPort(address);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

namespace {

// 0 when `host` resolves now, else getaddrinfo's error.
int Resolve(const std::string& host) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (result != nullptr) freeaddrinfo(result);
  return rc;
}

}  // namespace

absl::Status WaitForHostName(absl::string_view address, absl::Time deadline,
                             absl::string_view what) {
  const std::string host = HostOf(address);
  const absl::Time start = absl::Now();
  Backoff backoff(deadline);
  bool logged = false;
  while (true) {
    const int rc = Resolve(host);
    if (rc == 0) {
      if (logged) LogInfo("host name '", host, "' of ", what, " resolves now");
      return absl::OkStatus();
    }
    // Errors other than "not (yet) known" will not go away by waiting.
    if (rc != EAI_NONAME && rc != EAI_AGAIN && rc != EAI_FAIL && rc != EAI_NODATA) {
      return absl::InvalidArgumentError(absl::StrCat("host name '", host, "' of ", what,
                                                     " cannot be resolved: ", gai_strerror(rc)));
    }
    if (!logged) {
      LogInfo("host name '", host, "' of ", what, " does not resolve yet (", gai_strerror(rc),
              "); retrying for up to ",
              absl::FormatDuration(absl::Trunc(deadline - start, absl::Seconds(1))));
      logged = true;
    }
    if (!backoff.Wait()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "host name '", host, "' of ", what, " did not resolve within ",
          absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(100))), ": ",
          gai_strerror(rc)));
    }
  }
}

}  // namespace psrt
