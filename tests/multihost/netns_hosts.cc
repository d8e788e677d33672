#include "tests/multihost/netns_hosts.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"

namespace psrt {
namespace {

absl::Status Sh(const std::string& cmd) {
  const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  if (rc == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("'", cmd, "' failed (status ", rc, ")"));
}

}  // namespace

std::string NetnsHosts::Namespace(int host) const {
  return host < 0 ? prefix_ + "br" : absl::StrCat(prefix_, "h", host);
}

std::string NetnsHosts::address(int host) const { return absl::StrCat("10.213.0.", host + 1); }

std::string NetnsHosts::Exec(int host) const { return "ip netns exec " + Namespace(host) + " "; }

absl::StatusOr<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(int num_hosts) {
  if (geteuid() != 0) {
    return absl::UnavailableError(
        "multi-host tests need root (CAP_NET_ADMIN) to make network namespaces");
  }
  if (!Sh("ip -V").ok()) return absl::UnavailableError("multi-host tests need `ip` (iproute2)");
  // Names of at most 15 bytes, unique to this process.
  std::unique_ptr<NetnsHosts> hosts(
      new NetnsHosts(absl::StrCat("p", getpid() % 1000000), num_hosts));
  const std::string br = hosts->Namespace(-1);
  const std::string in_br = "ip netns exec " + br + " ";
  absl::Status s = Sh("ip netns add " + br);
  if (s.ok()) s = Sh(in_br + "ip link add br0 type bridge");
  if (s.ok()) s = Sh(in_br + "ip link set br0 up");
  for (int h = 0; h < num_hosts && s.ok(); ++h) {
    const std::string ns = hosts->Namespace(h), in_host = hosts->Exec(h);
    const std::string bridge_end = absl::StrCat("b", h), host_end = absl::StrCat("eth", h);
    s = Sh("ip netns add " + ns);
    if (s.ok()) s = Sh(in_host + "ip link set lo up");
    if (s.ok())
      s = Sh(in_br + "ip link add " + bridge_end + " type veth peer name " + host_end + " netns " +
             ns);
    if (s.ok()) s = Sh(in_br + "ip link set " + bridge_end + " master br0");
    if (s.ok()) s = Sh(in_br + "ip link set " + bridge_end + " up");
    if (s.ok()) s = Sh(in_host + "ip addr add " + hosts->address(h) + "/24 dev " + host_end);
    if (s.ok()) s = Sh(in_host + "ip link set " + host_end + " up");
  }
  if (!s.ok())
    return absl::UnavailableError(absl::StrCat("cannot make network namespaces: ", s.message()));
  return hosts;
}

NetnsHosts::~NetnsHosts() {
  for (int h = -1; h < num_hosts_; ++h) {
    Sh("ip netns del " + Namespace(h)).IgnoreError();
    Sh("rm -rf /etc/netns/" + Namespace(h)).IgnoreError();
  }
}

absl::StatusOr<std::string> NetnsHosts::Shape(const std::string& delay, const std::string& rate) {
  const std::string netem = absl::StrCat("netem delay ", delay, " rate ", rate);
  const std::string tbf = absl::StrCat("tbf rate ", rate, " burst 256kb latency 50ms");
  const bool has_netem = Sh(absl::StrCat(Exec(0), "tc qdisc replace dev eth0 root ", netem)).ok();
  for (int h = 0; h < num_hosts_; ++h) {
    absl::Status s =
        Sh(absl::StrCat(Exec(h), "tc qdisc replace dev eth", h, " root ", has_netem ? netem : tbf));
    if (!s.ok()) return s;
  }
  return has_netem ? netem : tbf + " (this kernel has no netem: no added delay)";
}

absl::StatusOr<std::string> NetnsHosts::LimitRate(const std::string& rate,
                                                  const std::string& burst) {
  const std::string tbf = absl::StrCat("tbf rate ", rate, " burst ", burst, " latency 2s");
  for (int h = 0; h < num_hosts_; ++h) {
    absl::Status s = Sh(absl::StrCat(Exec(h), "tc qdisc replace dev eth", h, " root ", tbf));
    if (!s.ok()) return s;
  }
  return tbf;
}

absl::Status NetnsHosts::SetHostNames(const std::map<std::string, std::string>& names) {
  std::string hosts = "127.0.0.1 localhost\n";
  for (const auto& [name, address] : names) absl::StrAppend(&hosts, address, " ", name, "\n");
  for (int h = 0; h < num_hosts_; ++h) {
    const std::string dir = "/etc/netns/" + Namespace(h);
    if (absl::Status s = Sh("mkdir -p " + dir); !s.ok()) return s;
    // Truncated and rewritten, not replaced: the bind mounts of running
    // processes point at these inodes.
    std::ofstream(dir + "/hosts", std::ios::trunc) << hosts;
    std::ofstream(dir + "/resolv.conf", std::ios::trunc) << "# no name server on the test hosts\n";
    if (!std::ifstream(dir + "/hosts")) return absl::InternalError("cannot write " + dir + "/hosts");
  }
  return absl::OkStatus();
}

absl::Status NetnsHosts::Cut(int host) {
  return Sh(absl::StrCat(Exec(-1), "ip link set b", host, " down"));
}

absl::Status NetnsHosts::Restore(int host) {
  return Sh(absl::StrCat(Exec(-1), "ip link set b", host, " up"));
}

}  // namespace psrt
