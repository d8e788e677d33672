// Hosts for multi-host tests: network namespaces joined by a bridge in a
// namespace of its own, on 10.213.0.0/24, an address range that exists only
// inside them, so no test traffic reaches any other address. Processes run
// in host h through the prefix Exec(h) ("ip netns exec NAME ").
//
//   absl::StatusOr<std::unique_ptr<NetnsHosts>> hosts = NetnsHosts::Create(3);
//   if (!hosts.ok()) GTEST_SKIP() << hosts.status().message();  // not root
//   Proc p = Proc::Start((*hosts)->Exec(0) + "psrt-run ...", log);
//   (*hosts)->Cut(2);  // host 2's cable out
#ifndef PSRT_TESTS_MULTIHOST_NETNS_HOSTS_H_
#define PSRT_TESTS_MULTIHOST_NETNS_HOSTS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace psrt {

class NetnsHosts {
 public:
  // UNAVAILABLE (with why) where namespaces cannot be made: not root, or
  // no `ip` (iproute2).
  static absl::StatusOr<std::unique_ptr<NetnsHosts>> Create(int num_hosts);
  // Deletes the namespaces; their processes should be gone by then.
  ~NetnsHosts();

  int size() const { return num_hosts_; }
  std::string address(int host) const;  // "10.213.0.1" for host 0
  std::string Exec(int host) const;     // command prefix that runs in it
  // Takes host's link to the bridge down (a cut cable) or up again.
  absl::Status Cut(int host);
  absl::Status Restore(int host);
  // Shapes what every host sends: `delay` ("2ms") and `rate` ("1gbit")
  // with tc's netem; where the kernel has no netem, the rate alone with tbf.
  // Says which was applied.
  absl::StatusOr<std::string> Shape(const std::string& delay, const std::string& rate);
  // Limits what every host sends to `rate` with tc's tbf, a bucket of
  // `burst` and a queue long enough that nothing is dropped (a rate, no
  // loss: what a scaling model can take as a link). Returns the qdisc.
  absl::StatusOr<std::string> LimitRate(const std::string& rate, const std::string& burst);
  // Makes `names` (name -> address) what every host's /etc/hosts says, as a
  // cluster's DNS would; other names resolve nowhere (no name server is
  // reachable from the hosts). `ip netns exec` binds these files over
  // /etc/hosts and /etc/resolv.conf; they are rewritten in place, so
  // processes already running see a later call.
  absl::Status SetHostNames(const std::map<std::string, std::string>& names);

 private:
  NetnsHosts(std::string prefix, int num_hosts)
      : prefix_(std::move(prefix)), num_hosts_(num_hosts) {}
  std::string Namespace(int host) const;  // host -1: the bridge's

  const std::string prefix_;
  int num_hosts_;
};

}  // namespace psrt

#endif  // PSRT_TESTS_MULTIHOST_NETNS_HOSTS_H_
