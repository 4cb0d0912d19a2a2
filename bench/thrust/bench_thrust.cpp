// bitrefit-bench-thrust — throughput of the codec's execution backends on one BF16 model, side by
// side in one run: host (the reference, one thread), thrust-cpp, thrust-omp, thrust-cuda.
//
//   bitrefit-bench-thrust --backend host,thrust-cuda --size-mib 4096 --change 0.03 [--json]
//
// For each backend the same model (old and new BF16 versions, tensors of 64 MiB) is staged where
// the backend works (device memory for thrust-cuda; staging is not timed), then, best of --repeat:
//   detect_s       change detection alone: count of changed elements of every chunk
//   detect_prep_s  detection + preparation: positions compacted, XOR words and new values
//                  gathered, and copied to host memory (the encoder's first step, every chunk)
//   encode_s       the whole chunk_encoder (preparation above + location coding + zstd on host)
//   apply_scatter_s  in-place scatter of every frame's (already decoded) positions and values
//   apply_frames_s   verified frame apply (parse, digest, decode on host, then scatter)
//   attest_s       attestation digest of the new model (per-64-KiB XXH3-128 leaves on the backend)
// and GB/s = model bytes / seconds. Frames must be byte-identical across backends, the applied
// copy bit-exact, and the attestation digests equal: the bench exits 1 otherwise.
// With nvcc this file is compiled through bench_thrust.cu and gains the thrust-cuda backend.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../codec/sim_stream.hpp"
#include "bitrefit/codec/codec.hpp"
#include "bitrefit/codec/thrust/backend.hpp"

using namespace bitrefit;
using namespace bitrefit::codec;

namespace {

struct args {
  std::vector<std::string> backends{"host"};
  std::uint64_t size_mib = 256;
  std::string change = "0.03";
  std::uint64_t frame_mib = 64;
  int repeat = 1;
  std::uint64_t seed = 42;
  bool json = false;
};

using clk = std::chrono::steady_clock;
double since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

struct model {
  std::vector<tensor_info> infos;
  std::vector<std::uint64_t> offsets;
  std::uint64_t bytes = 0;
  std::vector<std::byte> old_b, new_b;
};

model make_model(const args& a) {
  model m;
  m.bytes = a.size_mib << 20;
  const std::uint64_t per = 64ull << 20;
  for (std::uint64_t off = 0, i = 0; off < m.bytes; off += per, ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model.layers.%04llu.weight", static_cast<unsigned long long>(i));
    m.infos.push_back({name, dtype::BF16, {std::min(per, m.bytes - off) / 2}});
  }
  m.infos = model_manifest(m.infos).tensors();  // name order
  for (std::uint64_t off = 0; auto& t : m.infos) m.offsets.push_back(off), off += t.bytes();
  m.old_b.resize(m.bytes);
  m.new_b.resize(m.bytes);
  auto* o = reinterpret_cast<std::uint16_t*>(m.old_b.data());
  auto* n = reinterpret_cast<std::uint16_t*>(m.new_b.data());
  const std::int64_t elems = static_cast<std::int64_t>(m.bytes / 2), blk = 1 << 16;
  if (a.change == "adamw") {
    bitrefit_bench::adamw_stream sim;
    sim.seed = a.seed;
#pragma omp parallel for schedule(dynamic, 16)
    for (std::int64_t s = 0; s < elems; s += blk) sim.fill(s, std::min(blk, elems - s), o + s, n + s);
  } else {
    const double p = std::strtod(a.change.c_str(), nullptr);
    if (!(p >= 0.0 && p <= 1.0)) throw error(errc::invalid_argument, "--change must be adamw or a rate in [0, 1]");
    const auto thresh = static_cast<std::uint64_t>(p * 18446744073709551615.0);
    const std::uint64_t k_init = bitrefit_bench::mix64(a.seed * 4 + 1), k_pick = bitrefit_bench::mix64(a.seed * 4 + 2);
#pragma omp parallel for schedule(static)
    for (std::int64_t j = 0; j < elems; ++j) {
      const auto u = static_cast<std::uint64_t>(j);
      o[j] = bitrefit_bench::bf16_rne(0.02f * bitrefit_bench::approx_normal(k_init, u));
      const std::uint64_t r = bitrefit_bench::mix64(k_pick + 0x9E3779B97F4A7C15ull * (u + 1));
      n[j] = r < thresh ? static_cast<std::uint16_t>((r & 1) ? o[j] + 1 : o[j] - 1) : o[j];
    }
  }
  return m;
}

/// Where a backend's tensor bytes live: the host vectors themselves, or copies in device memory.
struct staged {
  std::function<std::span<const std::byte>(const std::vector<std::byte>&)> old_span, new_span;
  std::span<std::byte> work;                       // receiver copy, starts at old
  std::function<void()> reset_work;                // work := old
  std::function<bool()> work_equals_new;           // bit-exact check
};

struct result {
  nlohmann::json j;
  std::vector<std::vector<std::byte>> frames;
  digest128 attestation;
  std::uint64_t conditioned_items = 0;  // base-conditioned items among the frames (frame format 2)
};

template <class Backend>
result measure(const args& a, const model& m, const model_manifest& man, std::span<const std::byte> old_s,
               std::span<const std::byte> new_s, std::span<std::byte> work, const std::function<void()>& reset_work,
               const std::function<bool()>& work_equals_new,
               const std::function<void(void*, std::size_t)>& pin = [](void*, std::size_t) {},
               const std::function<void(void*)>& unpin = [](void*) {}) {
  result r;
  Backend backend;
  const auto plan = plan_chunks(man, a.frame_mib << 20);
  auto pieces = [&](std::size_t i) {
    std::vector<chunk_piece> ps;
    for (auto& cr : plan[i]) {
      const std::size_t ti = *man.index_of(cr.tensor);
      const std::uint64_t off = m.offsets[ti] + cr.begin * 2, len = cr.size() * 2;
      ps.push_back({m.infos[ti].name, dtype::BF16, m.infos[ti].elements(), cr.begin, cr.end, old_s.subspan(off, len),
                    new_s.subspan(off, len)});
    }
    return ps;
  };
  const std::uint64_t max_m = (a.frame_mib << 20) / 2;
  std::vector<std::uint32_t> pos(max_m);
  std::vector<std::byte> xv(max_m * 2), nv(max_m * 2);
  // Device backends copy the compacted streams into these: page-locked, as a GPU sender's
  // staging buffers would be (pageable copies run at a fraction of the link's rate).
  pin(pos.data(), pos.size() * sizeof(std::uint32_t));
  pin(xv.data(), xv.size());
  pin(nv.data(), nv.size());
  double detect = 1e300, prep = 1e300, enc = 1e300, scatter = 1e300, frames_s = 1e300, attest = 1e300;
  std::uint64_t changed = 0;
  for (int rep = 0; rep < a.repeat; ++rep) {
    std::uint64_t c1 = 0, c2 = 0;
    auto t0 = clk::now();
    if constexpr (requires { backend.count_changes(old_s, new_s, std::size_t{2}); }) {
      for (std::size_t i = 0; i < plan.size(); ++i)
        for (auto& pc : pieces(i)) c1 += backend.count_changes(pc.old_bytes, pc.new_bytes, 2);
    } else {
      for (std::size_t i = 0; i < plan.size(); ++i)
        for (auto& pc : pieces(i)) c1 += backend.collect_changes(pc.old_bytes, pc.new_bytes, 2, pos, {}, {});
    }
    detect = std::min(detect, since(t0));
    t0 = clk::now();
    for (std::size_t i = 0; i < plan.size(); ++i)
      for (auto& pc : pieces(i)) c2 += backend.collect_changes(pc.old_bytes, pc.new_bytes, 2, pos, xv, nv);
    prep = std::min(prep, since(t0));
    if (c1 != c2) throw std::logic_error("count and collect disagree");
    changed = c2;
  }
  chunk_encoder<Backend> encoder(encode_options{.max_frame_input_bytes = a.frame_mib << 20});
  byte_buffer out;
  for (int rep = 0; rep < a.repeat; ++rep) {
    r.frames.clear();
    const auto t0 = clk::now();
    for (std::size_t i = 0; i < plan.size(); ++i) {
      encoder.encode({frame_kind::delta, payload_id{{1, 0}, 0, static_cast<std::uint32_t>(i)}, 0, 1}, pieces(i), out);
      r.frames.emplace_back(out.data(), out.data() + out.size());
    }
    enc = std::min(enc, since(t0));
  }
  // Decoded streams of every frame, for the scatter-only timing.
  struct decoded_stream {
    std::span<std::byte> dst;
    value_mode mode;
    std::vector<std::uint32_t> pos;
    std::vector<std::byte> val;
  };
  std::vector<mutable_tensor_view> views;
  for (std::size_t i = 0; i < m.infos.size(); ++i)
    views.emplace_back(m.infos[i].name, m.infos[i].type, m.infos[i].shape, work.subspan(m.offsets[i], m.infos[i].bytes()));
  target_map tm(views);
  std::vector<decoded_stream> streams;
  {
    frame_decoder dec;
    // base-conditioned items decode against the base bits of their range (host copy of the model)
    const base_reader base = [&](const frame_item& it) -> std::optional<std::span<const std::byte>> {
      const auto ti = *man.index_of(it.tensor);
      return std::span<const std::byte>(m.old_b).subspan(m.offsets[ti] + it.begin * 2, it.range_elements() * 2);
    };
    for (auto& f : r.frames) {
      const frame_view v = frame_view::parse(f);
      for (auto& d : dec.decode(v, {}, base)) {
        const auto ti = *man.index_of(d.item->tensor);
        if (d.item->mode == value_mode::base_conditioned) ++r.conditioned_items;
        streams.push_back({work.subspan(m.offsets[ti] + d.item->begin * 2, d.item->range_elements() * 2), d.apply,
                           {d.positions.begin(), d.positions.end()}, {d.values.begin(), d.values.end()}});
      }
    }
  }
  frame_applier<Backend> applier;
  bool exact = true;
  for (int rep = 0; rep < a.repeat; ++rep) {
    reset_work();
    auto t0 = clk::now();
    for (auto& s : streams) backend.apply_changes(s.dst, 2, s.mode, s.pos, s.val);
    scatter = std::min(scatter, since(t0));
    exact = exact && work_equals_new();
    reset_work();
    t0 = clk::now();
    for (auto& f : r.frames) applier.apply(f, tm);
    frames_s = std::min(frames_s, since(t0));
    exact = exact && work_equals_new();
  }
  std::vector<tensor_view> nviews;
  for (std::size_t i = 0; i < m.infos.size(); ++i)
    nviews.emplace_back(m.infos[i].name, m.infos[i].type, m.infos[i].shape, new_s.subspan(m.offsets[i], m.infos[i].bytes()));
  for (int rep = 0; rep < a.repeat; ++rep) {
    const auto t0 = clk::now();
    r.attestation = attestation_digest(std::span<const tensor_view>(nviews), backend);
    attest = std::min(attest, since(t0));
  }
  const double gb = static_cast<double>(m.bytes) / 1e9;
  std::uint64_t frame_bytes = 0;
  for (auto& f : r.frames) frame_bytes += f.size();
  r.j = {{"backend", std::string(Backend::name())},
         {"model_bytes", m.bytes},
         {"changed", changed},
         {"frames", r.frames.size()},
         {"frame_bytes", frame_bytes},
         {"detect_s", detect},
         {"detect_prep_s", prep},
         {"encode_s", enc},
         {"apply_scatter_s", scatter},
         {"apply_frames_s", frames_s},
         {"attest_s", attest},
         {"detect_GBps", gb / detect},
         {"detect_prep_GBps", gb / prep},
         {"encode_GBps", gb / enc},
         {"apply_scatter_GBps", gb / scatter},
         {"apply_frames_GBps", gb / frames_s},
         {"attest_GBps", gb / attest},
         {"attestation", r.attestation.to_hex()},
         {"bit_exact", exact}};
  unpin(pos.data());
  unpin(xv.data());
  unpin(nv.data());
  return r;
}

template <class Backend>
result run_host_memory(const args& a, const model& m, const model_manifest& man) {
  std::vector<std::byte> work(m.bytes);
  return measure<Backend>(
      a, m, man, m.old_b, m.new_b, work, [&] { std::memcpy(work.data(), m.old_b.data(), m.bytes); },
      [&] { return std::memcmp(work.data(), m.new_b.data(), m.bytes) == 0; });
}

#if BITREFIT_THRUST_HAS_CUDA
result run_cuda(const args& a, const model& m, const model_manifest& man) {
  using sys = thrust_systems::cuda;
  std::byte *d_old = nullptr, *d_new = nullptr, *d_work = nullptr;
  sys::check(cudaMalloc(&d_old, m.bytes), "cudaMalloc old");
  sys::check(cudaMalloc(&d_new, m.bytes), "cudaMalloc new");
  sys::check(cudaMalloc(&d_work, m.bytes), "cudaMalloc work");
  std::unique_ptr<std::byte, void (*)(std::byte*)> g1(d_old, [](std::byte* p) { cudaFree(p); }),
      g2(d_new, [](std::byte* p) { cudaFree(p); }), g3(d_work, [](std::byte* p) { cudaFree(p); });
  sys::from_host(d_old, m.old_b.data(), m.bytes);
  sys::from_host(d_new, m.new_b.data(), m.bytes);
  std::vector<std::byte> check(m.bytes);
  return measure<thrust_backend<sys>>(
      a, m, man, {d_old, m.bytes}, {d_new, m.bytes}, {d_work, m.bytes},
      [&] { sys::check(cudaMemcpy(d_work, d_old, m.bytes, cudaMemcpyDeviceToDevice), "reset work"); },
      [&] {
        sys::to_host(check.data(), d_work, m.bytes);
        return std::memcmp(check.data(), m.new_b.data(), m.bytes) == 0;
      },
      [](void* p, std::size_t n) { sys::check(cudaHostRegister(p, n, cudaHostRegisterDefault), "cudaHostRegister"); },
      [](void* p) { sys::check(cudaHostUnregister(p), "cudaHostUnregister"); });
}
#endif

std::vector<std::string> known_backends() {
  std::vector<std::string> k{"host", "thrust-cpp"};
#if BITREFIT_THRUST_HAS_OMP
  k.push_back("thrust-omp");
#endif
#if BITREFIT_THRUST_HAS_CUDA
  k.push_back("thrust-cuda");
#endif
  return k;
}

result run(const std::string& b, const args& a, const model& m, const model_manifest& man) {
  if (b == "host") return run_host_memory<host_backend>(a, m, man);
  if (b == "thrust-cpp") return run_host_memory<thrust_backend<thrust_systems::cpp>>(a, m, man);
#if BITREFIT_THRUST_HAS_OMP
  if (b == "thrust-omp") return run_host_memory<thrust_backend<thrust_systems::omp>>(a, m, man);
#endif
#if BITREFIT_THRUST_HAS_CUDA
  if (b == "thrust-cuda") return run_cuda(a, m, man);
#endif
  throw error(errc::invalid_argument, "backend '" + b + "' is not built into this binary");
}

[[noreturn]] void usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: bitrefit-bench-thrust [--backend B[,B...]] [--size-mib N] [--change adamw|RATE] [--frame-mib M]\n"
               "                             [--repeat R] [--seed S] [--json]\nbackends built in:");
  for (auto& k : known_backends()) std::fprintf(code ? stderr : stdout, " %s", k.c_str());
  std::fprintf(code ? stderr : stdout, "\n");
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) try {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(2);
      return argv[++i];
    };
    if (s == "--backend") {
      a.backends.clear();
      std::string list = next();
      for (std::size_t p = 0; p <= list.size();) {
        const std::size_t q = std::min(list.find(',', p), list.size());
        if (q > p) a.backends.push_back(list.substr(p, q - p));
        p = q + 1;
      }
    } else if (s == "--size-mib") a.size_mib = std::stoull(next());
    else if (s == "--change") a.change = next();
    else if (s == "--frame-mib") a.frame_mib = std::stoull(next());
    else if (s == "--repeat") a.repeat = std::max(1, std::stoi(next()));
    else if (s == "--seed") a.seed = std::stoull(next());
    else if (s == "--json") a.json = true;
    else if (s == "--help" || s == "-h") usage(0);
    else usage(2);
  }
  if (a.size_mib == 0 || a.frame_mib == 0 || a.backends.empty()) usage(2);
  for (auto& b : a.backends)
    if (std::find(known_backends().begin(), known_backends().end(), b) == known_backends().end()) {
      std::fprintf(stderr, "unknown or not built backend '%s'\n", b.c_str());
      usage(2);
    }
  const auto t0 = clk::now();
  const model m = make_model(a);
  const model_manifest man(m.infos);
  nlohmann::json all = {{"size_mib", a.size_mib}, {"change", a.change}, {"frame_mib", a.frame_mib},
                        {"repeat", a.repeat}, {"generate_s", since(t0)}, {"backends", nlohmann::json::array()}};
  bool ok = true;
  std::vector<result> rs;
  for (auto& b : a.backends) {
    rs.push_back(run(b, a, m, man));
    auto& r = rs.back();
    const bool same_frames = r.frames == rs.front().frames, same_digest = r.attestation == rs.front().attestation;
    r.j["frames_identical_to_first"] = same_frames;
    r.j["conditioned_items"] = r.conditioned_items;
    r.j["attestation_equal_to_first"] = same_digest;
    ok = ok && same_frames && same_digest && r.j["bit_exact"].get<bool>();
    all["backends"].push_back(r.j);
    if (!a.json) {
      const auto& j = r.j;
      std::printf("%-12s %llu MiB BF16, change %s: %llu changed, %zu frames, %llu frame bytes\n",
                  j["backend"].get<std::string>().c_str(), static_cast<unsigned long long>(a.size_mib), a.change.c_str(),
                  j["changed"].get<unsigned long long>(), r.frames.size(), j["frame_bytes"].get<unsigned long long>());
      std::printf("  GB/s of model bytes: detect %.1f | detect+prep %.1f | encode (incl. host zstd) %.2f | "
                  "apply scatter %.1f | apply frames %.2f | attestation %.1f\n",
                  j["detect_GBps"].get<double>(), j["detect_prep_GBps"].get<double>(), j["encode_GBps"].get<double>(),
                  j["apply_scatter_GBps"].get<double>(), j["apply_frames_GBps"].get<double>(), j["attest_GBps"].get<double>());
      std::printf("  frames identical to %s: %s; attestation %s equal: %s; bit-exact apply: %s\n",
                  a.backends.front().c_str(), same_frames ? "yes" : "NO", j["attestation"].get<std::string>().c_str(),
                  same_digest ? "yes" : "NO", j["bit_exact"].get<bool>() ? "yes" : "NO");
    }
    std::fflush(stdout);
  }
  all["ok"] = ok;
  if (a.json) std::printf("%s\n", all.dump(2).c_str());
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bitrefit-bench-thrust: %s\n", e.what());
  return 1;
}
