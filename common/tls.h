#ifndef PSRT_COMMON_TLS_H_
#define PSRT_COMMON_TLS_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace psrt {

// Mutual TLS for every psrt channel: each process presents the job's
// certificate and accepts only peers whose certificates the job's CA signed.
struct TlsConfig {
  std::string ca_pem;    // CA bundle that signed every peer's certificate
  std::string cert_pem;  // this process's certificate (chain)
  std::string key_pem;   // and its private key
  // Servers are checked against this name instead of the host in their
  // address: one job certificate can then name the job, not every host.
  std::string server_name;
  bool enabled() const { return !cert_pem.empty(); }
};

// The environment's TLS settings: PSRT_TLS_CA, PSRT_TLS_CERT and
// PSRT_TLS_KEY (paths of PEM files; all three or none) and optionally
// PSRT_TLS_SERVER_NAME. INVALID_ARGUMENT naming the variable and file when a
// file cannot be read or parsed, or the key is not the certificate's.
absl::StatusOr<TlsConfig> LoadTlsConfig(const std::function<const char*(const char*)>& getenv);

}  // namespace psrt

#endif  // PSRT_COMMON_TLS_H_
