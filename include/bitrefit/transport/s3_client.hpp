// bitrefit/transport/s3_client.hpp — the S3 REST API as the object-store transport and the S3
// baseline store need it: signed requests, retries, named errors, and the XML answers parsed.
//
// Signing: libcurl's built-in AWS Signature V4 (CURLOPT_AWS_SIGV4, "aws:amz:<region>:s3"). Two
// things curl 7.88 leaves to its caller, done here: the body's SHA-256 goes in
// x-amz-content-sha256 (curl signs that header's value as the payload hash; without it, it would
// hash an empty body for uploads), and the query string is sent already in canonical form (keys
// sorted, RFC 3986 encoded, "key=" for empty values), because curl signs it exactly as sent.
// Credentials come from the options or from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
// AWS_SESSION_TOKEN; the region from the options, AWS_REGION or AWS_DEFAULT_REGION.
//
// Retries: connection failures, timeouts, resets, HTTP 5xx, 429, 408 and the codes SlowDown,
// RequestTimeout, InternalError and ServiceUnavailable are retried with exponential backoff and
// full jitter (a uniformly random delay up to base * 2^k, capped), up to max_attempts tries. Every
// other error — 403 AccessDenied / SignatureDoesNotMatch / InvalidAccessKeyId, 404 NoSuchBucket,
// any other 4xx — cannot be fixed by retrying and is thrown at once as an s3_error that names the
// request, the object, the HTTP status and S3's error code and message.
// XML answers (errors, listings, multipart) are read with pugixml.
#pragma once

#include <openssl/evp.h>
#include <pugixml.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/transport/http.hpp"

namespace bitrefit::transport {

struct s3_credentials {
  std::string access_key, secret_key, session_token;

  /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and (optional) AWS_SESSION_TOKEN.
  static s3_credentials from_environment() {
    auto env = [](const char* n) {
      const char* v = std::getenv(n);
      return std::string(v ? v : "");
    };
    return {env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"), env("AWS_SESSION_TOKEN")};
  }
};

struct s3_retry_policy {
  std::uint32_t max_attempts = 8;            // tries per request, the first one included
  std::chrono::milliseconds base_delay{50};  // the delay before retry k is uniform in [0, min(max, base * 2^k)]
  std::chrono::milliseconds max_delay{5000};
};

struct s3_options {
  /// Any S3-compatible server ("http://127.0.0.1:9000"); empty: AWS, https://s3.<region>.amazonaws.com.
  std::string endpoint;
  std::string bucket;
  /// Empty: AWS_REGION, else AWS_DEFAULT_REGION, else "us-east-1".
  std::string region;
  /// Empty: from the environment (s3_credentials::from_environment).
  std::optional<s3_credentials> credentials;
  /// Every key lives under this prefix ("runs/7/"), so several deployments can share one bucket.
  std::string prefix;
  /// The bucket in the host name (https://bucket.host/key) instead of the path (https://host/bucket/key).
  bool virtual_hosted = false;
  /// Objects above this size are uploaded in parts of this size (S3: at least 5 MiB but the last).
  std::size_t part_size = std::size_t(8) << 20;
  /// Parts of one object in flight at once (each on its own connection).
  unsigned parallel_parts = 4;
  /// Keys per LIST page (S3's maximum is 1000; smaller pages exercise pagination in tests).
  std::uint32_t list_page = 1000;
  /// Sign each body's SHA-256; false sends UNSIGNED-PAYLOAD (acceptable over TLS, saves a hash pass).
  bool sign_payload = true;
  s3_retry_policy retry;
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::seconds stall_timeout{30};
};

/// An S3 request that failed for good: status 0 when the network failed on every try.
class s3_error : public error {
 public:
  s3_error(std::string message, std::string where, long status, std::string code, bool retryable)
      : error(errc::io, std::move(message), {.file = std::move(where), .tensor = {}, .field = code.empty() ? "http" : code}),
        status_(status),
        code_(std::move(code)),
        retryable_(retryable) {}
  long status() const noexcept { return status_; }
  /// S3's error code ("AccessDenied", "SignatureDoesNotMatch", "NoSuchBucket", "SlowDown", ...).
  const std::string& s3_code() const noexcept { return code_; }
  /// Whether the last failure was of a retryable kind (the tries ran out) rather than a final answer.
  bool retryable() const noexcept { return retryable_; }

 private:
  long status_;
  std::string code_;
  bool retryable_;
};

/// Requests made, by kind (atomic: the client is shared by threads). Read with snapshot().
struct s3_counters {
  std::uint64_t requests = 0, retries = 0, put = 0, get = 0, head = 0, list = 0, remove = 0, multipart = 0;
  std::uint64_t bytes_up = 0, bytes_down = 0;
  friend s3_counters operator-(s3_counters a, const s3_counters& b) {
    a.requests -= b.requests, a.retries -= b.retries, a.put -= b.put, a.get -= b.get, a.head -= b.head;
    a.list -= b.list, a.remove -= b.remove, a.multipart -= b.multipart, a.bytes_up -= b.bytes_up, a.bytes_down -= b.bytes_down;
    return a;
  }
};

namespace s3_detail {

inline std::string hex(const unsigned char* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) out[2 * i] = digits[p[i] >> 4], out[2 * i + 1] = digits[p[i] & 15];
  return out;
}

/// Digest of `b` with an OpenSSL EVP algorithm (EVP_sha256(), EVP_md5()).
inline std::vector<unsigned char> digest(const EVP_MD* md, std::span<const std::byte> b) {
  std::vector<unsigned char> out(EVP_MAX_MD_SIZE);
  unsigned n = 0;
  if (EVP_Digest(b.data(), b.size(), out.data(), &n, md, nullptr) != 1) throw error(errc::io, "OpenSSL digest failed");
  out.resize(n);
  return out;
}

inline std::string sha256_hex(std::span<const std::byte> b) {
  const auto d = digest(EVP_sha256(), b);
  return hex(d.data(), d.size());
}

/// S3's XML error body: (Code, Message); empty strings when the body is not one.
inline std::pair<std::string, std::string> parse_error(std::string_view body) {
  pugi::xml_document doc;
  if (body.empty() || !doc.load_buffer(body.data(), body.size())) return {};
  const pugi::xml_node e = doc.child("Error");
  if (!e) return {};
  return {e.child_value("Code"), e.child_value("Message")};
}

inline bool retryable_status(long status, const std::string& code) {
  if (code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" || code == "ServiceUnavailable") return true;
  return status >= 500 || status == 429 || status == 408;
}

}  // namespace s3_detail

/// One S3 call: what to send and which answers are not errors. Built fluently:
///   s3_call::make("GetObject", "GET", key).answer(404, "NoSuchKey")
struct s3_call {
  const char* op = "GetObject";                             // names the request in errors and counters
  std::string method = "GET";
  std::string key;                                          // object key under the prefix; empty: the bucket
  bool bucket_key = false;                                  // `key` is a full bucket key (no prefix added)
  std::vector<std::pair<std::string, std::string>> query;   // canonicalized by the client
  std::vector<std::string> headers;                         // "name: value" (signed)
  std::span<const std::byte> body;
  std::string range;                                        // "a-b" or "-n"
  /// HTTP statuses that are answers, not errors (e.g. 404 for a GET that may find nothing), with
  /// the S3 codes that qualify them (empty: any code).
  std::vector<std::pair<long, std::string>> answers;
  /// The operation may answer HTTP 200 with an <Error> body (CompleteMultipartUpload does).
  bool error_in_200 = false;

  static s3_call make(const char* op, std::string method, std::string key = {}) {
    s3_call c;
    c.op = op;
    c.method = std::move(method);
    c.key = std::move(key);
    return c;
  }
  s3_call& param(std::string k, std::string v) { return query.emplace_back(std::move(k), std::move(v)), *this; }
  s3_call& header(std::string line) { return headers.push_back(std::move(line)), *this; }
  s3_call& with_body(std::span<const std::byte> b) { return body = b, *this; }
  s3_call& bytes(std::string r) { return range = std::move(r), *this; }
  s3_call& answer(long status, std::string code = {}) { return answers.emplace_back(status, std::move(code)), *this; }
  s3_call& whole_key() { return bucket_key = true, *this; }
  s3_call& errors_in_200() { return error_in_200 = true, *this; }
};

class s3_client {
 public:
  explicit s3_client(s3_options o) : s_(std::make_shared<state>()) {
    if (o.bucket.empty()) throw error(errc::invalid_argument, "S3: no bucket given", {.file = {}, .tensor = {}, .field = "bucket"});
    if (o.region.empty()) {
      for (const char* n : {"AWS_REGION", "AWS_DEFAULT_REGION"})
        if (const char* v = std::getenv(n); v && *v) {
          o.region = v;
          break;
        }
      if (o.region.empty()) o.region = "us-east-1";
    }
    if (!o.credentials) o.credentials = s3_credentials::from_environment();
    if (o.credentials->access_key.empty() || o.credentials->secret_key.empty())
      throw error(errc::invalid_argument,
                  "S3: no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or s3_options::credentials)",
                  {.file = {}, .tensor = {}, .field = "credentials"});
    if (o.endpoint.empty()) o.endpoint = "https://s3." + o.region + ".amazonaws.com";
    while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
    if (o.endpoint.rfind("http://", 0) != 0 && o.endpoint.rfind("https://", 0) != 0)
      throw error(errc::invalid_argument, "S3 endpoint must start with http:// or https://", {.file = o.endpoint, .tensor = {}, .field = "endpoint"});
    if (o.part_size < 1 || o.parallel_parts < 1 || o.list_page < 1 || o.retry.max_attempts < 1)
      throw error(errc::invalid_argument, "S3: part_size, parallel_parts, list_page and retry.max_attempts must be positive",
                  {.file = {}, .tensor = {}, .field = "s3_options"});
    s_->opt = std::move(o);
  }

  const s3_options& options() const noexcept { return s_->opt; }

  /// "s3://bucket/prefix+key": how errors name an object.
  std::string where(const std::string& key, bool bucket_key = false) const {
    return "s3://" + s_->opt.bucket + "/" + (bucket_key ? key : s_->opt.prefix + key);
  }
  /// The key inside the bucket.
  std::string bucket_key(const std::string& key) const { return s_->opt.prefix + key; }

  /// Sends `c`, retrying what retrying can fix. Returns the response (2xx, or one of c.answers).
  /// @throws s3_error naming the request when it failed for good.
  http::response call(const s3_call& c) const {
    const s3_options& o = s_->opt;
    http::request q;
    q.method = c.method;
    q.url = url(c);
    q.headers = c.headers;
    q.body = c.body;
    q.range = c.range;
    q.aws_sigv4 = "aws:amz:" + o.region + ":s3";
    q.userpwd = o.credentials->access_key + ":" + o.credentials->secret_key;
    q.connect_timeout = o.connect_timeout;
    q.stall_timeout = o.stall_timeout;
    q.headers.push_back("x-amz-content-sha256: " + (o.sign_payload ? s3_detail::sha256_hex(c.body) : std::string("UNSIGNED-PAYLOAD")));
    if (!o.credentials->session_token.empty()) q.headers.push_back("x-amz-security-token: " + o.credentials->session_token);
    count(c);
    const std::string what = std::string("S3 ") + c.op + " " + where(c.key, c.bucket_key);
    for (std::uint32_t attempt = 1;; ++attempt) {
      s_->n.requests++;
      s_->n.bytes_up += c.body.size();
      http::response r = s_->http.perform(q);
      s_->n.bytes_down += r.body.size();
      std::string code, message;
      bool retry = false;
      if (r.failed != http::failure::none) {
        retry = true;
        message = std::string(http::to_string(r.failed)) + ": " + r.error;
      } else {
        const bool ok = r.status >= 200 && r.status < 300;
        if (!ok || (c.error_in_200 && r.text().find("<Error>") != std::string_view::npos)) std::tie(code, message) = s3_detail::parse_error(r.text());
        for (const auto& [status, answer_code] : c.answers)
          if (r.status == status && (answer_code.empty() || answer_code == code)) return r;
        if (ok && code.empty()) return r;
        retry = s3_detail::retryable_status(ok ? 500 : r.status, code);
        if (message.empty()) message = std::string(r.text().substr(0, 200));
      }
      if (!retry || attempt >= o.retry.max_attempts) {
        std::string m = what + ": ";
        m += r.status ? "HTTP " + std::to_string(r.status) + (code.empty() ? "" : " " + code) : std::string("no response");
        if (!message.empty()) m += ": " + message;
        if (retry) m += " (gave up after " + std::to_string(attempt) + " tries)";
        throw s3_error(m, where(c.key, c.bucket_key), r.status, code, retry);
      }
      s_->n.retries++;
      std::this_thread::sleep_for(backoff(attempt));
    }
  }

  s3_counters counters() const {
    const auto& n = s_->n;
    return {n.requests.load(), n.retries.load(), n.put.load(),      n.get.load(),      n.head.load(),
            n.list.load(),     n.remove.load(),  n.multipart.load(), n.bytes_up.load(), n.bytes_down.load()};
  }

 private:
  struct atomic_counters {
    std::atomic<std::uint64_t> requests{0}, retries{0}, put{0}, get{0}, head{0}, list{0}, remove{0}, multipart{0};
    std::atomic<std::uint64_t> bytes_up{0}, bytes_down{0};
  };
  struct state {
    s3_options opt;
    http::client http;
    atomic_counters n;
  };

  void count(const s3_call& c) const {
    const std::string_view op = c.op;
    auto& n = s_->n;
    if (op.find("Multipart") != std::string_view::npos || op == "UploadPart") n.multipart++;
    else if (op.rfind("List", 0) == 0) n.list++;
    else if (op.rfind("Delete", 0) == 0) n.remove++;
    else if (c.method == "PUT") n.put++;
    else if (c.method == "HEAD") n.head++;
    else n.get++;
  }

  std::string url(const s3_call& c) const {
    const s3_options& o = s_->opt;
    const std::string key = c.bucket_key ? c.key : (c.key.empty() ? std::string() : o.prefix + c.key);
    std::string u;
    if (o.virtual_hosted) {
      const auto scheme_end = o.endpoint.find("://") + 3;
      u = o.endpoint.substr(0, scheme_end) + o.bucket + "." + o.endpoint.substr(scheme_end) + "/" + http::uri_encode(key, true);
    } else {
      u = o.endpoint + "/" + o.bucket + (key.empty() ? std::string() : "/" + http::uri_encode(key, true));
    }
    if (c.query.empty()) return u;
    std::vector<std::pair<std::string, std::string>> q;
    for (const auto& [k, v] : c.query) q.emplace_back(http::uri_encode(k, false), http::uri_encode(v, false));
    std::sort(q.begin(), q.end());
    char sep = '?';
    for (const auto& [k, v] : q) {
      u += sep + k + "=" + v;
      sep = '&';
    }
    return u;
  }

  std::chrono::milliseconds backoff(std::uint32_t attempt) const {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    const auto& p = s_->opt.retry;
    const double cap = std::min<double>(double(p.max_delay.count()), double(p.base_delay.count()) * double(1ull << std::min(attempt - 1, 30u)));
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::uniform_real_distribution<double>(0.0, cap)(rng)));
  }

  std::shared_ptr<state> s_;
};

}  // namespace bitrefit::transport
