// bitrefit/io/safetensors.hpp — read and write the safetensors format, strictly.
//
// Format (https://github.com/huggingface/safetensors): 8 bytes little-endian header length N, N
// bytes of JSON {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the data section; offsets are relative to it.
//
// Reading is strict, because a refit must never silently act on a damaged checkpoint: every rule
// broken is reported as a checkpoint_error naming the rule (checkpoint_error.hpp), the file, the
// tensor and the field. The data section must be covered exactly: no tensor past the end, no two
// tensors sharing a byte, no byte owned by no tensor (what the reference implementation enforces).
//
// Writing lays tensors out in byte-wise name order (the manifest order), pads the header with
// spaces so the data section starts 8-byte aligned, and is atomic (atomic_file.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/core/dtype.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"
#include "bitrefit/io/atomic_file.hpp"
#include "bitrefit/io/checkpoint_error.hpp"
#include "bitrefit/io/mapped_file.hpp"

namespace bitrefit::io {

/// The free-form string map stored under "__metadata__".
using metadata_map = std::map<std::string, std::string, std::less<>>;

/// Headers above this are refused as absurd (the limit the reference implementation uses).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
/// Arrays/objects nested deeper than this in a header are refused (checkpoint_errc::header_too_deep).
/// A valid header needs 3 (header, entry, shape); the slack admits unknown nested fields.
inline constexpr std::size_t max_header_depth = 64;

namespace detail {

/// One top-level header entry as the SAX pass saw it; its rules are checked once the whole header
/// parsed (JSON errors and duplicate names come first, then entries in name order).
struct header_entry {
  enum class state : std::uint8_t { absent, bad, ok };
  std::string name;
  bool is_object = false;
  state dtype = state::absent, shape = state::absent, offsets = state::absent;
  std::string field_twice;  // a field of this entry given twice (nlohmann would keep the last)
  std::string dtype_text;
  shape_t shape_dims;
  std::vector<std::uint64_t> offset_values;
};

/// The safetensors header grammar as a SAX handler (nlohmann's sax_parse): builds header_entry
/// records and the metadata map directly, never a JSON tree. Unknown fields of an entry are
/// skipped, whatever they hold, up to max_header_depth.
class header_sax {
 public:
  using json = nlohmann::json;
  explicit header_sax(metadata_map& metadata) : metadata_(metadata) {}

  std::vector<header_entry> entries;
  std::string duplicate;  // the first tensor name seen twice
  bool not_object = false, too_deep = false, metadata_not_object = false, metadata_key_twice = false;
  std::string metadata_bad_key;  // the first __metadata__ key whose value is not a string (or repeats)
  std::string parse_message;  // nlohmann's description of a JSON syntax error

  bool null() { return scalar(kind::other, 0, nullptr); }
  bool boolean(bool) { return scalar(kind::other, 0, nullptr); }
  bool number_integer(json::number_integer_t) { return scalar(kind::other, 0, nullptr); }
  bool number_unsigned(json::number_unsigned_t v) { return scalar(kind::unsigned_int, v, nullptr); }
  bool number_float(json::number_float_t, const json::string_t&) { return scalar(kind::other, 0, nullptr); }
  bool string(json::string_t& v) { return scalar(kind::string, 0, &v); }
  bool binary(json::binary_t&) { return scalar(kind::other, 0, nullptr); }
  bool start_object(std::size_t) { return open(false); }
  bool start_array(std::size_t) { return open(true); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    switch (ctx_.back()) {
      case ctx::top:
        if (!seen_.insert(k).second && duplicate.empty()) duplicate = k;
        if (k == "__metadata__") {
          in_metadata_ = true;
        } else {
          in_metadata_ = false;
          entries.emplace_back().name = k;
        }
        break;
      case ctx::entry: {
        auto& e = entries.back();
        field_ = k == "dtype" ? field::dtype : k == "shape" ? field::shape : k == "data_offsets" ? field::offsets : field::other;
        const auto* s = field_ == field::dtype ? &e.dtype : field_ == field::shape ? &e.shape : field_ == field::offsets ? &e.offsets : nullptr;
        if (s && *s != header_entry::state::absent && e.field_twice.empty()) e.field_twice = k;
        break;
      }
      case ctx::metadata:
        metadata_key_ = k;
        break;
      default: break;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    parse_message = e.what();
    return false;
  }

 private:
  enum class ctx : std::uint8_t { top, entry, shape, offsets, metadata, skip };
  enum class field : std::uint8_t { other, dtype, shape, offsets };
  enum class kind : std::uint8_t { other, unsigned_int, string };
  using state = header_entry::state;

  void mark_bad(state& s) { s = state::bad; }

  bool scalar(kind k, std::uint64_t u, json::string_t* str) {
    if (ctx_.empty()) return not_a_header();
    switch (ctx_.back()) {
      case ctx::top:  // a value that should have been an object
        if (in_metadata_) metadata_not_object = true;
        break;  // entries start with is_object = false
      case ctx::entry: {
        auto& e = entries.back();
        if (field_ == field::dtype) {
          if (k == kind::string) {
            e.dtype = state::ok;
            e.dtype_text = *str;
          } else mark_bad(e.dtype);
        } else if (field_ == field::shape) mark_bad(e.shape);
        else if (field_ == field::offsets) mark_bad(e.offsets);
        break;
      }
      case ctx::shape:
        if (k == kind::unsigned_int) entries.back().shape_dims.push_back(u);
        else mark_bad(entries.back().shape);
        break;
      case ctx::offsets:
        if (k == kind::unsigned_int) entries.back().offset_values.push_back(u);
        else mark_bad(entries.back().offsets);
        break;
      case ctx::metadata:
        if (k != kind::string) bad_metadata(false);
        else if (!metadata_.emplace(metadata_key_, *str).second) bad_metadata(true);
        break;
      case ctx::skip: break;
    }
    return true;
  }

  void bad_metadata(bool twice) {
    if (!metadata_bad_key.empty()) return;
    metadata_bad_key = metadata_key_;
    metadata_key_twice = twice;
  }

  bool open(bool array) {
    if (ctx_.size() >= max_header_depth) {
      too_deep = true;
      return false;
    }
    if (ctx_.empty()) {
      if (array) return not_a_header();
      ctx_.push_back(ctx::top);
      return true;
    }
    ctx next = ctx::skip;
    switch (ctx_.back()) {
      case ctx::top:
        if (in_metadata_) {
          if (array) metadata_not_object = true;
          else next = ctx::metadata;
        } else if (!array) {
          entries.back().is_object = true;
          next = ctx::entry;
        }
        break;
      case ctx::entry: {
        auto& e = entries.back();
        if (field_ == field::dtype) mark_bad(e.dtype);
        else if (field_ == field::shape) {
          if (array) {
            if (e.shape == state::absent) e.shape = state::ok;
            e.shape_dims.clear();
            next = ctx::shape;
          } else mark_bad(e.shape);
        } else if (field_ == field::offsets) {
          if (array) {
            if (e.offsets == state::absent) e.offsets = state::ok;
            e.offset_values.clear();
            next = ctx::offsets;
          } else mark_bad(e.offsets);
        }
        break;
      }
      case ctx::shape: mark_bad(entries.back().shape); break;
      case ctx::offsets: mark_bad(entries.back().offsets); break;
      case ctx::metadata: bad_metadata(false); break;
      case ctx::skip: break;
    }
    ctx_.push_back(next);
    return true;
  }

  bool close() {
    ctx_.pop_back();
    return true;
  }

  bool not_a_header() {
    not_object = true;
    return false;
  }

  metadata_map& metadata_;
  std::vector<ctx> ctx_;
  std::unordered_set<std::string> seen_;
  bool in_metadata_ = false;
  field field_ = field::other;
  std::string metadata_key_;
};

}  // namespace detail

/// A tensor's [begin, end) byte range within the data section.
struct data_offsets {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  friend bool operator==(const data_offsets&, const data_offsets&) = default;
};

/// A validated, non-owning view of a complete safetensors file held in memory.
/// @post every tensor's bytes lie inside the buffer, the tensors tile the data section exactly,
///       and names are unique; tensors()/manifest() list them in byte-wise name order.
class safetensors_view {
 public:
  safetensors_view() = default;

  /// Parses and validates `file` (the whole file's bytes). `source` names it in errors.
  /// Throws checkpoint_error naming the broken rule. The buffer must outlive the view.
  explicit safetensors_view(std::span<const std::byte> file, std::string source = {})
      : source_(std::move(source)), file_(file) {
    parse();
  }

  const std::string& source() const noexcept { return source_; }
  const model_manifest& manifest() const noexcept { return manifest_; }
  const metadata_map& metadata() const noexcept { return metadata_; }
  /// 8 + header length: where the data section starts in the file.
  std::uint64_t data_start() const noexcept { return data_start_; }
  std::span<const std::byte> data() const noexcept { return file_.subspan(data_start_); }

  /// Byte range of tensor `name` within the data section; nullopt when absent.
  std::optional<data_offsets> offsets_of(std::string_view name) const {
    auto i = manifest_.index_of(name);
    if (!i) return std::nullopt;
    return offsets_[*i];
  }

  /// The tensor named `name`, or nullopt.
  std::optional<tensor_view> find(std::string_view name) const {
    auto i = manifest_.index_of(name);
    if (!i) return std::nullopt;
    return view_at(*i);
  }

  /// The tensor named `name`; throws errc::mismatch naming the file and tensor when absent.
  tensor_view tensor(std::string_view name) const {
    if (auto v = find(name)) return *v;
    throw error(errc::mismatch, "no such tensor in this file", {.file = source_, .tensor = std::string(name), .field = {}});
  }

  /// Every tensor, in byte-wise name order.
  std::vector<tensor_view> tensors() const {
    std::vector<tensor_view> out;
    out.reserve(manifest_.size());
    for (std::size_t i = 0; i < manifest_.size(); ++i) out.push_back(view_at(i));
    return out;
  }

 private:
  tensor_view view_at(std::size_t i) const {
    const tensor_info& t = manifest_.tensors()[i];
    return tensor_view(t.name, t.type, t.shape,
                       file_.subspan(data_start_ + offsets_[i].begin, offsets_[i].end - offsets_[i].begin));
  }

  [[noreturn]] void fail(checkpoint_errc p, const std::string& msg, std::string tensor = {}, std::string field = {}) const {
    throw checkpoint_error(p, msg, {.file = source_, .tensor = std::move(tensor), .field = std::move(field)});
  }

  void parse() {
    if (file_.size() < 8) fail(checkpoint_errc::file_too_short, "file holds " + std::to_string(file_.size()) + " bytes, fewer than the 8-byte header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(file_[static_cast<std::size_t>(i)]);
    if (n > max_header_bytes)
      fail(checkpoint_errc::header_length_absurd, "header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(max_header_bytes) + " bytes", {}, "header length");
    if (n > file_.size() - 8)
      fail(checkpoint_errc::header_length_past_end, "header length " + std::to_string(n) + " is larger than the " + std::to_string(file_.size() - 8) + " bytes after it", {}, "header length");
    data_start_ = 8 + n;

    const char* text = reinterpret_cast<const char*>(file_.data() + 8);
    // JSON never holds a raw NUL, and nlohmann would take one as the end of input: refuse it here.
    if (std::find(text, text + n, '\0') != text + n) fail(checkpoint_errc::malformed_json, "header contains a NUL byte", {}, "header");
    // One SAX pass: no JSON tree is built (a tree costs 20-50x the header), memory is the entries'
    // own size, time is linear in the header (duplicates found by hashing, not by re-scanning).
    detail::header_sax sax(metadata_);
    if (!nlohmann::json::sax_parse(text, text + n, &sax)) {
      if (sax.too_deep) fail(checkpoint_errc::header_too_deep, "header nests deeper than " + std::to_string(max_header_depth) + " levels", {}, "header");
      if (sax.not_object) fail(checkpoint_errc::malformed_json, "header is not a JSON object", {}, "header");
      fail(checkpoint_errc::malformed_json, "header is not valid JSON: " + sax.parse_message, {}, "header");
    }
    if (!sax.duplicate.empty()) fail(checkpoint_errc::duplicate_tensor, "name appears twice in the header", sax.duplicate);
    if (sax.metadata_not_object) fail(checkpoint_errc::malformed_entry, "__metadata__ is not an object", {}, "__metadata__");
    if (!sax.metadata_bad_key.empty())
      fail(checkpoint_errc::malformed_entry, "value of key '" + sax.metadata_bad_key + "' is " + (sax.metadata_key_twice ? "given twice" : "not a string"), {}, "__metadata__");

    // Each entry's rules, in byte-wise name order (the order errors are reported in).
    std::vector<detail::header_entry>& raw = sax.entries;
    std::sort(raw.begin(), raw.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    const std::uint64_t data_size = file_.size() - data_start_;
    std::vector<std::pair<tensor_info, data_offsets>> entries;
    entries.reserve(raw.size());
    using st = detail::header_entry::state;
    for (auto& e : raw) {
      const std::string& name = e.name;
      if (name.empty()) fail(checkpoint_errc::malformed_entry, "tensor with an empty name", {}, "name");
      if (!e.is_object) fail(checkpoint_errc::malformed_entry, "entry is not an object", name);
      if (!e.field_twice.empty()) fail(checkpoint_errc::malformed_entry, "field '" + e.field_twice + "' appears twice", name, e.field_twice);
      auto present = [&](st s, const char* f) {
        if (s == st::absent) fail(checkpoint_errc::malformed_entry, std::string("missing field '") + f + "'", name, f);
      };
      present(e.dtype, "dtype");
      if (e.dtype == st::bad) fail(checkpoint_errc::malformed_entry, "dtype is not a string", name, "dtype");
      auto type = parse_dtype(e.dtype_text);
      if (!type) fail(checkpoint_errc::unknown_dtype, "unknown dtype '" + e.dtype_text + "'", name, "dtype");
      present(e.shape, "shape");
      if (e.shape == st::bad) fail(checkpoint_errc::malformed_entry, "shape is not an array of non-negative integers", name, "shape");
      present(e.offsets, "data_offsets");
      if (e.offsets == st::bad || e.offset_values.size() != 2)
        fail(checkpoint_errc::malformed_entry, "data_offsets is not a pair of non-negative integers", name, "data_offsets");
      data_offsets off{e.offset_values[0], e.offset_values[1]};
      if (off.end < off.begin)
        fail(checkpoint_errc::offsets_reversed, "data_offsets out of order: end " + std::to_string(off.end) + " < begin " + std::to_string(off.begin), name, "data_offsets");
      std::uint64_t expect = 0;
      try {
        expect = byte_size(*type, e.shape_dims, name);
      } catch (const error&) {
        fail(checkpoint_errc::shape_size_mismatch, "shape's byte size overflows 64 bits", name, "shape");
      }
      if (off.end - off.begin != expect)
        fail(checkpoint_errc::shape_size_mismatch,
             "data_offsets span " + std::to_string(off.end - off.begin) + " bytes but dtype " + std::string(dtype_name(*type)) +
                 " and shape need " + std::to_string(expect),
             name, "data_offsets");
      if (off.end > data_size)
        fail(checkpoint_errc::offsets_past_end,
             "tensor ends at byte " + std::to_string(off.end) + " of a data section of " + std::to_string(data_size) + " bytes", name, "data_offsets");
      entries.emplace_back(tensor_info{std::move(e.name), *type, std::move(e.shape_dims)}, off);
    }

    // The tensors must tile [0, data_size) exactly: walk them in offset order.
    std::vector<std::size_t> by_offset(entries.size());
    std::iota(by_offset.begin(), by_offset.end(), std::size_t{0});
    std::sort(by_offset.begin(), by_offset.end(), [&](std::size_t a, std::size_t b) {
      const auto& x = entries[a].second;
      const auto& y = entries[b].second;
      return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
    });
    std::uint64_t covered = 0;
    const std::string* previous = nullptr;
    for (std::size_t i : by_offset) {
      const auto& [info, off] = entries[i];
      if (off.begin < covered)
        fail(checkpoint_errc::offsets_overlap, "bytes [" + std::to_string(off.begin) + ", " + std::to_string(covered) + ") also belong to tensor '" + *previous + "'", info.name, "data_offsets");
      if (off.begin > covered)
        fail(checkpoint_errc::offsets_gap, "bytes [" + std::to_string(covered) + ", " + std::to_string(off.begin) + ") before this tensor belong to no tensor", info.name, "data_offsets");
      covered = off.end;
      previous = &info.name;
    }
    if (covered != data_size)
      fail(checkpoint_errc::offsets_gap, "bytes [" + std::to_string(covered) + ", " + std::to_string(data_size) + ") at the end of the data section belong to no tensor", {}, "data_offsets");

    // entries are in byte-wise name order (sorted above)
    std::vector<tensor_info> infos;
    infos.reserve(entries.size());
    offsets_.reserve(entries.size());
    for (auto& [info, off] : entries) {
      infos.push_back(std::move(info));
      offsets_.push_back(off);
    }
    manifest_ = model_manifest(std::move(infos));
  }

  std::string source_;
  std::span<const std::byte> file_;
  std::uint64_t data_start_ = 0;
  model_manifest manifest_;
  std::vector<data_offsets> offsets_;  // parallel to manifest_.tensors()
  metadata_map metadata_;
};

/// A safetensors file on disk, memory-mapped and validated on open.
/// Tensor views point into the mapping and stay valid as long as this object (moves included).
class safetensors_file {
 public:
  safetensors_file() = default;
  explicit safetensors_file(const std::filesystem::path& file) : map_(file), view_(map_.bytes(), file.string()) {}

  static safetensors_file open(const std::filesystem::path& file) { return safetensors_file(file); }

  const std::filesystem::path& path() const noexcept { return map_.path(); }
  const safetensors_view& view() const noexcept { return view_; }
  const model_manifest& manifest() const noexcept { return view_.manifest(); }
  const metadata_map& metadata() const noexcept { return view_.metadata(); }
  std::optional<tensor_view> find(std::string_view name) const { return view_.find(name); }
  tensor_view tensor(std::string_view name) const { return view_.tensor(name); }
  std::vector<tensor_view> tensors() const { return view_.tensors(); }
  std::uint64_t file_size() const noexcept { return map_.size(); }
  /// The whole mapped file (a tensor's bytes().data() minus this data() is its offset in the file).
  std::span<const std::byte> file_bytes() const noexcept { return map_.bytes(); }

 private:
  mapped_file map_;
  safetensors_view view_;
};

/// Called after each chunk written with (bytes done, bytes total). It may throw to abort the
/// write, which then leaves nothing under the target name.
using progress_fn = std::function<void(std::uint64_t done, std::uint64_t total)>;

namespace detail {

/// Tensors sorted by name, after checking names: non-empty, unique, not "__metadata__".
inline std::vector<const tensor_view*> sorted_for_writing(std::span<const tensor_view> tensors, const std::string& target) {
  std::vector<const tensor_view*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->name() < b->name(); });
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::string& n = order[i]->name();
    if (n.empty() || n == "__metadata__")
      throw error(errc::invalid_argument, "a tensor may not be called '" + n + "'", {.file = target, .tensor = n, .field = "name"});
    if (i > 0 && order[i - 1]->name() == n)
      throw error(errc::invalid_argument, "two tensors share this name", {.file = target, .tensor = n, .field = "name"});
  }
  return order;
}

/// The 8-byte length and the JSON header (space-padded so the data starts 8-byte aligned).
inline std::string safetensors_prefix(const std::vector<const tensor_view*>& sorted, const metadata_map& metadata,
                                      const std::string& target) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::uint64_t at = 0;
  for (const tensor_view* t : sorted) {
    header[t->name()] = {{"dtype", std::string(dtype_name(t->type()))},
                         {"shape", t->shape()},
                         {"data_offsets", {at, at + t->bytes().size()}}};
    at += t->bytes().size();
  }
  std::string text;
  try {
    text = header.dump();  // strict: refuses invalid UTF-8, which no reader could parse back
  } catch (const nlohmann::json::type_error& e) {
    throw error(errc::invalid_argument, std::string("a tensor name or metadata string is not valid UTF-8: ") + e.what(),
                {.file = target, .tensor = {}, .field = "header"});
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + text;
}

inline std::uint64_t total_bytes(const std::vector<const tensor_view*>& sorted) {
  std::uint64_t n = 0;
  for (auto* t : sorted) n += t->bytes().size();
  return n;
}

/// Streams one safetensors file into `sink` (anything with write(span<const byte>)).
template <class Sink>
void stream_safetensors(Sink& sink, const std::vector<const tensor_view*>& sorted, const metadata_map& metadata,
                        const progress_fn& progress, std::uint64_t& done, std::uint64_t total, const std::string& target) {
  const std::string prefix = safetensors_prefix(sorted, metadata, target);
  sink.write(std::as_bytes(std::span<const char>(prefix.data(), prefix.size())));
  constexpr std::size_t chunk = std::size_t{64} << 20;  // progress granularity
  for (const tensor_view* t : sorted) {
    auto bytes = t->bytes();
    for (std::size_t at = 0; at < bytes.size(); at += chunk) {
      auto piece = bytes.subspan(at, std::min(chunk, bytes.size() - at));
      sink.write(piece);
      done += piece.size();
      if (progress) progress(done, total);
    }
  }
}

struct vector_sink {
  std::vector<std::byte>& out;
  void write(std::span<const std::byte> b) { out.insert(out.end(), b.begin(), b.end()); }
};

}  // namespace detail

/// The bytes of a safetensors file holding `tensors` (any order; laid out in name order).
/// Throws errc::invalid_argument on an empty, reserved or repeated name.
inline std::vector<std::byte> serialize_safetensors(std::span<const tensor_view> tensors, const metadata_map& metadata = {}) {
  auto sorted = detail::sorted_for_writing(tensors, {});
  std::vector<std::byte> out;
  detail::vector_sink sink{out};
  std::uint64_t done = 0;
  detail::stream_safetensors(sink, sorted, metadata, {}, done, detail::total_bytes(sorted), {});
  return out;
}

/// Writes `tensors` (any order; laid out in name order) and `metadata` to `file` atomically,
/// replacing an existing file. @post on any exception `file` is as it was before and no
/// temporary is left behind.
inline void write_safetensors(const std::filesystem::path& file, std::span<const tensor_view> tensors,
                              const metadata_map& metadata = {}, const progress_fn& progress = {}) {
  auto sorted = detail::sorted_for_writing(tensors, file.string());
  atomic_file out(file);
  std::uint64_t done = 0;
  detail::stream_safetensors(out, sorted, metadata, progress, done, detail::total_bytes(sorted), file.string());
  out.commit();
}

}  // namespace bitrefit::io
