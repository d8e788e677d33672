#include "common/grpc_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/tls.h"

namespace psrt {
namespace {

// HTTP/2 and TCP settings for large tensors, on channels and servers alike
// (about 4% more push-pull goodput at 1-64 MiB on the reference VM).
template <typename SetInt>
void TuneForTensors(SetInt set) {
  set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (1 << 24) - 1);
  set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  set(GRPC_ARG_TCP_READ_CHUNK_SIZE, 4 << 20);
  set(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 16 << 20);
}

absl::Mutex tls_mu;
absl::StatusOr<TlsConfig>* tls ABSL_GUARDED_BY(tls_mu) = nullptr;

// The process's TLS settings, loaded on first use and never changed.
const absl::StatusOr<TlsConfig>& Tls() {
  absl::MutexLock lock(&tls_mu);
  if (tls == nullptr) {
    tls = new absl::StatusOr<TlsConfig>(LoadTlsConfig([](const char* name) { return std::getenv(name); }));
  }
  return *tls;
}

}  // namespace

absl::Status InitTransportSecurity() { return Tls().status(); }

absl::StatusOr<TlsConfig> TransportSecurity() { return Tls(); }

bool TlsEnabled() {
  const absl::StatusOr<TlsConfig>& c = Tls();
  return !c.ok() || c->enabled();
}

namespace {

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address, int64_t max_message_bytes,
                                          bool tensors) {
  grpc::ChannelArguments args;
  const int limit = static_cast<int>(std::min<int64_t>(max_message_bytes, INT_MAX));
  args.SetMaxReceiveMessageSize(limit);
  args.SetMaxSendMessageSize(limit);
  // Fail fast on a dead peer instead of waiting out long reconnect backoff.
  // gRPC also takes the minimum backoff as the connect timeout: 1 s, since
  // a handshake on a loaded host can take longer than 100 ms ("timed out
  // before receiving SETTINGS"); a dead process refuses at once anyway.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (tensors) {
    // One TCP connection per server from each process is the bottleneck for
    // big tensors; a local subchannel pool per channel keeps channels apart.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    TuneForTensors([&](const char* name, int v) { args.SetInt(name, v); });
  }
  const absl::StatusOr<TlsConfig>& tls = Tls();
  if (tls.ok() && !tls->enabled()) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions ssl;
  if (tls.ok()) {
    ssl.pem_root_certs = tls->ca_pem;
    ssl.pem_cert_chain = tls->cert_pem;
    ssl.pem_private_key = tls->key_pem;
    if (!tls->server_name.empty()) args.SetSslTargetNameOverride(tls->server_name);
  }  // else the system's roots, which trust no job certificate
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int64_t max_message_bytes) {
  return NewChannel(address, max_message_bytes, /*tensors=*/true);
}

std::shared_ptr<grpc::Channel> MakeControlChannel(const std::string& address) {
  return NewChannel(address, kDefaultMaxMessageBytes, /*tensors=*/false);
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder, int64_t max_message_bytes) {
  const int limit = static_cast<int>(std::min<int64_t>(max_message_bytes, INT_MAX));
  builder->SetMaxReceiveMessageSize(limit);
  builder->SetMaxSendMessageSize(limit);
  grpc::ResourceQuota quota("psrt");
  // Pulls may block waiting for a version, so allow many handler threads.
  quota.SetMaxThreads(512);
  builder->SetResourceQuota(quota);
  TuneForTensors([&](const char* name, int v) { builder->AddChannelArgument(name, v); });
}

namespace {

// The token from the metadata (SameToken).
grpc::Status CheckTokenIn(const std::multimap<grpc::string_ref, grpc::string_ref>& md,
                          const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  auto it = md.find(kTokenMetadata);
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "this call carries no psrt job token");
  }
  if (!SameToken(absl::string_view(it->second.data(), it->second.size()), token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "this call's job token is not this job's");
  }
  return grpc::Status::OK;
}

// Every call's answer, whatever the method: an UNAUTHENTICATED one when the
// token is wrong, even where gRPC answered before the handler ran (a body
// that does not parse), so that nothing about a request is told to a
// caller without the token; and an error text cut to kMaxErrorBytes,
// since one past gRPC's 16 KiB metadata limit would reach the caller as
// "Stream removed" instead. The handlers check the token themselves too:
// an interceptor cannot keep them from running.
class GuardInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit GuardInterceptor(const std::string* token) : token_(token) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      const auto* md = methods->GetRecvInitialMetadata();
      if (md != nullptr) refused_ = CheckTokenIn(*md, *token_);
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      if (!refused_.ok()) {
        methods->ModifySendStatus(refused_);
      } else {
        const grpc::Status s = methods->GetSendStatus();
        if (s.error_message().size() > kMaxErrorBytes) {
          methods->ModifySendStatus(grpc::Status(s.error_code(), BoundErrorText(s.error_message())));
        }
      }
    }
    methods->Proceed();
  }

 private:
  const std::string* token_;
  grpc::Status refused_;
};

class GuardFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit GuardFactory(std::string token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo*) override {
    return new GuardInterceptor(&token_);
  }

 private:
  const std::string token_;
};

}  // namespace

std::string BoundErrorText(absl::string_view text) {
  if (text.size() <= kMaxErrorBytes) return std::string(text);
  return absl::StrCat(text.substr(0, kMaxErrorBytes - 64), "... (cut: ", text.size(), " bytes in all)");
}

absl::StatusOr<ServingServer> StartServer(const std::string& bind, int port, grpc::Service* service,
                                          const std::string& token) {
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> guards;
  guards.push_back(std::make_unique<GuardFactory>(token));
  builder.experimental().SetInterceptorCreators(std::move(guards));
  ServingServer out;
  const absl::StatusOr<TlsConfig>& tls = Tls();
  if (!tls.ok()) return tls.status();
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (tls->enabled()) {
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = tls->ca_pem;
    ssl.pem_key_cert_pairs.push_back({tls->key_pem, tls->cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort(absl::StrCat(bind, ":", port), credentials, &out.port);
  builder.RegisterService(service);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", bind, ":", port));
  }
  return out;
}

void PrepareContext(grpc::ClientContext* ctx, const std::string& token,
                    absl::Duration timeout) {
  if (!token.empty()) ctx->AddMetadata(kTokenMetadata, token);
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(timeout));
}

grpc::Status CheckToken(const grpc::ServerContextBase* ctx, const std::string& token) {
  return CheckTokenIn(ctx->client_metadata(), token);
}

bool SameToken(absl::string_view got, const std::string& token) {
  if (token.empty()) return true;
  return got.size() == token.size() && CRYPTO_memcmp(got.data(), token.data(), token.size()) == 0;
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

bool AwaitForCaller(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline,
                    grpc::ServerContextBase* ctx) {
  // Cancellation has no wake-up of its own: look every 100 ms.
  while (!mu->AwaitWithDeadline(cond, std::min(deadline, absl::Now() + absl::Milliseconds(100)))) {
    if (absl::Now() >= deadline || ctx->IsCancelled()) return false;
  }
  return true;
}

absl::Duration TimeLeft(const grpc::ServerContextBase* ctx, absl::Duration cap) {
  absl::Duration left = absl::FromChrono(ctx->deadline() - std::chrono::system_clock::now());
  return std::max(absl::ZeroDuration(), std::min(left, cap));
}

std::string RandomToken() {
  std::random_device rd;
  std::string out;
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) out.push_back(kHex[rd() % 16]);
  return out;
}

int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace psrt
