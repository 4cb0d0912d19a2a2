// tests/cli/checkpoint_fixture.hpp — independent safetensors writing/reading and a chain of
// training-like versions for the CLI tests.
//
// Deliberately independent of bitrefit's io/: the tests check the CLI's output against bytes
// read by this separate, minimal reader, and they feed the CLI files laid out differently from
// how bitrefit writes them (tensors not in name order, metadata, several shards).
#pragma once

#include <nlohmann/json.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bitrefit/testing/adamw.hpp"

namespace fixture {

namespace fs = std::filesystem;

struct tensor {
  std::string dtype;  // safetensors spelling
  std::vector<std::uint64_t> shape;
  std::vector<std::byte> bytes;
  friend bool operator==(const tensor&, const tensor&) = default;
};
using model = std::map<std::string, tensor>;  // by name

inline std::vector<std::byte> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("fixture: cannot read " + p.string());
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  if (!c.empty()) std::memcpy(out.data(), c.data(), c.size());
  return out;
}
inline void write_bytes(const fs::path& p, const std::vector<std::byte>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) throw std::runtime_error("fixture: cannot write " + p.string());
}

/// Writes `names` of `m` (in that order, which need not be name order) as one safetensors file.
inline void write_file(const fs::path& p, const model& m, const std::vector<std::string>& names) {
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", "pt"}, {"writer", "tests/cli fixture"}};
  std::uint64_t at = 0;
  for (auto& n : names) {
    const tensor& t = m.at(n);
    h[n] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  std::string text = h.dump();
  while (text.size() % 8) text.push_back(' ');
  std::vector<std::byte> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xFF);
  for (char c : text) out.push_back(static_cast<std::byte>(c));
  for (auto& n : names) out.insert(out.end(), m.at(n).bytes.begin(), m.at(n).bytes.end());
  write_bytes(p, out);
}

/// All tensors, in reverse name order (so a reader that assumes name order is caught).
inline void write_file(const fs::path& p, const model& m) {
  std::vector<std::string> names;
  for (auto it = m.rbegin(); it != m.rend(); ++it) names.push_back(it->first);
  write_file(p, m, names);
}

/// A Hugging Face style sharded directory: `shards` files model-0000k-of-0000n.safetensors and
/// model.safetensors.index.json; tensors dealt to shards round-robin in name order.
inline void write_sharded(const fs::path& dir, const model& m, int shards) {
  fs::create_directories(dir);
  std::vector<std::vector<std::string>> parts(static_cast<std::size_t>(shards));
  int k = 0;
  for (auto& [n, t] : m) parts[static_cast<std::size_t>(k++ % shards)].push_back(n);
  nlohmann::ordered_json index;
  std::uint64_t total = 0;
  for (auto& [n, t] : m) total += t.bytes.size();
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    write_file(dir / name, m, parts[static_cast<std::size_t>(s)]);
    for (auto& n : parts[static_cast<std::size_t>(s)]) index["weight_map"][n] = name;
  }
  std::ofstream(dir / "model.safetensors.index.json") << index.dump(2);
}

/// Independent reader: one .safetensors file, or a directory with model.safetensors.index.json.
inline model read(const fs::path& p) {
  model m;
  auto read_one = [&](const fs::path& f) {
    auto b = read_bytes(f);
    if (b.size() < 8) throw std::runtime_error("fixture: short file " + f.string());
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint8_t>(b[static_cast<std::size_t>(i)]);
    auto h = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(b.data()) + 8, n));
    for (auto& [name, v] : h.items()) {
      if (name == "__metadata__") continue;
      tensor t;
      t.dtype = v.at("dtype").get<std::string>();
      t.shape = v.at("shape").get<std::vector<std::uint64_t>>();
      auto off = v.at("data_offsets").get<std::vector<std::uint64_t>>();
      t.bytes.assign(b.begin() + static_cast<std::ptrdiff_t>(8 + n + off[0]),
                     b.begin() + static_cast<std::ptrdiff_t>(8 + n + off[1]));
      if (!m.emplace(name, std::move(t)).second) throw std::runtime_error("fixture: duplicate " + name);
    }
  };
  if (fs::is_directory(p)) {
    auto idx = nlohmann::json::parse(std::ifstream(p / "model.safetensors.index.json"));
    std::map<std::string, bool> files;
    for (auto& [n, f] : idx.at("weight_map").items()) files[f.get<std::string>()] = true;
    for (auto& [f, _] : files) read_one(p / f);
  } else {
    read_one(p);
  }
  return m;
}

/// Version k of a small Llama-shaped model trained by the AdamW simulation, plus tensors of other
/// dtypes that checkpoints carry: the FP32 master copy of one projection (changes almost every
/// element each step), an F16 copy of the final norm, and integer/bool buffers that never change.
inline std::vector<model> make_chain(int versions, std::uint64_t seed, const bitrefit::testing::llama_dims& dims = {}) {
  using namespace bitrefit::testing;
  adamw_sim sim(llama_like(dims), seed, {.lr = 1e-6f});
  std::vector<model> out;
  auto u64_shape = [](const bitrefit::shape_t& s) { return std::vector<std::uint64_t>(s.begin(), s.end()); };
  for (int v = 0; v < versions; ++v) {
    if (v > 0) sim.step();
    model m;
    for (std::size_t i = 0; i < sim.tensor_count(); ++i)
      m[sim.spec(i).name] = {"BF16", u64_shape(sim.spec(i).shape), sim.bf16_bytes(i)};
    // FP32 master of layer 0's q_proj, as an optimizer-state-like extra tensor.
    const std::size_t q = 2;
    std::vector<std::byte> f32(4 * sim.elements(q));
    sim.export_f32(q, f32);
    m["optimizer.master.q_proj.weight"] = {"F32", u64_shape(sim.spec(q).shape), std::move(f32)};
    // Derived tensors of the other float dtypes, changing with training: FP8 E4M3/E5M2 as the
    // high byte of layer 0's o_proj BF16 bits (a crude stand-in for a quantized copy; bits are all
    // that matter here), F16 and F64 copies of the final norm's master weights, as raw bits.
    {
      const std::size_t o = 5;  // model.layers.0.self_attn.o_proj.weight
      const auto bf = sim.bf16_bytes(o);
      std::vector<std::byte> e4(bf.size() / 2), e5(bf.size() / 2);
      for (std::size_t i = 0; i < e4.size(); ++i) {
        e4[i] = bf[2 * i + 1];
        e5[i] = bf[2 * i + 1] ^ std::byte{0x80};
      }
      m["quant.o_proj.weight_e4m3"] = {"F8_E4M3", u64_shape(sim.spec(o).shape), std::move(e4)};
      m["quant.o_proj.weight_e5m2"] = {"F8_E5M2", u64_shape(sim.spec(o).shape), std::move(e5)};
      const std::size_t q2 = 1;  // model.layers.0.input_layernorm.weight (init 1.0)
      const auto mf = sim.master(q2);
      std::vector<std::byte> f16(2 * mf.size()), f64(8 * mf.size());
      for (std::size_t i = 0; i < mf.size(); ++i) {
        const std::uint32_t b = std::bit_cast<std::uint32_t>(mf[i]);
        f16[2 * i] = static_cast<std::byte>(b & 0xFF);  // low mantissa bits: change every step
        f16[2 * i + 1] = static_cast<std::byte>((b >> 8) & 0x3F);
        const std::uint64_t d = std::bit_cast<std::uint64_t>(static_cast<double>(mf[i]));
        for (int k = 0; k < 8; ++k) f64[8 * i + static_cast<std::size_t>(k)] = static_cast<std::byte>((d >> (8 * k)) & 0xFF);
      }
      m["extra.norm_f16"] = {"F16", u64_shape(sim.spec(q2).shape), std::move(f16)};
      m["extra.norm_f64"] = {"F64", u64_shape(sim.spec(q2).shape), std::move(f64)};
    }
    // Integer and bool buffers (unchanged across versions), and a 0-d scalar.
    std::vector<std::byte> pos(8 * 64);
    for (std::size_t i = 0; i < 64; ++i) pos[8 * i] = static_cast<std::byte>(i);
    m["model.position_ids"] = {"I64", {1, 64}, pos};
    std::vector<std::byte> mask(64);
    for (std::size_t i = 0; i < 64; ++i) mask[i] = static_cast<std::byte>((i * 7) % 3 == 0);
    m["model.causal_mask"] = {"BOOL", {8, 8}, mask};
    m["model.step"] = {"I64", {}, std::vector<std::byte>(8)};
    m["model.step"].bytes[0] = static_cast<std::byte>(v);
    out.push_back(std::move(m));
  }
  return out;
}

/// Bytes per element of a safetensors dtype spelling.
inline std::size_t elem_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  return 1;
}

/// Flat indices of the elements whose stored bytes differ (at most `limit`), and their count:
/// the independent reference for `stat` and `verify`.
inline std::uint64_t count_changed(const tensor& a, const tensor& b, std::vector<std::uint64_t>* first = nullptr,
                                   std::size_t limit = 0) {
  const std::size_t e = elem_size(a.dtype);
  std::uint64_t c = 0;
  for (std::size_t i = 0; i + e <= a.bytes.size(); i += e)
    if (std::memcmp(&a.bytes[i], &b.bytes[i], e) != 0) {
      if (first && first->size() < limit) first->push_back(i / e);
      ++c;
    }
  return c;
}

}  // namespace fixture
