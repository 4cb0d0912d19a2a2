// bitrefit/ops/checkpoint_ops.hpp — stat, diff, apply, verify and digest on checkpoints on disk.
//
// The operations behind the `bitrefit` CLI (examples/cli) and the Python binding's
// bitrefit.stat/diff/apply/verify/digest (python/): one implementation, two shells. Reading
// checkpoints is io/ (one .safetensors file or a sharded directory); change detection, encoding,
// bundles and attestation digests are codec/. This header only composes them, reports progress
// and per-phase timings (ops/progress.hpp), and decides what the operations promise: nothing is
// written unless everything checked out, and every failure is a bitrefit::error naming the file,
// tensor and field.
#pragma once

#include <fcntl.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/codec/bundle.hpp"
#include "bitrefit/codec/entropy.hpp"
#include "bitrefit/codec/host_backend.hpp"
#include "bitrefit/core/digest.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/io/checkpoint.hpp"
#include "bitrefit/io/tensor_store.hpp"
#include "bitrefit/ops/progress.hpp"

namespace bitrefit::ops {

struct codec_settings {
  int zstd_level = codec::default_zstd_level;
  std::uint64_t frame_bytes = codec::default_max_frame_input_bytes;  // canonical input bytes per frame
  unsigned threads = 0;                                               // 0: hardware concurrency

  unsigned thread_count() const { return threads ? threads : std::max(1u, std::thread::hardware_concurrency()); }
  codec::encode_options options(codec::mode_policy policy, bool base_conditioned = true) const {
    codec::encode_options o;
    o.policy = policy;
    o.base_conditioned = base_conditioned;
    o.zstd_level = zstd_level;
    o.max_frame_input_bytes = frame_bytes;
    return o;
  }
};

// ---- results --------------------------------------------------------------------------------------

struct stat_row {
  std::string name;
  dtype type = dtype::U8;
  shape_t shape;
  std::uint64_t elements = 0, changed = 0;
  std::uint64_t dense_bytes = 0, overwrite_only_bytes = 0, xor_bytes = 0, chosen_bytes = 0;
  // the codec choosing between XOR and overwrite only (frame format 1's codings, before
  // base-conditioned items): what the chosen coding gained
  std::uint64_t unconditioned_bytes = 0;
  double entropy_bytes = 0;
  double change_rate() const { return elements ? static_cast<double>(changed) / static_cast<double>(elements) : 0.0; }
};

struct stat_result {
  std::vector<stat_row> tensors;  // byte-wise name order
  stat_row total;
  bool equal = false;
  codec_settings settings;
  std::uint64_t frames = 0, frame_bytes = 0, bundle_bytes = 0;  // of the chosen coding, as diff writes it
  std::vector<phase_time> phases;
};

struct diff_result {
  std::string delta_path;
  digest128 base_digest, target_digest;
  std::uint64_t tensors = 0, elements = 0, changed = 0, dense_bytes = 0;
  std::uint64_t frames = 0, frame_bytes = 0, bundle_bytes = 0;
  std::vector<phase_time> phases;
};

struct apply_result {
  digest128 base_digest, target_digest;
  std::uint64_t frames = 0, changed = 0;
  std::vector<phase_time> phases;
};

struct verify_difference {
  std::string tensor;
  std::string reason;  // "only in A", "only in B", "dtype", "shape", "bits"
  std::uint64_t differing_elements = 0;
  std::vector<std::uint64_t> first_indices;  // flat row-major element indices
};

struct verify_result {
  bool equal = false;
  digest128 a_digest, b_digest;
  std::uint64_t differing_tensors = 0;
  std::vector<verify_difference> differences;  // at most `limit`, in name order
};

struct digest_result {
  digest128 digest;
  std::uint64_t tensors = 0, elements = 0, bytes = 0;
};

// ---- helpers ----------------------------------------------------------------------------------------

inline std::uint64_t total_bytes(const io::checkpoint& c) { return c.manifest().total_bytes(); }

/// Compares two checkpoints by canonical tensor: names, dtypes, shapes and every stored bit.
/// Reports at most `limit` differing tensors (name order) with at most `limit` first indices each.
inline void compare_checkpoints(const io::checkpoint& a, const io::checkpoint& b, std::uint64_t limit,
                                verify_result& r, progress_phase& bar) {
  const auto& ta = a.manifest().tensors();
  const auto& tb = b.manifest().tensors();
  std::uint64_t done = 0;
  auto note = [&](verify_difference d) {
    ++r.differing_tensors;
    if (r.differences.size() < limit) r.differences.push_back(std::move(d));
  };
  std::size_t i = 0, j = 0;
  while (i < ta.size() || j < tb.size()) {
    if (j == tb.size() || (i < ta.size() && ta[i].name < tb[j].name)) {
      note({ta[i++].name, "only in A", 0, {}});
      continue;
    }
    if (i == ta.size() || tb[j].name < ta[i].name) {
      note({tb[j++].name, "only in B", 0, {}});
      continue;
    }
    const tensor_info& x = ta[i++];
    const tensor_info& y = tb[j++];
    if (x.type != y.type) {
      note({x.name, "dtype", 0, {}});
      continue;
    }
    if (x.shape != y.shape) {
      note({x.name, "shape", 0, {}});
      continue;
    }
    const auto xb = a.tensor(x.name).bytes();
    const auto yb = b.tensor(y.name).bytes();
    const std::size_t E = element_size(x.type);
    verify_difference d{x.name, "bits", 0, {}};
    // Block-wise memcmp first (fast path for equal data), element-wise only inside differing blocks.
    constexpr std::size_t block = std::size_t{1} << 20;
    for (std::size_t at = 0; at < xb.size(); at += block) {
      const std::size_t n = std::min(block, xb.size() - at);
      if (std::memcmp(xb.data() + at, yb.data() + at, n) != 0) {
        for (std::size_t k = at; k < at + n; k += E)
          if (std::memcmp(xb.data() + k, yb.data() + k, E) != 0) {
            ++d.differing_elements;
            if (d.first_indices.size() < limit) d.first_indices.push_back(k / E);
          }
      }
      done += n;
      bar.update(done);
    }
    if (d.differing_elements) note(std::move(d));
  }
  r.equal = r.differing_tensors == 0;
}

namespace detail {

/// Reads every byte of `tensors` once (pages mmapped data in), reporting progress: the I/O-bound
/// part of every operation, so progress shows disk bytes and rate. Returns a checksum nobody uses
/// except to keep the reads from being optimised away.
inline std::uint64_t page_in(std::span<const tensor_view> tensors, progress_phase& bar, std::uint64_t& done) {
  std::uint64_t sum = 0;
  constexpr std::size_t page = 4096, step = std::size_t{16} << 20;
  for (auto& t : tensors) {
    auto b = t.bytes();
    for (std::size_t at = 0; at < b.size(); at += step) {
      const std::size_t n = std::min(step, b.size() - at);
      for (std::size_t k = 0; k < n; k += page) sum += static_cast<std::uint8_t>(b[at + k]);
      done += n;
      bar.update(done);
    }
  }
  return sum;
}

inline volatile std::uint64_t page_in_sink = 0;


inline bool ends_with_separator(const std::string& p) { return !p.empty() && (p.back() == '/'); }

/// Writes a bundle atomically in the requested form: nothing appears under `path` on failure.
inline std::uint64_t write_bundle_atomically(const codec::delta_bundle& b, const std::filesystem::path& path, bool as_dir) {
  namespace fs = std::filesystem;
  if (!as_dir) {
    codec::write_bundle_file(b, path);
    return fs::file_size(path);
  }
  std::error_code ec;
  if (fs::exists(fs::symlink_status(path, ec))) {
    // Replace only an earlier bundle directory (or an empty one), never unrelated files.
    const bool replaceable = fs::is_directory(path) && (fs::is_empty(path, ec) || fs::exists(path / "manifest.json"));
    if (!replaceable)
      throw error(errc::invalid_argument, "refusing to replace something that is not a delta bundle directory",
                  {.file = path.string(), .tensor = {}, .field = {}});
  }
  io::atomic_directory out(path);
  codec::write_bundle_directory(b, out.temp_path());
  out.commit(/*replace_existing=*/true);
  std::uint64_t n = 0;
  for (auto& e : fs::recursive_directory_iterator(path))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

/// Bytes a bundle occupies on disk in the single-file form (header + manifest JSON + frames),
/// computed exactly as write_bundle_file lays it out, without writing.
inline std::uint64_t bundle_file_bytes(const codec::delta_bundle& b) {
  std::uint64_t n = codec::bundle_file_header_size + b.manifest.to_json().dump(1).size();
  for (auto& f : b.frames) n += f.size();
  return n;
}

/// Writes `views` as a sharded directory laid out like `base`: the same shard file names, each
/// holding the same tensors with the same __metadata__, and an index with BASE's metadata and
/// weight map. Atomic as a whole (io::atomic_directory); an existing `dir` is replaced only when it
/// is a checkpoint directory or empty, as io::write_sharded_checkpoint does.
inline void write_like_shards(const io::checkpoint& base, const std::filesystem::path& dir,
                              std::span<const tensor_view> views, const io::progress_fn& progress) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir, ec))) {
    const bool replaceable = fs::is_directory(dir) && (fs::is_empty(dir, ec) || fs::exists(dir / io::index_file_name) ||
                                                       fs::exists(dir / io::single_file_name));
    if (!replaceable)
      throw error(errc::invalid_argument, "refusing to replace something that is not a checkpoint directory",
                  {.file = dir.string(), .tensor = {}, .field = {}});
  }
  std::vector<std::vector<tensor_view>> per_shard(base.shards().size());
  for (const tensor_view& v : views) per_shard.at(*base.shard_of(v.name())).push_back(v);
  std::uint64_t total = 0, before = 0;
  for (const tensor_view& v : views) total += v.bytes().size();
  io::atomic_directory out(dir);
  nlohmann::json weight_map = nlohmann::json::object();
  for (std::size_t i = 0; i < base.shards().size(); ++i) {
    const std::string name = base.shards()[i].path().filename().string();
    std::uint64_t shard_bytes = 0;
    for (auto& v : per_shard[i]) shard_bytes += v.bytes().size();
    io::progress_fn shard_progress;
    if (progress) shard_progress = [&, before](std::uint64_t done, std::uint64_t) { progress(before + done, total); };
    io::write_safetensors(out.path_of(name), per_shard[i], base.shards()[i].metadata(), shard_progress);
    before += shard_bytes;
    for (auto& v : per_shard[i]) weight_map[v.name()] = name;
  }
  nlohmann::json meta = base.index_metadata();
  if (!meta.is_object()) meta = nlohmann::json::object();
  meta["total_size"] = total;
  const nlohmann::json index = {{"metadata", std::move(meta)}, {"weight_map", std::move(weight_map)}};
  const std::string index_text = index.dump(2) + "\n";
  io::write_file_atomically(out.path_of(std::string(io::index_file_name)),
                            std::as_bytes(std::span<const char>(index_text.data(), index_text.size())));
  out.commit(/*replace_existing=*/true);
}

/// Runs fn(i) for i in [0, n) on `threads` workers (dynamic assignment). fn must not throw across
/// threads: the first exception is captured and rethrown here.
template <class Fn>
void parallel_for(std::size_t n, unsigned threads, Fn fn) {
  std::atomic<std::size_t> next{0};
  std::exception_ptr failure;
  std::mutex m;
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard g(m);
        if (!failure) failure = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned w = 1; w < std::min<std::size_t>(threads, n); ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

/// OLD and NEW opened (phase "open") and paged in with progress (phase "read"), as stat and
/// diff both need them before they encode.
struct checkpoint_pair {
  std::optional<io::checkpoint> a, b;
  std::vector<tensor_view> ta, tb;

  void open(const std::filesystem::path& old_path, const std::filesystem::path& new_path, phase_timer& timer,
            progress& pm) {
    {
      auto p = timer.phase("open");
      a.emplace(old_path);
      b.emplace(new_path);
    }
    ta = a->tensors();
    tb = b->tensors();
    auto p = timer.phase("read");
    progress_phase bar(pm, "read", total_bytes(*a) + total_bytes(*b));
    std::uint64_t done = 0;
    page_in_sink = page_in(ta, bar, done) + page_in(tb, bar, done);
  }
};

}  // namespace detail

// ---- stat -------------------------------------------------------------------------------------------

/// Per tensor: the tensor encoded alone (its own frames) in each coding; total: the whole model as
/// `diff` encodes it (tensors packed into frames of settings.frame_bytes), so totals equal what diff
/// writes and the per-tensor payloads add up to slightly more (per-frame headers and digests).
inline stat_result compute_stat(const std::filesystem::path& old_path, const std::filesystem::path& new_path,
                                codec_settings settings, progress& pm = no_progress()) {
  stat_result r;
  r.settings = settings;
  phase_timer timer;
  detail::checkpoint_pair pair;
  pair.open(old_path, new_path, timer, pm);
  const auto& a = pair.a;
  const auto& b = pair.b;
  const auto& ta = pair.ta;
  const auto& tb = pair.tb;
  const unsigned threads = settings.thread_count();
  struct mode_pass {
    codec::mode_policy policy;
    bool base_conditioned;
    std::uint64_t stat_row::*field;
  };
  const mode_pass passes[] = {{codec::mode_policy::overwrite_only, false, &stat_row::overwrite_only_bytes},
                              {codec::mode_policy::xor_only, false, &stat_row::xor_bytes},
                              {codec::mode_policy::xor_allowed, false, &stat_row::unconditioned_bytes},
                              {codec::mode_policy::xor_allowed, true, &stat_row::chosen_bytes}};
  // Whole model, three codings (this also checks the tensor sets agree, naming the tensor if not).
  codec::entropy_accumulator total_entropy;
  std::mutex entropy_lock;
  {
    auto p = timer.phase("encode");
    progress_phase note(pm, "encode", 4 * (total_bytes(*a) + total_bytes(*b)), /*counted=*/false);
    for (const auto& pass : passes) {
      codec::encode_stats st;
      auto bundle = codec::make_delta_bundle(ta, tb, 0, 1, settings.options(pass.policy, pass.base_conditioned), threads, &st);
      r.total.*pass.field = st.frame_bytes;
      if (pass.policy == codec::mode_policy::xor_allowed && pass.base_conditioned) {
        r.frames = st.frames;
        r.frame_bytes = st.frame_bytes;
        r.bundle_bytes = detail::bundle_file_bytes(bundle);
        r.total.changed = st.changed;
      }
    }
  }
  {
    auto p = timer.phase("per-tensor");
    progress_phase note(pm, "tensors", 4 * (total_bytes(*a) + total_bytes(*b)), /*counted=*/false);
    const auto& infos = a->manifest().tensors();
    r.tensors.resize(infos.size());
    detail::parallel_for(infos.size(), threads, [&](std::size_t i) {
      stat_row& row = r.tensors[i];
      row.name = infos[i].name;
      row.type = infos[i].type;
      row.shape = infos[i].shape;
      row.elements = infos[i].elements();
      row.dense_bytes = infos[i].bytes();
      const tensor_view one_a[] = {a->tensor(row.name)};
      const tensor_view one_b[] = {b->tensor(row.name)};
      // Order-0 entropy bound from the codec's change detection (XOR words of changed elements),
      // per tensor and, under a lock (a histogram: order does not matter), for the whole model.
      if (one_a[0].type() == one_b[0].type() && one_a[0].bytes().size() == one_b[0].bytes().size()) {
        codec::entropy_accumulator ent;
        codec::host_backend be;
        const std::size_t E = element_size(row.type);
        const std::uint64_t chunk = std::max<std::uint64_t>(1, settings.frame_bytes / E);
        std::vector<std::uint32_t> pos;
        std::vector<std::byte> xr;
        for (std::uint64_t at = 0; at < row.elements; at += chunk) {
          const std::uint64_t m = std::min(chunk, row.elements - at);
          pos.resize(m);
          xr.resize(m * E);
          const std::size_t c = be.collect_changes(one_a[0].bytes().subspan(at * E, m * E),
                                                   one_b[0].bytes().subspan(at * E, m * E), E, pos, xr, {});
          ent.add(E, m, std::span<const std::byte>(xr.data(), c * E));
          std::lock_guard g(entropy_lock);
          total_entropy.add(E, m, std::span<const std::byte>(xr.data(), c * E));
        }
        row.entropy_bytes = ent.bytes();
      }
      for (const auto& pass : passes) {
        codec::encode_stats st;
        (void)codec::make_delta_bundle(one_a, one_b, 0, 1, settings.options(pass.policy, pass.base_conditioned), 1, &st);
        row.*pass.field = st.frame_bytes;
        if (pass.policy == codec::mode_policy::xor_allowed) row.changed = st.changed;
      }
    });
  }
  r.total.name = "TOTAL";
  r.total.elements = a->manifest().total_elements();
  r.total.dense_bytes = a->manifest().total_bytes();
  r.total.entropy_bytes = total_entropy.bytes();
  r.equal = r.total.changed == 0;
  r.phases = std::move(timer.phases);
  return r;
}

// ---- diff -------------------------------------------------------------------------------------------

inline diff_result write_diff(const std::filesystem::path& old_path, const std::filesystem::path& new_path,
                              const std::string& delta, bool as_dir, bool overwrite_only, codec_settings settings,
                              progress& pm = no_progress()) {
  diff_result r;
  phase_timer timer;
  detail::checkpoint_pair pair;
  pair.open(old_path, new_path, timer, pm);
  const auto& a = pair.a;
  const auto& b = pair.b;
  const auto& ta = pair.ta;
  const auto& tb = pair.tb;
  codec::delta_bundle bundle;
  codec::encode_stats st;
  {
    auto p = timer.phase("encode");
    progress_phase note(pm, "encode", total_bytes(*a) + total_bytes(*b), /*counted=*/false);
    bundle = codec::make_delta_bundle(
        ta, tb, 0, 1, settings.options(overwrite_only ? codec::mode_policy::overwrite_only : codec::mode_policy::xor_allowed),
        settings.thread_count(), &st);
  }
  std::string path = delta;
  while (path.size() > 1 && detail::ends_with_separator(path)) path.pop_back();
  {
    auto p = timer.phase("write");
    r.bundle_bytes = detail::write_bundle_atomically(bundle, path, as_dir);
  }
  const auto& m = bundle.manifest;
  r.delta_path = path;
  r.base_digest = m.base_digest;
  r.target_digest = m.target_digest;
  r.tensors = m.tensors.size();
  r.elements = m.elements;
  r.changed = m.changed;
  r.dense_bytes = m.dense_bytes;
  r.frames = m.frames.size();
  r.frame_bytes = m.payload_bytes;
  r.phases = std::move(timer.phases);
  return r;
}

// ---- apply ------------------------------------------------------------------------------------------

namespace detail {

/// A delta bundle opened without copying its frames: the single file, or each frame file of the
/// directory form, memory-mapped (io::mapped_file); frames are views of the mappings.
struct mapped_bundle {
  std::vector<io::mapped_file> maps;
  codec::bundle_view view;

  explicit mapped_bundle(const std::filesystem::path& path) {
    const std::string src = path.string();
    if (std::filesystem::is_directory(path)) {
      view.manifest = codec::read_bundle_manifest(path);
      maps.reserve(1 + view.manifest.frames.size());  // spans stay valid: no reallocation below
      for (auto& e : view.manifest.frames) {
        const auto fp = path / codec::detail::frame_file_name(e.seq);
        if (!std::filesystem::exists(fp)) throw error(errc::integrity, "frame file missing", {.file = fp.string(), .tensor = {}, .field = {}});
        view.frames.push_back(maps.emplace_back(fp).bytes());
      }
    } else {
      view = codec::parse_bundle_file(maps.emplace_back(path).bytes(), src);
    }
    codec::verify_bundle_frames(view.manifest, view.frames, src);
  }
};

/// Replaces `out` by `stage` (a file, or a directory when `dir`): rename, or for an existing
/// directory an atomic exchange (renameat2) with the old tree deleted after; then fsync the parent.
inline void replace_with(const std::filesystem::path& stage, const std::filesystem::path& out, bool dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(out, ec));
  if (dir && exists) {
    bool swapped = false;
#ifdef RENAME_EXCHANGE
    swapped = ::renameat2(AT_FDCWD, stage.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) == 0;
#endif
    if (swapped) {
      fs::remove_all(stage, ec);  // now the old tree
    } else {
      const fs::path aside = io::detail::temporary_sibling(out);
      if (::rename(out.c_str(), aside.c_str()) != 0) throw io::detail::os_error("cannot move old output aside", out);
      if (::rename(stage.c_str(), out.c_str()) != 0) {
        const int e = errno;
        ::rename(aside.c_str(), out.c_str());
        throw io::detail::os_error("cannot rename into place", out, e);
      }
      fs::remove_all(aside, ec);
    }
  } else if (::rename(stage.c_str(), out.c_str()) != 0) {
    throw io::detail::os_error("cannot rename into place", out);
  }
  io::detail::fsync_directory(fs::absolute(out).parent_path());
}

}  // namespace detail

/// Builds the target from BASE and the bundle, streaming: the output is first written from BASE's
/// memory-mapped bytes under a temporary sibling name in BASE's form (a file when `out` ends in
/// .safetensors or BASE is a file, else a sharded directory), then memory-mapped read-write and
/// patched in place by codec::apply_bundle (every check passes first: tensor set, base digest,
/// every frame; target digest after), synced, and renamed over `out`. Memory beyond the mapped
/// BASE, output and bundle is the decoder's scratch for one frame. `out` may be BASE itself
/// (--in-place): BASE stays mapped and valid until the rename. Nothing is left behind on failure.
inline apply_result apply_delta(const std::filesystem::path& base_path, const std::filesystem::path& delta_path,
                                const std::filesystem::path& out_path, progress& pm = no_progress()) {
  namespace fs = std::filesystem;
  apply_result r;
  phase_timer timer;
  std::optional<io::checkpoint> base;
  std::optional<detail::mapped_bundle> bundle;
  fs::path out = out_path;
  {
    auto p = timer.phase("open");
    base.emplace(base_path);
    bundle.emplace(delta_path);  // structure + every frame's size and digest
    // In place on a directory holding one model.safetensors: replace that file.
    if (out == base_path && !base->is_sharded()) out = base->shards().front().path();
  }
  const bool as_file = out.extension() == ".safetensors" || (!base->is_sharded() && !fs::is_directory(out));
  if (!as_file && fs::exists(out)) {  // the same refusal as the writers, before any work
    std::error_code ec;
    const bool replaceable = fs::is_directory(out) && (fs::is_empty(out, ec) || fs::exists(out / io::index_file_name) ||
                                                       fs::exists(out / io::single_file_name));
    if (!replaceable)
      throw error(errc::invalid_argument, "refusing to replace something that is not a checkpoint directory", {.file = out.string(), .tensor = {}, .field = {}});
  }
  const fs::path stage = io::detail::temporary_sibling(out);
  struct stage_guard {
    fs::path p;
    bool keep = false;
    ~stage_guard() {
      std::error_code ec;
      if (!keep) fs::remove_all(p, ec);
    }
  } guard{stage};
  {
    auto p = timer.phase("copy");
    const auto views = base->tensors();
    progress_phase bar(pm, "copy", base->manifest().total_bytes());
    io::write_options wo;
    wo.progress = [&](std::uint64_t done, std::uint64_t) { bar.update(done); };
    if (as_file) io::write_safetensors(stage, views, base->metadata(), wo.progress);
    else if (base->is_sharded()) detail::write_like_shards(*base, stage, views, wo.progress);
    else io::write_sharded_checkpoint(stage, views, base->metadata(), wo);
  }
  {
    auto p = timer.phase("apply");
    progress_phase note(pm, "apply", total_bytes(*base), /*counted=*/false);
    const io::checkpoint staged(stage);
    std::vector<io::writable_mapping> maps;
    maps.reserve(staged.shards().size());
    std::vector<mutable_tensor_view> targets;
    for (const auto& shard : staged.shards()) {
      const auto& map = maps.emplace_back(shard.path());
      for (const tensor_view& t : shard.tensors()) {
        const auto off = static_cast<std::size_t>(t.bytes().data() - shard.file_bytes().data());
        targets.emplace_back(t.name(), t.type(), t.shape(), map.bytes().subspan(off, t.bytes().size()));
      }
    }
    try {
      codec::apply_bundle(bundle->view.manifest, bundle->view.frames, std::span<const mutable_tensor_view>(targets), delta_path.string());
    } catch (const error& e) {
      // The codec speaks of "the target model" (what a delta is applied to); here that is BASE.
      if (e.code() != errc::mismatch) throw;
      error_context w = e.where();
      w.file = base_path.string();
      throw error(errc::mismatch, "BASE does not fit the delta " + delta_path.string() + ": " + e.message(), w);
    }
    for (const auto& m : maps) m.sync();
  }
  {
    auto p = timer.phase("write");
    detail::replace_with(stage, out, !as_file);
    guard.keep = true;
  }
  r.base_digest = bundle->view.manifest.base_digest;
  r.target_digest = bundle->view.manifest.target_digest;
  r.frames = bundle->view.frames.size();
  r.changed = bundle->view.manifest.changed;
  r.phases = std::move(timer.phases);
  return r;
}

// ---- verify / digest --------------------------------------------------------------------------------

inline verify_result verify_checkpoints(const std::filesystem::path& a_path, const std::filesystem::path& b_path,
                                        std::uint64_t limit, progress& pm = no_progress()) {
  verify_result r;
  io::checkpoint a(a_path), b(b_path);
  const auto ta = a.tensors(), tb = b.tensors();
  {
    progress_phase bar(pm, "compare", total_bytes(a));
    compare_checkpoints(a, b, limit, r, bar);
  }
  {
    progress_phase note(pm, "digest", total_bytes(a) + total_bytes(b), /*counted=*/false);
    r.a_digest = codec::attestation_digest(std::span<const tensor_view>(ta));
    r.b_digest = codec::attestation_digest(std::span<const tensor_view>(tb));
  }
  if (r.equal && r.a_digest != r.b_digest)  // cannot happen unless the digest code disagrees with memcmp
    throw error(errc::integrity, "equal checkpoints with different attestation digests (bug)", {});
  return r;
}

inline digest_result digest_checkpoint(const std::filesystem::path& path, progress& pm = no_progress()) {
  digest_result r;
  io::checkpoint c(path);
  const auto ts = c.tensors();
  {
    progress_phase bar(pm, "read", total_bytes(c));
    std::uint64_t done = 0;
    detail::page_in_sink = detail::page_in(ts, bar, done);
  }
  {
    progress_phase note(pm, "digest", total_bytes(c), /*counted=*/false);
    r.digest = codec::attestation_digest(std::span<const tensor_view>(ts));
  }
  r.tensors = ts.size();
  r.elements = c.manifest().total_elements();
  r.bytes = c.manifest().total_bytes();
  return r;
}

// ---- results as JSON: the CLI's --json output and the Python binding's dicts (one schema) ------------

using ordered_json = nlohmann::ordered_json;

inline ordered_json to_json(const std::vector<phase_time>& phases) {
  ordered_json j = ordered_json::object();
  for (auto& p : phases) j[p.name] = p.seconds;
  return j;
}

inline ordered_json to_json(const stat_row& r, bool with_identity) {
  ordered_json j;
  if (with_identity) {
    j["name"] = r.name;
    j["dtype"] = std::string(dtype_name(r.type));
    j["shape"] = r.shape;
  }
  j["elements"] = r.elements;
  j["changed"] = r.changed;
  j["change_rate"] = r.change_rate();
  j["dense_bytes"] = r.dense_bytes;
  j["overwrite_only_bytes"] = r.overwrite_only_bytes;
  j["xor_bytes"] = r.xor_bytes;
  j["chosen_bytes"] = r.chosen_bytes;
  j["unconditioned_bytes"] = r.unconditioned_bytes;  // the codec without base-conditioned items
  j["entropy_bytes"] = r.entropy_bytes;
  if (r.changed) {
    j["chosen_bytes_per_changed"] = static_cast<double>(r.chosen_bytes) / static_cast<double>(r.changed);
    j["unconditioned_bytes_per_changed"] = static_cast<double>(r.unconditioned_bytes) / static_cast<double>(r.changed);
  }
  return j;
}

inline ordered_json to_json(const stat_result& r) {
  ordered_json j;
  j["equal"] = r.equal;
  j["zstd_level"] = r.settings.zstd_level;
  j["frame_bytes"] = r.settings.frame_bytes;
  j["tensors"] = ordered_json::array();
  for (auto& t : r.tensors) j["tensors"].push_back(to_json(t, true));
  j["total"] = to_json(r.total, false);
  j["payload"] = {{"frames", r.frames}, {"frame_bytes", r.frame_bytes}, {"bundle_bytes", r.bundle_bytes}};
  j["seconds"] = to_json(r.phases);
  return j;
}

inline ordered_json to_json(const diff_result& r) {
  ordered_json j;
  j["delta"] = r.delta_path;
  j["base_digest"] = r.base_digest.to_hex();
  j["target_digest"] = r.target_digest.to_hex();
  j["tensors"] = r.tensors;
  j["elements"] = r.elements;
  j["changed"] = r.changed;
  j["change_rate"] = r.elements ? static_cast<double>(r.changed) / static_cast<double>(r.elements) : 0.0;
  j["dense_bytes"] = r.dense_bytes;
  j["frames"] = r.frames;
  j["frame_bytes"] = r.frame_bytes;
  j["bundle_bytes"] = r.bundle_bytes;
  j["seconds"] = to_json(r.phases);
  return j;
}

inline ordered_json to_json(const apply_result& r) {
  ordered_json j;
  j["base_digest"] = r.base_digest.to_hex();
  j["target_digest"] = r.target_digest.to_hex();
  j["frames"] = r.frames;
  j["changed"] = r.changed;
  j["seconds"] = to_json(r.phases);
  return j;
}

inline ordered_json to_json(const verify_result& r) {
  ordered_json j;
  j["equal"] = r.equal;
  j["a_digest"] = r.a_digest.to_hex();
  j["b_digest"] = r.b_digest.to_hex();
  j["differing_tensors"] = r.differing_tensors;
  j["differences"] = ordered_json::array();
  for (auto& d : r.differences) {
    ordered_json x;
    x["tensor"] = d.tensor;
    x["reason"] = d.reason;
    x["differing_elements"] = d.differing_elements;
    x["first_indices"] = d.first_indices;
    j["differences"].push_back(std::move(x));
  }
  return j;
}

inline ordered_json to_json(const digest_result& r) {
  ordered_json j;
  j["digest"] = r.digest.to_hex();
  j["tensors"] = r.tensors;
  j["elements"] = r.elements;
  j["bytes"] = r.bytes;
  return j;
}

}  // namespace bitrefit::ops
