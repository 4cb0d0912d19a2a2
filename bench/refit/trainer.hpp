// bench/refit/trainer.hpp — the trainer side of a session (one method over one link).
//
//   trainer  walks the version sequence (workload.hpp). bitrefit/overwrite: one
//            refit::sender (coordinator + owners) refits every version; dense: publishes every
//            byte of each version as raw chunks over the same transport and waits until every
//            receiver holds them (the transport-only dense baseline). Writes one JSON object per
//            refit to <session>/runs.jsonl.
// Methods, on the same engine API:
//   bitrefit   the default hybrid coding (XOR or overwrite per item, whichever is smaller);
//   overwrite  every changed element as absolute values (the best overwrite-only coding: the
//              same encoder's location coding, byte planes and zstd): sender_options::xor_deltas
//              = false prepares every attempt in overwrite mode. (Declaring the receivers'
//              placement non-bit-preserving would also force overwrite, but then receivers apply
//              and attest through a converting Loader's slow path — not the baseline we want.)
//   dense      the full model, raw, over the same transport: no compare, no coding, no commit
//              protocol, no attestation (what a transport-only dense transfer does).
// Bench messages ride the transport's control plane in "bench/..." mailboxes (outside the
// protocol): receivers report the attestation digest they hold after each commit, and the trainer
// checks it against its own bits (bit_exact in every record).
#pragma once

#include <map>
#include <set>
#include <thread>
#include <vector>

#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/refit/sender.hpp"
#include "link.hpp"
#include "session.hpp"
#include "workload.hpp"

namespace bench {


/// Everything a record says about its inputs (the same for every refit of a session).
inline json inputs_json(const options& o, const workload& w, const link_rate& link) {
  const auto& d = w.dims();
  return {{"method", o.method},
          {"transport", o.transport},
          {"net", o.net_label},
          {"link", link.name},
          {"link_bits_per_s", link.bits_per_s},
          {"receivers", o.receivers},
          {"mode", o.mode},
          {"owners", o.owners},
          {"threads", o.threads},
          {"frame_bytes", o.frame_kib << 10},
          {"zstd_level", o.zstd_level},
          {"poll_ms", o.poll_ms},
          {"attest", o.attest},
          {"seed", o.seed},
          {"changes", o.changes},
          {"model",
           {{"params", w.manifest().total_elements()},
            {"bytes", w.manifest().total_bytes()},
            {"tensors", w.manifest().size()},
            {"dtype", "BF16"},
            {"shape", "llama-like"},
            {"layers", d.layers},
            {"hidden", d.hidden},
            {"intermediate", d.intermediate},
            {"vocab", d.vocab}}}};
}

/// Applies the session's link rate once setup (receivers' initial restore) is done.
class link_control {
 public:
  link_control(const options& o, link_rate l, std::shared_ptr<token_bucket> limiter)
      : dev_(o.shape_dev), link_(std::move(l)), limiter_(std::move(limiter)) {}
  void apply() {
    if (!dev_.empty()) shape_egress(dev_, link_);
    else if (limiter_) limiter_->set_rate(link_.bytes_per_s(), tbf_burst_bytes(link_));
  }
  /// Kernel counters of the trainer's veth end: tx = trainer->rollout, rx = rollout->trainer.
  std::optional<if_counters> counters() const { return dev_.empty() ? std::nullopt : read_if_counters(dev_); }

 private:
  std::string dev_;
  link_rate link_;
  std::shared_ptr<token_bucket> limiter_;
};

/// Byte counts around one refit.
struct link_meter {
  std::optional<if_counters> if0;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> app0;
  template <class Net>
  void start(const link_control& lc, Net& net) {
    if0 = lc.counters();
    app0 = app_counters(net);
  }
  template <class Net>
  json finish(const link_control& lc, Net& net) const {
    json j;
    const auto if1 = lc.counters();
    const auto app1 = app_counters(net);
    if (if0 && if1) {
      j["trainer_to_rollout"] = if1->tx - if0->tx;
      j["rollout_to_trainer"] = if1->rx - if0->rx;
      j["counted_by"] = "kernel (veth, wire bytes incl. headers)";
    } else {
      j["trainer_to_rollout"] = nullptr;
      j["rollout_to_trainer"] = nullptr;
      j["counted_by"] = "client (application bytes; no veth in loopback mode)";
    }
    if (app0 && app1) {
      j["app_trainer_to_rollout"] = app1->first - app0->first;
      j["app_rollout_to_trainer"] = app1->second - app0->second;
    }
    return j;
  }
};

/// Collects the receivers' "bench/report" messages of `version` and compares each attestation
/// with `expected`. Returns (every receiver reported the expected digest, per-receiver digests).
template <class Net>
std::pair<bool, json> check_reports(Net& net, const options& o, version_t version, const digest128& expected,
                                    std::chrono::seconds timeout = 120s) {
  std::map<int, std::string> got;
  const auto until = steady::now() + timeout;
  while (static_cast<int>(got.size()) < o.receivers && steady::now() < until) {
    for (const auto& b : net.receive("bench/report", std::chrono::milliseconds(o.poll_ms))) {
      try {
        const json r = parse_json(b);
        if (r.at("version").get<version_t>() == version && r.contains("attestation"))
          got[r.at("receiver").get<int>()] = r.at("attestation").get<std::string>();
      } catch (const std::exception&) {
      }
    }
  }
  const std::string want = digest_json(expected);
  bool all = static_cast<int>(got.size()) == o.receivers;
  json per = json::object();
  for (auto& [r, d] : got) {
    per[std::to_string(r)] = d;
    all &= d == want;
  }
  return {all, per};
}

inline void emit(std::ofstream& out, const json& j) {
  out << j.dump() << "\n";
  out.flush();
}

template <class Net>
int engine_trainer(const options& o, workload& w, link_control& lc, Net raw_net, std::ofstream& out) {
  auto probe = std::make_shared<publish_probe>();
  using T = probed_transport<Net>;
  using sender_t = refit::sender<T, durability::filesystem_commit_log, durability::filesystem_baseline_store>;
  refit::sender_options so;
  so.gate = o.mode == "async" ? protocol::gate_policy::asynchronous : protocol::gate_policy::synchronous;
  so.owners = o.owners;
  so.receivers = static_cast<std::uint32_t>(o.receivers);
  so.threads = o.threads;
  so.max_frame_input_bytes = o.frame_kib << 10;
  so.zstd_level = o.zstd_level;
  so.attest = o.attest;
  so.deadline = std::chrono::milliseconds(o.deadline_ms);
  so.poll = std::chrono::milliseconds(o.poll_ms);
  so.xor_deltas = o.method != "overwrite";  // overwrite: every changed element as its absolute value
  std::vector<durability::filesystem_baseline_store> baselines;
  for (std::uint32_t i = 0; i < o.owners; ++i) baselines.emplace_back(fs::path(o.session) / "baseline" / ("owner-" + std::to_string(i)));
  sender_t tx(w.manifest(), T(std::move(raw_net), probe), durability::filesystem_commit_log(fs::path(o.session) / "log"),
              std::move(baselines), so);
  const auto t_setup = steady::now();
  tx.start(w.source());
  if (!tx.wait_for_members(std::chrono::minutes(20)))
    throw error(errc::protocol, "receivers did not join within 20 minutes", {.file = {}, .tensor = {}, .field = "receivers"});
  std::fprintf(stderr, "bench trainer [%s]: %d receivers restored version 0 in %.1f s (link not yet shaped)\n", o.method.c_str(),
               o.receivers, since(t_setup));
  w.warm_up();  // one unrecorded refit (no change) before the link is shaped
  const auto warm = tx.refit(w.source());
  std::fprintf(stderr, "bench trainer [%s]: warm-up refit %.3f s (not recorded)\n", o.method.c_str(), warm.total_s);
  lc.apply();
  const json inputs = inputs_json(o, w, parse_link_rate(o.link));
  for (std::size_t k = 0; k < w.steps().size(); ++k) {
    const auto t_train = steady::now();
    w.advance(k);
    const double train_s = since(t_train);
    link_meter meter;
    meter.start(lc, tx.transport().inner());
    probe->reset();
    const double cpu0 = process_cpu_s(), load = loadavg_1m();
    const refit::transition_stats st = tx.refit(w.source());
    const double trainer_cpu_s = process_cpu_s() - cpu0;
    json bytes_per_link = meter.finish(lc, tx.transport().inner());
    const double wire_s = probe->window_s();
    const digest128 expected = attestation_of(w.manifest(), w.bits());
    auto [exact, per] = check_reports(tx.transport(), o, st.version, expected);
    json j = st.to_json();
    j["schema"] = "bitrefit-bench-refit/1";
    j["inputs"] = inputs;
    j["change"] = {{"step", w.steps()[k].label()}, {"requested_rate", w.steps()[k].rate}};
    j["bytes_per_link"] = bytes_per_link;
    j["wire_s"] = wire_s;
    j["published_bytes"] = probe->bytes;
    j["bit_exact"] = exact && st.committed;
    j["attestations"] = per;
    j["train_s"] = train_s;
    j["trainer_cpu_s"] = trainer_cpu_s;
    j["loadavg_1m"] = load;
    emit(out, j);
    std::fprintf(stderr, "bench trainer [%s %s] %-14s %s wire=%.3fs bit-exact=%s\n", o.method.c_str(), o.link.c_str(),
                 w.steps()[k].label().c_str(), st.line().c_str(), wire_s, exact ? "yes" : "NO");
    if (!exact) return 3;
  }
  return 0;
}

template <class Net>
int dense_trainer(const options& o, workload& w, link_control& lc, Net raw_net, std::ofstream& out) {
  auto probe = std::make_shared<publish_probe>();
  probed_transport<Net> net(std::move(raw_net), probe);
  {  // every receiver has its buffer
    std::set<int> ready;
    const auto until = steady::now() + std::chrono::minutes(10);
    while (static_cast<int>(ready.size()) < o.receivers && steady::now() < until)
      for (const auto& b : net.receive("bench/ready", 50ms)) { const json r = parse_json(b); ready.insert(r.at("receiver").get<int>()); }
    if (static_cast<int>(ready.size()) < o.receivers)
      throw error(errc::protocol, "dense receivers did not report ready", {.file = {}, .tensor = {}, .field = "receivers"});
  }
  const auto plan = dense_plan(w.manifest(), o.frame_kib << 10);
  const json inputs = inputs_json(o, w, parse_link_rate(o.link));
  // one unrecorded dense transfer of an unchanged version before the link is shaped (warm-up)
  w.warm_up();
  for (std::size_t k = 0; k <= w.steps().size(); ++k) {
    const bool warm = k == 0;
    const auto t_train = steady::now();
    if (!warm) w.advance(k - 1);
    const double train_s = since(t_train);
    const version_t v = w.version();
    const transport::stream_key stream{"d" + std::to_string(v)};
    link_meter meter;
    meter.start(lc, net);
    probe->reset();
    const double cpu0 = process_cpu_s(), load = loadavg_1m();
    const auto t0 = steady::now();
    const std::string job = json{{"version", v}, {"stream", stream.name}, {"chunks", plan.size()}}.dump();
    for (int r = 0; r < o.receivers; ++r) net.post("bench/dense/" + std::to_string(r), as_span(job));
    {  // publish every chunk, `threads` at a time (as many streams as the engine uses)
      std::atomic<std::size_t> next{0};
      std::vector<std::jthread> workers;
      for (unsigned t = 0; t < o.threads; ++t)
        workers.emplace_back([&] {
          for (std::size_t i; (i = next++) < plan.size();) {
            const dense_chunk& c = plan[i];
            const auto src = w.bits().bytes(w.manifest().tensors()[c.tensor].name).subspan(c.offset, c.size);
            net.publish(transport::frame_key{stream, 0, static_cast<std::uint32_t>(i)}, src);
          }
        });
    }
    std::map<int, double> apply_s;
    while (static_cast<int>(apply_s.size()) < o.receivers) {
      for (const auto& b : net.receive("bench/dense-done", std::chrono::milliseconds(o.poll_ms))) {
        const json d = parse_json(b);
        if (d.at("version").get<version_t>() == v) apply_s[d.at("receiver").get<int>()] = d.at("apply_s").get<double>();
      }
      if (since(t0) > 3600) throw error(errc::protocol, "dense transfer did not finish within an hour");
    }
    const double total_s = since(t0);
    const double trainer_cpu_s = process_cpu_s() - cpu0;
    json bytes_per_link = meter.finish(lc, net);
    const double wire_s = probe->window_s();
    auto [exact, per] = check_reports(net, o, v, attestation_of(w.manifest(), w.bits()));
    net.discard(stream);
    double apply_max = 0;
    for (auto& [r, s] : apply_s) apply_max = std::max(apply_max, s);
    if (warm) {
      std::fprintf(stderr, "bench trainer [dense]: warm-up transfer %.3f s (not recorded)\n", total_s);
      if (!exact) return 3;
      lc.apply();
      continue;
    }
    json j{{"schema", "bitrefit-bench-refit/1"},
           {"inputs", inputs},
           {"change", {{"step", w.steps()[k - 1].label()}, {"requested_rate", w.steps()[k - 1].rate}}},
           {"version", v},
           {"attempts", 1},
           {"elements", w.manifest().total_elements()},
           {"changed", w.last_changed()},
           {"change_rate", double(w.last_changed()) / double(w.manifest().total_elements())},
           {"payload_bytes", w.manifest().total_bytes()},
           {"dense_bytes", w.manifest().total_bytes()},
           {"frames", plan.size()},
           {"mode", o.mode},
           {"committed", true},
           {"phases_s",
            {{"compare", 0.0}, {"encode", 0.0}, {"transfer", wire_s}, {"apply", apply_max}, {"sync", 0.0}, {"commit", 0.0}, {"persist", 0.0}}},
           {"total_s", total_s},
           {"gate_closed_s", total_s},
           {"bytes_per_link", bytes_per_link},
           {"wire_s", wire_s},
           {"published_bytes", probe->bytes},
           {"bit_exact", exact},
           {"attestations", per},
           {"train_s", train_s},
           {"trainer_cpu_s", trainer_cpu_s},
           {"loadavg_1m", load}};
    emit(out, j);
    std::fprintf(stderr, "bench trainer [dense %s] %-14s v=%llu %.2f MiB total=%.3fs wire=%.3fs apply=%.3fs bit-exact=%s\n",
                 o.link.c_str(), w.steps()[k - 1].label().c_str(), static_cast<unsigned long long>(v),
                 double(w.manifest().total_bytes()) / 1048576.0, total_s, wire_s, apply_max, exact ? "yes" : "NO");
    if (!exact) return 3;
  }
  return 0;
}

inline int run_trainer(const options& o) {
  const link_rate link = parse_link_rate(o.link);
  workload w(o.model_mib << 20, o.seed, parse_changes(o.changes), o.threads);
  // loopback fallback: the trainer's own sends are paced (unlimited until setup is done)
  std::shared_ptr<token_bucket> limiter;
  if (o.shape_dev.empty() && link.bits_per_s > 0) limiter = std::make_shared<token_bucket>(0);
  link_control lc(o, link, limiter);
  if (!o.shape_dev.empty()) shape_egress(o.shape_dev, link_rate{"unlimited", 0});
  std::ofstream out(fs::path(o.session) / "runs.jsonl", std::ios::app);
  transport_endpoint ep{o.transport, o.host, o.port, limiter, std::chrono::milliseconds(o.poll_ms), o.session, -1, o.receivers};
  return with_transport(ep, [&](auto net) {
    return o.method == "dense" ? dense_trainer(o, w, lc, std::move(net), out) : engine_trainer(o, w, lc, std::move(net), out);
  });
}

}  // namespace bench
