// Host addresses as a cluster needs them: the address of a named network
// interface (what ps-lite's DMLC_INTERFACE picks), and waiting for a host
// name that does not resolve yet (SageMaker's and Kubernetes' hosts get their
// DNS names as they come up, not all at once).
#ifndef PSRT_COMMON_NET_H_
#define PSRT_COMMON_NET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace psrt {

// The IPv4 address of network interface `name` ("eth0" -> "10.0.0.5").
// NOT_FOUND naming the interfaces there are when it does not exist,
// FAILED_PRECONDITION when it has no IPv4 address.
absl::StatusOr<std::string> InterfaceAddress(absl::string_view name);

// "host:port" -> "host"; "[::1]:2222" -> "[::1]"; a bare IPv6 address or a
// name without a port is returned unchanged.
std::string StripPort(absl::string_view address);
// The host of "host:port", "[v6]:port" or a bare host, as getaddrinfo takes
// it: StripPort without the brackets.
std::string HostOf(absl::string_view address);

// Returns once the host of `address` resolves (at once for an IP address).
// While it does not, logs one line naming it and `what` ("the
// coordinator"), and retries until `deadline`; then DEADLINE_EXCEEDED naming
// the host, `what` and how long it waited.
absl::Status WaitForHostName(absl::string_view address, absl::Time deadline,
                             absl::string_view what);

}  // namespace psrt

#endif  // PSRT_COMMON_NET_H_
