// bitrefit/transport/http.hpp — one HTTP exchange through libcurl, with the one rule that matters to
// callers who must not guess: did the server possibly see the request?
//
// Used by the S3 client (transport/s3_client.hpp: AWS SigV4 through CURLOPT_AWS_SIGV4) and the etcd
// commit log (durability/etcd_kv.hpp). The client keeps a pool of curl easy handles (each keeps its
// connections alive between requests) and is safe to share between threads: every perform() takes
// a handle of its own.
//
// Failure classes (how a caller decides "failed" vs "unknown"):
//   not_sent   the connection could not be made: the server never saw the request;
//   timed_out  the deadline passed: the request may have been applied;
//   broken     the connection broke or the reply did not parse as HTTP: may have been applied.
#pragma once

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/core/error.hpp"

namespace bitrefit::transport::http {

enum class failure : std::uint8_t { none, not_sent, timed_out, broken };

constexpr const char* to_string(failure f) noexcept {
  switch (f) {
    case failure::none: return "none";
    case failure::not_sent: return "not sent";
    case failure::timed_out: return "timed out";
    case failure::broken: return "connection broken";
  }
  return "?";
}

struct request {
  std::string method = "GET";              // GET, PUT, POST, DELETE, HEAD
  std::string url;                         // already percent-encoded
  std::vector<std::string> headers;        // "name: value" (every one is signed under SigV4)
  std::span<const std::byte> body;         // sent as is for PUT and POST (valid during perform)
  std::string range;                       // "a-b" (inclusive) or "-n" (the last n bytes); empty: all
  std::string aws_sigv4;                   // CURLOPT_AWS_SIGV4 parameter, e.g. "aws:amz:us-east-1:s3"
  std::string userpwd;                     // "access key:secret key" for SigV4
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::milliseconds timeout{0};    // whole exchange; 0: none (stall_timeout still applies)
  std::chrono::seconds stall_timeout{30};  // abort when under 1 byte/s for this long
  /// A connection of its own, closed after the exchange. curl silently sends a request again when
  /// a REUSED connection dies before any answer; for a request that must report "maybe applied"
  /// instead of being repeated (an etcd txn), that resend would hide the outcome.
  bool fresh_connection = false;
};

struct response {
  long status = 0;                         // HTTP status; 0 when failed != none
  failure failed = failure::none;
  std::string error;                       // curl's description when failed != none
  std::vector<std::byte> body;
  std::map<std::string, std::string> headers;  // lower-case names, last value wins

  std::string_view text() const noexcept { return {reinterpret_cast<const char*>(body.data()), body.size()}; }
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

namespace detail {

inline void global_init() {
  static const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (rc != CURLE_OK) throw error(errc::io, std::string("curl_global_init failed: ") + curl_easy_strerror(rc));
}

inline failure classify(CURLcode rc) noexcept {
  switch (rc) {
    case CURLE_OK: return failure::none;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT: return failure::not_sent;
    case CURLE_OPERATION_TIMEDOUT: return failure::timed_out;
    default: return failure::broken;
  }
}

struct upload_cursor {
  std::span<const std::byte> body;
  std::size_t at = 0;
};

inline std::size_t on_read(char* out, std::size_t size, std::size_t n, void* user) {
  auto* c = static_cast<upload_cursor*>(user);
  const std::size_t k = std::min(size * n, c->body.size() - c->at);
  if (k) std::memcpy(out, c->body.data() + c->at, k);
  c->at += k;
  return k;
}

/// curl rewinds the body when it must resend it (a redirect, a reused connection that was closed).
inline int on_seek(void* user, curl_off_t offset, int origin) {
  auto* c = static_cast<upload_cursor*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<std::size_t>(offset) > c->body.size()) return CURL_SEEKFUNC_FAIL;
  c->at = static_cast<std::size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

inline std::size_t on_write(char* data, std::size_t size, std::size_t n, void* user) {
  auto* r = static_cast<response*>(user);
  const auto* b = reinterpret_cast<const std::byte*>(data);
  r->body.insert(r->body.end(), b, b + size * n);
  return size * n;
}

inline std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* r = static_cast<response*>(user);
  const std::string_view line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) r->headers.clear();  // a new status line (after 100 Continue)
  const auto colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) value.remove_suffix(1);
    r->headers[name] = std::string(value);
  }
  return size * n;
}

}  // namespace detail

/// A thread-safe HTTP client: a pool of curl easy handles shared by its copies.
class client {
 public:
  client() : pool_(std::make_shared<pool>()) { detail::global_init(); }

  /// Performs one exchange. Never throws for network or HTTP errors (they are in the response);
  /// throws errc::io only when curl cannot be set up at all.
  response perform(const request& q) const {
    handle h(*pool_);
    CURL* c = h.get();
    response r;
    detail::upload_cursor cursor{q.body, 0};
    curl_slist* headers = nullptr;
    for (const auto& line : q.headers) headers = curl_slist_append(headers, line.c_str());
    struct slist_guard {
      curl_slist* l;
      ~slist_guard() { curl_slist_free_all(l); }
    } guard{headers};

    curl_easy_setopt(c, CURLOPT_URL, q.url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &detail::on_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &detail::on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(q.connect_timeout.count()));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(q.timeout.count()));
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, static_cast<long>(q.stall_timeout.count()));
    if (!q.range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, q.range.c_str());
    if (q.fresh_connection) {
      curl_easy_setopt(c, CURLOPT_FRESH_CONNECT, 1L);
      curl_easy_setopt(c, CURLOPT_FORBID_REUSE, 1L);
    }
    if (!q.aws_sigv4.empty()) {
      curl_easy_setopt(c, CURLOPT_AWS_SIGV4, q.aws_sigv4.c_str());
      curl_easy_setopt(c, CURLOPT_USERPWD, q.userpwd.c_str());
    }
    if (q.method == "PUT") {
      curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(c, CURLOPT_READFUNCTION, &detail::on_read);
      curl_easy_setopt(c, CURLOPT_READDATA, &cursor);
      curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, &detail::on_seek);
      curl_easy_setopt(c, CURLOPT_SEEKDATA, &cursor);
      curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(q.body.size()));
      // curl announces uploads with "Expect: 100-continue" and would wait a round trip (up to 1 s
      // on a server that does not answer it) before sending the body; send it at once instead.
      // (Removing the header with "Expect:" is not an option under SigV4: curl signs every header
      // in the list, the removed one included.)
      curl_easy_setopt(c, CURLOPT_EXPECT_100_TIMEOUT_MS, 0L);
    } else if (q.method == "POST") {
      curl_easy_setopt(c, CURLOPT_POST, 1L);
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, q.body.empty() ? "" : reinterpret_cast<const char*>(q.body.data()));
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(q.body.size()));
    } else if (q.method == "HEAD") {
      curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (q.method != "GET") {
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, q.method.c_str());
    }
    const CURLcode rc = curl_easy_perform(c);
    r.failed = detail::classify(rc);
    if (r.failed != failure::none) {
      r.error = curl_easy_strerror(rc);
      r.status = 0;
      h.discard();  // its connection state is unknown: never reuse it
      return r;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    return r;
  }

 private:
  struct pool {
    std::mutex mu;
    std::vector<CURL*> idle;
    ~pool() {
      for (CURL* c : idle) curl_easy_cleanup(c);
    }
  };

  /// A handle borrowed from the pool, reset to defaults (its connection cache survives a reset).
  class handle {
   public:
    explicit handle(pool& p) : p_(p) {
      {
        std::lock_guard lock(p_.mu);
        if (!p_.idle.empty()) {
          c_ = p_.idle.back();
          p_.idle.pop_back();
        }
      }
      if (c_) curl_easy_reset(c_);
      else c_ = curl_easy_init();
      if (!c_) throw error(errc::io, "curl_easy_init failed");
    }
    handle(const handle&) = delete;
    ~handle() {
      if (!c_) return;
      std::lock_guard lock(p_.mu);
      p_.idle.push_back(c_);
    }
    CURL* get() const noexcept { return c_; }
    void discard() noexcept {
      curl_easy_cleanup(c_);
      c_ = nullptr;
    }

   private:
    pool& p_;
    CURL* c_ = nullptr;
  };

  std::shared_ptr<pool> pool_;
};

/// RFC 3986 percent-encoding as AWS SigV4 canonicalizes it: unreserved characters stay, every
/// other byte becomes %XX (upper-case hex); '/' stays when `keep_slash` (object key paths).
inline std::string uri_encode(std::string_view s, bool keep_slash) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (unsigned char ch : s) {
    const bool unreserved = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                            ch == '_' || ch == '.' || ch == '~';
    if (unreserved || (keep_slash && ch == '/')) {
      out.push_back(static_cast<char>(ch));
    } else {
      out.push_back('%');
      out.push_back(hex[ch >> 4]);
      out.push_back(hex[ch & 15]);
    }
  }
  return out;
}

/// Standard base64 (RFC 4648, with padding) through OpenSSL: S3's Content-MD5, etcd's JSON keys.
inline std::string base64_encode(std::span<const std::byte> b) {
  std::string out(4 * ((b.size() + 2) / 3), '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(b.data()),
                                static_cast<int>(b.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}
inline std::string base64_encode(std::string_view s) { return base64_encode(std::as_bytes(std::span(s.data(), s.size()))); }

/// @throws errc::format when `s` is not base64.
inline std::string base64_decode(std::string_view s) {
  if (s.size() % 4 != 0) throw error(errc::format, "base64 text length is not a multiple of 4", {.file = {}, .tensor = {}, .field = "base64"});
  std::string out(s.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(s.data()),
                                static_cast<int>(s.size()));
  if (n < 0) throw error(errc::format, "not base64", {.file = {}, .tensor = {}, .field = "base64"});
  std::size_t len = static_cast<std::size_t>(n);  // EVP_DecodeBlock counts the padding as zero bytes
  if (!s.empty() && s.back() == '=') --len;
  if (s.size() > 1 && s[s.size() - 2] == '=') --len;
  out.resize(len);
  return out;
}

}  // namespace bitrefit::transport::http
