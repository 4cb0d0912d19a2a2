// bitrefit/transport/s3_store.hpp — an ObjectStore on S3 (or any S3-compatible server), and the
// object-store transport over it: the cross-cluster path for payload frames.
//
// What the ObjectStore laws need, and how S3 gives it:
//  - put is atomic: S3 makes an object visible only when its PUT (or CompleteMultipartUpload)
//    succeeded, whole; a reader sees the old object, nothing, or the new one.
//  - list(prefix) returns every visible key, sorted byte-wise: ListObjectsV2 returns keys in UTF-8
//    binary order, page by page (continuation tokens) — all pages are read.
//  - remove of an absent key is a no-op: DeleteObject answers 204 either way.
// Streaming: the engine publishes each frame the moment it is encoded (refit/sender.hpp); a frame
// above options().part_size goes up as a multipart upload whose parts run in parallel, at most
// options().parallel_parts at once. open() streams an object of unknown size (a baseline image)
// with memory bounded by the parts in flight.
// Cleanup: remove_prefix() deletes a stream's objects in batches of 1000 (DeleteObjects) and aborts
// every incomplete multipart upload under the prefix, so an upload abandoned by a crashed sender is
// gone once the transport discards that attempt's stream (the next coordinator's cleanup of it).
// Ranged reads: get_range(key, offset, length) and get_tail(key, n).
#pragma once

#include <pugixml.hpp>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/transport/object_store.hpp"
#include "bitrefit/transport/s3_client.hpp"

namespace bitrefit::transport {

/// A listed object.
struct s3_object_info {
  std::string key;  // under the store's prefix (the prefix removed)
  std::uint64_t size = 0;
};

/// A multipart upload that was started and neither completed nor aborted.
struct s3_upload_info {
  std::string key;  // under the store's prefix
  std::string upload_id;
};

namespace s3_detail {

inline std::string xml_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += ch;
    }
  }
  return out;
}

inline pugi::xml_document parse_xml(const http::response& r, const std::string& what) {
  pugi::xml_document doc;
  if (!doc.load_buffer(r.body.data(), r.body.size()))
    throw error(errc::format, "S3 answer is not XML", {.file = what, .tensor = {}, .field = "body"});
  return doc;
}

inline std::span<const std::byte> as_bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

}  // namespace s3_detail

/// One multipart upload: parts go up on at most `parallel` worker threads (each with its own
/// connection); add_part blocks while that many parts are queued or in flight, so the memory a
/// streaming writer holds is bounded. Not completed -> aborted by the destructor (best effort).
class s3_multipart_upload {
 public:
  s3_multipart_upload(const s3_client& c, std::string key) : c_(c), key_(std::move(key)) {
    const auto r = c_.call(s3_call::make("CreateMultipartUpload", "POST", key_).param("uploads", ""));
    upload_id_ = s3_detail::parse_xml(r, c_.where(key_)).child("InitiateMultipartUploadResult").child_value("UploadId");
    if (upload_id_.empty())
      throw error(errc::format, "S3 CreateMultipartUpload answered without an UploadId", {.file = c_.where(key_), .tensor = {}, .field = "UploadId"});
  }
  s3_multipart_upload(const s3_multipart_upload&) = delete;
  ~s3_multipart_upload() {
    stop_workers();
    if (!completed_) abort();
  }

  /// Queues part `number` (1-based, increasing). A `view` must stay valid until complete();
  /// `owned` bytes are kept here until their part is up. Rethrows a failed part's error.
  void add_part(std::uint32_t number, std::span<const std::byte> view, std::vector<std::byte> owned = {}) {
    std::unique_lock lock(mu_);
    if (failure_) std::rethrow_exception(failure_);
    if (workers_.size() < c_.options().parallel_parts) workers_.emplace_back([this] { work(); });
    space_.wait(lock, [&] { return queued_.size() + busy_ < c_.options().parallel_parts || failure_; });
    if (failure_) std::rethrow_exception(failure_);
    part p{number, view, std::move(owned)};
    if (!p.owned.empty()) p.view = p.owned;
    queued_.push_back(std::move(p));
    etags_[number];  // reserve its slot: complete() lists every part in order
    ready_.notify_one();
  }

  /// Waits for every part, then completes the upload (the object appears whole, atomically).
  void complete() {
    {
      std::unique_lock lock(mu_);
      space_.wait(lock, [&] { return (queued_.empty() && busy_ == 0) || failure_; });
      if (failure_) std::rethrow_exception(failure_);
    }
    stop_workers();
    std::string xml = "<CompleteMultipartUpload>";
    for (const auto& [n, etag] : etags_) xml += "<Part><PartNumber>" + std::to_string(n) + "</PartNumber><ETag>" + s3_detail::xml_escape(etag) + "</ETag></Part>";
    xml += "</CompleteMultipartUpload>";
    const auto r = c_.call(s3_call::make("CompleteMultipartUpload", "POST", key_)
                               .param("uploadId", upload_id_)
                               .header("content-type: application/xml")
                               .with_body(s3_detail::as_bytes(xml))
                               .answer(404, "NoSuchUpload")
                               .errors_in_200());
    if (r.status == 404) {
      // A retried Complete whose first try succeeded (its answer was lost) finds no upload: the
      // object must then be there with the multipart ETag these very parts give.
      const auto head = c_.call(s3_call::make("HeadObject", "HEAD", key_).answer(404));
      if (head.status != 200 || unquote(head.header("etag")) != multipart_etag())
        throw s3_error("S3 CompleteMultipartUpload " + c_.where(key_) + ": the upload vanished and the object is not this upload's",
                       c_.where(key_), 404, "NoSuchUpload", false);
    }
    completed_ = true;
  }

  /// Aborts the upload (S3 frees its parts). Best effort: a failure here leaves it for the
  /// cleanup of the stream (remove_prefix) to find.
  void abort() noexcept {
    try {
      c_.call(s3_call::make("AbortMultipartUpload", "DELETE", key_).param("uploadId", upload_id_).answer(404));
    } catch (...) {
    }
    completed_ = true;
  }

  const std::string& upload_id() const noexcept { return upload_id_; }

 private:
  struct part {
    std::uint32_t number = 0;
    std::span<const std::byte> view;
    std::vector<std::byte> owned;
  };

  static std::string unquote(std::string s) {
    if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
    return s;
  }

  /// S3's ETag of a completed multipart object: MD5 of the parts' binary MD5s, "-", part count.
  std::string multipart_etag() const {
    std::vector<std::byte> md5s;
    for (const auto& [n, etag] : etags_) {
      const std::string h = unquote(etag);
      for (std::size_t i = 0; i + 1 < h.size(); i += 2) md5s.push_back(static_cast<std::byte>(std::stoi(h.substr(i, 2), nullptr, 16)));
    }
    const auto d = s3_detail::digest(EVP_md5(), md5s);
    return s3_detail::hex(d.data(), d.size()) + "-" + std::to_string(etags_.size());
  }

  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      ready_.wait(lock, [&] { return !queued_.empty() || stopping_; });
      if (queued_.empty()) return;
      part p = std::move(queued_.front());
      queued_.pop_front();
      ++busy_;
      lock.unlock();
      std::string etag;
      std::exception_ptr failed;
      try {
        etag = c_.call(s3_call::make("UploadPart", "PUT", key_)
                           .param("partNumber", std::to_string(p.number))
                           .param("uploadId", upload_id_)
                           .with_body(p.view))
                   .header("etag");
        if (etag.empty()) throw error(errc::format, "S3 UploadPart answered without an ETag", {.file = c_.where(key_), .tensor = {}, .field = "ETag"});
      } catch (...) {
        failed = std::current_exception();
      }
      p.owned.clear();
      p.owned.shrink_to_fit();
      lock.lock();
      --busy_;
      if (failed && !failure_) failure_ = failed;
      if (!failed) etags_[p.number] = etag;
      space_.notify_all();
    }
  }

  void stop_workers() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      if (failure_) queued_.clear();
    }
    ready_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    std::lock_guard lock(mu_);
    stopping_ = false;
  }

  const s3_client& c_;
  std::string key_;
  std::string upload_id_;
  bool completed_ = false;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::deque<part> queued_;
  std::size_t busy_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::map<std::uint32_t, std::string> etags_;
  std::vector<std::thread> workers_;
};

class s3_store {
 public:
  using options = s3_options;

  explicit s3_store(s3_options o) : c_(std::move(o)) {}

  /// Writes `b` under `key`: one PUT up to part_size, a parallel multipart upload above.
  void put(const std::string& key, std::span<const std::byte> b) {
    check_key(key);
    const std::size_t part = c_.options().part_size;
    if (b.size() <= part) {
      c_.call(s3_call::make("PutObject", "PUT", key).with_body(b));
      return;
    }
    s3_multipart_upload up(c_, key);
    std::uint32_t n = 1;
    for (std::size_t at = 0; at < b.size(); at += part, ++n) up.add_part(n, b.subspan(at, std::min(part, b.size() - at)));
    up.complete();
  }

  /// The whole object; nullopt when there is none (404 NoSuchKey).
  std::optional<bytes> get(const std::string& key) {
    check_key(key);
    auto r = c_.call(s3_call::make("GetObject", "GET", key).answer(404, "NoSuchKey"));
    if (r.status == 404) return std::nullopt;
    return std::move(r.body);
  }

  /// `length` bytes from `offset` (fewer at the end of the object); nullopt when it is absent.
  std::optional<bytes> get_range(const std::string& key, std::uint64_t offset, std::uint64_t length) {
    check_key(key);
    if (length == 0) {
      if (!get_tail(key, 0)) return std::nullopt;
      return bytes{};
    }
    auto r = c_.call(s3_call::make("GetObject(range)", "GET", key)
                         .bytes(std::to_string(offset) + "-" + std::to_string(offset + length - 1))
                         .answer(404, "NoSuchKey")
                         .answer(416));
    if (r.status == 404) return std::nullopt;
    if (r.status == 416) return bytes{};  // the range starts past the end
    return std::move(r.body);
  }

  /// The last min(n, size) bytes of the object (a suffix range); nullopt when it is absent.
  std::optional<bytes> get_tail(const std::string& key, std::uint64_t n) {
    check_key(key);
    if (n == 0) {  // a zero-length suffix range is invalid HTTP: ask whether the object exists
      const auto r = c_.call(s3_call::make("HeadObject", "HEAD", key).answer(404));
      if (r.status == 404) return std::nullopt;
      return bytes{};
    }
    auto r = c_.call(s3_call::make("GetObject(range)", "GET", key).bytes("-" + std::to_string(n)).answer(404, "NoSuchKey").answer(416));
    if (r.status == 404) return std::nullopt;
    if (r.status == 416) return bytes{};  // an empty object
    if (r.body.size() > n) r.body.erase(r.body.begin(), r.body.end() - static_cast<std::ptrdiff_t>(n));  // a server that ignored the range
    return std::move(r.body);
  }

  /// Every key starting with `prefix`, sorted byte-wise (all pages).
  std::vector<std::string> list(const std::string& prefix) {
    std::vector<std::string> out;
    for (auto& o : list_objects(prefix)) out.push_back(std::move(o.key));
    return out;
  }

  /// Every object under `prefix` with its size, sorted byte-wise by key (all pages).
  std::vector<s3_object_info> list_objects(const std::string& prefix) {
    std::vector<s3_object_info> out;
    const std::string& root = c_.options().prefix;
    std::string token;
    for (;;) {
      auto q = s3_call::make("ListObjectsV2", "GET").param("list-type", "2").param("prefix", root + prefix);
      q.param("max-keys", std::to_string(c_.options().list_page));
      if (!token.empty()) q.param("continuation-token", token);
      const auto r = c_.call(q);
      const auto doc = s3_detail::parse_xml(r, c_.where(prefix));
      const pugi::xml_node res = doc.child("ListBucketResult");
      for (pugi::xml_node o : res.children("Contents")) {
        const std::string key = o.child_value("Key");
        if (key.rfind(root, 0) != 0) continue;
        out.push_back({key.substr(root.size()), std::strtoull(o.child_value("Size"), nullptr, 10)});
      }
      token = res.child_value("NextContinuationToken");
      if (std::string_view(res.child_value("IsTruncated")) != "true" || token.empty()) break;
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
    return out;
  }

  void remove(const std::string& key) {
    check_key(key);
    c_.call(s3_call::make("DeleteObject", "DELETE", key).answer(404));
  }

  /// Deletes every object under `prefix` (DeleteObjects, 1000 keys a request) and aborts every
  /// incomplete multipart upload there. Idempotent.
  void remove_prefix(const std::string& prefix) {
    for (const auto& u : incomplete_uploads(prefix)) {
      c_.call(s3_call::make("AbortMultipartUpload", "DELETE", u.key).param("uploadId", u.upload_id).answer(404));
    }
    remove_keys(list(prefix));
  }

  /// Deletes these keys (DeleteObjects, 1000 keys a request); absent keys are no error.
  void remove_keys(const std::vector<std::string>& keys) {
    const std::string prefix = keys.empty() ? std::string() : keys.front();
    for (std::size_t at = 0; at < keys.size(); at += 1000) {
      std::string xml = "<Delete><Quiet>true</Quiet>";
      for (std::size_t i = at; i < std::min(keys.size(), at + 1000); ++i)
        xml += "<Object><Key>" + s3_detail::xml_escape(c_.bucket_key(keys[i])) + "</Key></Object>";
      xml += "</Delete>";
      const auto body = s3_detail::as_bytes(xml);
      const auto md5 = s3_detail::digest(EVP_md5(), body);
      const auto r = c_.call(s3_call::make("DeleteObjects", "POST")
                                 .param("delete", "")
                                 .header("content-md5: " + http::base64_encode(std::as_bytes(std::span(md5))))
                                 .header("content-type: application/xml")
                                 .with_body(body));
      const auto doc = s3_detail::parse_xml(r, c_.where(prefix));
      if (const pugi::xml_node e = doc.child("DeleteResult").child("Error"))
        throw s3_error(std::string("S3 DeleteObjects ") + c_.where(prefix) + ": " + e.child_value("Key") + ": " + e.child_value("Code") +
                           ": " + e.child_value("Message"),
                       c_.where(e.child_value("Key"), true), 200, e.child_value("Code"), false);
    }
  }

  /// Multipart uploads under `prefix` that were neither completed nor aborted (all pages).
  std::vector<s3_upload_info> incomplete_uploads(const std::string& prefix) {
    std::vector<s3_upload_info> out;
    const std::string& root = c_.options().prefix;
    std::string key_marker, id_marker;
    for (;;) {
      auto q = s3_call::make("ListMultipartUploads", "GET").param("uploads", "").param("prefix", root + prefix);
      if (!key_marker.empty()) q.param("key-marker", key_marker);
      if (!id_marker.empty()) q.param("upload-id-marker", id_marker);
      const auto r = c_.call(q);
      const auto doc = s3_detail::parse_xml(r, c_.where(prefix));
      const pugi::xml_node res = doc.child("ListMultipartUploadsResult");
      for (pugi::xml_node u : res.children("Upload")) {
        const std::string key = u.child_value("Key");
        if (key.rfind(root, 0) == 0) out.push_back({key.substr(root.size()), u.child_value("UploadId")});
      }
      key_marker = res.child_value("NextKeyMarker");
      id_marker = res.child_value("NextUploadIdMarker");
      if (std::string_view(res.child_value("IsTruncated")) != "true" || key_marker.empty()) break;
    }
    return out;
  }

  /// Creates the bucket (idempotent: a bucket this account already owns is fine). Deployments
  /// usually create buckets out of band; tests and the demo create theirs here.
  void create_bucket() {
    const auto& o = c_.options();
    std::string xml;
    if (o.region != "us-east-1")
      xml = "<CreateBucketConfiguration><LocationConstraint>" + s3_detail::xml_escape(o.region) + "</LocationConstraint></CreateBucketConfiguration>";
    c_.call(s3_call::make("CreateBucket", "PUT").whole_key().with_body(s3_detail::as_bytes(xml)).answer(409, "BucketAlreadyOwnedByYou"));
  }

  /// Streams one object of unknown size: write() as often as needed, then commit(). Up to
  /// part_size it is one PUT at commit; beyond, parts go up while the caller writes (at most
  /// parallel_parts parts of memory). Destroyed without commit(): nothing appears under the key
  /// and a started multipart upload is aborted.
  class writer {
   public:
    writer(const s3_client& c, std::string key) : c_(c), key_(std::move(key)) {}
    writer(writer&&) = default;
    void write(std::span<const std::byte> b) {
      const std::size_t part = c_.options().part_size;
      while (!b.empty()) {
        const std::size_t k = std::min(b.size(), part - buf_.size());
        buf_.insert(buf_.end(), b.begin(), b.begin() + static_cast<std::ptrdiff_t>(k));
        b = b.subspan(k);
        if (buf_.size() == part && !b.empty()) flush_part();
      }
    }
    void operator()(std::span<const std::byte> b) { write(b); }
    void commit() {
      if (!up_) {
        c_.call(s3_call::make("PutObject", "PUT", key_).with_body(buf_));
      } else {
        if (!buf_.empty()) flush_part();
        up_->complete();
      }
      buf_.clear();
    }

   private:
    void flush_part() {
      if (!up_) up_ = std::make_unique<s3_multipart_upload>(c_, key_);
      up_->add_part(next_++, {}, std::move(buf_));
      buf_ = {};
      buf_.reserve(c_.options().part_size);
    }
    const s3_client& c_;
    std::string key_;
    std::vector<std::byte> buf_;
    std::unique_ptr<s3_multipart_upload> up_;
    std::uint32_t next_ = 1;
  };

  writer open(const std::string& key) {
    check_key(key);
    return writer(c_, key);
  }

  s3_client& client() noexcept { return c_; }
  const s3_client& client() const noexcept { return c_; }
  s3_counters counters() const { return c_.counters(); }

 private:
  static void check_key(const std::string& key) {
    if (key.empty() || key.size() > 900)
      throw error(errc::invalid_argument, "S3 object key must be 1..900 bytes", {.file = key, .tensor = {}, .field = "key"});
  }

  s3_client c_;
};

static_assert(ObjectStore<s3_store>);

/// Payload frames and control messages on S3: the object-store transport over s3_store.
using s3_transport = object_store_transport<s3_store>;

static_assert(Transport<s3_transport>);

}  // namespace bitrefit::transport
