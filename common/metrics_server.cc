// Copyright 2024 The psrt Authors.

#include "common/metrics_server.h"

#include <netdb.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>

#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "CivetServer.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "common/logging.h"
#include "httplib.h"
#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace psrt {
namespace {

// A scraper that connects and then stalls holds one of the server's threads
// this long at most.
constexpr int kIoTimeoutSeconds = 5;
constexpr int kThreads = 2;

// The numeric address `bind` stands for ("" means every IPv4 interface), so
// both servers get the same address and a name resolves once.
absl::StatusOr<std::string> NumericHost(const std::string& bind) {
  if (bind.empty()) return std::string("0.0.0.0");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(bind.c_str(), nullptr, &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot resolve '", bind, "': ", gai_strerror(rc)));
  }
  char host[NI_MAXHOST] = {};
  const int rc = getnameinfo(found->ai_addr, found->ai_addrlen, host, sizeof(host), nullptr, 0,
                             NI_NUMERICHOST);
  freeaddrinfo(found);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot resolve '", bind, "': ", gai_strerror(rc)));
  }
  return std::string(host);
}

std::string HostPort(const std::string& host, int port) {
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port)
                                      : absl::StrCat(host, ":", port);
}

// civetweb's messages: the last one says why a start failed.
absl::Mutex civetweb_mu;
std::string* civetweb_last_message ABSL_GUARDED_BY(civetweb_mu) = nullptr;

int OnCivetwebMessage(const mg_connection*, const char* message) {
  absl::MutexLock lock(&civetweb_mu);
  if (civetweb_last_message == nullptr) civetweb_last_message = new std::string;
  *civetweb_last_message = message;
  return 1;  // handled: civetweb prints nothing itself
}

std::string TakeCivetwebMessage() {
  absl::MutexLock lock(&civetweb_mu);
  if (civetweb_last_message == nullptr) return "";
  return std::exchange(*civetweb_last_message, "");
}

// Plain HTTP: prometheus-cpp's Exposer collects the registry on every scrape.
class ExposerServer : public MetricsServer {
 public:
  ExposerServer(std::string bind, int port, std::unique_ptr<prometheus::Exposer> exposer)
      : MetricsServer(std::move(bind), port, false), exposer_(std::move(exposer)) {}

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> StartHttp(const std::string& host, int port,
                                                         const Metrics& metrics) {
  static CivetCallbacks* const callbacks = [] {
    auto* c = new CivetCallbacks;
    c->log_message = OnCivetwebMessage;
    return c;
  }();
  const std::string address = HostPort(host, port);
  TakeCivetwebMessage();
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", address, "num_threads",
                                 std::to_string(kThreads), "request_timeout_ms",
                                 std::to_string(kIoTimeoutSeconds * 1000)},
        callbacks);
  } catch (const std::exception& e) {
    const std::string why = TakeCivetwebMessage();
    return absl::UnavailableError(absl::StrCat("metrics: cannot serve http://", address,
                                               "/metrics: ", why.empty() ? e.what() : why));
  }
  exposer->RegisterCollectable(metrics.registry());
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("metrics: http://", address, "/metrics has no listening port"));
  }
  return std::unique_ptr<MetricsServer>(new ExposerServer(host, ports[0], std::move(exposer)));
}

// The OpenSSL error queue as text, emptied.
std::string OpensslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The job's certificate (and chain) and key, and client certificates checked
// against its CA, as every gRPC server of the job does. LoadTlsConfig has
// already checked that the files parse and belong together.
absl::Status ConfigureTls(SSL_CTX* ctx, const TlsConfig& tls) {
  ERR_clear_error();
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
    return absl::InternalError(OpensslErrors());
  }
  BioPtr cert_bio = MemBio(tls.cert_pem);
  X509* cert = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr);
  const bool cert_ok = cert != nullptr && SSL_CTX_use_certificate(ctx, cert) == 1;
  X509_free(cert);
  if (!cert_ok) return absl::InvalidArgumentError(absl::StrCat("certificate: ", OpensslErrors()));
  while (X509* link = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(ctx, link) != 1) {  // takes `link` on success
      X509_free(link);
      return absl::InvalidArgumentError(absl::StrCat("certificate chain: ", OpensslErrors()));
    }
  }
  ERR_clear_error();  // the end of the chain reads as an error
  EVP_PKEY* key = PEM_read_bio_PrivateKey(MemBio(tls.key_pem).get(), nullptr, nullptr, nullptr);
  const bool key_ok = key != nullptr && SSL_CTX_use_PrivateKey(ctx, key) == 1 &&
                      SSL_CTX_check_private_key(ctx) == 1;
  EVP_PKEY_free(key);
  if (!key_ok) return absl::InvalidArgumentError(absl::StrCat("private key: ", OpensslErrors()));
  X509_STORE* trusted = SSL_CTX_get_cert_store(ctx);
  BioPtr ca_bio = MemBio(tls.ca_pem);
  int num_ca = 0;
  while (X509* ca = PEM_read_bio_X509(ca_bio.get(), nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(trusted, ca);
    SSL_CTX_add_client_CA(ctx, ca);  // named in the request for a client certificate
    X509_free(ca);
    ++num_ca;
  }
  ERR_clear_error();
  if (num_ca == 0) return absl::InvalidArgumentError("the CA bundle holds no certificate");
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return absl::OkStatus();
}

// HTTPS: cpp-httplib's server, writing the registry with prometheus-cpp's
// serializer.
class HttpsServer : public MetricsServer {
 public:
  HttpsServer(std::string bind, int port, std::unique_ptr<httplib::SSLServer> server,
              std::thread thread)
      : MetricsServer(std::move(bind), port, true),
        server_(std::move(server)),
        thread_(std::move(thread)) {}
  ~HttpsServer() override {
    server_->stop();
    thread_.join();
  }

 private:
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> StartHttps(const std::string& host, int port,
                                                          const Metrics& metrics,
                                                          const TlsConfig& tls) {
  const std::string url = absl::StrCat("https://", HostPort(host, port), "/metrics");
  absl::Status configured;
  auto server = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
    configured = ConfigureTls(&ctx, tls);
    return configured.ok();
  });
  if (!server->is_valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics: cannot serve ", url, ": ",
                     configured.ok() ? OpensslErrors() : configured.message()));
  }
  server->new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  // cpp-httplib's default adds SO_REUSEPORT, with which a second process
  // of the user could listen on the same port and take half the scrapes (or
  // a gRPC server's connections) instead of failing to start.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->set_read_timeout(kIoTimeoutSeconds, 0);
  server->set_write_timeout(kIoTimeoutSeconds, 0);
  std::weak_ptr<prometheus::Registry> registry = metrics.registry();
  server->Get("/metrics", [registry](const httplib::Request&, httplib::Response& response) {
    std::shared_ptr<prometheus::Registry> r = registry.lock();
    if (r == nullptr) {
      response.status = 503;
      return;
    }
    response.set_content(prometheus::TextSerializer().Serialize(r->Collect()),
                         "text/plain; version=0.0.4; charset=utf-8");
  });
  int bound = port;
  if (port == 0) {
    bound = server->bind_to_any_port(host);
  } else if (!server->bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen at ", url,
                                               " (the port is taken, or ", host,
                                               " is no address of this host)"));
  }
  httplib::SSLServer* s = server.get();
  std::thread thread([s] { s->listen_after_bind(); });
  // stop() only ends a server that is already running: wait for that, so
  // the destructor cannot miss it.
  const absl::Time deadline = absl::Now() + absl::Seconds(kIoTimeoutSeconds);
  while (!s->is_running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  if (!s->is_running()) {
    s->stop();
    thread.join();
    return absl::UnavailableError(absl::StrCat("metrics: ", url, " did not start listening"));
  }
  return std::unique_ptr<MetricsServer>(
      new HttpsServer(host, bound, std::move(server), std::move(thread)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& bind,
                                                                    int port,
                                                                    const Metrics& metrics,
                                                                    const TlsConfig& tls) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics: port must be in 0..65535, got ", port));
  }
  absl::StatusOr<std::string> host = NumericHost(bind);
  if (!host.ok()) return host.status();
  if (tls.enabled()) return StartHttps(*host, port, metrics, tls);
  return StartHttp(*host, port, metrics);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(const std::string& bind, int port,
                                                            const Metrics* metrics) {
  if (port < 0) return std::unique_ptr<MetricsServer>();
  absl::StatusOr<TlsConfig> tls = TransportSecurity();
  if (!tls.ok()) return tls.status();
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(bind, port, *metrics, *tls);
  if (server.ok())
    LogInfo("metrics at ", (*server)->url(), (*server)->tls() ? " (mutual TLS)" : "");
  return server;
}

std::string MetricsServer::url() const {
  return absl::StrCat(tls_ ? "https://" : "http://", HostPort(bind_, port_), "/metrics");
}

}  // namespace psrt
