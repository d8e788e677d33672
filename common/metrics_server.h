// Copyright 2024 The psrt Authors.
//
// Serves a daemon's metrics at /metrics for Prometheus: plain HTTP through
// prometheus-cpp's Exposer (civetweb), or HTTPS with the job's certificate
// when the job uses TLS.
//
//   absl::StatusOr<std::unique_ptr<MetricsServer>> server =
//       MetricsServer::Start("0.0.0.0", 9100, metrics, tls_config);
//
// HTTPS goes through cpp-httplib, not civetweb: Debian 12's civetweb (1.15)
// loads OpenSSL at run time by symbol name and looks for
// SSL_get_peer_certificate, which OpenSSL 3 no longer exports (it became
// SSL_get1_peer_certificate); civetweb calls the missing function after every
// handshake and the process dies of a null call.

#ifndef PSRT_COMMON_METRICS_SERVER_H_
#define PSRT_COMMON_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "common/tls.h"

namespace psrt {

class MetricsServer {
 public:
  // Serves `metrics` (which must outlive the server) at bind:port/metrics;
  // port 0 picks a free port, an empty bind means every IPv4 interface.
  // With `tls.enabled()`, HTTPS with tls's certificate, and only for clients
  // presenting a certificate tls's CA signed, as the job's gRPC channels
  // (mutual TLS); plain HTTP otherwise. UNAVAILABLE naming the address when
  // it cannot listen.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& bind, int port,
                                                              const Metrics& metrics,
                                                              const TlsConfig& tls);
  // Stops serving. Over plain HTTP, civetweb's shutdown takes about 2 s once
  // it has served a scrape; daemons stop it last, as they exit.
  virtual ~MetricsServer() = default;

  // The bound port (the chosen one when Start() was given 0).
  int port() const { return port_; }
  bool tls() const { return tls_; }
  // http(s)://bind:port/metrics
  std::string url() const;

 protected:
  MetricsServer(std::string bind, int port, bool tls)
      : bind_(std::move(bind)), port_(port), tls_(tls) {}

 private:
  const std::string bind_;
  const int port_;
  const bool tls_;
};

// A daemon's /metrics on bind:port (0 picks a free port), over HTTPS with the
// process's TLS settings (common/grpc_util.h) when it uses TLS; logs the URL.
// Null when port < 0 (metrics off).
absl::StatusOr<std::unique_ptr<MetricsServer>> ServeMetrics(const std::string& bind, int port,
                                                            const Metrics* metrics);

}  // namespace psrt

#endif  // PSRT_COMMON_METRICS_SERVER_H_
