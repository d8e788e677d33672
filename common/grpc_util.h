#ifndef PSRT_COMMON_GRPC_UTIL_H_
#define PSRT_COMMON_GRPC_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"

namespace psrt {

// Largest gRPC message either end accepts. A push or pull carries at most a
// few keys of partition_bytes per server and call, so 256 MiB leaves room
// for any batching the client does plus framing.
inline constexpr int64_t kDefaultMaxMessageBytes = 256ll << 20;

// Metadata key of the per-job token checked on every RPC.
inline constexpr char kTokenMetadata[] = "x-psrt-job-token";

// Loads this process's transport security from the environment once
// (LoadTlsConfig in common/tls.h) and returns how that went; every later
// MakeChannel and StartServer then speaks mutual TLS if it is configured.
// Daemons call it at start (InitProcess), the client in Connect.
absl::Status InitTransportSecurity();
// Whether this process's channels and servers use mutual TLS.
bool TlsEnabled();
// This process's TLS settings, as InitTransportSecurity loaded them, for the
// process's other servers (its /metrics) to present the same certificate.
absl::StatusOr<TlsConfig> TransportSecurity();
// Appended to "cannot connect" errors under TLS: a failed handshake shows
// only as a connection that never comes up.
inline constexpr char kTlsHint[] =
    " (with mutual TLS: a peer's certificate must be signed by PSRT_TLS_CA and name the address "
    "it is reached at, or PSRT_TLS_SERVER_NAME)";

// A channel to `address`, with mutual TLS when configured (a TLS
// configuration that failed to load gives a channel that cannot connect,
// never a plaintext one).
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address,
    int64_t max_message_bytes = kDefaultMaxMessageBytes);

// The same for calls that carry no tensors (checkpoint rounds, a server's
// Stats): without the tensor path's large read buffers and connection of its
// own, so that a coordinator holding one per server stays small.
std::shared_ptr<grpc::Channel> MakeControlChannel(const std::string& address);

// Applies message limits and thread limits shared by every psrt service.
void ConfigureServerBuilder(grpc::ServerBuilder* builder,
                            int64_t max_message_bytes = kDefaultMaxMessageBytes);

// A started gRPC server and the port it got.
struct ServingServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
// Serves `service` on bind:port (0 picks a free port) with the limits of
// ConfigureServerBuilder; UNAVAILABLE naming the address when it cannot.
// Every call's token is checked before anything about the request is
// answered, and every error text is cut to kMaxErrorBytes.
absl::StatusOr<ServingServer> StartServer(const std::string& bind, int port, grpc::Service* service,
                                          const std::string& token);

// Longest error text a psrt service sends: gRPC drops a call whose status
// metadata passes 16 KiB, and a text is sent percent-encoded (up to 3x).
inline constexpr size_t kMaxErrorBytes = 2048;
// `text`, or its first part and how long it was when longer than
// kMaxErrorBytes.
std::string BoundErrorText(absl::string_view text);

// Sets the token and a deadline on an outgoing call.
void PrepareContext(grpc::ClientContext* ctx, const std::string& token,
                    absl::Duration timeout);

// UNAUTHENTICATED unless the call carries `token` (an empty token turns the
// check off, for jobs started without one).
grpc::Status CheckToken(const grpc::ServerContextBase* ctx, const std::string& token);

// Whether `got` is `token`, in constant time: how long a comparison takes
// says nothing about where a guessed token first differs. An empty token
// (checks off) matches anything.
bool SameToken(absl::string_view got, const std::string& token);

grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);

// Waits on `mu` (held) until `cond` holds (true), `deadline` passes or the
// caller of `ctx` goes away (false): a handler's wait never outlives its
// caller.
bool AwaitForCaller(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline,
                    grpc::ServerContextBase* ctx);

// Time left before the call's deadline, capped at `cap`.
absl::Duration TimeLeft(const grpc::ServerContextBase* ctx, absl::Duration cap);

// A random hex string for job tokens.
std::string RandomToken();

// Asks the kernel for a free TCP port on 127.0.0.1 (for local mode).
int PickFreePort();

}  // namespace psrt

#endif  // PSRT_COMMON_GRPC_UTIL_H_
