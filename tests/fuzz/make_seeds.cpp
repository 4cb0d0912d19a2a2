// Writes the seed corpora of the fuzz targets from real outputs of the library:
//   fuzz_make_seeds <tests/fuzz/corpus>
// Deterministic (fixed data, no clocks), so rerunning it rewrites identical files. Seeds are small
// (a few KiB each) and cover every coding the decoders know: each location coding, interleaved and
// byte-plane values, raw and zstd sections, XOR, overwrite and base-conditioned items (several
// classes and one), delta and dense frames; the bundle and safetensors forms; every control-message
// type; each durability file. Not the fuzz_relay_framing seeds (README.md).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bitrefit/bitrefit.hpp"

using namespace bitrefit;
namespace fs = std::filesystem;

namespace {

fs::path root;

void write(const std::string& target, const std::string& name, std::span<const std::byte> bytes, int prefix = -1) {
  fs::create_directories(root / target);
  std::FILE* f = std::fopen((root / target / ("seed-" + name)).c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + name);
  if (prefix >= 0) std::fputc(prefix, f);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}
void write_text(const std::string& target, const std::string& name, const std::string& text, int prefix = -1) {
  write(target, name, std::as_bytes(std::span(text.data(), text.size())), prefix);
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = static_cast<std::byte>(x);
  }
  return v;
}

/// new = old with every `stride`-th element changed (in its low byte), starting at `first`.
std::vector<std::byte> changed(const std::vector<std::byte>& old, std::size_t E, std::size_t stride, std::size_t first) {
  auto v = old;
  for (std::size_t i = first; i * E < v.size(); i += stride) v[i * E] ^= std::byte{0x5a};
  return v;
}

void frames() {
  struct spec {
    const char* name;
    dtype type;
    std::size_t elements, stride, first;
    codec::mode_policy policy;
  };
  const spec specs[] = {
      {"bf16-xor-gaps", dtype::BF16, 2048, 37, 3, codec::mode_policy::xor_allowed},
      {"f32-overwrite", dtype::F32, 1024, 5, 0, codec::mode_policy::overwrite_only},
      {"u8-dense-changes", dtype::U8, 512, 1, 0, codec::mode_policy::xor_allowed},
      {"f16-runs", dtype::F16, 4096, 1, 100, codec::mode_policy::xor_only},
      {"f64-sparse", dtype::F64, 300, 97, 11, codec::mode_policy::xor_allowed},
      {"bf16-bitmap", dtype::BF16, 2048, 2, 0, codec::mode_policy::xor_allowed},
      {"i32-wide-gaps", dtype::I32, 1u << 18, 70000, 5, codec::mode_policy::overwrite_only},
  };
  unsigned seed = 1;
  for (const auto& s : specs) {
    const std::size_t E = element_size(s.type);
    const auto old = pattern(s.elements * E, seed++);
    auto neu = s.stride == 1 && s.first == 100 ? old : changed(old, E, s.stride, s.first);
    if (s.stride == 1 && s.first == 100)  // one long run of changes
      for (std::size_t i = 100; i < 900; ++i) neu[i * E] ^= std::byte{1};
    codec::chunk_encoder<> enc(codec::encode_options{.policy = s.policy});
    codec::chunk_piece pc{"model.layers.0.w", s.type, s.elements, 0, s.elements, old, neu};
    codec::byte_buffer out;
    enc.encode({codec::frame_kind::delta, payload_id{{3, 7}, 1, 2}, 4, 5}, std::span(&pc, 1), out);
    write("fuzz_frame", s.name, out.span());
  }
  {  // two tensors in one frame, and a dense frame
    const auto a = pattern(256 * 2, 50), b = pattern(100 * 4, 51);
    const auto a2 = changed(a, 2, 9, 1), b2 = changed(b, 4, 3, 2);
    const codec::chunk_piece pcs[] = {{"a", dtype::BF16, 256, 0, 256, a, a2}, {"b", dtype::F32, 100, 0, 100, b, b2}};
    codec::chunk_encoder<> enc;
    codec::byte_buffer out;
    enc.encode({codec::frame_kind::delta, payload_id{{1, 1}, 0, 0}, 0, 1}, pcs, out);
    write("fuzz_frame", "two-tensors", out.span());
    enc.encode_dense({codec::frame_kind::dense, payload_id{{1, 1}, 0, 1}, 1, 1}, pcs, out);
    write("fuzz_frame", "dense", out.span());
  }
  // Base-conditioned items (class ranks and ULP distances) against the fuzz target's own model
  // bytes (fuzz_frame.cpp: byte i of a tensor is i*131 + the name's length), so they decode there:
  // "classes", changes likelier on smaller exponents (several classes); "one-class", changes that
  // ignore the exponent (the decoder's one-class path).
  {
    const std::string name = "model.layers.0.w";
    const std::size_t n = 4096;
    std::vector<std::byte> old(n * 2);
    for (std::size_t i = 0; i < old.size(); ++i) old[i] = static_cast<std::byte>(i * 131 + name.size());
    const auto f = *codec::float_format_of(dtype::BF16);
    for (const bool classes : {true, false}) {
      auto neu = old;
      std::uint32_t x = classes ? 7 : 11;
      for (std::size_t i = 0; i < n; ++i) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        std::uint16_t o;
        std::memcpy(&o, old.data() + 2 * i, 2);
        const std::uint64_t e = f.exponent(o);
        const bool pick = classes ? x % 256 < (e < 64 ? 160u : e < 128 ? 24u : 2u) : x % 16 == 0;
        if (!pick) continue;
        if (const auto s = codec::ulp_step(f, o, (x >> 16) & 1 ? 1 : -1)) {
          const auto v = static_cast<std::uint16_t>(*s);
          std::memcpy(neu.data() + 2 * i, &v, 2);
        }
      }
      codec::chunk_encoder<> enc(codec::encode_options{.policy = codec::mode_policy::conditioned_only});
      const codec::chunk_piece pc{name, dtype::BF16, n, 0, n, old, neu};
      codec::byte_buffer out;
      enc.encode({codec::frame_kind::delta, payload_id{{3, 7}, 1, 2}, 4, 5}, std::span(&pc, 1), out);
      write("fuzz_frame", classes ? "bf16-conditioned-classes" : "bf16-conditioned-one-class", out.span());
    }
  }
  // "lanes": a class large enough for sixteen-lane streams (codec::conditioned_detail::lanes_min_changes, 65 536
  // changes) in a small seed: every element that can move of a 66 577-element tensor (16 lanes x 4161
  // groups + 1, so a partial group too) moves up by one ULP (d = +1). The fuzz model's byte pattern
  // holds no NaN, infinity or largest finite value, so every element moves: the gaps are all 0 and
  // the values almost all one symbol, and the streams cost little (an element ulp_step could not
  // move would stay and give the gap stream another symbol).
  {
    const std::string name = "model.layers.1.w";
    const std::size_t n = 16 * 4161 + 1;
    std::vector<std::byte> old(n * 2);
    for (std::size_t i = 0; i < old.size(); ++i) old[i] = static_cast<std::byte>(i * 131 + name.size());
    const auto f = *codec::float_format_of(dtype::BF16);
    auto neu = old;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t o;
      std::memcpy(&o, old.data() + 2 * i, 2);
      if (const auto s = codec::ulp_step(f, o, 1)) {
        const auto v = static_cast<std::uint16_t>(*s);
        std::memcpy(neu.data() + 2 * i, &v, 2);
      }
    }
    codec::chunk_encoder<> enc(codec::encode_options{.policy = codec::mode_policy::conditioned_only});
    const codec::chunk_piece pc{name, dtype::BF16, n, 0, n, old, neu};
    codec::byte_buffer out;
    codec::encode_stats st;
    enc.encode({codec::frame_kind::delta, payload_id{{3, 7}, 1, 3}, 4, 5}, std::span(&pc, 1), out, &st);
    if (st.changed < codec::conditioned_detail::lanes_min_changes) throw std::runtime_error("lanes seed: fewer changes than a lane class needs");
    write("../corpus_large/fuzz_frame", "bf16-conditioned-lanes", out.span());  // too slow to fuzz from in CI
  }
}

void bundles() {
  std::vector<std::vector<std::byte>> base_bytes, target_bytes;
  std::vector<tensor_view> base, target;
  const std::pair<const char*, dtype> ts[] = {{"embed", dtype::BF16}, {"norm", dtype::F32}, {"head", dtype::F16}};
  base_bytes.reserve(3);
  target_bytes.reserve(3);
  unsigned seed = 9;
  for (auto [name, type] : ts) {
    const std::size_t n = 300, E = element_size(type);
    base_bytes.emplace_back(n * E);  // the zero base the fuzz target rebuilds
    target_bytes.push_back(changed(pattern(n * E, seed++), E, 1, 0));
    for (std::size_t i = 0; i < n * E; i += 7 * E) target_bytes.back()[i] = std::byte{0};
    base.emplace_back(name, type, shape_t{n}, std::span<const std::byte>(base_bytes.back()));
    target.emplace_back(name, type, shape_t{n}, std::span<const std::byte>(target_bytes.back()));
  }
  const auto b = codec::make_delta_bundle(base, target, 3, 4, codec::encode_options{.max_frame_input_bytes = 512});
  const auto p = fs::temp_directory_path() / "bitrefit-seed.bundle";
  codec::write_bundle_file(b, p);
  write("fuzz_bundle", "three-tensors", codec::detail::read_all(p));
  const auto b1 = codec::make_delta_bundle(std::span(base).first(1), std::span(base).first(1), 0, 1);
  codec::write_bundle_file(b1, p);
  write("fuzz_bundle", "no-change", codec::detail::read_all(p));
  fs::remove(p);
}

void safetensors() {
  const auto a = pattern(6 * 2, 20), b = pattern(4 * 4, 21);
  const std::vector<tensor_view> ts{{"model.embed", dtype::BF16, {2, 3}, a}, {"model.norm", dtype::F32, {4}, b},
                                    {"empty", dtype::F64, {0}, {}}};
  write("fuzz_safetensors", "file", io::serialize_safetensors(ts, {{"format", "pt"}}), 0);
  write("fuzz_safetensors", "file-no-metadata", io::serialize_safetensors(std::span(ts).first(1)), 0);
  write_text("fuzz_safetensors", "index",
             R"({"metadata":{"total_size":28},"weight_map":{"model.embed":"model-00001-of-00002.safetensors",)"
             R"("model.norm":"model-00002-of-00002.safetensors"}})",
             1);
}

void wire_messages() {
  using namespace protocol;
  const attempt_id a{2, 5};
  const commit_record k{4, baseline_id{9}};
  prepare_record r{a, k, 5, baseline_id{10}, mode::xor_mask, true, {{0, 1}, {1, 3}}, {digest128{1, 2}, digest128{3, 4}}};
  const message msgs[] = {prepare_msg{r},
                          obsolete_msg{a},
                          open_msg{a, {3, 0, 2}},
                          flush_msg{a},
                          announce_msg{k},
                          announce_msg{k, member{1, 3}, true, false, 2},
                          roll_call_msg{2},
                          abort_msg{2, a},
                          manifest_msg{a, 1, 3},
                          arrived_msg{a, {1, 3}},
                          ack_msg{a, {1, 3}, digest128{5, 6}},
                          ack_msg{a, {0, 1}, std::nullopt},
                          stopped_msg{a, {1, 3}},
                          failed_msg{a, {1, 3}, failure_reason{}},
                          join_msg{{2, 7}, k, 2},
                          baseline_msg{1, k},
                          frozen_lost_msg{a, 1, 5},
                          payload_msg{payload_id{a, 1, 2}, 4, 5, mode::xor_mask, digest128{7, 8}}};
  int i = 0;
  for (const auto& m : msgs) {
    const envelope e{endpoint::coord(), endpoint::receiver_(1), m};
    write("fuzz_wire", std::to_string(i++) + "-" + std::to_string(m.index()), wire::encode(e));
  }
}

void durability_files() {
  using namespace protocol;
  log_snapshot s{3, {4, baseline_id{9}}, prepare_record{{3, 1}, {4, baseline_id{9}}, 5, baseline_id{10}, mode::overwrite, false, {{0, 1}}, {}}};
  write_text("fuzz_durability", "commit-log", wire::to_json(s).dump(), 0);
  const auto d = fs::temp_directory_path() / "bitrefit-seed-baselines";
  fs::remove_all(d);
  durability::filesystem_baseline_store st(d);
  durability::baseline_image img;
  img["a"] = std::vector<std::byte>(64, std::byte{1});
  img["b"] = std::vector<std::byte>(40, std::byte{2});
  img["c"] = std::vector<std::byte>(16, std::byte{3});
  st.save(1, img);
  durability::change_set cs;
  cs["a"] = {8, 8, {0, 3, 7}, pattern(24, 3)};
  cs["c"] = {4, 4, {2}, pattern(4, 4)};
  st.save_changes(1, 2, cs);
  auto without_digest = [](const fs::path& p) {
    auto v = codec::detail::read_all(p);
    v.resize(v.size() - 8);  // the target seals the file itself
    return v;
  };
  write("fuzz_durability", "full-image", without_digest(st.full_path(1)), 1);
  write("fuzz_durability", "delta", without_digest(st.delta_path(2)), 2);
  fs::remove_all(d);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <tests/fuzz/corpus>\n", argv[0]);
    return 2;
  }
  root = argv[1];
  frames();
  bundles();
  safetensors();
  wire_messages();
  durability_files();
  std::printf("seeds written under %s\n", root.c_str());
}
