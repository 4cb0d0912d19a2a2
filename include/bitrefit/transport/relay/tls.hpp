// bitrefit/transport/relay/tls.hpp — the TLS context every relay connection is authenticated with.
//
// Mutual TLS 1.3 on asio::ssl (OpenSSL): both ends present a certificate signed by the cluster CA
// and verify the other's; a connection without one, with another CA's, or speaking anything but
// TLS 1.3 fails its handshake and is closed before a single byte reaches the framing decoder.
// Why mutual TLS rather than an HMAC challenge-response (see the relay README): it authenticates
// AND protects every later byte (integrity, so nothing can be injected into an authenticated
// stream, and confidentiality of the weights) with a vetted protocol, where a challenge-response
// would authenticate only the first round trip unless we also designed per-message MACs.
// Host names are not checked: membership in the cluster is the certificate's CA; relays address
// each other by the numeric addresses they advertise.
#pragma once

#include <utility>  // Boost 1.74's Asio wants <utility> before it (coroutine support)

#include <openssl/ssl.h>

#include <filesystem>
#include <string>

#include <boost/asio/ssl.hpp>

#include "bitrefit/core/error.hpp"
#include "bitrefit/transport/relay/options.hpp"

namespace bitrefit::transport::relay {

/// @throws errc::io naming the file that is missing or errc::format naming the file OpenSSL
/// rejected (not PEM, key does not match the certificate, ...).
inline boost::asio::ssl::context make_tls_context(const tls_files& f) {
  namespace ssl = boost::asio::ssl;
  for (const auto& [p, what] : {std::pair{f.ca, "ca"}, std::pair{f.cert, "cert"}, std::pair{f.key, "key"}}) {
    if (p.empty()) throw error(errc::invalid_argument, std::string("no TLS ") + what + " file configured: every relay connection is authenticated",
                               {.file = {}, .tensor = {}, .field = std::string("tls.") + what});
    if (!std::filesystem::is_regular_file(p))
      throw error(errc::io, std::string("TLS ") + what + " file not found", {.file = p.string(), .tensor = {}, .field = std::string("tls.") + what});
  }
  ssl::context ctx(ssl::context::tls);
  SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_3_VERSION);
  ctx.set_options(ssl::context::no_compression | ssl::context::single_dh_use);
  const auto load = [&](auto&& fn, const std::filesystem::path& p, const char* what) {
    boost::system::error_code ec;
    fn(ec);
    if (ec) throw error(errc::format, std::string("TLS ") + what + " file rejected: " + ec.message(), {.file = p.string(), .tensor = {}, .field = std::string("tls.") + what});
  };
  load([&](auto& ec) { ctx.load_verify_file(f.ca.string(), ec); }, f.ca, "ca");
  load([&](auto& ec) { ctx.use_certificate_chain_file(f.cert.string(), ec); }, f.cert, "cert");
  load([&](auto& ec) { ctx.use_private_key_file(f.key.string(), ssl::context::pem, ec); }, f.key, "key");
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1)
    throw error(errc::mismatch, "TLS key does not match the certificate", {.file = f.key.string(), .tensor = {}, .field = "tls.key"});
  ctx.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  return ctx;
}

}  // namespace bitrefit::transport::relay
