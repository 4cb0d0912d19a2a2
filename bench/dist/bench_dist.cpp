// bitrefit-bench-dist — what the distributed stores cost on this machine: S3 goodput against moto
// on loopback (8 MiB parts), the S3 requests one refit makes, and the time the etcd
// compare-and-set adds to a refit. Starts moto and etcd itself (tests/fixtures/servers.hpp).
//
//   bitrefit-bench-dist [--object-mib N] [--reps R] [--refits K] [--json]
//
// Goodput: an object of N MiB (default 64) uploaded as a multipart upload of 8 MiB parts with 1 and
// with 4 parts in flight, single 8 MiB PUTs, whole-object GETs and 8 MiB ranged GETs; MiB/s, the
// median of R runs (default 5). moto is a Python server: these numbers bound what the dist tests
// and the demo can show on loopback; they say nothing about S3 itself.
// Refits: K refits (default 20) of a 4M-element BF16 model (3% of elements change per refit, 2
// owners, 3 receivers on threads) over S3, with the commit log on etcd, on the filesystem and in
// memory (no durability: the baseline the other two are compared with), side by side in one run;
// per refit: the commit phase (the compare-and-set) and the S3 requests of the trainer side (frames,
// control messages, baselines) and of the receivers. Reported: medians, and the etcd
// compare-and-set alone (median of K, outside any refit).
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "../../tests/fixtures/servers.hpp"
#include "bitrefit/durability/etcd_commit_log.hpp"
#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/durability/memory.hpp"
#include "bitrefit/durability/s3_baseline_store.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/transport/s3_store.hpp"

using namespace bitrefit;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

transport::s3_options bucket_options(const std::string& endpoint, const std::string& bucket) {
  transport::s3_options o;
  o.endpoint = endpoint;
  o.bucket = bucket;
  o.region = "us-east-1";
  o.credentials = transport::s3_credentials{"testing", "testing", ""};
  transport::s3_store(o).create_bucket();
  return o;
}

// ---- goodput ------------------------------------------------------------------------------------

nlohmann::json goodput(const std::string& endpoint, std::size_t object_mib, int reps) {
  auto o = bucket_options(endpoint, "bench-goodput");
  o.part_size = std::size_t(8) << 20;
  std::vector<std::byte> data(object_mib << 20);
  std::mt19937_64 rng(1);
  for (auto& x : data) x = static_cast<std::byte>(rng());
  const double mib = double(object_mib);
  auto rate = [&](double mib_moved, auto&& f) {
    std::vector<double> r;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = clock_type::now();
      f();
      r.push_back(mib_moved / seconds_since(t0));
    }
    return median(r);
  };
  nlohmann::json out;
  for (unsigned parallel : {1u, 4u}) {
    o.parallel_parts = parallel;
    transport::s3_store s(o);
    out["upload_multipart_" + std::to_string(parallel) + "_in_flight_mib_s"] = rate(mib, [&] { s.put("object", data); });
  }
  transport::s3_store s(o);
  const std::span<const std::byte> part(data.data(), std::size_t(8) << 20);
  out["upload_single_put_8mib_mib_s"] = rate(8.0, [&] { s.put("part", part); });
  out["download_object_mib_s"] = rate(mib, [&] {
    if (s.get("object")->size() != data.size()) throw error(errc::integrity, "short read");
  });
  out["download_ranged_8mib_mib_s"] = rate(8.0, [&] {
    if (s.get_range("object", std::uint64_t(8) << 20, std::uint64_t(8) << 20)->size() != part.size()) throw error(errc::integrity, "short read");
  });
  out["object_mib"] = object_mib;
  out["part_mib"] = 8;
  s.remove_prefix("");
  return out;
}

// ---- refits -------------------------------------------------------------------------------------

model_manifest bench_model() {
  std::vector<tensor_info> ts;
  for (int i = 0; i < 8; ++i) ts.push_back({"model.layers." + std::to_string(i) + ".weight", dtype::BF16, {512, 1024}});
  return model_manifest(std::move(ts));
}

struct truth {
  model_manifest m = bench_model();
  std::map<std::string, std::vector<std::byte>> bits;
  std::mt19937_64 rng{7};
  truth() {
    for (auto& t : m.tensors()) {
      auto& b = bits[t.name];
      b.resize(t.bytes());
      for (auto& x : b) x = static_cast<std::byte>(rng());
    }
  }
  void step() {
    for (auto& t : m.tensors())
      for (std::uint64_t i = 0; i < t.elements(); ++i)
        if (rng() % 100 < 3) bits[t.name][2 * i] ^= std::byte{1};
  }
  refit::tensor_source source() const {
    return refit::copy_from([this](const tensor_info& t) { return std::span<const std::byte>(bits.at(t.name)); });
  }
};

struct series {
  std::vector<double> commit_s, total_s;
  std::vector<double> sender_requests, receiver_requests, frames;
  bool all_committed = true;
};

template <class Log>
series run_refits(const transport::s3_options& s3, Log log, int refits) {
  using net_t = transport::s3_transport;
  using sender_t = refit::sender<net_t, Log, durability::s3_baseline_store>;
  using receiver_t = refit::receiver<layout::canonical_store, net_t, Log>;
  constexpr std::uint32_t receivers = 3, owners = 2;
  truth tr;
  refit::sender_options so;
  so.owners = owners;
  so.receivers = receivers;
  so.threads = 2;
  so.max_frame_input_bytes = 1 << 20;
  so.deadline = 10s;
  const transport::s3_store bucket(s3);
  std::vector<durability::s3_baseline_store> stores;
  for (std::uint32_t i = 0; i < owners; ++i) stores.emplace_back(bucket, durability::s3_baseline_store::options{.key_prefix = "baseline/owner-" + std::to_string(i), .max_chain = 16});
  sender_t tx(tr.m, net_t{bucket}, log, std::move(stores), so);
  tx.start(tr.source());
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> rx_requests{0};
  std::atomic<int> at_version[receivers];
  std::vector<std::unique_ptr<layout::canonical_store>> weights;
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < receivers; ++r) {
    at_version[r] = -1;
    weights.push_back(std::make_unique<layout::canonical_store>(tr.m));
    threads.emplace_back([&, r] {
      refit::receiver_options o;
      o.index = r;
      o.poll = 5ms;
      o.deadline = 5s;
      o.persist_incarnation = [](std::uint64_t) {};
      o.on_commit = [&, r](const protocol::commit_record& k) { at_version[r] = static_cast<int>(k.version); };
      receiver_t rcv(*weights[r], net_t{transport::s3_store(s3)}, log, o);
      rcv.start();
      std::uint64_t seen = 0;
      while (!stop) {
        rcv.step(5ms);
        const auto n = rcv.transport().store().counters().requests;
        rx_requests += n - seen;
        seen = n;
      }
    });
  }
  if (!tx.wait_for_members(120s)) throw error(errc::protocol, "receivers did not join");
  series out;
  for (int k = 1; k <= refits; ++k) {
    tr.step();
    const auto s0 = tx.transport().store().counters();
    const auto r0 = rx_requests.load();
    const auto st = tx.refit(tr.source());
    for (bool all = false; !all;) {  // every receiver at the new version (gates reopened)
      all = true;
      for (std::uint32_t r = 0; r < receivers; ++r) all = all && at_version[r] == k;
      if (!all) tx.pump(5ms);
    }
    out.all_committed = out.all_committed && st.committed && st.attempts == 1;
    out.commit_s.push_back(st.phases.commit_s);
    out.total_s.push_back(st.total_s);
    out.frames.push_back(double(st.frames));
    out.sender_requests.push_back(double((tx.transport().store().counters() - s0).requests));
    out.receiver_requests.push_back(double(rx_requests.load() - r0));
  }
  stop = true;
  for (auto& t : threads) t.join();
  return out;
}

nlohmann::json summary(const series& s) {
  return {{"refits", s.commit_s.size()},
          {"all_committed_in_one_attempt", s.all_committed},
          {"commit_ms_median", 1e3 * median(s.commit_s)},
          {"refit_total_s_median", median(s.total_s)},
          {"frames_median", median(s.frames)},
          {"trainer_s3_requests_per_refit_median", median(s.sender_requests)},
          {"receivers_s3_requests_per_refit_median", median(s.receiver_requests)}};
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t object_mib = 64;
  int reps = 5, refits = 20;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::stoi(argv[++i]) : 0; };
    if (a == "--object-mib") object_mib = static_cast<std::size_t>(next());
    else if (a == "--reps") reps = next();
    else if (a == "--refits") refits = next();
    else if (a == "--json") json = true;
    else {
      std::fprintf(stderr, "usage: bitrefit-bench-dist [--object-mib N] [--reps R] [--refits K] [--json]\n");
      return 2;
    }
  }
  if (object_mib < 16 || reps < 1 || refits < 1) {
    std::fprintf(stderr, "bitrefit-bench-dist: --object-mib >= 16, --reps >= 1, --refits >= 1\n");
    return 2;
  }
  try {
    std::string why;
    auto* moto = bitrefit::testing::moto_server::get(why);
    if (!moto) throw error(errc::io, why);
    bitrefit::testing::etcd_server etcd;
    if (const auto e = etcd.start("bench"); !e.empty()) throw error(errc::io, e);

    nlohmann::json out;
    out["goodput"] = goodput(moto->endpoint(), object_mib, reps);

    // the compare-and-set alone, outside any refit
    durability::etcd_commit_log raw({.etcd = {.endpoints = {etcd.endpoint()}}, .prefix = "/bench-cas"});
    raw.apply(protocol::claim_epoch_request{1});
    std::vector<double> cas;
    protocol::commit_record k{};
    for (int i = 0; i < refits; ++i) {
      const protocol::commit_record next{k.version + 1, baseline_id{k.version + 100}};
      const auto t0 = clock_type::now();
      if (raw.apply(protocol::compare_and_set_request{1, {1, k.version + 1}, k, next}).outcome != protocol::log_outcome::ok)
        throw error(errc::protocol, "compare-and-set refused");
      cas.push_back(seconds_since(t0));
      k = next;
    }
    out["etcd_cas_alone_ms_median"] = 1e3 * median(cas);

    const auto s3_etcd = bucket_options(moto->endpoint(), "bench-refit-etcd");
    const auto s3_file = bucket_options(moto->endpoint(), "bench-refit-file");
    const auto log_dir = bitrefit::testing::temp_dir("bench-log");
    const auto with_etcd = run_refits(s3_etcd, durability::etcd_commit_log({.etcd = {.endpoints = {etcd.endpoint()}}, .prefix = "/bench-refit"}), refits);
    const auto with_file = run_refits(s3_file, durability::filesystem_commit_log(log_dir), refits);
    const auto s3_memory = bucket_options(moto->endpoint(), "bench-refit-memory");
    const auto with_memory = run_refits(s3_memory, durability::memory_commit_log(), refits);
    std::filesystem::remove_all(log_dir);
    out["refits_s3_etcd"] = summary(with_etcd);
    out["refits_s3_file_log"] = summary(with_file);
    out["refits_s3_memory_log"] = summary(with_memory);
    out["etcd_cas_added_per_refit_ms"] = 1e3 * (median(with_etcd.commit_s) - median(with_memory.commit_s));
    out["file_cas_added_per_refit_ms"] = 1e3 * (median(with_file.commit_s) - median(with_memory.commit_s));

    if (json) {
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      const auto& g = out["goodput"];
      std::printf("S3 goodput against moto on loopback (%zu MiB object, 8 MiB parts, median of %d):\n", object_mib, reps);
      std::printf("  upload, multipart, 1 part in flight   %8.1f MiB/s\n", g["upload_multipart_1_in_flight_mib_s"].get<double>());
      std::printf("  upload, multipart, 4 parts in flight  %8.1f MiB/s\n", g["upload_multipart_4_in_flight_mib_s"].get<double>());
      std::printf("  upload, one 8 MiB PUT                 %8.1f MiB/s\n", g["upload_single_put_8mib_mib_s"].get<double>());
      std::printf("  download, whole object                %8.1f MiB/s\n", g["download_object_mib_s"].get<double>());
      std::printf("  download, 8 MiB ranged GET            %8.1f MiB/s\n", g["download_ranged_8mib_mib_s"].get<double>());
      for (const char* name : {"refits_s3_etcd", "refits_s3_file_log", "refits_s3_memory_log"}) {
        const auto& r = out[name];
        std::printf("%s: %d refits, all in one attempt: %s; commit phase %.2f ms, refit %.3f s, %.0f frames, S3 requests per refit: "
                    "trainer %.0f, receivers %.0f (medians)\n",
                    name, r["refits"].get<int>(), r["all_committed_in_one_attempt"].get<bool>() ? "yes" : "NO", r["commit_ms_median"].get<double>(),
                    r["refit_total_s_median"].get<double>(), r["frames_median"].get<double>(), r["trainer_s3_requests_per_refit_median"].get<double>(),
                    r["receivers_s3_requests_per_refit_median"].get<double>());
      }
      std::printf("etcd compare-and-set alone: %.2f ms (median of %d); time the compare-and-set adds per refit over the in-memory log: "
                  "etcd %.2f ms, filesystem log %.2f ms\n",
                  out["etcd_cas_alone_ms_median"].get<double>(), refits, out["etcd_cas_added_per_refit_ms"].get<double>(),
                  out["file_cas_added_per_refit_ms"].get<double>());
    }
    return with_etcd.all_committed && with_file.all_committed && with_memory.all_committed ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bitrefit-bench-dist: %s\n", e.what());
    return 1;
  }
}
