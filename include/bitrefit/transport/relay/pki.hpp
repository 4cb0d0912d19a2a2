// bitrefit/transport/relay/pki.hpp — a throwaway cluster CA for demos and tests.
//
// make_cluster_ca(dir) writes ca.pem/ca.key (EC P-256, self-signed, CA:TRUE); issue(dir, name)
// writes <name>.pem/<name>.key signed by it, usable as TLS client and server certificate. Keys
// are written 0600. This is what `bitrefit-demo --transport relay` and the relay tests use; a
// production cluster brings certificates from its own CA (the relay README shows the openssl
// commands) and points tls_files at them.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "bitrefit/core/error.hpp"
#include "bitrefit/transport/relay/options.hpp"

namespace bitrefit::transport::relay::pki {

namespace detail {
struct pkey_free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct x509_free {
  void operator()(X509* p) const { X509_free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;
using x509_ptr = std::unique_ptr<X509, x509_free>;

inline void check(bool ok, const std::string& what) {
  if (!ok) throw error(errc::io, "OpenSSL failed to " + what, {.file = {}, .tensor = {}, .field = "pki"});
}

inline pkey_ptr new_key() {
  pkey_ptr k(EVP_EC_gen("P-256"));
  check(k != nullptr, "generate an EC key");
  return k;
}

inline void add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  check(ext != nullptr, "build a certificate extension");
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

inline x509_ptr make_cert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key, bool ca, long serial) {
  x509_ptr c(X509_new());
  check(c != nullptr, "allocate a certificate");
  X509_set_version(c.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(c.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(c.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(c.get()), 60L * 60 * 24 * 365 * 10);
  X509_set_pubkey(c.get(), key);
  X509_NAME* name = X509_get_subject_name(c.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(c.get(), issuer ? X509_get_subject_name(issuer) : name);
  X509* iss = issuer ? issuer : c.get();
  if (ca) {
    add_ext(c.get(), iss, NID_basic_constraints, "critical,CA:TRUE");
    add_ext(c.get(), iss, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_ext(c.get(), iss, NID_basic_constraints, "critical,CA:FALSE");
    add_ext(c.get(), iss, NID_key_usage, "critical,digitalSignature");
    add_ext(c.get(), iss, NID_ext_key_usage, "serverAuth,clientAuth");
  }
  add_ext(c.get(), iss, NID_subject_key_identifier, "hash");
  check(X509_sign(c.get(), issuer_key ? issuer_key : key, EVP_sha256()) > 0, "sign a certificate");
  return c;
}

inline void write_cert(const std::filesystem::path& p, X509* c) {
  FILE* f = std::fopen(p.c_str(), "w");
  check(f != nullptr, "open " + p.string());
  const bool ok = PEM_write_X509(f, c) == 1;
  std::fclose(f);
  check(ok, "write " + p.string());
}
inline void write_key(const std::filesystem::path& p, EVP_PKEY* k) {
  FILE* f = std::fopen(p.c_str(), "w");
  check(f != nullptr, "open " + p.string());
  ::fchmod(fileno(f), 0600);
  const bool ok = PEM_write_PrivateKey(f, k, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  std::fclose(f);
  check(ok, "write " + p.string());
}
inline pkey_ptr read_key(const std::filesystem::path& p) {
  FILE* f = std::fopen(p.c_str(), "r");
  check(f != nullptr, "open " + p.string());
  pkey_ptr k(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  check(k != nullptr, "read " + p.string());
  return k;
}
inline x509_ptr read_cert(const std::filesystem::path& p) {
  FILE* f = std::fopen(p.c_str(), "r");
  check(f != nullptr, "open " + p.string());
  x509_ptr c(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  check(c != nullptr, "read " + p.string());
  return c;
}
}  // namespace detail

/// Creates dir/ca.pem and dir/ca.key (a new CA named `cluster`).
inline void make_cluster_ca(const std::filesystem::path& dir, const std::string& cluster) {
  std::filesystem::create_directories(dir);
  auto key = detail::new_key();
  auto cert = detail::make_cert(key.get(), cluster + " relay CA", nullptr, nullptr, true, 1);
  detail::write_key(dir / "ca.key", key.get());
  detail::write_cert(dir / "ca.pem", cert.get());
}

/// Issues dir/<name>.pem + dir/<name>.key from the CA in `dir` and returns the node's tls_files.
inline tls_files issue(const std::filesystem::path& dir, const std::string& name) {
  static long serial = 2;
  auto ca_key = detail::read_key(dir / "ca.key");
  auto ca = detail::read_cert(dir / "ca.pem");
  auto key = detail::new_key();
  auto cert = detail::make_cert(key.get(), name, ca.get(), ca_key.get(), false, ++serial + long(::getpid()) * 1000);
  detail::write_key(dir / (name + ".key"), key.get());
  detail::write_cert(dir / (name + ".pem"), cert.get());
  return {dir / "ca.pem", dir / (name + ".pem"), dir / (name + ".key")};
}

/// The files issue(dir, name) wrote.
inline tls_files files(const std::filesystem::path& dir, const std::string& name) {
  return {dir / "ca.pem", dir / (name + ".pem"), dir / (name + ".key")};
}

}  // namespace bitrefit::transport::relay::pki
