// End-to-end refits composed with the layout policies: a sender whose Projection gathers canonical
// bits from Megatron TP x DP trainer shards; receivers whose Loaders are vLLM-like serving ranks
// that hold only their tensor-parallel slice, or place RMSNorm weights non-bit-preservingly (F32
// upcast). After every commit each receiver's held ranges are compared byte for byte with the
// dense canonical reference, and its attestation with the digest over the same ranges. Label e2e.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "bitrefit/codec/frame.hpp"
#include "bitrefit/durability/memory.hpp"
#include "bitrefit/layout/apply.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/layout/megatron.hpp"
#include "bitrefit/layout/vllm_layout.hpp"
#include "bitrefit/refit/projection.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/testing/crash_points.hpp"
#include "bitrefit/transport/inprocess.hpp"
#include "bitrefit_proofs/trace_check.hpp"

using namespace bitrefit;
using namespace std::chrono_literals;

namespace {

/// Records a copy of every delta frame published (the sender deletes them at cleanup).
class recording_transport {
 public:
  struct log_t {
    std::mutex mu;
    std::vector<std::vector<std::byte>> frames;
  };
  recording_transport() : log_(std::make_shared<log_t>()) {}

  void publish(const transport::frame_key& k, std::span<const std::byte> b) {
    if (!k.stream.name.empty() && k.stream.name[0] == 'a') {  // attempt streams (not dense restores)
      std::lock_guard lock(log_->mu);
      log_->frames.emplace_back(b.begin(), b.end());
    }
    inner_.publish(k, b);
  }
  std::vector<transport::frame_key> list(const transport::stream_key& s) { return inner_.list(s); }
  std::optional<transport::bytes> fetch(const transport::frame_key& k) { return inner_.fetch(k); }
  void discard(const transport::stream_key& s) { inner_.discard(s); }
  void post(const std::string& m, std::span<const std::byte> b) { inner_.post(m, b); }
  std::vector<transport::bytes> receive(const std::string& m, std::chrono::milliseconds w) { return inner_.receive(m, w); }

  std::vector<std::vector<std::byte>> take() {
    std::lock_guard lock(log_->mu);
    return std::exchange(log_->frames, {});
  }

 private:
  transport::inprocess_transport inner_;
  std::shared_ptr<log_t> log_;
};
static_assert(transport::Transport<recording_transport>);

using recording_net_t = recording_transport;
using log_t = durability::memory_commit_log;
using store_t = durability::memory_baseline_store;

layout::model_spec tiny_llama() {
  return {.name = "tiny-llama", .hidden = 64, .heads = 4, .kv_heads = 2, .head_dim = 16, .layers = 2,
          .intermediate = 128, .vocab = 200, .tied_embeddings = false};
}

/// The dense canonical reference of the current version. Each step changes ~3% of elements:
/// mostly the lowest mantissa bit (AdamW-like, so XOR wins), some to -0.0, NaN payloads, random.
struct canonical_truth {
  model_manifest m;
  std::map<std::string, std::vector<std::byte>, std::less<>> bits;
  std::mt19937_64 rng{2024};

  explicit canonical_truth(model_manifest mm) : m(std::move(mm)) {
    for (const auto& t : m.tensors()) {
      auto& b = bits[t.name];
      b.resize(t.bytes());
      for (auto& x : b) x = std::byte(rng());
    }
  }
  void step() {
    for (const auto& t : m.tensors()) {
      auto& b = bits[t.name];
      const std::size_t E = element_size(t.type);
      for (std::uint64_t i = 0; i < t.elements(); ++i) {
        if (rng() % 100 >= 3) continue;
        std::byte* p = b.data() + i * E;
        switch (rng() % 8) {
          case 0: std::memset(p, 0, E); p[E - 1] = std::byte{0x80}; break;       // -0.0
          case 1: std::memset(p, 0xFF, E); p[0] = std::byte(rng() | 1); break;  // NaN with payload
          case 2: for (std::size_t k = 0; k < E; ++k) p[k] = std::byte(rng()); break;
          default: p[0] ^= std::byte{1};                                          // one ulp
        }
      }
    }
  }
  refit::tensor_source source() const {
    return refit::copy_from([this](const tensor_info& t) { return std::span<const std::byte>(bits.at(t.name)); });
  }
  std::span<const std::byte> of(const tensor_info& t) const { return bits.at(t.name); }
};

/// Compares every held range of `l` with the reference, and the attestation over held ranges.
template <layout::Loader Ld>
::testing::AssertionResult holds_exactly(const Ld& l, const canonical_truth& truth, digest128 attested) {
  std::uint64_t held = 0;
  for (const auto& t : truth.m.tensors()) {
    const std::size_t E = element_size(t.type);
    for (const auto& r : l.held(t.name)) {
      std::vector<std::byte> got(r.size() * E);
      layout::read_canonical(l, t.name, r, got);
      if (std::memcmp(got.data(), truth.bits.at(t.name).data() + r.begin * E, got.size()) != 0)
        return ::testing::AssertionFailure() << t.name << " [" << r.begin << ", " << r.end << ") differs from the dense reference";
      held += r.size();
    }
  }
  if (held == 0) return ::testing::AssertionFailure() << "holds nothing";
  const digest128 want = refit::expected_attestation(truth.m, refit::declare(l), [&](const tensor_info& t) { return truth.of(t); });
  if (attested != want) return ::testing::AssertionFailure() << "attestation over held ranges differs";
  return ::testing::AssertionSuccess();
}

/// One rollout engine: a receiver thread over a Loader built by `make` (rebuilt, zeroed, after a
/// crash), and a check of its bits.
struct engine_slot {
  std::thread thread;
  std::mutex mu;
  std::atomic<std::uint64_t> at{~0ull};
  std::atomic<std::uint64_t> incarnation{1};
  std::atomic<int> crashes{0};
  std::function<::testing::AssertionResult(const canonical_truth&)> check;  // under mu
};

struct rig {
  recording_net_t net;
  log_t log;
  std::vector<store_t> stores{2};
  bitrefit::testing::crash_points faults;
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<engine_slot>> rx;
  /// Every machine's steps (wire/trace.hpp), replayed through the pure machines when the rig ends.
  std::filesystem::path trace = std::filesystem::temp_directory_path() /
                                ("bitrefit-layouts-trace-" + std::to_string(::getpid()) + "-" + std::to_string(next_trace()));
  static int next_trace() {
    static std::atomic<int> n{0};
    return n++;
  }

  refit::sender_options options(std::uint32_t receivers) {
    refit::sender_options so;
    so.owners = 2;
    so.receivers = receivers;
    so.threads = 2;
    so.max_frame_input_bytes = 4096;
    so.deadline = 500ms;
    so.poll = 1ms;
    so.transition_timeout = 60s;
    so.trace_dir = trace.string();
    return so;
  }

  /// Starts receiver `index` over loaders built by `make()` (returns std::unique_ptr<Ld>).
  template <class Make>
  void add_receiver(Make make) {
    using Ld = typename decltype(make())::element_type;
    const auto index = static_cast<std::uint32_t>(rx.size());
    rx.push_back(std::make_unique<engine_slot>());
    engine_slot& slot = *rx.back();
    slot.thread = std::thread([this, &slot, index, make] {
      while (!stop) {
        std::unique_ptr<Ld> loader = make();
        std::unique_ptr<refit::receiver<Ld, recording_net_t, log_t, bitrefit::testing::crash_points>> r;
        {
          std::lock_guard lock(slot.mu);
          refit::receiver_options o;
          o.index = index;
          o.incarnation = slot.incarnation;
          o.poll = 1ms;
          o.deadline = 300ms;
          o.trace_dir = trace.string();
          o.persist_incarnation = [&slot](std::uint64_t n) { slot.incarnation = n; };
          o.on_commit = [&slot](const protocol::commit_record& k) { slot.at.store(k.version, std::memory_order_release); };
          r = std::make_unique<refit::receiver<Ld, recording_net_t, log_t, bitrefit::testing::crash_points>>(*loader, net, log, o, faults);
          slot.check = [l = loader.get(), rp = r.get()](const canonical_truth& truth) { return holds_exactly(*l, truth, rp->attest()); };
        }
        try {
          r->start();
          while (!stop) r->step(1ms);
        } catch (const bitrefit::testing::injected_crash&) {
          slot.at = ~0ull;
          ++slot.crashes;
          ++slot.incarnation;
        }
        std::lock_guard lock(slot.mu);
        slot.check = nullptr;
        r.reset();
        loader.reset();
      }
    });
  }

  ~rig() {
    stop = true;
    for (auto& s : rx) s->thread.join();
    // Senders are gone by now (declared after the rig): every trace file is complete.
    const auto report = proofs::traces::check_dir(trace);
    EXPECT_TRUE(report.ok()) << report.text() << "\ntrace kept in " << trace;
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(trace);
  }

  /// Pumps `tx` until every engine holds v, then checks each one's held bits.
  template <class Sender>
  void expect_all_bit_exact(Sender& tx, const canonical_truth& truth, version_t v) {
    const auto until = std::chrono::steady_clock::now() + 60s;
    auto all_at = [&] {
      for (auto& s : rx)
        if (s->at.load(std::memory_order_acquire) != v) return false;
      return true;
    };
    while (!all_at() && std::chrono::steady_clock::now() < until) tx.pump(5ms);
    ASSERT_TRUE(all_at()) << "not every receiver reached v" << v;
    for (std::uint32_t r = 0; r < rx.size(); ++r) {
      std::lock_guard lock(rx[r]->mu);
      ASSERT_TRUE(rx[r]->check);
      EXPECT_TRUE(rx[r]->check(truth)) << "receiver " << r << " at v" << v;
    }
    EXPECT_EQ(durability::read_log(log).snapshot.record.version, v);
  }
};

/// Every shard's local bytes of one version, scattered from the canonical reference by the
/// shards' run blocks. Owned runs carry the truth; non-owned copies (replicas, tied copies) and
/// padding carry garbage that changes every version, so a projection that read anything but the
/// owned runs would send wrong bits.
struct megatron_trainer {
  std::vector<layout::megatron_projection> ranks;
  std::vector<std::vector<std::vector<std::byte>>> local;  // [rank][tensor]
  std::mt19937_64 rng{99};

  megatron_trainer(const layout::model_spec& spec, layout::trainer_parallel par) {
    auto canonical = std::make_shared<const model_manifest>(layout::canonical_manifest(spec));
    for (const auto& r : layout::all_ranks(par)) ranks.emplace_back(canonical, spec, par, r);
    local.resize(ranks.size());
  }
  void export_from(const canonical_truth& truth) {
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const auto& ts = ranks[r].tensors();
      local[r].resize(ts.size());
      for (std::size_t k = 0; k < ts.size(); ++k) {
        auto& buf = local[r][k];
        const std::size_t E = element_size(ts[k].type);
        buf.resize(ts[k].elements() * E);
        for (auto& b : buf) b = std::byte(rng());
        for (const auto& blk : ts[k].runs) {
          if (!blk.owned) continue;
          const auto& src = truth.bits.at(ranks[r].canonical().tensors()[blk.tensor].name);
          layout::for_each_run(blk, [&](std::uint64_t lb, std::uint64_t cb, std::uint64_t len) {
            std::memcpy(buf.data() + lb * E, src.data() + cb * E, len * E);
          });
        }
      }
    }
  }
  refit::shard_bytes input() const {
    return [this](std::size_t r, std::size_t k) { return std::span<const std::byte>(local.at(r).at(k)); };
  }
};

}  // namespace

TEST(RefitLayouts, MegatronShardedTrainerProjectsToBitExactReceivers) {
  const auto spec = tiny_llama();
  const layout::trainer_parallel par{.tp = 2, .pp = 2, .dp = 2};
  megatron_trainer trainer(spec, par);
  canonical_truth truth(layout::canonical_manifest(spec));
  trainer.export_from(truth);

  using projection_t = refit::sharded_projection<layout::megatron_projection>;
  using sender_t = refit::sender<recording_net_t, log_t, store_t, projection_t>;
  rig g;
  sender_t tx(projection_t(trainer.ranks), g.net, g.log, g.stores, g.options(3));
  tx.start(trainer.input());
  for (int r = 0; r < 3; ++r) g.add_receiver([&] { return std::make_unique<layout::canonical_store>(truth.m); });
  ASSERT_TRUE(tx.wait_for_members(60s));
  g.expect_all_bit_exact(tx, truth, 0);
  for (version_t v = 1; v <= 2; ++v) {
    truth.step();
    trainer.export_from(truth);
    const auto st = tx.refit(trainer.input());
    EXPECT_TRUE(st.committed);
    EXPECT_EQ(st.attempts, 1u);
    EXPECT_GT(st.changed, 0u);
    EXPECT_LT(st.payload_bytes, st.dense_bytes);
    g.expect_all_bit_exact(tx, truth, v);
  }
}

TEST(RefitLayouts, ShardedProjectionGathersCanonicalBitsForEveryConfiguration) {
  layout::model_spec tied = tiny_llama();
  tied.tied_embeddings = true;  // pp > 1: the last stage's output layer is a non-owning copy
  const layout::model_spec moe{.name = "tiny-moe", .hidden = 32, .heads = 4, .kv_heads = 2, .head_dim = 8, .layers = 2,
                               .experts = 4, .moe_intermediate = 16, .vocab = 100, .qk_norm = true};
  const std::vector<std::pair<layout::model_spec, layout::trainer_parallel>> configs{
      {tiny_llama(), {.tp = 1}},
      {tiny_llama(), {.tp = 2, .pp = 2, .dp = 2}},
      {tied, {.tp = 2, .pp = 2}},
      {moe, {.tp = 2, .pp = 1, .dp = 2, .ep = 2, .etp = 1}},
      {moe, {.tp = 1, .pp = 2, .dp = 4, .ep = 2, .etp = 2}},
  };
  for (const auto& [spec, par] : configs) {
    SCOPED_TRACE(spec.name + " tp=" + std::to_string(par.tp) + " pp=" + std::to_string(par.pp) + " dp=" + std::to_string(par.dp) +
                 " ep=" + std::to_string(par.ep) + " etp=" + std::to_string(par.etp));
    megatron_trainer trainer(spec, par);
    canonical_truth truth(layout::canonical_manifest(spec));
    trainer.export_from(truth);
    const refit::sharded_projection<layout::megatron_projection> p(trainer.ranks);
    ASSERT_EQ(p.canonical(), truth.m);
    const auto in = trainer.input();
    for (const auto& t : truth.m.tensors()) {
      std::vector<std::byte> out(t.bytes(), std::byte{0x5A});
      p.project(in, t, out);
      EXPECT_TRUE(out == truth.bits.at(t.name)) << t.name;
    }
  }
}

TEST(RefitLayouts, ShardedProjectionRefusesAnIncompleteConfiguration) {
  const auto spec = tiny_llama();
  const layout::trainer_parallel par{.tp = 2, .pp = 1, .dp = 1};
  megatron_trainer trainer(spec, par);
  auto missing = trainer.ranks;
  missing.pop_back();  // rank tp=1 is missing: half of every sharded tensor has no owner
  try {
    refit::sharded_projection<layout::megatron_projection> p(missing);
    FAIL() << "a configuration that does not own every element must be refused";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::mismatch);
    EXPECT_FALSE(e.where().tensor.empty());
  }
}

TEST(RefitLayouts, NonBitPreservingTensorsGoAsOverwriteOthersAsXor) {
  const auto spec = tiny_llama();
  canonical_truth truth(layout::canonical_manifest(spec));
  auto canonical = std::make_shared<const model_manifest>(truth.m);
  const layout::serving_parallel f32_norms{.tp = 1, .norms_as_f32 = true};
  auto make_vllm = [&] { return std::make_unique<layout::vllm_rank_loader>(canonical, spec, f32_norms, 0); };

  rig g;
  auto so = g.options(3);
  so.placements = {refit::declare(*make_vllm()), {}, {}};
  refit::sender<recording_net_t, log_t, store_t> tx(truth.m, g.net, g.log, g.stores, so);
  tx.start(truth.source());
  g.add_receiver(make_vllm);
  for (int r = 0; r < 2; ++r) g.add_receiver([&] { return std::make_unique<layout::canonical_store>(truth.m); });
  ASSERT_TRUE(tx.wait_for_members(60s));
  g.expect_all_bit_exact(tx, truth, 0);

  // the five RMSNorm weights (2 layers x 2 + final) are the overwrite-only tensors
  std::set<std::string, std::less<>> norms;
  for (const auto& t : truth.m.tensors())
    if (t.name.find("norm") != std::string::npos) norms.insert(t.name);
  ASSERT_EQ(norms.size(), 5u);
  EXPECT_EQ(tx.overwrite_only(), norms);

  for (version_t v = 1; v <= 2; ++v) {
    g.net.take();
    truth.step();
    const auto st = tx.refit(truth.source());
    EXPECT_TRUE(st.committed);
    EXPECT_EQ(st.attempts, 1u);
    g.expect_all_bit_exact(tx, truth, v);
    std::uint64_t norm_items = 0, xor_items = 0;
    for (const auto& bytes : g.net.take()) {
      const auto f = codec::frame_view::parse(bytes);
      for (const auto& it : f.items()) {
        if (norms.count(it.tensor)) {
          ++norm_items;
          EXPECT_EQ(it.mode, codec::value_mode::overwrite) << it.tensor << " is not placed bit-preservingly by receiver 0";
        } else {
          xor_items += it.mode == codec::value_mode::xor_mask;
        }
      }
    }
    EXPECT_GT(norm_items, 0u);
    EXPECT_GT(xor_items, 0u) << "bit-preservingly placed tensors still go as XOR";
  }
}

TEST(RefitLayouts, PartialHoldersApplyAndAttestTheirHeldRangesOnly) {
  const auto spec = tiny_llama();
  canonical_truth truth(layout::canonical_manifest(spec));
  auto canonical = std::make_shared<const model_manifest>(truth.m);
  // two tensor-parallel halves (rank 1 also keeps its norms upcast to F32) and one full holder
  auto make_rank = [&](std::uint32_t rank) {
    return [&, rank] {
      return std::make_unique<layout::vllm_rank_loader>(canonical, spec, layout::serving_parallel{.tp = 2, .norms_as_f32 = rank == 1}, rank);
    };
  };
  auto make_full = [&] { return std::make_unique<layout::canonical_store>(truth.m); };
  const refit::placement half0 = refit::declare(*make_rank(0)()), half1 = refit::declare(*make_rank(1)());
  ASSERT_FALSE(half0.full());
  ASSERT_FALSE(half1.full());
  ASSERT_NE(half0, half1);
  ASSERT_LT(layout::held_bytes(*make_rank(0)()), truth.m.total_bytes());

  rig g;
  auto so = g.options(3);
  so.placements = {half0, half1, {}};
  refit::sender<recording_net_t, log_t, store_t> tx(truth.m, g.net, g.log, g.stores, so);
  tx.start(truth.source());
  g.add_receiver(make_rank(0));
  g.add_receiver(make_rank(1));
  g.add_receiver(make_full);
  ASSERT_TRUE(tx.wait_for_members(60s));
  g.expect_all_bit_exact(tx, truth, 0);

  truth.step();
  EXPECT_EQ(tx.refit(truth.source()).attempts, 1u);
  g.expect_all_bit_exact(tx, truth, 1);

  // a partial holder dies mid-refit: it restores its held ranges densely and the retry overwrites
  g.faults.arm("receiver_applied", 3, "receiver/0");
  truth.step();
  const auto st = tx.refit(truth.source());
  EXPECT_TRUE(st.committed);
  EXPECT_EQ(g.rx[0]->crashes.load(), 1);
  EXPECT_GE(st.attempts, 2u);
  g.expect_all_bit_exact(tx, truth, 2);
}

TEST(RefitLayouts, AMisconfiguredPlacementIsRefusedByName) {
  const auto spec = tiny_llama();
  canonical_truth truth(layout::canonical_manifest(spec));
  auto canonical = std::make_shared<const model_manifest>(truth.m);
  rig g;
  auto so = g.options(1);  // placements left empty: the sender assumes a full, bit-preserving holder
  refit::sender<recording_net_t, log_t, store_t> tx(truth.m, g.net, g.log, g.stores, so);
  tx.start(truth.source());
  g.add_receiver([&] { return std::make_unique<layout::vllm_rank_loader>(canonical, spec, layout::serving_parallel{.tp = 2}, 1); });
  ASSERT_TRUE(tx.wait_for_members(60s));  // it announced its placement before it joined
  truth.step();
  try {
    tx.refit(truth.source());
    FAIL() << "a transition that could never commit must be refused";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::mismatch);
    EXPECT_NE(std::string(e.what()).find("receiver 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(durability::read_log(g.log).snapshot.record.version, 0u);
}

TEST(RefitLayouts, XorDeltasOffSendsEveryChangedElementAsOverwrite) {
  // sender_options::xor_deltas = false: bit-preserving receivers, yet every attempt is prepared
  // in overwrite mode and every frame item carries absolute values (bench/refit's overwrite-only
  // baseline); the receivers still end bit-exact, through their fast (bit-preserving) paths.
  const auto spec = tiny_llama();
  canonical_truth truth(layout::canonical_manifest(spec));
  rig g;
  auto so = g.options(2);
  so.xor_deltas = false;
  refit::sender<recording_net_t, log_t, store_t> tx(truth.m, g.net, g.log, g.stores, so);
  tx.start(truth.source());
  for (int r = 0; r < 2; ++r) g.add_receiver([&] { return std::make_unique<layout::canonical_store>(truth.m); });
  ASSERT_TRUE(tx.wait_for_members(60s));
  g.expect_all_bit_exact(tx, truth, 0);
  EXPECT_TRUE(tx.overwrite_only().empty()) << "no receiver placement forces overwrite here";
  for (version_t v = 1; v <= 2; ++v) {
    g.net.take();
    truth.step();
    const auto st = tx.refit(truth.source());
    EXPECT_TRUE(st.committed);
    EXPECT_EQ(st.attempts, 1u);
    g.expect_all_bit_exact(tx, truth, v);
    std::uint64_t items = 0;
    for (const auto& bytes : g.net.take()) {
      const auto f = codec::frame_view::parse(bytes);
      for (const auto& it : f.items()) {
        ++items;
        EXPECT_EQ(it.mode, codec::value_mode::overwrite) << it.tensor << " went as XOR with xor_deltas = false";
      }
    }
    EXPECT_GT(items, 0u);
  }
}
