// bitrefit/transport/object_store.hpp — a Transport over any ObjectStore (a directory, S3, ...).
//
// Object layout (keys derived only from ids, so any process can find them):
//   payloads/<stream>/<owner:08x>.<seq:08x>   one payload frame (stream = attempt or restore)
//   control/<mailbox>/<time:016x>-<sender>-<n:08x>   one control message
// A store with remove_prefix(prefix) (s3_store) discards a stream with it: batched deletes, and
// no incomplete multipart upload of the stream survives.
// Receivers poll: receive() lists the mailbox, reads and removes what it found, and otherwise
// sleeps with an interval that doubles from 1 ms up to `max_poll_interval`, never past `wait`.
#pragma once

#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/transport/directory_store.hpp"

namespace bitrefit::transport {

struct object_store_transport_options {
  std::chrono::milliseconds max_poll_interval{20};
};

template <ObjectStore Store>
class object_store_transport {
 public:
  using options = object_store_transport_options;

  explicit object_store_transport(Store store, options o = {}) : store_(std::move(store)), opt_(o) {
    std::random_device rd;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
    sender_tag_ = buf;
  }

  void publish(const frame_key& k, std::span<const std::byte> b) { store_.put(object_key(k), b); }

  std::vector<frame_key> list(const stream_key& s) {
    const std::string prefix = "payloads/" + s.name + "/";
    std::vector<frame_key> out;
    for (const std::string& key : store_.list(prefix)) {
      // exactly frame_object_name's spelling (8 hex digits '.' 8 hex digits); anything else in the
      // stream's directory is not a frame (sscanf would also take signs and spaces)
      const std::string_view name = std::string_view(key).substr(prefix.size());
      std::uint32_t owner = 0, seq = 0;
      auto hex8 = [](std::string_view t, std::uint32_t& v) {
        const auto r = std::from_chars(t.data(), t.data() + t.size(), v, 16);
        return t.size() == 8 && std::isxdigit(static_cast<unsigned char>(t[0])) && r.ec == std::errc{} && r.ptr == t.data() + t.size();
      };
      if (name.size() == 17 && name[8] == '.' && hex8(name.substr(0, 8), owner) && hex8(name.substr(9), seq))
        out.push_back({s, owner, seq});
    }
    return out;  // byte-wise key order == (owner, seq) order thanks to fixed-width hex
  }

  std::optional<bytes> fetch(const frame_key& k) { return store_.get(object_key(k)); }

  void discard(const stream_key& s) {
    const std::string prefix = "payloads/" + s.name + "/";
    if constexpr (requires { store_.remove_prefix(prefix); }) {
      store_.remove_prefix(prefix);  // a store that deletes in batches (S3: and aborts stray uploads)
      return;
    }
    for (const std::string& key : store_.list(prefix)) store_.remove(key);
    if constexpr (requires { store_.prune(std::string()); }) store_.prune("payloads/" + s.name);
  }

  void post(const std::string& mailbox, std::span<const std::byte> b) {
    const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
    char name[96];
    std::snprintf(name, sizeof name, "%016llx-%s-%08x", static_cast<unsigned long long>(now), sender_tag_.c_str(),
                  counter_++);
    store_.put("control/" + mailbox + "/" + name, b);
  }

  std::vector<bytes> receive(const std::string& mailbox, std::chrono::milliseconds wait) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    auto interval = std::chrono::milliseconds(1);
    const std::string prefix = "control/" + mailbox + "/";
    for (;;) {
      std::vector<bytes> out;
      for (const std::string& key : store_.list(prefix)) {
        if (key.find('/', prefix.size()) != std::string::npos) continue;  // a sub-mailbox, not ours
        try {
          if (auto b = store_.get(key)) out.push_back(std::move(*b));
        } catch (const error&) {
          // unreadable or above the store's size limit: not a message (a lost one, as far as the
          // protocol is concerned); removed below like any message taken
        }
        store_.remove(key);
      }
      const auto now = std::chrono::steady_clock::now();
      if (!out.empty() || now >= deadline) return out;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(interval, deadline - now));
      interval = std::min(interval * 2, opt_.max_poll_interval);
    }
  }

  Store& store() { return store_; }

 private:
  static std::string object_key(const frame_key& k) {
    return "payloads/" + k.stream.name + "/" + frame_object_name(k.owner, k.seq);
  }

  Store store_;
  options opt_;
  std::string sender_tag_;
  std::uint32_t counter_ = 0;
};

/// The embedded default: an object store transport over a directory.
using directory_transport = object_store_transport<directory_store>;

static_assert(Transport<directory_transport>);

}  // namespace bitrefit::transport
