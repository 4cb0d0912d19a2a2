// bitrefit_proofs/compact.hpp — a compact byte encoding of protocol values, for the checker's
// frontier (proofs/README.md "Speed": memory).
//
// The cluster world is a tree of vectors, optionals and variants: a few kilobytes of heap per
// state, most of it allocator overhead and empty capacity. A breadth-first frontier of a million
// states did not fit the machine (the runs with 2 owners or a crash across 2 transitions were
// killed above 6 GB). Encoded, a world is a few hundred bytes: integers as LEB128 varints (signed:
// zigzag), a vector as its size then its elements, an optional as a flag then its value, a variant
// as its index then the alternative, a struct as its fields in BITREFIT_FIELDS order (the same
// list the state hash uses, so nothing can be left out). `decode` into an existing value reuses its
// vectors' capacity (the checker decodes into one scratch world per thread).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "bitrefit/core/digest.hpp"
#include "bitrefit/core/fields.hpp"

namespace bitrefit::proofs::compact {

using bytes = std::vector<std::uint8_t>;

/// Appends to `out` through a cursor: `out` is grown in large steps ahead of the cursor and cut
/// back to it by `finish()` (a byte-wise push_back was 9 % of the checker's time: every state it
/// keeps is encoded, about 700 fields).
struct writer {
  bytes& out;
  std::size_t pos;
  explicit writer(bytes& o) : out(o), pos(o.size()) {}
  /// A pointer to at least n writable bytes at the cursor.
  [[gnu::always_inline]] std::uint8_t* room(std::size_t n) {
    if (out.size() - pos < n) [[unlikely]] grow(n);
    return out.data() + pos;
  }
  // Within the capacity, only a step ahead (resize zero-fills what it adds, and `out` may be a long
  // arena that many encodings are appended to: doubling its size at each one cost as much as the
  // arena); past it, double.
  [[gnu::noinline]] void grow(std::size_t n) {
    const std::size_t step = pos + n + 1024;
    out.resize(step <= out.capacity() ? step : std::max(out.size() * 2, step));
  }
  [[gnu::always_inline]] void varint(std::uint64_t v) {
    std::uint8_t* const p = room(10);
    if (v < 0x80) [[likely]] {  // most fields: small counters, flags, enum values
      *p = std::uint8_t(v);
      ++pos;
      return;
    }
    std::size_t k = 0;
    while (v >= 0x80) {
      p[k++] = std::uint8_t(v | 0x80);
      v >>= 7;
    }
    p[k++] = std::uint8_t(v);
    pos += k;
  }
  void raw(const void* data, std::size_t n) {
    if (n) std::memcpy(room(n), data, n);
    pos += n;
  }
  /// Cuts `out` back to what was written.
  void finish() { out.resize(pos); }
};

struct reader {
  const std::uint8_t* p;
  const std::uint8_t* end;
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
      if (p == end || shift > 63) throw std::runtime_error("compact: truncated or malformed encoding");
      const std::uint8_t b = *p++;
      v |= std::uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  }
};

template <class T>
  requires(std::is_integral_v<T> || std::is_enum_v<T>)
void put(writer& w, T v) {
  if constexpr (std::is_enum_v<T>) put(w, static_cast<std::underlying_type_t<T>>(v));
  else if constexpr (std::is_signed_v<T>) {
    const auto u = static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
    w.varint((u << 1) ^ (static_cast<std::int64_t>(v) < 0 ? ~std::uint64_t{0} : 0));  // zigzag
  } else {
    w.varint(static_cast<std::uint64_t>(v));
  }
}
template <class T>
  requires(std::is_integral_v<T> || std::is_enum_v<T>)
void get(reader& r, T& v) {
  if constexpr (std::is_enum_v<T>) {
    std::underlying_type_t<T> u{};
    get(r, u);
    v = static_cast<T>(u);
  } else if constexpr (std::is_signed_v<T>) {
    const std::uint64_t u = r.varint();
    v = static_cast<T>(static_cast<std::int64_t>((u >> 1) ^ (~(u & 1) + 1)));
  } else {
    v = static_cast<T>(r.varint());
  }
}

inline void put(writer& w, const std::string& s) {
  w.varint(s.size());
  w.raw(s.data(), s.size());
}
inline void get(reader& r, std::string& s) {
  const auto n = r.varint();
  if (std::uint64_t(r.end - r.p) < n) throw std::runtime_error("compact: truncated string");
  s.assign(reinterpret_cast<const char*>(r.p), n);
  r.p += n;
}

/// A digest: its low half raw (the model's digests are hashes there: a varint would take 10
/// bytes), its high half as a varint (an attestation's is the receiver's index + 1).
inline void put(writer& w, const digest128& d) {
  w.raw(&d.low64, sizeof d.low64);
  w.varint(d.high64);
}
inline void get(reader& r, digest128& d) {
  if (r.end - r.p < std::ptrdiff_t(sizeof d.low64)) throw std::runtime_error("compact: truncated digest");
  std::memcpy(&d.low64, r.p, sizeof d.low64);
  r.p += sizeof d.low64;
  d.high64 = r.varint();
}

template <class T> void put(writer& w, const std::optional<T>& o);
template <class T> void get(reader& r, std::optional<T>& o);
template <class T> void put(writer& w, const std::vector<T>& v);
template <class T> void get(reader& r, std::vector<T>& v);
template <class... T> void put(writer& w, const std::variant<T...>& v);
template <class... T> void get(reader& r, std::variant<T...>& v);
template <class A, class B> void put(writer& w, const std::pair<A, B>& p);
template <class A, class B> void get(reader& r, std::pair<A, B>& p);

template <has_fields T>
void put(writer& w, const T& x) {
  std::apply([&w](const auto&... f) { (put(w, f), ...); }, fields_of(x));
}
template <has_fields T>
void get(reader& r, T& x) {
  std::apply([&r](auto&... f) { (get(r, f), ...); }, fields_of(x));
}

template <class T>
void put(writer& w, const std::optional<T>& o) {
  w.varint(o.has_value());
  if (o) put(w, *o);
}
template <class T>
void get(reader& r, std::optional<T>& o) {
  if (!r.varint()) {
    o.reset();
    return;
  }
  if (!o) o.emplace();
  get(r, *o);
}
template <class T>
void put(writer& w, const std::vector<T>& v) {
  w.varint(v.size());
  for (const auto& x : v) put(w, x);
}
template <class T>
void get(reader& r, std::vector<T>& v) {
  const auto n = r.varint();
  if (n > std::uint64_t(r.end - r.p)) throw std::runtime_error("compact: vector longer than the encoding");
  v.resize(n);
  for (auto& x : v) get(r, x);
}
/// If the bytes at the reading position begin with [from, to) (the encoding of a value), moves
/// past them and returns true. An encoding delimits itself, so reading a value there would read
/// exactly those bytes and give the value they encode: a caller that still holds that value can
/// keep it instead of decoding it again.
inline bool skip_if_same(reader& r, const std::uint8_t* from, const std::uint8_t* to) {
  const auto n = std::size_t(to - from);
  if (std::size_t(r.end - r.p) < n || std::memcmp(r.p, from, n) != 0) return false;
  r.p += n;
  return true;
}

/// get(r, v), recording where each element's encoding begins, as an offset from `base`, in `at`,
/// and after them where the last one ends (at.size() == v.size() + 1): whoever keeps the bytes can
/// then copy one element's encoding instead of encoding the element again
/// (cluster_world::encode_successor). With `prev_base`: v holds the values of an earlier
/// encoding, whose elements begin at (*prev_at)[j] from prev_base (recorded alike); an element
/// whose earlier encoding recurs at its position is kept instead of decoded (skip_if_same), and
/// `kept_at` (if given) gets, per element, its index if it was kept and -1 if not.
template <class T>
void get_indexed(reader& r, std::vector<T>& v, const std::uint8_t* base, std::vector<std::uint32_t>& at,
                 const std::uint8_t* prev_base = nullptr, const std::vector<std::uint32_t>* prev_at = nullptr,
                 std::vector<std::int32_t>* kept_at = nullptr) {
  const auto n = r.varint();
  if (n > std::uint64_t(r.end - r.p)) throw std::runtime_error("compact: vector longer than the encoding");
  // elements that may be kept: those v holds that the earlier encoding has
  const std::size_t kept = prev_base && !prev_at->empty() ? std::min({std::size_t(n), v.size(), prev_at->size() - 1}) : 0;
  v.resize(n);
  at.resize(n + 1);
  if (kept_at) kept_at->assign(n, -1);
  for (std::size_t i = 0; i < n; ++i) {
    at[i] = static_cast<std::uint32_t>(r.p - base);
    if (i < kept && skip_if_same(r, prev_base + (*prev_at)[i], prev_base + (*prev_at)[i + 1])) {
      if (kept_at) (*kept_at)[i] = static_cast<std::int32_t>(i);
      continue;
    }
    get(r, v[i]);
  }
  at[n] = static_cast<std::uint32_t>(r.p - base);
}
template <class... T>
void put(writer& w, const std::variant<T...>& v) {
  w.varint(v.index());
  std::visit([&w](const auto& x) { put(w, x); }, v);
}
template <class... T>
void get(reader& r, std::variant<T...>& v) {
  const auto i = r.varint();
  if (i >= sizeof...(T)) throw std::runtime_error("compact: bad variant index");
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (void)((i == I ? (v.index() != I ? (void)v.template emplace<I>() : (void)0, get(r, std::get<I>(v)), true) : false) || ...);
  }(std::index_sequence_for<T...>{});
}
template <class A, class B>
void put(writer& w, const std::pair<A, B>& p) {
  put(w, p.first);
  put(w, p.second);
}
template <class A, class B>
void get(reader& r, std::pair<A, B>& p) {
  get(r, p.first);
  get(r, p.second);
}

/// Appends x's encoding to `out`.
template <class T>
void encode(const T& x, bytes& out) {
  writer w{out};
  put(w, x);
  w.finish();
}
/// Decodes one value from [p, end) into x (reusing its storage); returns the end of its encoding.
template <class T>
const std::uint8_t* decode(const std::uint8_t* p, const std::uint8_t* end, T& x) {
  reader r{p, end};
  get(r, x);
  return r.p;
}

}  // namespace bitrefit::proofs::compact
