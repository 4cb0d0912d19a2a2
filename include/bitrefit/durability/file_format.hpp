// bitrefit/durability/file_format.hpp — the owners' baseline files, byte for byte.
//
//   full-v<v>.bin    "BRBASE01", u64 v, u64 tensors, then per tensor: u64 name length, name,
//                    u64 byte count, the bytes; then u64 XXH3-64 of every byte before it.
//   delta-v<t>.bin   "BRDELT01", u64 t, u64 base b, u64 link (the XXH3-64 trailer of the file that
//                    held b's image when this delta was written), u64 tensors, then per tensor:
//                    u64 name length, name, u64 element size, u64 elements, u64 count, u64 position
//                    bytes, positions gap-coded as LEB128 (each minus previous + 1), count*E value
//                    bytes (absolute new bits); then the XXH3-64 trailer.
// All integers little-endian. A file whose trailer does not match is torn or corrupt
// (errc::integrity); a verified file that does not parse is errc::format naming the file, tensor
// and field. Every length and position is checked against what is left before it is used.
// The store that reads and writes these files is filesystem_baseline_store.hpp.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <vector>

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/ids.hpp"
#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/io/atomic_file.hpp"

namespace bitrefit::durability::file_format {

struct delta_file {
  std::filesystem::path path;
  version_t target = 0, base = 0;
  std::uint64_t link = 0;
  std::vector<std::byte> body;  // verified (digest stripped)
};

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

/// Bounds-checked reader over a verified file's body; running past the end is errc::format.
struct byte_reader {
  std::span<const std::byte> d;
  std::size_t at = 0;
  const std::filesystem::path& file;
  void need(std::uint64_t n) const {
    if (n > d.size() - at) throw error(errc::format, "baseline file ends inside a record", {.file = file.string(), .tensor = {}, .field = {}});
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
    throw error(errc::format, "position varint too long", {.file = file.string(), .tensor = {}, .field = "positions"});
  }
};


/// The digest a file claims (its last 8 bytes); 0 when unreadable. Used only to pick the linked
/// file; the file is then verified in full before anything of it is used.
inline std::uint64_t stored_digest(const std::filesystem::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct stat st {};
  std::uint64_t x = 0;
  unsigned char b[8];
  if (::fstat(fd, &st) == 0 && st.st_size >= 8 && ::pread(fd, b, 8, st.st_size - 8) == 8)
    for (int i = 0; i < 8; ++i) x |= std::uint64_t(b[i]) << (8 * i);
  ::close(fd);
  return x;
}

/// The first n bytes of a file (fewer when it is shorter or unreadable).
inline std::vector<std::byte> read_head(const std::filesystem::path& p, std::size_t n) {
  std::vector<std::byte> out(n);
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  const ssize_t got = ::pread(fd, out.data(), n, 0);
  ::close(fd);
  out.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
  return out;
}


/// A file's bytes without the trailing digest, after checking that digest.
inline std::vector<std::byte> read_verified(const std::filesystem::path& p) {
  auto data = io::read_whole_file(p);
  if (!data) throw error(errc::mismatch, "baseline file is gone", {.file = p.string(), .tensor = {}, .field = {}});
  auto& d = *data;
  if (d.size() < 16) throw error(errc::integrity, "baseline file is truncated (torn write)", {.file = p.string(), .tensor = {}, .field = "digest"});
  std::uint64_t stored = 0;
  for (int i = 0; i < 8; ++i) stored |= std::uint64_t(std::to_integer<unsigned>(d[d.size() - 8 + i])) << (8 * i);
  if (stored != XXH3_64bits(d.data(), d.size() - 8))
    throw error(errc::integrity, "baseline file digest mismatch (torn or corrupt): refused", {.file = p.string(), .tensor = {}, .field = "digest"});
  d.resize(d.size() - 8);
  return std::move(d);
}

inline baseline_image parse_full(const std::vector<std::byte>& d, version_t v, const std::filesystem::path& p) {
  byte_reader r{d, 0, p};
  if (std::memcmp(r.take(8).data(), "BRBASE01", 8) != 0) throw error(errc::format, "not a full baseline image (bad magic)", {.file = p.string(), .tensor = {}, .field = "magic"});
  if (r.u64() != v) throw error(errc::format, "full image of another version", {.file = p.string(), .tensor = {}, .field = "version"});
  baseline_image img;
  for (std::uint64_t i = 0, n = r.u64(); i < n; ++i) {
    const auto name = r.take(r.u64());
    const auto bytes = r.take(r.u64());
    img[std::string(reinterpret_cast<const char*>(name.data()), name.size())].assign(bytes.begin(), bytes.end());
  }
  if (r.at != d.size()) throw error(errc::format, "trailing bytes after the last tensor", {.file = p.string(), .tensor = {}, .field = {}});
  return img;
}

/// A verified delta's header (magic, target, base, link); the body is decoded by apply_delta.
inline delta_file delta_head(std::vector<std::byte> d, version_t t, const std::filesystem::path& p) {
  byte_reader r{d, 0, p};
  if (std::memcmp(r.take(8).data(), "BRDELT01", 8) != 0) throw error(errc::format, "not a baseline delta (bad magic)", {.file = p.string(), .tensor = {}, .field = "magic"});
  if (r.u64() != t) throw error(errc::format, "delta of another version", {.file = p.string(), .tensor = {}, .field = "version"});
  delta_file f{p, t, r.u64(), r.u64(), {}};
  if (f.base >= t) throw error(errc::format, "delta's base is not older than its target", {.file = p.string(), .tensor = {}, .field = "base"});
  f.body = std::move(d);
  return f;
}

/// img := img + the delta's change set, decoded and applied in one pass (no change_set is built:
/// a chain load touches each change once). Every position is range-checked before its write; on
/// a throw `img` is a scratch copy the caller discards.
inline void apply_delta(baseline_image& img, const delta_file& f) {
  const auto& p = f.path;
  byte_reader r{f.body, 32, p};
  std::set<std::string, std::less<>> seen;
  for (std::uint64_t i = 0, n = r.u64(); i < n; ++i) {
    const auto name_b = r.take(r.u64());
    const std::string name(reinterpret_cast<const char*>(name_b.data()), name_b.size());
    const std::uint64_t E = r.u64(), elements = r.u64(), count = r.u64(), pos_bytes = r.u64();
    if (E == 0 || E > 8 || count > elements || count > pos_bytes)
      throw error(errc::format, "delta: implausible element size or count", {.file = p.string(), .tensor = name, .field = "elements"});
    if (!seen.insert(name).second) throw error(errc::format, "delta: tensor listed twice", {.file = p.string(), .tensor = name, .field = {}});
    auto it = img.find(name);
    if (it == img.end() || it->second.size() != elements * E)
      throw error(errc::mismatch, "delta names a tensor the base image does not hold, or of another size", {.file = p.string(), .tensor = name, .field = "elements"});
    byte_reader pr{r.take(pos_bytes), 0, p};
    const std::byte* val = r.take(count * E).data();
    std::byte* dst = it->second.data();
    std::uint64_t next = 0;
    for (std::uint64_t k = 0; k < count; ++k, val += E) {
      const std::uint64_t x = next + pr.leb128();
      if (x < next || x >= elements) throw error(errc::format, "delta: position outside the tensor", {.file = p.string(), .tensor = name, .field = "positions"});
      std::memcpy(dst + x * E, val, E);
      next = x + 1;
    }
    if (pr.at != pos_bytes) throw error(errc::format, "delta: stray bytes after the positions", {.file = p.string(), .tensor = name, .field = "positions"});
  }
  if (r.at != f.body.size()) throw error(errc::format, "trailing bytes after the last tensor", {.file = p.string(), .tensor = {}, .field = {}});
}


}  // namespace bitrefit::durability::file_format
