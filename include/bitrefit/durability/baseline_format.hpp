// bitrefit/durability/baseline_format.hpp — the bytes of the owners' durable baselines and the
// rule that links them into chains: one home for every store that keeps them as files or objects
// (filesystem.hpp keeps them in a directory, s3_baseline_store.hpp in a bucket).
//
//   full-v<v>.bin    BRBASE01: the whole image of v.
//                    "BRBASE01" u64 v, u64 n, n x (u64 len, name, u64 len, bytes)
//   delta-v<t>.bin   BRDELT01: the change set of t against the image of its base version b, and
//                    the digest of the very file that held b's image when it was written (law 5:
//                    a delta never applies to any other bits; a link that does not resolve reads
//                    as loss).
//                    "BRDELT01" u64 t, u64 b, u64 link, u64 n, n x (u64 len, name, u64 element
//                    size, u64 elements, u64 count, u64 position bytes, positions gap-coded as
//                    LEB128, count x element size value bytes)
// All integers little-endian. Every file ends with XXH3-64 over all its other bytes, so a torn or
// flipped file is refused (errc::integrity naming the file) and a store reports loss instead of
// wrong bits.
//
// The chain walk (load_chain, chain_names, image_link) reads through a BaselineFiles policy
// (durability/concepts.hpp): a name -> bytes view of a directory or a bucket prefix.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/ids.hpp"
#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/durability/concepts.hpp"

namespace bitrefit::durability::baseline_format {

inline std::string full_name(version_t v) { return "full-v" + std::to_string(v) + ".bin"; }
inline std::string delta_name(version_t v) { return "delta-v" + std::to_string(v) + ".bin"; }
/// Whether `name` is one of the format's files (or a legacy "baseline-" one a store may sweep).
inline bool is_image_name(const std::string& n) {
  return n.rfind("full-v", 0) == 0 || n.rfind("delta-v", 0) == 0 || n.rfind("baseline-", 0) == 0;
}
inline bool is_delta_name(const std::string& n) { return n.rfind("delta-", 0) == 0; }

constexpr std::size_t trailer_size = 8;      // the XXH3-64 at the end of every file
constexpr std::size_t delta_head_size = 32;  // magic, target, base, link

struct byte_writer {
  std::vector<std::byte> out;
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  }
  void u64(std::uint64_t x) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(x >> (8 * i)));
  }
  void leb128(std::uint64_t x) {
    while (x >= 0x80) {
      out.push_back(static_cast<std::byte>((x & 0x7F) | 0x80));
      x >>= 7;
    }
    out.push_back(static_cast<std::byte>(x));
  }
};

/// Bounds-checked reader over a verified file's body; running past the end is errc::integrity.
struct byte_reader {
  std::span<const std::byte> d;
  std::size_t at = 0;
  const std::string& file;
  void need(std::uint64_t n) const {
    if (n > d.size() - at) throw error(errc::integrity, "baseline file ends inside a record", {.file = file, .tensor = {}, .field = {}});
  }
  std::uint64_t u64() {
    need(8);
    std::uint64_t x = 0;
    for (int i = 0; i < 8; ++i) x |= std::uint64_t(std::to_integer<unsigned>(d[at + i])) << (8 * i);
    at += 8;
    return x;
  }
  std::span<const std::byte> take(std::uint64_t n) {
    need(n);
    auto s = d.subspan(at, n);
    at += n;
    return s;
  }
  std::uint64_t leb128() {
    std::uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const unsigned b = std::to_integer<unsigned>(d[at++]);
      x |= std::uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return x;
    }
    throw error(errc::integrity, "position varint too long", {.file = file, .tensor = {}, .field = "positions"});
  }
};

/// The little-endian u64 in 8 bytes (a file's trailer).
inline std::uint64_t load_u64(std::span<const std::byte> b) {
  std::uint64_t x = 0;
  for (int i = 0; i < 8; ++i) x |= std::uint64_t(std::to_integer<unsigned>(b[i])) << (8 * i);
  return x;
}

/// Streams a file's bytes to `put` (a callable taking std::span<const std::byte>) while hashing
/// them, and appends the trailer: no second copy of an image is ever built.
template <class Put>
class trailer_writer {
 public:
  explicit trailer_writer(Put& put) : put_(put), hash_(XXH3_createState()) { XXH3_64bits_reset(hash_); }
  trailer_writer(const trailer_writer&) = delete;
  ~trailer_writer() { XXH3_freeState(hash_); }
  void operator()(std::span<const std::byte> b) {
    XXH3_64bits_update(hash_, b.data(), b.size());
    put_(b);
  }
  /// Writes the trailer; returns the digest it holds (the file's link target).
  std::uint64_t finish() {
    const std::uint64_t d = XXH3_64bits_digest(hash_);
    byte_writer tail;
    tail.u64(d);
    put_(std::span<const std::byte>(tail.out));
    return d;
  }

 private:
  Put& put_;
  XXH3_state_t* hash_;
};

/// The whole file of a full image of v, streamed to `put` (trailer included). Returns its digest.
template <class Put>
std::uint64_t write_full(Put&& put, version_t v, const baseline_image& img) {
  trailer_writer<std::remove_reference_t<Put>> out(put);
  byte_writer w;
  w.bytes("BRBASE01", 8);
  w.u64(v);
  w.u64(img.size());
  for (auto& [name, b] : img) {
    w.u64(name.size());
    w.bytes(name.data(), name.size());
    w.u64(b.size());
    out(w.out);
    w.out.clear();
    out(b);
  }
  out(w.out);
  return out.finish();
}

/// The whole file of t's change set against b, whose image file has digest `link`, streamed to
/// `put`. Cost: the change set's bytes (positions gap-coded as LEB128, values raw), never the
/// model's. Throws errc::invalid_argument (the caller discards what was put) when cs is malformed.
template <class Put>
std::uint64_t write_delta(Put&& put, version_t t, version_t b, std::uint64_t link, const change_set& cs) {
  trailer_writer<std::remove_reference_t<Put>> out(put);
  byte_writer w;
  w.bytes("BRDELT01", 8);
  w.u64(t);
  w.u64(b);
  w.u64(link);
  w.u64(cs.size());
  for (const auto& [name, c] : cs) {
    if (c.element_size == 0 || c.values.size() != c.positions.size() * c.element_size)
      throw error(errc::invalid_argument, "save_changes: value bytes do not match the position count", {.file = {}, .tensor = name, .field = "values"});
    w.u64(name.size());
    w.bytes(name.data(), name.size());
    w.u64(c.element_size);
    w.u64(c.elements);
    w.u64(c.positions.size());
    byte_writer pos;
    std::uint64_t next = 0;  // gap coding: each position minus (previous + 1)
    for (std::uint64_t p : c.positions) {
      if (p < next || p >= c.elements)
        throw error(errc::invalid_argument, "save_changes: positions not strictly increasing within the tensor", {.file = {}, .tensor = name, .field = "positions"});
      pos.leb128(p - next);
      next = p + 1;
    }
    w.u64(pos.out.size());
    out(w.out);
    w.out.clear();
    out(pos.out);
    out(c.values);
  }
  out(w.out);
  return out.finish();
}

/// A file's bytes without the trailing digest, after checking that digest.
inline std::vector<std::byte> verified_body(std::vector<std::byte> d, const std::string& file) {
  if (d.size() < 16) throw error(errc::integrity, "baseline file is truncated (torn write)", {.file = file, .tensor = {}, .field = "digest"});
  const std::uint64_t stored = load_u64(std::span<const std::byte>(d).last(trailer_size));
  if (stored != XXH3_64bits(d.data(), d.size() - trailer_size))
    throw error(errc::integrity, "baseline file digest mismatch (torn or corrupt): refused", {.file = file, .tensor = {}, .field = "digest"});
  d.resize(d.size() - trailer_size);
  return d;
}

inline baseline_image parse_full(const std::vector<std::byte>& d, version_t v, const std::string& file) {
  byte_reader r{d, 0, file};
  if (std::memcmp(r.take(8).data(), "BRBASE01", 8) != 0) throw error(errc::format, "not a full baseline image (bad magic)", {.file = file, .tensor = {}, .field = "magic"});
  if (r.u64() != v) throw error(errc::format, "full image of another version", {.file = file, .tensor = {}, .field = "version"});
  baseline_image img;
  for (std::uint64_t i = 0, n = r.u64(); i < n; ++i) {
    const auto name = r.take(r.u64());
    const auto bytes = r.take(r.u64());
    auto [it, fresh] = img.try_emplace(std::string(reinterpret_cast<const char*>(name.data()), name.size()));
    if (!fresh) throw error(errc::integrity, "full image lists a tensor twice", {.file = file, .tensor = it->first, .field = {}});
    it->second.assign(bytes.begin(), bytes.end());
  }
  if (r.at != d.size()) throw error(errc::format, "trailing bytes after the last tensor", {.file = file, .tensor = {}, .field = {}});
  return img;
}

/// A verified delta: its header, and its body for apply_delta.
struct delta_file {
  std::string file;
  version_t target = 0, base = 0;
  std::uint64_t link = 0;
  std::vector<std::byte> body;  // verified (digest stripped)
};

/// A verified delta's header (magic, target, base, link); the body is decoded by apply_delta.
inline delta_file delta_head(std::vector<std::byte> d, version_t t, const std::string& file) {
  byte_reader r{d, 0, file};
  if (std::memcmp(r.take(8).data(), "BRDELT01", 8) != 0) throw error(errc::format, "not a baseline delta (bad magic)", {.file = file, .tensor = {}, .field = "magic"});
  if (r.u64() != t) throw error(errc::format, "delta of another version", {.file = file, .tensor = {}, .field = "version"});
  delta_file f{file, t, r.u64(), r.u64(), {}};
  if (f.base >= t) throw error(errc::format, "delta's base is not older than its target", {.file = file, .tensor = {}, .field = "base"});
  f.body = std::move(d);
  return f;
}

/// Walks a verified delta's records, checking everything the file alone can tell: per tensor
/// on_tensor(name, E, elements, count) once, then on_change(x, value bytes) for each change in
/// position order, after x is checked to be strictly increasing and below `elements`. Any record
/// that does not fit is errc::integrity naming the file (errc::format for trailing bytes).
template <class OnTensor, class OnChange>
void walk_delta(const delta_file& f, OnTensor&& on_tensor, OnChange&& on_change) {
  const auto& p = f.file;
  byte_reader r{f.body, delta_head_size, p};
  std::set<std::string, std::less<>> seen;
  for (std::uint64_t i = 0, n = r.u64(); i < n; ++i) {
    const auto name_b = r.take(r.u64());
    const std::string name(reinterpret_cast<const char*>(name_b.data()), name_b.size());
    const std::uint64_t E = r.u64(), elements = r.u64(), count = r.u64(), pos_bytes = r.u64();
    if (E == 0 || E > 8 || count > elements || count > pos_bytes)
      throw error(errc::integrity, "delta: implausible element size or count", {.file = p, .tensor = name, .field = "elements"});
    if (!seen.insert(name).second) throw error(errc::integrity, "delta: tensor listed twice", {.file = p, .tensor = name, .field = {}});
    // the record's positions and values lie inside the file: what on_tensor sizes by `count` is
    // bounded by the file's bytes, whatever the fields claim
    r.need(pos_bytes);
    if (count > (r.d.size() - r.at - pos_bytes) / E)
      throw error(errc::integrity, "delta: record runs past the end of the file", {.file = p, .tensor = name, .field = "count"});
    on_tensor(name, E, elements, count);
    byte_reader pr{r.take(pos_bytes), 0, p};
    const std::byte* val = r.take(count * E).data();
    std::uint64_t next = 0;
    for (std::uint64_t k = 0; k < count; ++k, val += E) {
      const std::uint64_t x = next + pr.leb128();
      if (x < next || x >= elements) throw error(errc::integrity, "delta: position outside the tensor", {.file = p, .tensor = name, .field = "positions"});
      on_change(x, val);
      next = x + 1;
    }
    if (pr.at != pos_bytes) throw error(errc::integrity, "delta: stray bytes after the positions", {.file = p, .tensor = name, .field = "positions"});
  }
  if (r.at != f.body.size()) throw error(errc::format, "trailing bytes after the last tensor", {.file = p, .tensor = {}, .field = {}});
}

/// img := img + the delta's change set, decoded and applied in one pass (no change_set is built:
/// a chain load touches each change once). Every position is range-checked before its write; on
/// a throw `img` is a scratch copy the caller discards.
inline void apply_delta(baseline_image& img, const delta_file& f) {
  std::byte* dst = nullptr;
  std::size_t E = 0;
  walk_delta(
      f,
      [&](const std::string& name, std::uint64_t e, std::uint64_t elements, std::uint64_t) {
        auto it = img.find(name);
        // No product of two file fields is ever formed (elements * E could wrap to the image's
        // size): the image's size is divided instead, so every later x * E stays below it.
        if (it == img.end() || it->second.size() % e != 0 || elements != it->second.size() / e)
          throw error(errc::integrity, "delta names a tensor the base image does not hold, or of another size", {.file = f.file, .tensor = name, .field = "elements"});
        dst = it->second.data(), E = static_cast<std::size_t>(e);
      },
      [&](std::uint64_t x, const std::byte* val) { std::memcpy(dst + x * E, val, E); });
}

/// The delta's change set itself (for a reader that keeps changes, not images: a restarted
/// owner's frozen target). Shapes are the file's; whether they fit an image is the caller's check.
inline change_set delta_change_set(const delta_file& f) {
  change_set cs;
  tensor_changes* cur = nullptr;
  walk_delta(
      f,
      [&](const std::string& name, std::uint64_t E, std::uint64_t elements, std::uint64_t count) {
        cur = &cs[name];
        cur->element_size = static_cast<std::uint32_t>(E);
        cur->elements = elements;
        cur->positions.reserve(count);  // count <= the file's position bytes: bounded by the file
        cur->values.reserve(count * E);
      },
      [&](std::uint64_t x, const std::byte* val) {
        cur->positions.push_back(x);
        cur->values.insert(cur->values.end(), val, val + cur->element_size);
      });
  std::erase_if(cs, [](const auto& kv) { return kv.second.positions.empty(); });
  return cs;
}

// ---- the chain walk, over any BaselineFiles -------------------------------------------------------

/// Which file holds b's image now, with its digest: the full image if any (a fold's twin holds the
/// same bits), else the delta. A new delta of b's successor links to it.
template <BaselineFiles F>
std::optional<std::pair<std::string, std::uint64_t>> image_link(F& f, version_t b) {
  for (const auto& n : {full_name(b), delta_name(b)})
    if (auto d = f.digest_of(n)) return std::pair{n, *d};
  return std::nullopt;
}

namespace detail {
template <BaselineFiles F>
std::vector<std::byte> read_verified(F& f, const std::string& name) {
  auto data = f.read(name);
  if (!data) throw error(errc::mismatch, "baseline file is gone", {.file = f.where(name), .tensor = {}, .field = {}});
  return verified_body(std::move(*data), f.where(name));
}
}  // namespace detail

/// The image of v: a full image, or the full image at the root of v's delta chain with every
/// delta applied in order. Throws the reason it cannot: errc::integrity (a file's digest does not
/// match: torn or corrupt; or a record whose count, position or length does not fit the image or the
/// file), errc::format (a verified file of another kind or version), errc::mismatch
/// (absent, or a delta whose base image is gone or was replaced).
template <BaselineFiles F>
baseline_image load_chain(F& f, version_t v) {
  std::vector<delta_file> chain;
  std::optional<std::uint64_t> want;  // the digest the next link must have
  version_t cur = v;
  for (;;) {
    if (chain.size() > 100000) throw error(errc::format, "delta chain does not end", {.file = f.where(""), .tensor = {}, .field = {}});
    const std::string full = full_name(cur), delta = delta_name(cur);
    const auto full_digest = f.digest_of(full), delta_digest = f.digest_of(delta);
    // a full image serves when no particular file is wanted, or when it is the linked one
    if (full_digest && (!want || *full_digest == *want)) {
      try {
        baseline_image img = parse_full(detail::read_verified(f, full), cur, f.where(full));
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) apply_delta(img, *it);
        return img;
      } catch (const error&) {
        if (!delta_digest || want) throw;  // else: the fold's twin is damaged, the chain may still serve
      }
    }
    if (delta_digest && (!want || *delta_digest == *want)) {
      delta_file d = delta_head(detail::read_verified(f, delta), cur, f.where(delta));
      want = d.link;
      cur = d.base;
      chain.push_back(std::move(d));
      continue;
    }
    // name the damage when a file of that version is there but does not verify (torn, flipped)
    if (full_digest) (void)detail::read_verified(f, full);
    if (delta_digest) (void)detail::read_verified(f, delta);
    if (chain.empty()) throw error(errc::mismatch, "no image of version " + std::to_string(v), {.file = f.where(full), .tensor = {}, .field = "version"});
    throw error(errc::mismatch, "the base image (version " + std::to_string(cur) + ") this delta was written against is gone or was replaced",
                {.file = chain.back().file, .tensor = {}, .field = "base"});
  }
}

/// The change set of t against b, read from t's delta alone, when load_chain(t) would be
/// exactly load_chain(b) + that delta: t has no full image, its delta's base is b, and its link is
/// the digest of a file that holds b's image now (law 5). nullopt otherwise (the caller loads the
/// image, which names any loss). Throws like load_chain when the delta itself does not verify.
/// Whether the set fits b's image (tensors, sizes) is the caller's check_fits: load_chain would
/// refuse a delta that does not.
/// Cost: the delta's bytes and the change set; no image is built.
template <BaselineFiles F>
std::optional<change_set> delta_changes(F& f, version_t b, version_t t) {
  const std::string delta = delta_name(t);
  if (f.digest_of(full_name(t)) || !f.digest_of(delta)) return std::nullopt;
  const delta_file d = delta_head(detail::read_verified(f, delta), t, f.where(delta));
  if (d.base != b) return std::nullopt;
  const auto full_b = f.digest_of(full_name(b)), delta_b = f.digest_of(delta_name(b));
  if (!(full_b && *full_b == d.link) && !(delta_b && *delta_b == d.link)) return std::nullopt;
  return delta_change_set(d);
}

/// The file names load_chain(v) would read (headers of deltas only; nothing is verified here beyond
/// what picking a link needs). Empty when v has no image.
template <BaselineFiles F>
std::set<std::string> chain_names(F& f, version_t v) {
  std::set<std::string> out;
  std::optional<std::uint64_t> want;
  for (version_t cur = v; out.size() < 100000;) {
    const std::string full = full_name(cur), delta = delta_name(cur);
    if (const auto d = f.digest_of(full); d && (!want || *d == *want)) {
      out.insert(full);
      return out;
    }
    const auto dd = f.digest_of(delta);
    if (!dd || (want && *dd != *want)) return out;
    out.insert(delta);
    // the header only (magic, target, base, link): the files are verified by load, not here
    const auto h = f.read_head(delta, delta_head_size);
    if (h.size() != delta_head_size || std::memcmp(h.data(), "BRDELT01", 8) != 0) return out;  // damaged: load reports the loss
    const std::string where = f.where(delta);
    byte_reader r{h, 8, where};
    if (r.u64() != cur) return out;
    const version_t base = r.u64();
    if (base >= cur) return out;
    want = r.u64();
    cur = base;
  }
  return out;
}

/// The folding rule (retain_only): fold v's chain into a full image when it reached its bound, or
/// when its deltas together weigh as much as the full image — the fold's write then costs no more
/// than the deltas already written, so the durable bytes per refit stay within twice the change
/// sets' (and a load reads at most 2 images' worth).
inline bool fold_due(std::uint32_t deltas, std::uint64_t delta_bytes, std::uint64_t full_bytes, std::uint32_t max_chain) {
  return deltas > 0 && (deltas >= std::max<std::uint32_t>(max_chain, 1) || delta_bytes >= full_bytes);
}

}  // namespace bitrefit::durability::baseline_format
