// bitrefit/transport/relay/framing.hpp — the bytes of one relay link, after TLS.
//
// Every message is a 12-byte header and a body (all integers little-endian):
//   u8 magic 0xB7 | u8 type | u16 reserved (0) | u32 channel | u32 body length
// `channel` numbers a frame transfer on this link (frame_begin/block/abort), 0 otherwise. Bodies:
//   hello        u16 version, str cluster, u8 role, str name, str listen host, u16 listen port,
//                u32 subtree size, strs mailboxes, inventory (the complete frames held)
//   welcome      endpoints ancestors (root first, excluding the parent), strs tombstones
//   redirect     endpoint, str why          refuse   str why
//   frame_begin  key, u64 size              frame_block  raw bytes (the next piece of the frame)
//   frame_abort  (empty)                    control  u32 n, n x (str mailbox, blob message)
//   discard      str stream                 want / missing   key
//   routes       u32 subtree size, strs mailboxes            ping / pong  u64 nonce
// where str = u32 length + bytes, strs = u32 count + strs, key = str stream + u32 owner + u32 seq,
// blob = u32 length + bytes, endpoint = str host + u16 port, endpoints = u32 count + endpoints,
// inventory = u32 streams, each: str stream + u32 count + count x (u32 owner, u32 seq).
//
// The decoder is a pure function of the bytes it is fed (no I/O, no clock), so it can be fuzzed
// (tests/fuzz/fuzz_relay_framing.cpp). It rejects, naming the reason: a wrong magic or reserved
// field, an unknown type, a length above the limit for its type (checked from the header alone,
// before any body byte is buffered: an oversized length field costs nothing), a truncated or
// over-long body, names outside their character set, and counts that the body cannot hold.
// Payload frame bytes are opaque here: their digest is checked by the receiving engine.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/transport/relay/options.hpp"

namespace bitrefit::transport::relay::framing {

inline constexpr std::uint8_t magic = 0xB7;
inline constexpr std::uint16_t link_version = 1;
inline constexpr std::size_t header_size = 12;
/// Hard ceilings, whatever the options say: a block above 4 MiB or a message above 64 MiB is
/// never buffered.
inline constexpr std::size_t max_block_bytes = 4 << 20;
inline constexpr std::size_t max_message_bytes = 64 << 20;
/// Messages without lists (begin, want, redirect, ...) are small.
inline constexpr std::size_t max_small_bytes = 4 << 10;

enum class type : std::uint8_t {
  hello = 1,
  welcome = 2,
  redirect = 3,
  refuse = 4,
  frame_begin = 5,
  frame_block = 6,
  frame_abort = 7,
  control = 8,
  discard = 9,
  want = 10,
  missing = 11,
  routes = 12,
  ping = 13,
  pong = 14,
};

constexpr std::string_view to_string(type t) {
  switch (t) {
    case type::hello: return "hello";
    case type::welcome: return "welcome";
    case type::redirect: return "redirect";
    case type::refuse: return "refuse";
    case type::frame_begin: return "frame_begin";
    case type::frame_block: return "frame_block";
    case type::frame_abort: return "frame_abort";
    case type::control: return "control";
    case type::discard: return "discard";
    case type::want: return "want";
    case type::missing: return "missing";
    case type::routes: return "routes";
    case type::ping: return "ping";
    case type::pong: return "pong";
  }
  return "unknown";
}

struct hello {
  std::uint16_t version = link_version;
  std::string cluster;
  node_role role = node_role::member;
  std::string name;
  endpoint_spec listen;  // port 0: accepts no children (owners)
  std::uint32_t subtree = 1;
  std::vector<std::string> mailboxes;  // served in this node's subtree
  std::vector<frame_key> inventory;    // complete frames it holds (a rejoin gets only the rest)
  friend bool operator==(const hello&, const hello&) = default;
};
struct welcome {
  std::vector<endpoint_spec> ancestors;  // root first; the parent itself is the connected address
  std::vector<std::string> tombstones;   // streams discarded recently: drop them if held
  friend bool operator==(const welcome&, const welcome&) = default;
};
struct redirect {
  endpoint_spec to;
  std::string why;
  friend bool operator==(const redirect&, const redirect&) = default;
};
struct refuse {
  std::string why;
  friend bool operator==(const refuse&, const refuse&) = default;
};
struct frame_begin {
  frame_key key;
  std::uint64_t size = 0;
  friend bool operator==(const frame_begin&, const frame_begin&) = default;
};
struct frame_block {
  std::vector<std::byte> data;
  friend bool operator==(const frame_block&, const frame_block&) = default;
};
struct frame_abort {
  friend bool operator==(const frame_abort&, const frame_abort&) = default;
};
struct control_item {
  std::string mailbox;
  std::vector<std::byte> message;
  friend bool operator==(const control_item&, const control_item&) = default;
};
struct control {
  std::vector<control_item> items;
  friend bool operator==(const control&, const control&) = default;
};
struct discard {
  std::string stream;
  friend bool operator==(const discard&, const discard&) = default;
};
struct want {
  frame_key key;
  friend bool operator==(const want&, const want&) = default;
};
struct missing {
  frame_key key;
  friend bool operator==(const missing&, const missing&) = default;
};
struct routes {
  std::uint32_t subtree = 1;
  std::vector<std::string> mailboxes;
  friend bool operator==(const routes&, const routes&) = default;
};
struct ping {
  std::uint64_t nonce = 0;
  friend bool operator==(const ping&, const ping&) = default;
};
struct pong {
  std::uint64_t nonce = 0;
  friend bool operator==(const pong&, const pong&) = default;
};

using message = std::variant<hello, welcome, redirect, refuse, frame_begin, frame_block, frame_abort, control, discard, want,
                             missing, routes, ping, pong>;

/// The wire type of each alternative (same order as the variant).
constexpr type type_of(const message& m) { return static_cast<type>(m.index() + 1); }

/// One decoded message and the transfer channel it names.
struct decoded {
  std::uint32_t channel = 0;
  message msg;
};

enum class reason : std::uint8_t {
  bad_magic,
  bad_reserved,
  unknown_type,
  too_long,
  truncated,
  trailing_bytes,
  bad_name,
  bad_value,
};

constexpr std::string_view to_string(reason r) {
  switch (r) {
    case reason::bad_magic: return "bad magic";
    case reason::bad_reserved: return "reserved field not zero";
    case reason::unknown_type: return "unknown message type";
    case reason::too_long: return "length field above the limit";
    case reason::truncated: return "body shorter than its fields";
    case reason::trailing_bytes: return "bytes after the last field";
    case reason::bad_name: return "name outside its character set or length";
    case reason::bad_value: return "field value out of range";
  }
  return "?";
}

struct error_info {
  reason code = reason::bad_value;
  std::string detail;
  std::string to_string() const { return std::string(framing::to_string(code)) + (detail.empty() ? "" : ": " + detail); }
};

/// Per-type length limits of the decoder (what a peer may make this node buffer).
struct limits {
  std::size_t max_block = max_block_bytes;
  std::size_t max_control = 16 << 20;  // control batches, hello, welcome, routes
  static limits from(const node_options& o) {
    limits l;
    l.max_block = std::min(max_block_bytes, std::max<std::size_t>(o.block_bytes, 1));
    l.max_control = std::min(max_message_bytes, std::max<std::size_t>(o.max_control_bytes, max_small_bytes));
    return l;
  }
  std::size_t for_type(type t) const {
    switch (t) {
      case type::frame_block: return max_block;
      case type::hello:
      case type::welcome:
      case type::control:
      case type::routes: return max_control;
      default: return max_small_bytes;
    }
  }
};

// ---- names ----------------------------------------------------------------------------------

namespace detail {
inline bool chars_ok(std::string_view s, std::size_t max, std::string_view extra, bool allow_empty = false) {
  if ((s.empty() && !allow_empty) || s.size() > max) return false;
  for (char c : s) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && extra.find(c) == std::string_view::npos) return false;
  }
  return true;
}
}  // namespace detail

/// Stream names are path components elsewhere (object stores): letters, digits, '.', '_', '-'.
inline bool valid_stream(std::string_view s) { return detail::chars_ok(s, 128, "._-"); }
inline bool valid_mailbox(std::string_view s) { return detail::chars_ok(s, 256, "._-/"); }
inline bool valid_cluster(std::string_view s) { return detail::chars_ok(s, 64, "._-"); }
inline bool valid_node_name(std::string_view s) { return detail::chars_ok(s, 128, "._-/"); }
inline bool valid_host(std::string_view s) { return detail::chars_ok(s, 255, ".:-_%", /*allow_empty=*/true); }

// ---- encoding -------------------------------------------------------------------------------

class writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v) { le(v, 2); }
  void u32(std::uint32_t v) { le(v, 4); }
  void u64(std::uint64_t v) { le(v, 8); }
  void str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  void blob(std::span<const std::byte> b) {
    u32(static_cast<std::uint32_t>(b.size()));
    out_.insert(out_.end(), b.begin(), b.end());
  }
  void strs(const std::vector<std::string>& v) {
    u32(static_cast<std::uint32_t>(v.size()));
    for (auto& s : v) str(s);
  }
  void key(const frame_key& k) {
    str(k.stream.name);
    u32(k.owner);
    u32(k.seq);
  }
  void ep(const endpoint_spec& e) {
    str(e.host);
    u16(e.port);
  }
  std::vector<std::byte>& bytes() { return out_; }

 private:
  void le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFF));
  }
  std::vector<std::byte> out_;
};

inline std::array<std::byte, header_size> header(type t, std::uint32_t channel, std::uint32_t length) {
  std::array<std::byte, header_size> h{};
  h[0] = static_cast<std::byte>(magic);
  h[1] = static_cast<std::byte>(t);
  for (int i = 0; i < 4; ++i) h[4 + i] = static_cast<std::byte>((channel >> (8 * i)) & 0xFF);
  for (int i = 0; i < 4; ++i) h[8 + i] = static_cast<std::byte>((length >> (8 * i)) & 0xFF);
  return h;
}

namespace detail {
inline void inventory(writer& w, const std::vector<frame_key>& keys) {
  // grouped by stream, in the order given (callers pass sorted keys)
  std::vector<std::pair<std::string, std::vector<std::pair<std::uint32_t, std::uint32_t>>>> groups;
  for (const auto& k : keys) {
    if (groups.empty() || groups.back().first != k.stream.name) groups.push_back({k.stream.name, {}});
    groups.back().second.push_back({k.owner, k.seq});
  }
  w.u32(static_cast<std::uint32_t>(groups.size()));
  for (auto& [s, v] : groups) {
    w.str(s);
    w.u32(static_cast<std::uint32_t>(v.size()));
    for (auto [o, q] : v) {
      w.u32(o);
      w.u32(q);
    }
  }
}

struct body_writer {
  writer& w;
  void operator()(const hello& m) const {
    w.u16(m.version);
    w.str(m.cluster);
    w.u8(static_cast<std::uint8_t>(m.role));
    w.str(m.name);
    w.ep(m.listen);
    w.u32(m.subtree);
    w.strs(m.mailboxes);
    inventory(w, m.inventory);
  }
  void operator()(const welcome& m) const {
    w.u32(static_cast<std::uint32_t>(m.ancestors.size()));
    for (auto& e : m.ancestors) w.ep(e);
    w.strs(m.tombstones);
  }
  void operator()(const redirect& m) const {
    w.ep(m.to);
    w.str(m.why);
  }
  void operator()(const refuse& m) const { w.str(m.why); }
  void operator()(const frame_begin& m) const {
    w.key(m.key);
    w.u64(m.size);
  }
  void operator()(const frame_block& m) const { w.bytes().insert(w.bytes().end(), m.data.begin(), m.data.end()); }
  void operator()(const frame_abort&) const {}
  void operator()(const control& m) const {
    w.u32(static_cast<std::uint32_t>(m.items.size()));
    for (auto& it : m.items) {
      w.str(it.mailbox);
      w.blob(it.message);
    }
  }
  void operator()(const discard& m) const { w.str(m.stream); }
  void operator()(const want& m) const { w.key(m.key); }
  void operator()(const missing& m) const { w.key(m.key); }
  void operator()(const routes& m) const {
    w.u32(m.subtree);
    w.strs(m.mailboxes);
  }
  void operator()(const ping& m) const { w.u64(m.nonce); }
  void operator()(const pong& m) const { w.u64(m.nonce); }
};
}  // namespace detail

/// Header + body of one message, contiguous. (A frame block's bytes are better sent as
/// header(type::frame_block, channel, size) followed by the block itself: no copy.)
inline std::vector<std::byte> encode(const message& m, std::uint32_t channel = 0) {
  writer w;
  w.bytes().resize(header_size);
  std::visit(detail::body_writer{w}, m);
  auto& out = w.bytes();
  const auto h = header(type_of(m), channel, static_cast<std::uint32_t>(out.size() - header_size));
  std::memcpy(out.data(), h.data(), header_size);
  return std::move(out);
}

// ---- decoding -------------------------------------------------------------------------------

/// Reads fields from one body; every read is bounds-checked and the first failure sticks.
class reader {
 public:
  explicit reader(std::span<const std::byte> b) : b_(b) {}
  bool ok() const { return !err_; }
  const std::optional<error_info>& error() const { return err_; }
  std::size_t left() const { return b_.size() - pos_; }

  std::uint8_t u8() { return static_cast<std::uint8_t>(le(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(le(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(le(4)); }
  std::uint64_t u64() { return le(8); }
  std::string str(std::string_view what) {
    const std::uint32_t n = u32();
    if (!take(n, what)) return {};
    return std::string(reinterpret_cast<const char*>(b_.data() + pos_ - n), n);
  }
  std::vector<std::byte> blob(std::string_view what) {
    const std::uint32_t n = u32();
    if (!take(n, what)) return {};
    return {b_.begin() + static_cast<std::ptrdiff_t>(pos_ - n), b_.begin() + static_cast<std::ptrdiff_t>(pos_)};
  }
  /// A count of elements that each take at least `min_each` bytes: rejected when the rest of the
  /// body cannot hold them, so a count field never drives an allocation the body does not back.
  std::uint32_t count(std::size_t min_each, std::string_view what) {
    const std::uint32_t n = u32();
    if (ok() && std::uint64_t(n) * min_each > left()) fail(reason::truncated, std::string(what) + " count " + std::to_string(n) + " exceeds the body");
    return ok() ? n : 0;
  }
  void fail(reason r, std::string detail) {
    if (!err_) err_ = error_info{r, std::move(detail)};
  }
  void finish() {
    if (ok() && left() != 0) fail(reason::trailing_bytes, std::to_string(left()) + " bytes");
  }

 private:
  bool take(std::size_t n, std::string_view what) {
    if (!ok()) return false;
    if (n > left()) {
      fail(reason::truncated, std::string(what));
      return false;
    }
    pos_ += n;
    return true;
  }
  std::uint64_t le(int n) {
    if (!take(static_cast<std::size_t>(n), "integer")) return 0;
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t(std::to_integer<std::uint8_t>(b_[pos_ - n + i])) << (8 * i);
    return v;
  }
  std::span<const std::byte> b_;
  std::size_t pos_ = 0;
  std::optional<error_info> err_;
};

namespace detail {
inline std::string checked(reader& r, bool (*valid)(std::string_view), std::string_view what) {
  std::string s = r.str(what);
  if (r.ok() && !valid(s)) r.fail(reason::bad_name, std::string(what));
  return s;
}
inline frame_key key(reader& r) {
  frame_key k;
  k.stream.name = checked(r, valid_stream, "stream");
  k.owner = r.u32();
  k.seq = r.u32();
  return k;
}
inline endpoint_spec ep(reader& r) {
  endpoint_spec e;
  e.host = checked(r, valid_host, "host");
  e.port = r.u16();
  return e;
}
inline std::vector<std::string> names(reader& r, bool (*valid)(std::string_view), std::string_view what) {
  const std::uint32_t n = r.count(4, what);
  std::vector<std::string> v;
  v.reserve(n);
  for (std::uint32_t i = 0; i < n && r.ok(); ++i) v.push_back(checked(r, valid, what));
  return v;
}
/// Free text (reasons): printable ASCII only, so a log line cannot be forged or garbled.
inline bool printable(std::string_view s) {
  if (s.size() > 1024) return false;
  for (char c : s)
    if (c < 0x20 || c > 0x7E) return false;
  return true;
}
}  // namespace detail

/// Decodes one body of type `t` (its header already checked). Pure.
inline std::variant<message, error_info> decode_body(type t, std::vector<std::byte> body) {
  if (t == type::frame_block) return message{frame_block{std::move(body)}};
  reader r(body);
  message m;
  switch (t) {
    case type::hello: {
      hello h;
      h.version = r.u16();
      h.cluster = detail::checked(r, valid_cluster, "cluster");
      const std::uint8_t role = r.u8();
      if (r.ok() && role > static_cast<std::uint8_t>(node_role::owner)) r.fail(reason::bad_value, "role " + std::to_string(role));
      h.role = static_cast<node_role>(role);
      h.name = detail::checked(r, valid_node_name, "name");
      h.listen = detail::ep(r);
      h.subtree = r.u32();
      if (r.ok() && h.subtree == 0) r.fail(reason::bad_value, "subtree size 0");
      h.mailboxes = detail::names(r, valid_mailbox, "mailbox");
      const std::uint32_t streams = r.count(8, "inventory streams");
      for (std::uint32_t s = 0; s < streams && r.ok(); ++s) {
        const std::string name = detail::checked(r, valid_stream, "stream");
        const std::uint32_t n = r.count(8, "inventory frames");
        for (std::uint32_t i = 0; i < n && r.ok(); ++i) {
          const std::uint32_t o = r.u32();
          h.inventory.push_back(frame_key{{name}, o, r.u32()});
        }
      }
      m = std::move(h);
      break;
    }
    case type::welcome: {
      welcome w;
      const std::uint32_t n = r.count(6, "ancestors");
      for (std::uint32_t i = 0; i < n && r.ok(); ++i) w.ancestors.push_back(detail::ep(r));
      w.tombstones = detail::names(r, valid_stream, "tombstone");
      m = std::move(w);
      break;
    }
    case type::redirect: {
      redirect d;
      d.to = detail::ep(r);
      d.why = r.str("why");
      if (r.ok() && !detail::printable(d.why)) r.fail(reason::bad_name, "why");
      m = std::move(d);
      break;
    }
    case type::refuse: {
      refuse d;
      d.why = r.str("why");
      if (r.ok() && !detail::printable(d.why)) r.fail(reason::bad_name, "why");
      m = std::move(d);
      break;
    }
    case type::frame_begin: {
      frame_begin b;
      b.key = detail::key(r);
      b.size = r.u64();
      if (r.ok() && b.size > (std::uint64_t(1) << 40)) r.fail(reason::bad_value, "frame size " + std::to_string(b.size));
      m = std::move(b);
      break;
    }
    case type::frame_abort: m = frame_abort{}; break;
    case type::control: {
      control c;
      const std::uint32_t n = r.count(8, "control items");
      c.items.reserve(n);
      for (std::uint32_t i = 0; i < n && r.ok(); ++i) {
        control_item it;
        it.mailbox = detail::checked(r, valid_mailbox, "mailbox");
        it.message = r.blob("message");
        c.items.push_back(std::move(it));
      }
      m = std::move(c);
      break;
    }
    case type::discard: {
      discard d;
      d.stream = detail::checked(r, valid_stream, "stream");
      m = std::move(d);
      break;
    }
    case type::want: m = want{detail::key(r)}; break;
    case type::missing: m = missing{detail::key(r)}; break;
    case type::routes: {
      routes x;
      x.subtree = r.u32();
      if (r.ok() && x.subtree == 0) r.fail(reason::bad_value, "subtree size 0");
      x.mailboxes = detail::names(r, valid_mailbox, "mailbox");
      m = std::move(x);
      break;
    }
    case type::ping: m = ping{r.u64()}; break;
    case type::pong: m = pong{r.u64()}; break;
    default: return error_info{reason::unknown_type, std::to_string(static_cast<int>(t))};
  }
  r.finish();
  if (!r.ok()) {
    error_info e = *r.error();
    e.detail = std::string(to_string(t)) + ": " + e.detail;
    return e;
  }
  return m;
}

/// Checks a header alone: magic, reserved bits, type and the length limit of that type.
inline std::optional<error_info> check_header(std::span<const std::byte, header_size> h, const limits& l, type& t,
                                              std::uint32_t& channel, std::uint32_t& length) {
  const auto u = [&](std::size_t i) { return std::to_integer<std::uint32_t>(h[i]); };
  if (u(0) != magic) {
    static constexpr char hex[] = "0123456789abcdef";
    return error_info{reason::bad_magic, std::string("0x") + hex[u(0) >> 4] + hex[u(0) & 15]};
  }
  if (u(2) != 0 || u(3) != 0) return error_info{reason::bad_reserved, {}};
  const std::uint32_t ty = u(1);
  if (ty < 1 || ty > static_cast<std::uint32_t>(type::pong)) return error_info{reason::unknown_type, std::to_string(ty)};
  t = static_cast<type>(ty);
  channel = u(4) | u(5) << 8 | u(6) << 16 | u(7) << 24;
  length = u(8) | u(9) << 8 | u(10) << 16 | u(11) << 24;
  if (length > l.for_type(t))
    return error_info{reason::too_long, std::string(to_string(t)) + " of " + std::to_string(length) + " bytes, limit " +
                                            std::to_string(l.for_type(t))};
  return std::nullopt;
}

/// Incremental decoder of one link's byte stream. Pure: the same bytes in any chunking give the
/// same messages and the same first error. After an error it stays failed.
class decoder {
 public:
  explicit decoder(limits l = {}) : lim_(l) {}

  /// Consumes `in`, calling sink(decoded&&) for each complete message. Returns the first error.
  template <class Sink>
  std::optional<error_info> feed(std::span<const std::byte> in, Sink&& sink) {
    if (err_) return err_;
    for (;;) {
      if (have_ < header_size) {
        if (in.empty()) break;
        const std::size_t n = std::min(in.size(), header_size - have_);
        std::memcpy(head_.data() + have_, in.data(), n);
        have_ += n;
        in = in.subspan(n);
        if (have_ < header_size) break;
        if (auto e = check_header(std::span<const std::byte, header_size>(head_), lim_, type_, channel_, length_)) return err_ = e;
        body_.clear();
        body_.reserve(length_);  // bounded by the per-type limit just checked
      }
      const std::size_t n = std::min<std::size_t>(in.size(), length_ - body_.size());
      body_.insert(body_.end(), in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n));
      in = in.subspan(n);
      if (body_.size() < length_) break;
      auto r = decode_body(type_, std::move(body_));
      body_ = {};
      have_ = 0;
      if (auto* e = std::get_if<error_info>(&r)) return err_ = *e;
      sink(decoded{channel_, std::move(std::get<message>(r))});
    }
    return std::nullopt;
  }

  /// Part of a message buffered (a stall here is a slowloris, not an idle link).
  bool mid_message() const noexcept { return have_ != 0; }
  const std::optional<error_info>& failed() const noexcept { return err_; }

 private:
  limits lim_;
  std::array<std::byte, header_size> head_{};
  std::size_t have_ = 0;
  type type_{};
  std::uint32_t channel_ = 0, length_ = 0;
  std::vector<std::byte> body_;
  std::optional<error_info> err_;
};

}  // namespace bitrefit::transport::relay::framing
