// bitrefit/io/checkpoint.hpp — a model checkpoint: one .safetensors file or a sharded directory.
//
// Hugging Face checkpoints come in two shapes: a single `model.safetensors`, or a directory of
// shards `model-00001-of-0000N.safetensors` with `model.safetensors.index.json` mapping every
// tensor name to its shard ({"metadata": {...}, "weight_map": {"name": "shard file"}}). Both open
// as one `checkpoint` that answers by canonical tensor name, so nothing above io/ cares which.
//
// Opening validates every shard (safetensors.hpp) and that the index and the shards agree exactly:
// every listed shard exists, every listed tensor is in its shard, every shard tensor is listed, and
// no tensor lives in two shards. Writing is atomic for the whole directory (atomic_file.hpp).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"
#include "bitrefit/io/atomic_file.hpp"
#include "bitrefit/io/checkpoint_error.hpp"
#include "bitrefit/io/json.hpp"
#include "bitrefit/io/safetensors.hpp"

namespace bitrefit::io {

inline constexpr std::string_view index_file_name = "model.safetensors.index.json";
inline constexpr std::string_view single_file_name = "model.safetensors";

/// What an index file may cost (io/json.hpp). A trillion-parameter model's index (~100 K tensors)
/// is about 10 MB of text and a 30 MB tree.
inline constexpr json_limits index_json_limits{.max_bytes = 64u << 20, .max_depth = 16, .max_tree_bytes = 256u << 20};

/// model.safetensors.index.json, validated on its own: the "metadata" object and the weight map.
struct checkpoint_index {
  nlohmann::json metadata = nlohmann::json::object();
  /// tensor name -> shard file name (a plain file name beside the index)
  std::map<std::string, std::string, std::less<>> weight_map;
};

/// Parses an index file's text. Every problem is checkpoint_errc::malformed_index naming `source`
/// (and the tensor, where one is at fault): not JSON, above index_json_limits, a key twice, no
/// weight_map object, a shard name that is not a string or not a plain file name.
inline checkpoint_index parse_index(std::string_view text, const std::string& source) {
  auto bad = [&](const std::string& msg, std::string tensor = {}, std::string field = {}) {
    return checkpoint_error(checkpoint_errc::malformed_index, msg, {.file = source, .tensor = std::move(tensor), .field = std::move(field)});
  };
  nlohmann::json index;
  try {
    index = parse_json(text, index_json_limits, {.file = source, .tensor = {}, .field = {}});
  } catch (const error& e) {
    throw bad("index refused: " + e.message(), {}, e.where().field);
  }
  if (!index.is_object()) throw bad("index is not a JSON object");
  checkpoint_index out;
  if (auto m = index.find("metadata"); m != index.end()) {
    if (!m->is_object()) throw bad("metadata is not an object", {}, "metadata");
    out.metadata = std::move(*m);
  }
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) throw bad("no weight_map object", {}, "weight_map");
  for (auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) throw bad("shard name is not a string", tensor, "weight_map");
    const std::string& s = shard.get_ref<const std::string&>();
    // Shards are plain file names beside the index: no directories, no way out of the checkpoint.
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos || s.find('\0') != std::string::npos)
      throw bad("shard name '" + s + "' is not a plain file name", tensor, "weight_map");
    out.weight_map.emplace_hint(out.weight_map.end(), tensor, s);
  }
  return out;
}

class checkpoint {
 public:
  checkpoint() = default;

  /// Opens `path`: a .safetensors file; a directory holding model.safetensors.index.json (sharded)
  /// or model.safetensors; or the index file itself. Throws checkpoint_error naming the problem,
  /// or errc::io when the path cannot be read.
  explicit checkpoint(const std::filesystem::path& path) : path_(path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto st = fs::status(path, ec);
    if (!fs::exists(st))
      throw error(errc::io, "no such file or directory", {.file = path.string(), .tensor = {}, .field = {}});
    if (fs::is_directory(st)) {
      if (fs::exists(path / index_file_name)) open_sharded(path / index_file_name);
      else if (fs::exists(path / single_file_name)) open_single(path / single_file_name);
      else
        throw checkpoint_error(checkpoint_errc::not_a_checkpoint,
                               "directory holds neither " + std::string(index_file_name) + " nor " + std::string(single_file_name),
                               {.file = path.string(), .tensor = {}, .field = {}});
    } else if (path.filename().string().ends_with(".index.json")) {
      open_sharded(path);
    } else {
      open_single(path);
    }
  }

  static checkpoint open(const std::filesystem::path& path) { return checkpoint(path); }

  /// The path given to open.
  const std::filesystem::path& path() const noexcept { return path_; }
  bool is_sharded() const noexcept { return sharded_; }
  /// Every tensor of every shard, in byte-wise name order.
  const model_manifest& manifest() const noexcept { return manifest_; }
  /// "__metadata__" of the file, or of the first shard (writers give every shard the same).
  const metadata_map& metadata() const noexcept {
    static const metadata_map none;
    return shards_.empty() ? none : shards_.front().metadata();
  }
  /// The index file's "metadata" object (e.g. total_size); an empty object when not sharded.
  const nlohmann::json& index_metadata() const noexcept { return index_metadata_; }
  /// The files, in shard-name order (one for a single-file checkpoint).
  const std::vector<safetensors_file>& shards() const noexcept { return shards_; }
  /// Which of shards() holds tensor `name`; nullopt when absent.
  std::optional<std::size_t> shard_of(std::string_view name) const {
    auto i = manifest_.index_of(name);
    if (!i) return std::nullopt;
    return shard_of_[*i];
  }

  std::optional<tensor_view> find(std::string_view name) const {
    auto s = shard_of(name);
    if (!s) return std::nullopt;
    return shards_[*s].find(name);
  }
  /// Throws errc::mismatch naming the checkpoint and the tensor when absent.
  tensor_view tensor(std::string_view name) const {
    if (auto v = find(name)) return *v;
    throw error(errc::mismatch, "no such tensor in this checkpoint", {.file = path_.string(), .tensor = std::string(name), .field = {}});
  }
  /// Every tensor in byte-wise name order (views into the mapped shards).
  std::vector<tensor_view> tensors() const {
    std::vector<tensor_view> out;
    out.reserve(manifest_.size());
    for (const auto& t : manifest_.tensors()) out.push_back(*find(t.name));
    return out;
  }

 private:
  void open_single(const std::filesystem::path& file) {
    shards_.emplace_back(file);
    manifest_ = shards_.front().manifest();
    shard_of_.assign(manifest_.size(), 0);
  }

  void open_sharded(const std::filesystem::path& index_path) {
    sharded_ = true;
    const std::string where = index_path.string();
    auto bad = [&](checkpoint_errc p, const std::string& msg, std::string tensor = {}, std::string field = {},
                   std::string file = {}) -> checkpoint_error {
      return checkpoint_error(p, msg, {.file = file.empty() ? where : file, .tensor = std::move(tensor), .field = std::move(field)});
    };
    // the size first: an index above the limit is refused unread
    std::error_code size_ec;
    const auto size = std::filesystem::file_size(index_path, size_ec);
    if (!size_ec && size > index_json_limits.max_bytes)
      throw bad(checkpoint_errc::malformed_index, "index file of " + std::to_string(size) + " bytes exceeds the limit of " + std::to_string(index_json_limits.max_bytes), {}, "json.size");
    std::ifstream in(index_path, std::ios::binary);
    if (!in) throw detail::os_error("cannot open for reading", index_path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    checkpoint_index index = parse_index(text, where);
    index_metadata_ = std::move(index.metadata);
    const auto& wm = index.weight_map;

    // shard file name -> the tensors the index places there
    std::map<std::string, std::vector<std::string>> listed;
    for (const auto& [tensor, shard] : wm) listed[shard].push_back(tensor);

    const std::filesystem::path dir = index_path.parent_path();
    std::map<std::string, std::size_t> shard_index;
    for (auto& [s, names] : listed) {
      std::error_code ec;
      if (!std::filesystem::is_regular_file(dir / s, ec))
        throw bad(checkpoint_errc::index_missing_shard, "index names shard '" + s + "', which does not exist", names.front(), "weight_map");
      shard_index[s] = shards_.size();
      shards_.emplace_back(dir / s);
      for (auto& name : names)
        if (!shards_.back().find(name))
          throw bad(checkpoint_errc::index_missing_tensor, "index places this tensor in shard '" + s + "', which does not hold it", name,
                    "weight_map");
    }

    std::vector<tensor_info> all;
    std::map<std::string, std::size_t, std::less<>> owner;
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      const std::string file = shards_[i].path().string();
      for (const auto& t : shards_[i].manifest().tensors()) {
        auto it = wm.find(t.name);
        if (it == wm.end())
          throw bad(checkpoint_errc::index_unlisted_tensor, "shard holds a tensor the index does not list", t.name, {}, file);
        if (shard_index.at(it->second) != i)
          throw bad(checkpoint_errc::duplicate_tensor, "tensor is also in shard '" + it->second + "'", t.name, {}, file);
        owner.emplace(t.name, i);
        all.push_back(t);
      }
    }
    manifest_ = model_manifest(std::move(all));
    shard_of_.reserve(manifest_.size());
    for (const auto& t : manifest_.tensors()) shard_of_.push_back(owner.find(t.name)->second);
  }

  std::filesystem::path path_;
  bool sharded_ = false;
  std::vector<safetensors_file> shards_;
  model_manifest manifest_;
  std::vector<std::size_t> shard_of_;  // parallel to manifest_.tensors()
  nlohmann::json index_metadata_ = nlohmann::json::object();
};

/// How write_checkpoint and write_sharded_checkpoint lay out and report their work.
struct write_options {
  /// A shard is closed before it would exceed this many tensor bytes (a larger tensor gets a shard
  /// of its own). The default matches Hugging Face's "5GB".
  std::uint64_t max_shard_bytes = 5'000'000'000;
  /// Called with (bytes done, bytes total); may throw to abort, leaving nothing written.
  progress_fn progress;
};

/// The shard file name Hugging Face uses: model-00001-of-00003.safetensors (1-based).
inline std::string shard_file_name(std::size_t index, std::size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buf;
}

/// Writes `tensors` as a sharded checkpoint directory `dir`: shards in name order, each carrying
/// `metadata` as its __metadata__, and model.safetensors.index.json with metadata.total_size and
/// the weight_map. Atomic as a whole: the directory appears complete or not at all. An existing
/// `dir` is replaced only when it is empty or is itself a checkpoint directory (holds an index or
/// model.safetensors); anything else is refused with errc::invalid_argument, so a mistyped output
/// path never deletes unrelated files.
inline void write_sharded_checkpoint(const std::filesystem::path& dir, std::span<const tensor_view> tensors,
                                     const metadata_map& metadata = {}, const write_options& options = {}) {
  namespace fs = std::filesystem;
  const std::string where = dir.string();
  std::error_code ec;
  auto st = fs::symlink_status(dir, ec);
  if (fs::exists(st)) {
    const bool replaceable = fs::is_directory(st) && (fs::is_empty(dir, ec) || fs::exists(dir / index_file_name) ||
                                                      fs::exists(dir / single_file_name));
    if (!replaceable)
      throw error(errc::invalid_argument, "refusing to replace something that is not a checkpoint directory",
                  {.file = where, .tensor = {}, .field = {}});
  }
  auto sorted = detail::sorted_for_writing(tensors, where);

  std::vector<std::vector<const tensor_view*>> shards(1);
  std::uint64_t in_shard = 0;
  for (const tensor_view* t : sorted) {
    const std::uint64_t n = t->bytes().size();
    if (!shards.back().empty() && in_shard + n > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += n;
  }

  const std::uint64_t total = detail::total_bytes(sorted);
  atomic_directory out(dir);
  nlohmann::json weight_map = nlohmann::json::object();
  std::uint64_t done = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shard_file_name(i, shards.size());
    detail::fd_writer file(out.path_of(name));
    detail::stream_safetensors(file, shards[i], metadata, options.progress, done, total, where);
    file.finish();
    for (const tensor_view* t : shards[i]) weight_map[t->name()] = name;
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
  detail::fd_writer index_file(out.path_of(index_file_name));
  index_file.write(index.dump(2) + "\n");
  index_file.finish();
  out.commit(/*replace_existing=*/true);
}

/// Writes `tensors` in the form `path` asks for: a single file when it ends in ".safetensors",
/// else a sharded directory. Atomic either way.
inline void write_checkpoint(const std::filesystem::path& path, std::span<const tensor_view> tensors,
                             const metadata_map& metadata = {}, const write_options& options = {}) {
  if (path.extension() == ".safetensors") write_safetensors(path, tensors, metadata, options.progress);
  else write_sharded_checkpoint(path, tensors, metadata, options);
}

}  // namespace bitrefit::io
