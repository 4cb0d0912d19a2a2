// bitrefit/codec/bundle.hpp — the delta bundle: the CLI's and the object store's unit of a delta.
//
// A bundle is a manifest plus its frames. The manifest (JSON) records the base and target
// versions, the attestation digests of the base and the target model (attestation.hpp), the
// tensor set (name, dtype, shape), the frame list (seq, size, XXH3-128 of the frame's bytes) and
// totals. Two storage forms:
//   file:      "BRFB" | u16 LE version (1) | u16 0 | u32 0 | u64 LE manifest length |
//              16-byte XXH3-128 of the manifest (low64 LE, high64 LE) | manifest JSON |
//              frames concatenated in manifest order
//   directory: manifest.json and frames/<seq as 8 digits>.frame
// read_bundle() takes either. apply_bundle() checks the base digest of the target, the tensor set
// and every frame (size, digest, full decode) before writing anything; after writing, it checks
// the target digest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/codec/apply.hpp"
#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/codec/encoder.hpp"
#include "bitrefit/codec/frame.hpp"
#include "bitrefit/codec/hash.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"
#include "bitrefit/io/atomic_file.hpp"
#include "bitrefit/io/json.hpp"

namespace bitrefit::codec {

inline constexpr char bundle_magic[4] = {'B', 'R', 'F', 'B'};
inline constexpr std::uint16_t bundle_format_version = 1;
inline constexpr std::size_t bundle_file_header_size = 4 + 2 + 2 + 4 + 8 + 16;
/// What a manifest may cost (io/json.hpp): a 100 K-tensor model's manifest is about 10 MB of text.
inline constexpr io::json_limits bundle_manifest_limits{.max_bytes = 64u << 20, .max_depth = 8, .max_tree_bytes = 512u << 20};

struct bundle_frame_entry {
  std::uint32_t seq = 0;
  std::uint64_t size = 0;
  digest128 digest;  // XXH3-128 of the whole frame's bytes
  friend bool operator==(const bundle_frame_entry&, const bundle_frame_entry&) = default;
};

struct bundle_manifest {
  version_t base_version = 0;
  version_t target_version = 1;
  digest128 base_digest;    // attestation digest of the base model
  digest128 target_digest;  // attestation digest of the target model
  mode_policy policy = mode_policy::xor_allowed;
  int zstd_level = default_zstd_level;
  std::uint64_t max_frame_input_bytes = default_max_frame_input_bytes;
  model_manifest tensors;
  std::vector<bundle_frame_entry> frames;
  // totals
  std::uint64_t elements = 0;
  std::uint64_t changed = 0;
  std::uint64_t dense_bytes = 0;
  std::uint64_t payload_bytes = 0;  // sum of frame sizes

  friend bool operator==(const bundle_manifest&, const bundle_manifest&) = default;

  nlohmann::json to_json() const {
    nlohmann::json j;
    j["format"] = "bitrefit-delta-bundle";
    j["format_version"] = bundle_format_version;
    j["base_version"] = base_version;
    j["target_version"] = target_version;
    j["base_digest"] = base_digest.to_hex();
    j["target_digest"] = target_digest.to_hex();
    j["mode"] = policy == mode_policy::xor_allowed        ? "xor"
                : policy == mode_policy::xor_only         ? "xor_only"
                : policy == mode_policy::conditioned_only ? "conditioned_only"
                                                          : "overwrite";
    j["zstd_level"] = zstd_level;
    j["max_frame_input_bytes"] = max_frame_input_bytes;
    auto& ts = j["tensors"] = nlohmann::json::array();
    for (auto& t : tensors.tensors()) ts.push_back({{"name", t.name}, {"dtype", std::string(dtype_name(t.type))}, {"shape", t.shape}});
    auto& fs = j["frames"] = nlohmann::json::array();
    for (auto& f : frames) fs.push_back({{"seq", f.seq}, {"size", f.size}, {"digest", f.digest.to_hex()}});
    j["totals"] = {{"elements", elements}, {"changed", changed}, {"dense_bytes", dense_bytes}, {"payload_bytes", payload_bytes}};
    return j;
  }

  /// Throws errc::format naming `source` and the field on anything missing or malformed: every
  /// number must be a JSON integer inside its field's range (io::json_integer), never a float, a
  /// negative or an out-of-range value converted.
  static bundle_manifest from_json(const nlohmann::json& j, std::string_view source = {}) {
    const error_context file{.file = std::string(source), .tensor = {}, .field = {}};
    const auto fail = [&](std::string field, std::string msg) -> void {
      throw error(errc::format, std::move(msg), {.file = file.file, .tensor = {}, .field = std::move(field)});
    };
    const auto at = [&](const nlohmann::json& o, const char* key, const std::string& field) -> const nlohmann::json& {
      if (!o.is_object()) fail(field, "not a JSON object");
      const auto it = o.find(key);
      if (it == o.end()) fail(field, "missing field");
      return *it;
    };
    const auto integer = [&]<class T>(const nlohmann::json& o, const char* key, std::string field, T& out) {
      out = io::json_integer<T>(at(o, key, field), {.file = file.file, .tensor = {}, .field = field});
    };
    const auto text = [&](const nlohmann::json& o, const char* key, const std::string& field) -> const std::string& {
      const auto& v = at(o, key, field);
      if (!v.is_string()) fail(field, "not a string");
      return v.get_ref<const std::string&>();
    };
    const auto array = [&](const nlohmann::json& o, const char* key) -> const nlohmann::json& {
      const auto& v = at(o, key, key);
      if (!v.is_array()) fail(key, "not an array");
      return v;
    };
    bundle_manifest m;
    const auto format = j.is_object() ? j.find("format") : j.end();
    if (format == j.end() || !format->is_string() || *format != "bitrefit-delta-bundle") fail("format", "not a bitrefit delta bundle manifest");
    std::uint16_t version = 0;
    integer(j, "format_version", "format_version", version);
    if (version != bundle_format_version)
      throw error(errc::unsupported, "bundle format version " + std::to_string(version), {.file = file.file, .tensor = {}, .field = "format_version"});
    integer(j, "base_version", "base_version", m.base_version);
    integer(j, "target_version", "target_version", m.target_version);
    auto dig = [&](const char* k) {
      auto d = digest128::from_hex(text(j, k, k));
      if (!d) fail(k, "not 32 hex digits");
      return *d;
    };
    m.base_digest = dig("base_digest");
    m.target_digest = dig("target_digest");
    const auto& mode = text(j, "mode", "mode");
    if (mode == "xor") m.policy = mode_policy::xor_allowed;
    else if (mode == "xor_only") m.policy = mode_policy::xor_only;
    else if (mode == "overwrite") m.policy = mode_policy::overwrite_only;
    else if (mode == "conditioned_only") m.policy = mode_policy::conditioned_only;
    else fail("mode", "unknown mode '" + mode + "'");
    integer(j, "zstd_level", "zstd_level", m.zstd_level);
    integer(j, "max_frame_input_bytes", "max_frame_input_bytes", m.max_frame_input_bytes);
    if (m.max_frame_input_bytes < 8 || m.max_frame_input_bytes > frame_input_bytes_limit)
      fail("max_frame_input_bytes", "outside [8, " + std::to_string(frame_input_bytes_limit) + "]");
    std::vector<tensor_info> ts;
    for (auto& t : array(j, "tensors")) {
      auto dt = parse_dtype(text(t, "dtype", "tensors.dtype"));
      if (!dt) fail("tensors.dtype", "unknown dtype '" + text(t, "dtype", "tensors.dtype") + "'");
      shape_t shape;
      const auto& js = at(t, "shape", "tensors.shape");
      if (!js.is_array()) fail("tensors.shape", "not an array");
      for (auto& d : js) shape.push_back(io::json_integer<std::uint64_t>(d, {.file = file.file, .tensor = {}, .field = "tensors.shape"}));
      ts.push_back({text(t, "name", "tensors.name"), *dt, std::move(shape)});
    }
    try {
      m.tensors = model_manifest(std::move(ts));
    } catch (const error& e) {  // an empty or repeated name, a shape whose size overflows
      throw error(errc::format, "tensor list: " + e.message(), {.file = file.file, .tensor = e.where().tensor, .field = "tensors"});
    }
    for (auto& f : array(j, "frames")) {
      auto d = digest128::from_hex(text(f, "digest", "frames.digest"));
      if (!d) fail("frames.digest", "not 32 hex digits");
      bundle_frame_entry e{0, 0, *d};
      integer(f, "seq", "frames.seq", e.seq);
      integer(f, "size", "frames.size", e.size);
      m.frames.push_back(e);
    }
    for (std::size_t i = 0; i < m.frames.size(); ++i)
      if (m.frames[i].seq != i) fail("frames.seq", "frame list is not numbered 0, 1, 2, ...");
    const auto& tot = at(j, "totals", "totals");
    integer(tot, "elements", "totals.elements", m.elements);
    integer(tot, "changed", "totals.changed", m.changed);
    integer(tot, "dense_bytes", "totals.dense_bytes", m.dense_bytes);
    integer(tot, "payload_bytes", "totals.payload_bytes", m.payload_bytes);
    return m;
  }
};

struct delta_bundle {
  bundle_manifest manifest;
  std::vector<std::vector<std::byte>> frames;
};

/// A bundle over borrowed bytes (e.g. a memory-mapped bundle file): the manifest and a view of each
/// frame. What apply needs without copying the frames (apply streams: O(one frame) of scratch).
struct bundle_view {
  bundle_manifest manifest;
  std::vector<std::span<const std::byte>> frames;
};

namespace detail {

inline void check_same_tensor_set(const model_manifest& expected, std::span<const tensor_view> got, std::string_view what) {
  std::vector<tensor_info> infos;
  for (auto& t : got) infos.push_back({t.name(), t.type(), t.shape()});
  model_manifest g(std::move(infos));
  if (g == expected) return;
  for (auto& t : expected.tensors()) {
    const tensor_info* o = g.find(t.name);
    if (!o) throw error(errc::mismatch, std::string(what) + " lacks this tensor", {.file = {}, .tensor = t.name, .field = {}});
    if (o->type != t.type) throw error(errc::mismatch, std::string(what) + " has dtype " + std::string(dtype_name(o->type)) + ", expected " + std::string(dtype_name(t.type)), {.file = {}, .tensor = t.name, .field = "dtype"});
    if (o->shape != t.shape) throw error(errc::mismatch, std::string(what) + " has another shape", {.file = {}, .tensor = t.name, .field = "shape"});
  }
  for (auto& t : g.tensors())
    if (!expected.find(t.name)) throw error(errc::mismatch, std::string(what) + " has a tensor the other side lacks", {.file = {}, .tensor = t.name, .field = {}});
}

inline const tensor_view& find_view(std::span<const tensor_view> ts, std::string_view name) {
  for (auto& t : ts)
    if (t.name() == name) return t;
  throw error(errc::mismatch, "tensor missing", {.file = {}, .tensor = std::string(name), .field = {}});
}

}  // namespace detail

/// Builds the bundle turning `base` into `target` (same tensor set, else errc::mismatch naming
/// the tensor). Frames carry payload ids (attempt 0.0, owner 0, seq = chunk index). `threads`
/// encoders work on disjoint chunks; the result does not depend on the thread count.
template <execution_backend Backend = host_backend>
delta_bundle make_delta_bundle(std::span<const tensor_view> base, std::span<const tensor_view> target,
                               version_t base_version, version_t target_version, encode_options options = {},
                               unsigned threads = 1, encode_stats* stats_out = nullptr) {
  std::vector<tensor_info> infos;
  for (auto& t : target) infos.push_back({t.name(), t.type(), t.shape()});
  delta_bundle b;
  auto& m = b.manifest;
  m.tensors = model_manifest(std::move(infos));
  detail::check_same_tensor_set(m.tensors, base, "base model");
  m.base_version = base_version;
  m.target_version = target_version;
  m.policy = options.policy;
  m.zstd_level = options.zstd_level;
  m.max_frame_input_bytes = options.max_frame_input_bytes;
  m.base_digest = attestation_digest(base);
  m.target_digest = attestation_digest(target);

  // index by name once: name order == manifest order
  std::vector<const tensor_view*> bv, tv;
  for (auto& t : m.tensors.tensors()) {
    bv.push_back(&detail::find_view(base, t.name));
    tv.push_back(&detail::find_view(target, t.name));
  }
  const auto plan = plan_chunks(m.tensors, options.max_frame_input_bytes);
  b.frames.resize(plan.size());
  std::vector<encode_stats> stats(std::max(1u, threads));
  auto work = [&](unsigned w) {
    chunk_encoder<Backend> enc(options);
    byte_buffer out;
    for (std::size_t s = w; s < plan.size(); s += stats.size()) {
      std::vector<chunk_piece> pieces;
      for (auto& r : plan[s]) {
        const std::size_t ti = *m.tensors.index_of(r.tensor);
        const std::size_t E = element_size(tv[ti]->type());
        pieces.push_back({tv[ti]->name(), tv[ti]->type(), tv[ti]->elements(), r.begin, r.end,
                          bv[ti]->bytes().subspan(r.begin * E, (r.end - r.begin) * E),
                          tv[ti]->bytes().subspan(r.begin * E, (r.end - r.begin) * E)});
      }
      frame_header h{frame_kind::delta, payload_id{attempt_id{0, 0}, 0, static_cast<std::uint32_t>(s)}, base_version, target_version};
      enc.encode(h, pieces, out, &stats[w]);
      b.frames[s].assign(out.data(), out.data() + out.size());
    }
  };
  if (stats.size() == 1) work(0);
  else {
    std::vector<std::thread> ts;
    for (unsigned w = 0; w < stats.size(); ++w) ts.emplace_back(work, w);
    for (auto& t : ts) t.join();
  }
  encode_stats total;
  for (auto& s : stats) total += s;
  for (std::size_t s = 0; s < b.frames.size(); ++s)
    m.frames.push_back({static_cast<std::uint32_t>(s), b.frames[s].size(), xxh3_128(b.frames[s])});
  m.elements = m.tensors.total_elements();
  m.changed = total.changed;
  m.dense_bytes = m.tensors.total_bytes();
  m.payload_bytes = total.frame_bytes;
  if (stats_out) *stats_out += total;
  return b;
}

/// Checks every frame against the manifest: count, size, XXH3-128. errc::integrity on mismatch.
inline void verify_bundle_frames(const bundle_manifest& m, std::span<const std::span<const std::byte>> frames, std::string_view source = {}) {
  if (frames.size() != m.frames.size())
    throw error(errc::integrity, "bundle holds " + std::to_string(frames.size()) + " frames, manifest lists " + std::to_string(m.frames.size()), {.file = std::string(source), .tensor = {}, .field = "frames"});
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const auto& e = m.frames[i];
    const error_context where{.file = std::string(source), .tensor = {}, .field = "frames[" + std::to_string(i) + "]"};
    if (frames[i].size() != e.size)
      throw error(errc::integrity, "frame " + std::to_string(i) + " is " + std::to_string(frames[i].size()) + " bytes, manifest says " + std::to_string(e.size) + " (truncated?)", where);
    if (xxh3_128(frames[i]) != e.digest) throw error(errc::integrity, "frame " + std::to_string(i) + " digest differs from the manifest (corrupted)", where);
  }
}
inline std::vector<std::span<const std::byte>> frame_spans(const delta_bundle& b) {
  return {b.frames.begin(), b.frames.end()};
}
inline void verify_bundle_frames(const delta_bundle& b, std::string_view source = {}) {
  verify_bundle_frames(b.manifest, frame_spans(b), source);
}

/// Applies the bundle (manifest `m`, frames `frames`) to `target` in place: verifies the target's
/// tensor set and base attestation digest, every frame (manifest size and digest, frame digest and
/// structure, full decode against the target's bits, target match), and only then writes, one
/// frame at a time (scratch: one frame's decoded positions and values). Afterwards the target's
/// digest must equal the manifest's target digest. On any error before writing, the target is
/// untouched. Base-conditioned items decode against the target, which holds the base until its own
/// frame is applied (frames are disjoint), so verifying all frames first is exact.
template <execution_backend Backend = host_backend>
void apply_bundle(const bundle_manifest& m, std::span<const std::span<const std::byte>> frames, std::span<const mutable_tensor_view> target,
                  std::string_view source = {}) {
  std::vector<tensor_view> ro(target.begin(), target.end());
  detail::check_same_tensor_set(m.tensors, ro, "target model");
  verify_bundle_frames(m, frames, source);
  const digest128 have = attestation_digest(std::span<const tensor_view>(ro));
  if (have != m.base_digest)
    throw error(errc::mismatch, "target's attestation digest " + have.to_hex() + " is not the bundle's base digest " + m.base_digest.to_hex() + " (wrong base model)", {.file = std::string(source), .tensor = {}, .field = "base_digest"});
  target_map tm(std::vector<mutable_tensor_view>(target.begin(), target.end()));
  frame_applier<Backend> ap;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const frame_view f = ap.verify(frames[i], tm, source);
    const auto& h = f.header();
    if (h.id.seq != i || h.base_version != m.base_version || h.target_version != m.target_version)
      throw error(errc::mismatch, "frame " + std::to_string(i) + " header does not match the manifest (seq or versions)", {.file = std::string(source), .tensor = {}, .field = "frames"});
  }
  for (std::size_t i = 0; i < frames.size(); ++i) ap.apply(frames[i], tm, source);
  const digest128 now = attestation_digest(std::span<const tensor_view>(ro));
  if (now != m.target_digest)
    throw error(errc::integrity, "after apply the model's digest " + now.to_hex() + " differs from the bundle's target digest " + m.target_digest.to_hex(), {.file = std::string(source), .tensor = {}, .field = "target_digest"});
}

/// Applies `b` to `target` in place (see the overload above).
template <execution_backend Backend = host_backend>
void apply_bundle(const delta_bundle& b, std::span<const mutable_tensor_view> target, std::string_view source = {}) {
  const auto spans = frame_spans(b);
  apply_bundle<Backend>(b.manifest, spans, target, source);
}

namespace detail {

/// The whole file; a file larger than `max_bytes` is refused unread (errc::integrity).
inline std::vector<std::byte> read_all(const std::filesystem::path& p, std::uint64_t max_bytes = ~std::uint64_t{0}) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw error(errc::io, "cannot open for reading", {.file = p.string(), .tensor = {}, .field = {}});
  in.seekg(0, std::ios::end);
  const auto n = static_cast<std::size_t>(in.tellg());
  if (n > max_bytes)
    throw error(errc::integrity, "file of " + std::to_string(n) + " bytes is larger than the " + std::to_string(max_bytes) + " expected", {.file = p.string(), .tensor = {}, .field = "size"});
  in.seekg(0);
  std::vector<std::byte> v(n);
  if (n && !in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n)))
    throw error(errc::io, "read failed", {.file = p.string(), .tensor = {}, .field = {}});
  return v;
}

/// io/atomic_file.hpp: temp file in the same directory, fsync, rename, fsync the directory.
inline void write_all_atomic(const std::filesystem::path& p, std::span<const std::span<const std::byte>> parts) {
  io::atomic_file out(p);
  for (auto part : parts) out.write(part);
  out.commit();
}

inline std::string frame_file_name(std::uint32_t seq) {
  std::string s = std::to_string(seq);
  return "frames/" + std::string(s.size() < 8 ? 8 - s.size() : 0, '0') + s + ".frame";
}

}  // namespace detail

/// Writes the single-file form (atomically and durably: io::atomic_file).
inline void write_bundle_file(const delta_bundle& b, const std::filesystem::path& path) {
  const std::string json = b.manifest.to_json().dump(1);
  std::vector<std::byte> head(bundle_file_header_size);
  std::byte* p = head.data();
  std::memcpy(p, bundle_magic, 4);
  p += 4;
  detail::put_u16(p, bundle_format_version);
  detail::put_u16(p, 0);
  detail::put_u32(p, 0);
  detail::put_u64(p, json.size());
  store_digest_le(xxh3_128(std::as_bytes(std::span(json.data(), json.size()))), p);
  std::vector<std::span<const std::byte>> parts{head, std::as_bytes(std::span(json.data(), json.size()))};
  for (auto& f : b.frames) parts.emplace_back(f);
  detail::write_all_atomic(path, parts);
}

/// Writes the directory form: manifest.json (written last, atomically) and frames/NNNNNNNN.frame.
inline void write_bundle_directory(const delta_bundle& b, const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir / "frames", ec);
  if (ec) throw error(errc::io, "cannot create directory: " + ec.message(), {.file = dir.string(), .tensor = {}, .field = {}});
  for (std::size_t i = 0; i < b.frames.size(); ++i) {
    std::span<const std::byte> part{b.frames[i]};
    detail::write_all_atomic(dir / detail::frame_file_name(static_cast<std::uint32_t>(i)), std::span(&part, 1));
  }
  const std::string json = b.manifest.to_json().dump(1);
  std::span<const std::byte> part = std::as_bytes(std::span(json.data(), json.size()));
  detail::write_all_atomic(dir / "manifest.json", std::span(&part, 1));
}

/// Parses a manifest's JSON text under bundle_manifest_limits (errc::format naming `source`).
inline bundle_manifest parse_bundle_manifest(std::string_view text, std::string_view source = {}) {
  return bundle_manifest::from_json(io::parse_json(text, bundle_manifest_limits, {.file = std::string(source), .tensor = {}, .field = "manifest"}), source);
}

/// Reads and parses the directory form's manifest.json (bounded by bundle_manifest_limits).
inline bundle_manifest read_bundle_manifest(const std::filesystem::path& dir) {
  const auto manifest_path = dir / "manifest.json";
  const auto jb = detail::read_all(manifest_path, bundle_manifest_limits.max_bytes);
  return parse_bundle_manifest(std::string_view(reinterpret_cast<const char*>(jb.data()), jb.size()), manifest_path.string());
}

/// Parses the single-file form held in `all` (e.g. a memory-mapped bundle file): header, manifest
/// digest and JSON (bounded by bundle_manifest_limits), and the frame layout (sizes, no trailing
/// bytes). Every length is checked against the bytes present before it is used. Frame digests are
/// checked by verify_bundle_frames. The views borrow `all`.
inline bundle_view parse_bundle_file(std::span<const std::byte> all, std::string_view source) {
  const std::string src(source);
  bundle_view b;
  const error_context where{.file = src, .tensor = {}, .field = "header"};
  if (all.size() < bundle_file_header_size) throw error(errc::integrity, "file too short for a bundle header (truncated?)", where);
  if (std::memcmp(all.data(), bundle_magic, 4) != 0) throw error(errc::format, "bad magic (not a bitrefit delta bundle)", where);
  const auto ver = detail::get_le<std::uint16_t>(all.data() + 4);
  if (ver != bundle_format_version) throw error(errc::unsupported, "bundle format version " + std::to_string(ver), where);
  const auto jlen = detail::get_le<std::uint64_t>(all.data() + 12);
  if (jlen > bundle_manifest_limits.max_bytes)
    throw error(errc::format, "manifest of " + std::to_string(jlen) + " bytes exceeds the limit of " + std::to_string(bundle_manifest_limits.max_bytes), {.file = src, .tensor = {}, .field = "manifest"});
  if (jlen > all.size() - bundle_file_header_size) throw error(errc::integrity, "manifest runs past the end of the file (truncated?)", where);
  const std::byte* jp = all.data() + bundle_file_header_size;
  if (xxh3_128({jp, jlen}) != load_digest_le(all.data() + 20)) throw error(errc::integrity, "manifest digest mismatch (corrupted)", {.file = src, .tensor = {}, .field = "manifest"});
  b.manifest = parse_bundle_manifest(std::string_view(reinterpret_cast<const char*>(jp), jlen), src);
  std::uint64_t off = bundle_file_header_size + jlen;
  for (auto& e : b.manifest.frames) {
    if (e.size > all.size() - off) throw error(errc::integrity, "frame " + std::to_string(e.seq) + " runs past the end of the file (truncated?)", {.file = src, .tensor = {}, .field = "frames"});
    b.frames.push_back(all.subspan(off, e.size));
    off += e.size;
  }
  if (off != all.size()) throw error(errc::integrity, "trailing bytes after the last frame", {.file = src, .tensor = {}, .field = "frames"});
  return b;
}

/// Reads the single-file form from memory (copying the frames) and checks every frame against the
/// manifest (verify_bundle_frames). `source` names the file in errors.
inline delta_bundle read_bundle_bytes(std::span<const std::byte> all, std::string_view source = {}) {
  bundle_view v = parse_bundle_file(all, source);
  delta_bundle b;
  b.manifest = std::move(v.manifest);
  for (auto f : v.frames) b.frames.emplace_back(f.begin(), f.end());
  verify_bundle_frames(b, source);
  return b;
}

/// Reads either form and checks every frame against the manifest (verify_bundle_frames).
inline delta_bundle read_bundle(const std::filesystem::path& path) {
  const std::string src = path.string();
  if (!std::filesystem::is_directory(path)) return read_bundle_bytes(detail::read_all(path), src);
  delta_bundle b;
  b.manifest = read_bundle_manifest(path);
  for (auto& e : b.manifest.frames) {
    const auto fp = path / detail::frame_file_name(e.seq);
    if (!std::filesystem::exists(fp)) throw error(errc::integrity, "frame file missing", {.file = fp.string(), .tensor = {}, .field = {}});
    b.frames.push_back(detail::read_all(fp, e.size));
  }
  verify_bundle_frames(b, src);
  return b;
}

}  // namespace bitrefit::codec
