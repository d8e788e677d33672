#include "common/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace psrt {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct StoreFree {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
struct ChainFree {
  void operator()(STACK_OF(X509) * c) const { sk_X509_pop_free(c, X509_free); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioFree> Bio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::string OpensslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "not PEM";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

absl::StatusOr<std::string> ReadPem(const char* var, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  if (!in || !(text << in.rdbuf())) {
    return absl::InvalidArgumentError(absl::StrCat(var, ": cannot read '", path, "'"));
  }
  return text.str();
}

}  // namespace

absl::StatusOr<TlsConfig> LoadTlsConfig(const std::function<const char*(const char*)>& getenv) {
  auto get = [&](const char* name) {
    const char* v = getenv(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  const std::string ca = get("PSRT_TLS_CA"), cert = get("PSRT_TLS_CERT"), key = get("PSRT_TLS_KEY");
  TlsConfig c;
  c.server_name = get("PSRT_TLS_SERVER_NAME");
  if (ca.empty() && cert.empty() && key.empty()) {
    if (!c.server_name.empty()) {
      return absl::InvalidArgumentError(
          "PSRT_TLS_SERVER_NAME is set without PSRT_TLS_CA, PSRT_TLS_CERT and PSRT_TLS_KEY");
    }
    return c;
  }
  if (ca.empty() || cert.empty() || key.empty()) {
    std::vector<std::string> missing;
    if (ca.empty()) missing.push_back("PSRT_TLS_CA");
    if (cert.empty()) missing.push_back("PSRT_TLS_CERT");
    if (key.empty()) missing.push_back("PSRT_TLS_KEY");
    return absl::InvalidArgumentError(
        absl::StrCat("mutual TLS needs PSRT_TLS_CA, PSRT_TLS_CERT and PSRT_TLS_KEY together; ",
                     absl::StrJoin(missing, " and "), " not set"));
  }
  absl::StatusOr<std::string> ca_pem = ReadPem("PSRT_TLS_CA", ca);
  if (!ca_pem.ok()) return ca_pem.status();
  absl::StatusOr<std::string> cert_pem = ReadPem("PSRT_TLS_CERT", cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadPem("PSRT_TLS_KEY", key);
  if (!key_pem.ok()) return key_pem.status();

  ERR_clear_error();
  // Every certificate of the CA bundle is trusted; the certificate file's
  // first is this process's, the rest its chain.
  std::unique_ptr<X509_STORE, StoreFree> trusted(X509_STORE_new());
  int num_ca = 0;
  for (auto bio = Bio(*ca_pem);; ++num_ca) {
    std::unique_ptr<X509, X509Free> x(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (x == nullptr) break;
    X509_STORE_add_cert(trusted.get(), x.get());
  }
  ERR_clear_error();
  if (num_ca == 0) {
    return absl::InvalidArgumentError(absl::StrCat("PSRT_TLS_CA: '", ca, "' holds no PEM certificate"));
  }
  auto cert_bio = Bio(*cert_pem);
  std::unique_ptr<X509, X509Free> x509(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (x509 == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("PSRT_TLS_CERT: '", cert, "' holds no PEM certificate (", OpensslError(), ")"));
  }
  std::unique_ptr<STACK_OF(X509), ChainFree> chain(sk_X509_new_null());
  while (X509* x = PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr)) sk_X509_push(chain.get(), x);
  ERR_clear_error();
  std::unique_ptr<EVP_PKEY, KeyFree> pkey(PEM_read_bio_PrivateKey(Bio(*key_pem).get(), nullptr, nullptr, nullptr));
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("PSRT_TLS_KEY: '", key, "' holds no unencrypted PEM private key (", OpensslError(), ")"));
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("PSRT_TLS_KEY: '", key, "' is not the key of the certificate in '", cert, "' (PSRT_TLS_CERT)"));
  }
  // Peers check each other against the CA: a certificate it did not sign,
  // or one expired, would fail every handshake later with less to go on.
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> ctx(X509_STORE_CTX_new());
  if (X509_STORE_CTX_init(ctx.get(), trusted.get(), x509.get(), chain.get()) != 1 || X509_verify_cert(ctx.get()) != 1) {
    const std::string why = X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("PSRT_TLS_CERT: the certificate in '", cert,
                                                   "' does not verify against PSRT_TLS_CA '", ca, "': ", why));
  }
  c.ca_pem = *std::move(ca_pem);
  c.cert_pem = *std::move(cert_pem);
  c.key_pem = *std::move(key_pem);
  return c;
}

}  // namespace psrt
