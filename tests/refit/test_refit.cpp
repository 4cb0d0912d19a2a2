// End-to-end refits in one process: a sender (coordinator + 2 owners) and 3 receiver threads over
// the in-process transport, with every fault the engine can inject, in synchronous and
// asynchronous mode. After every commit, every receiver is compared with the trainer's truth bit
// for bit (memcmp of every tensor) and by attestation digest; the log is checked for what
// committed. Label e2e.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "bitrefit/durability/memory.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/transport/faulty.hpp"
#include "bitrefit/transport/inprocess.hpp"

using namespace bitrefit;
using namespace std::chrono_literals;

namespace {

using net_t = transport::faulty_transport<transport::inprocess_transport>;
using sender_t = refit::sender<net_t, durability::memory_commit_log, durability::memory_baseline_store>;
using receiver_t = refit::receiver<layout::canonical_store, net_t, durability::memory_commit_log>;

model_manifest test_model() {
  return model_manifest({{"model.embed.weight", dtype::BF16, {64, 96}},
                         {"model.mlp.weight", dtype::BF16, {128, 40}},
                         {"model.norm.bias", dtype::F32, {300}},
                         {"model.steps", dtype::I64, {16}},
                         {"model.fp8.weight", dtype::F8_E4M3, {200}},
                         {"model.half", dtype::F16, {77}},
                         {"model.empty", dtype::BF16, {0, 4}}});
}

/// The trainer's truth: version k of every tensor. Each step changes ~3% of elements to random bit
/// patterns, with special values (-0.0, NaN payloads, infinities, subnormals) mixed in.
struct truth_model {
  model_manifest m = test_model();
  std::map<std::string, std::vector<std::byte>> bits;
  std::mt19937_64 rng{12345};

  truth_model() {
    for (auto& t : m.tensors()) {
      auto& b = bits[t.name];
      b.resize(t.bytes());
      for (auto& x : b) x = static_cast<std::byte>(rng());
    }
  }
  void step() {
    for (auto& t : m.tensors()) {
      auto& b = bits[t.name];
      const std::size_t E = element_size(t.type);
      for (std::uint64_t i = 0; i < t.elements(); ++i) {
        if (rng() % 100 >= 3) continue;
        std::byte* p = b.data() + i * E;
        switch (rng() % 6) {
          case 0: std::memset(p, 0, E); p[E - 1] = std::byte{0x80}; break;          // -0.0
          case 1: std::memset(p, 0xFF, E); p[0] = std::byte(rng() | 1); break;     // NaN with payload
          case 2: std::memset(p, 0, E); p[0] = std::byte{1}; break;                // smallest subnormal
          default:
            for (std::size_t k = 0; k < E; ++k) p[k] = static_cast<std::byte>(rng());
        }
      }
    }
  }
  refit::tensor_source source() const {
    return [this](const tensor_info& t, std::span<std::byte> out) {
      const auto& b = bits.at(t.name);
      ASSERT_EQ(out.size(), b.size());
      if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());
    };
  }
  digest128 attestation() const {
    std::vector<tensor_view> vs;
    for (auto& t : m.tensors()) vs.emplace_back(t.name, t.type, t.shape, std::span<const std::byte>(bits.at(t.name)));
    return codec::attestation_digest(std::span<const tensor_view>(vs));
  }
};

struct receiver_slot {
  std::thread thread;
  std::mutex mu;
  std::unique_ptr<layout::canonical_store> store;  // replaced (zeroed) when the receiver crashes
  std::atomic<std::uint64_t> at{~0ull};            // version its parameters hold, ~0 while restoring
  std::atomic<std::uint64_t> incarnation{1};
  std::atomic<int> crashes{0};
  std::atomic<std::uint64_t> undelivered{0}, duplicates{0}, restores{0};
};

struct cluster {
  static constexpr std::uint32_t receivers = 3;
  protocol::gate_policy gate;
  truth_model truth;
  net_t net;
  durability::memory_commit_log log;
  std::vector<durability::memory_baseline_store> stores{2};
  refit::fault_injector faults;
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<receiver_slot>> rx;
  std::unique_ptr<sender_t> tx;
  refit::sender_options sopt;
  bool attest = true;  // receivers attest and the coordinator checks (off: only the protocol keeps bits exact)

  explicit cluster(protocol::gate_policy g, transport::fault_rules rules = {}, std::uint32_t max_attempts = 0,
                   bool attest_ = true)
      : gate(g), net(transport::inprocess_transport{}, rules), attest(attest_) {
    sopt.gate = g;
    sopt.owners = 2;
    sopt.receivers = receivers;
    sopt.threads = 2;
    sopt.max_frame_input_bytes = 2048;  // ~20 frames per refit: faults land mid-stream
    sopt.deadline = 400ms;
    sopt.poll = 1ms;
    sopt.faults = &faults;
    sopt.max_attempts = max_attempts;
    sopt.attest = attest;
    sopt.transition_timeout = 60s;
    tx = make_sender();
    tx->start(truth.source());
    for (std::uint32_t r = 0; r < receivers; ++r) {
      rx.push_back(std::make_unique<receiver_slot>());
      rx.back()->thread = std::thread([this, r] { run_receiver(r); });
    }
    EXPECT_TRUE(tx->wait_for_members(60s));  // returns as soon as all are known; generous under load
    expect_all_bit_exact(0);
  }
  ~cluster() {
    stop = true;
    for (auto& s : rx) s->thread.join();
  }

  std::unique_ptr<sender_t> make_sender() {
    return std::make_unique<sender_t>(truth.m, net, log, stores, sopt);
  }

  void run_receiver(std::uint32_t r) {
    auto& slot = *rx[r];
    while (!stop) {
      auto store = std::make_unique<layout::canonical_store>(truth.m);
      {
        std::lock_guard lock(slot.mu);
        slot.store = std::move(store);
      }
      refit::receiver_options o;
      o.index = r;
      o.incarnation = slot.incarnation;
      o.gate = gate;
      o.poll = 1ms;
      o.deadline = 300ms;
      o.attest = attest;
      o.faults = &faults;
      o.persist_incarnation = [&slot](std::uint64_t n) { slot.incarnation = n; };
      o.on_commit = [&slot](const protocol::commit_record& k) { slot.at.store(k.version, std::memory_order_release); };
      receiver_t rcv(*slot.store, net, log, o);
      try {
        rcv.start();
        while (!stop) {
          rcv.step(1ms);
          slot.undelivered = rcv.counters().undelivered;
          slot.duplicates = rcv.counters().duplicates_seen;
          slot.restores = rcv.counters().restores;
        }
      } catch (const refit::injected_crash&) {
        // The process died: everything volatile is gone. It restarts with a new incarnation.
        slot.at = ~0ull;
        ++slot.crashes;
        ++slot.incarnation;
      }
    }
  }

  refit::transition_stats refit_once() {
    truth.step();
    return tx->refit(truth.source());
  }

  /// Waits (serving restores) until every receiver holds version v, then compares every byte and
  /// the attestation digest with the truth.
  void expect_all_bit_exact(version_t v) {
    // Bounded but driven by progress: the machine running the tests may be heavily loaded, so
    // the wait only gives up after 20 s in which no receiver moved (or 120 s in all).
    using steady = std::chrono::steady_clock;
    const auto cap = steady::now() + 120s;
    auto quiet_until = steady::now() + 20s;
    auto versions = [&] {
      std::vector<version_t> at;
      for (auto& s : rx) at.push_back(s->at.load(std::memory_order_acquire));
      return at;
    };
    auto all_at = [&] {
      for (auto& s : rx)
        if (s->at.load(std::memory_order_acquire) != v) return false;
      return true;
    };
    auto seen = versions();
    while (!all_at() && steady::now() < std::min(cap, quiet_until)) {
      tx->pump(5ms);
      if (auto now_at = versions(); now_at != seen) {
        seen = std::move(now_at);
        quiet_until = steady::now() + 20s;
      }
    }
    ASSERT_TRUE(all_at()) << "not every receiver reached v" << v;
    const digest128 expected = truth.attestation();
    for (std::uint32_t r = 0; r < rx.size(); ++r) {
      std::lock_guard lock(rx[r]->mu);
      std::vector<tensor_view> vs;
      for (auto& t : truth.m.tensors()) {
        const auto got = rx[r]->store->bytes(t.name);
        const auto& want = truth.bits.at(t.name);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_TRUE(want.empty() || std::memcmp(got.data(), want.data(), want.size()) == 0)
            << "receiver " << r << " tensor " << t.name << " differs from the dense reference at v" << v;
        vs.push_back(rx[r]->store->view(t.name));
      }
      EXPECT_EQ(codec::attestation_digest(std::span<const tensor_view>(vs)), expected) << "receiver " << r;
    }
    EXPECT_EQ(durability::read_log(log).snapshot.record.version, v);
  }
};

class Refit : public ::testing::TestWithParam<protocol::gate_policy> {};

std::string gate_name(const ::testing::TestParamInfo<protocol::gate_policy>& i) {
  return i.param == protocol::gate_policy::synchronous ? "sync" : "async";
}

}  // namespace

TEST_P(Refit, HappyPathEveryCommitBitExact) {
  cluster c(GetParam());
  for (version_t v = 1; v <= 3; ++v) {
    const auto st = c.refit_once();
    EXPECT_TRUE(st.committed);
    EXPECT_EQ(st.version, v);
    EXPECT_EQ(st.attempts, 1u);
    EXPECT_GT(st.changed, 0u);
    EXPECT_LT(st.changed, st.elements);
    EXPECT_GT(st.payload_bytes, 0u);
    EXPECT_LT(st.payload_bytes, st.dense_bytes);
    c.expect_all_bit_exact(v);
  }
  EXPECT_EQ(c.tx->retries_total(), 0u);
}

TEST_P(Refit, ReceiverKilledAfterSomePayloadsAppliedRetriesInOverwrite) {
  cluster c(GetParam());
  c.refit_once();
  c.expect_all_bit_exact(1);
  c.faults.arm(refit::fault_point::receiver_applied, 3, "receiver/1");  // mid-refit: 3 of ~20 applied
  const auto st = c.refit_once();
  EXPECT_EQ(c.rx[1]->crashes.load(), 1);
  EXPECT_GE(st.attempts, 2u) << "the attempt that lost a member must not commit";
  c.expect_all_bit_exact(2);
  EXPECT_GE(c.rx[1]->restores.load(), 1u);
  c.refit_once();  // and the next transition is a clean XOR one again
  c.expect_all_bit_exact(3);
}

TEST_P(Refit, CoordinatorCrashAfterCompareAndSetIsFinishedByItsSuccessor) {
  cluster c(GetParam());
  c.refit_once();
  c.expect_all_bit_exact(1);
  c.faults.arm(refit::fault_point::coordinator_after_cas, 1);
  c.truth.step();
  EXPECT_THROW(c.tx->refit(c.truth.source()), refit::injected_crash);
  EXPECT_EQ(durability::read_log(c.log).snapshot.record.version, 2u) << "K was durable before the crash";
  c.tx.reset();  // the trainer process is gone: owners recover from their durable baselines
  c.tx = c.make_sender();
  c.tx->start(nullptr);
  c.expect_all_bit_exact(2);  // the successor announced what its predecessor committed
  EXPECT_TRUE(c.tx->wait_for_members(10s));
  c.refit_once();
  c.expect_all_bit_exact(3);
}

TEST_P(Refit, FencedCoordinatorChangesNothing) {
  cluster c(GetParam());
  c.refit_once();
  c.expect_all_bit_exact(1);
  auto successor = c.make_sender();
  successor->start(nullptr);  // claims a newer epoch
  const auto before = durability::read_log(c.log).snapshot;
  c.truth.step();
  try {
    c.tx->refit(c.truth.source());
    FAIL() << "a fenced coordinator must not run a transition";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::fenced);
  }
  EXPECT_EQ(durability::read_log(c.log).snapshot, before);
  c.tx = std::move(successor);
  EXPECT_TRUE(c.tx->wait_for_members(10s));
  EXPECT_TRUE(c.tx->refit(c.truth.source()).committed);
  c.expect_all_bit_exact(2);
}

TEST_P(Refit, OwnerCrashMidStreamRecoversFromItsDurableBaseline) {
  cluster c(GetParam());
  c.refit_once();
  c.expect_all_bit_exact(1);
  c.faults.arm(refit::fault_point::owner_mid_stream, 2, "owner/0");
  c.truth.step();
  std::atomic<std::size_t> reads{0};
  const auto st = c.tx->refit([&, src = c.truth.source()](const tensor_info& t, std::span<std::byte> out) {
    ++reads;
    src(t, out);
  });
  EXPECT_EQ(c.faults.fired(), 1u);
  EXPECT_GE(st.attempts, 2u);
  EXPECT_EQ(reads.load(), c.truth.m.size()) << "the restarted owner recovers its frozen set from its durable store, not from the trainer";
  c.expect_all_bit_exact(2);
}

TEST_P(Refit, CorruptDuplicatedReorderedDelayedPayloadsStillBitExact) {
  transport::fault_rules rules;
  rules.seed = 7;
  rules.corrupt_one_in = 3;
  rules.duplicate_one_in = 2;
  rules.reorder = true;
  rules.delay_one_in = 4;
  rules.delay_lists = 3;
  cluster c(GetParam(), rules);
  for (version_t v = 1; v <= 3; ++v) {
    EXPECT_TRUE(c.refit_once().committed);
    c.expect_all_bit_exact(v);
  }
  std::uint64_t undelivered = 0, duplicates = 0;
  for (auto& s : c.rx) {
    undelivered += s->undelivered;
    duplicates += s->duplicates;
  }
  EXPECT_GT(c.net.counters().corrupted, 0u);
  EXPECT_GT(undelivered, 0u) << "corrupt copies were counted as undelivered";
  EXPECT_GT(duplicates, 0u) << "duplicate copies reached the state machine (and were ignored)";
}

TEST_P(Refit, LostControlMessagesAreRecovered) {
  transport::fault_rules rules;
  for (std::uint64_t n = 20; n < 400; n += 7) rules.drop_posts.insert(n);
  for (std::uint64_t n = 23; n < 400; n += 11) rules.duplicate_posts.insert(n);
  cluster c(GetParam(), rules);
  for (version_t v = 1; v <= 3; ++v) {
    EXPECT_TRUE(c.refit_once().committed);
    c.expect_all_bit_exact(v);
  }
  EXPECT_GT(c.net.counters().dropped_posts, 0u);
}

TEST_P(Refit, AMemberThatDoesNotHoldTheVersionBlocksTheCommit) {
  cluster c(GetParam(), {}, /*max_attempts=*/2);
  c.refit_once();
  c.expect_all_bit_exact(1);
  {
    // Receiver 2's parameters silently differ from v1 in an element no delta will touch.
    std::lock_guard lock(c.rx[2]->mu);
    c.rx[2]->store->bytes("model.steps")[3] ^= std::byte{0x10};
  }
  const std::vector<std::byte> kept(c.truth.bits["model.steps"].begin(), c.truth.bits["model.steps"].begin() + 8);
  c.truth.step();
  std::copy(kept.begin(), kept.end(), c.truth.bits["model.steps"].begin());  // element 0 keeps v1's bits
  const auto before = durability::read_log(c.log).snapshot.record;
  try {
    c.tx->refit(c.truth.source());
    FAIL() << "the attestation mismatch must block every attempt";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::protocol);
  }
  EXPECT_EQ(durability::read_log(c.log).snapshot.record, before) << "no commit while a member lacks the version";
}

INSTANTIATE_TEST_SUITE_P(Modes, Refit, ::testing::Values(protocol::gate_policy::synchronous, protocol::gate_policy::asynchronous),
                         gate_name);

// ---- the receiver's data path on its own ---------------------------------------------------------

TEST(ReceiverStore, CorruptOrForeignFramesAreRefusedWithNothingApplied) {
  truth_model truth;
  refit::owner_shard shard(truth.m, 0, 1, 1 << 20);
  shard.load_baseline(truth.source());
  truth.step();
  shard.freeze(truth.source());
  codec::chunk_encoder<> enc;
  codec::byte_buffer frame;
  shard.encode(0, {codec::frame_kind::delta, payload_id{{1, 1}, 0, 0}, 0, 1}, enc, frame);
  const std::vector<std::byte> good(frame.data(), frame.data() + frame.size());

  layout::canonical_store target(truth.m);
  for (auto& t : truth.m.tensors())
    if (t.bytes()) std::memcpy(target.bytes(t.name).data(), shard.baseline_bytes(t.name).data(), t.bytes());
  auto snapshot = [&] {
    std::vector<std::vector<std::byte>> s;
    for (auto& t : truth.m.tensors()) s.emplace_back(target.bytes(t.name).begin(), target.bytes(t.name).end());
    return s;
  };
  const auto before = snapshot();
  refit::receiver_store<layout::canonical_store> rs(target);
  for (std::size_t at : {std::size_t{0}, std::size_t{5}, good.size() / 2, good.size() - 1}) {
    auto bad = good;
    bad[at] ^= std::byte{0x01};
    EXPECT_THROW(rs.apply(bad), error) << "flipped byte " << at;
    EXPECT_EQ(snapshot(), before);
  }
  auto truncated = good;
  truncated.pop_back();
  EXPECT_THROW(rs.apply(truncated), error);
  EXPECT_EQ(snapshot(), before);
  // A frame for another model (a tensor this engine does not serve) is refused by name.
  layout::canonical_store other(model_manifest({{"model.embed.weight", dtype::BF16, {64, 96}}}));
  refit::receiver_store<layout::canonical_store> ors(other);
  try {
    ors.apply(good);
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::mismatch);
    EXPECT_FALSE(e.where().tensor.empty());
  }
  // The intact frame applies and gives exactly the new bits.
  rs.apply(good);
  for (auto& t : truth.m.tensors())
    EXPECT_TRUE(std::equal(target.bytes(t.name).begin(), target.bytes(t.name).end(), truth.bits.at(t.name).begin())) << t.name;
}

TEST(Wire, EveryMessageRoundTripsAndGarbageIsRefused) {
  protocol::prepare_record p;
  p.attempt = {3, 4};
  p.base = {7, baseline_id{99}};
  p.target = 8;
  p.next = protocol::baseline_of(p.attempt);
  p.mode = protocol::mode::xor_delta;
  p.xor_allowed = true;
  p.members = {{0, 1}, {2, 5}};
  p.expected = {digest128{1, 2}, digest128{3, 4}};
  protocol::prepare_record retry = p;
  retry.frozen = {digest128{9, 9}};
  retry.retry = true;
  retry.aborted = true;
  const std::vector<protocol::message> all{
      protocol::prepare_msg{p},
      protocol::prepare_msg{retry},
      protocol::frozen_lost_msg{{3, 4}, 1, 8},
      protocol::obsolete_msg{{3, 4}},
      protocol::open_msg{{3, 4}, {5, 6}},
      protocol::flush_msg{{3, 4}},
      protocol::announce_msg{{8, baseline_id{12}}},
      protocol::announce_msg{{8, baseline_id{12}}, protocol::member{2, 6}, false},
      protocol::announce_msg{{8, baseline_id{12}}, protocol::member{2, 5}, true},
      protocol::roll_call_msg{9},
      protocol::abort_msg{2, {3, 4}},
      protocol::manifest_msg{{3, 4}, 1, 17},
      protocol::arrived_msg{{3, 4}, {2, 5}},
      protocol::ack_msg{{3, 4}, {2, 5}, digest128{5, 6}},
      protocol::ack_msg{{3, 4}, {2, 5}, std::nullopt},
      protocol::stopped_msg{{3, 4}, {2, 5}},
      protocol::failed_msg{{3, 4}, {2, 5}, protocol::failure_reason::conflicting_payload},
      protocol::join_msg{{2, 6}, {8, baseline_id{12}}},
      protocol::baseline_msg{1, {8, baseline_id{12}}},
      protocol::payload_msg{payload_id{{3, 4}, 1, 2}, 7, 8, protocol::mode::overwrite, digest128{7, 8}},
  };
  std::set<std::size_t> covered;  // a new protocol message must be added here (and to wire.hpp)
  for (const auto& m : all) {
    covered.insert(m.index());
    const protocol::envelope e{protocol::endpoint::receiver_(2), protocol::endpoint::coord(), m};
    EXPECT_EQ(refit::wire::decode(refit::wire::encode(e)), e);
  }
  EXPECT_EQ(covered.size(), std::variant_size_v<protocol::message>);
  for (std::string bad : {"", "{", "{\"wire\":1}", "{\"wire\":1,\"from\":[0,0],\"to\":[0,0],\"msg\":{\"type\":\"nope\"}}",
                          "{\"wire\":1,\"from\":[7,0],\"to\":[0,0],\"msg\":{\"type\":\"flush\",\"attempt\":[1,1]}}"}) {
    try {
      refit::wire::decode(std::as_bytes(std::span(bad.data(), bad.size())));
      FAIL() << bad;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::format) << bad;
    }
  }
}

// ---- owners' durable baselines vs the commit ------------------------------------------------------

namespace {
/// A baseline store whose saves take 150 ms (a slow disk): the engine overlaps them with encoding.
struct slow_baseline_store {
  durability::memory_baseline_store inner;
  void save(version_t v, const durability::baseline_image& img) {
    std::this_thread::sleep_for(150ms);
    inner.save(v, img);
  }
  std::optional<durability::baseline_image> load(version_t v) { return inner.load(v); }
  void retain_only(version_t v) { inner.retain_only(v); }
};
static_assert(durability::BaselineStore<slow_baseline_store>);

/// A commit log that records, at every compare-and-set, whether every owner's image of the version
/// it would commit is already durable (DESIGN: K never names v+1 before the owners can recover it).
struct checking_log {
  durability::memory_commit_log inner;
  std::vector<slow_baseline_store> owners;
  std::shared_ptr<std::atomic<int>> cas = std::make_shared<std::atomic<int>>(0), early = std::make_shared<std::atomic<int>>(0);
  protocol::log_reply apply(const protocol::log_request& r) {
    if (const auto* c = std::get_if<protocol::compare_and_set_request>(&r)) {
      ++*cas;
      for (auto& o : owners)
        if (!o.load(c->desired.version)) ++*early;
    }
    return inner.apply(r);
  }
};
}  // namespace

TEST(RefitDurability, NoCommitBeforeEveryOwnersTargetImageIsDurable) {
  truth_model truth;
  transport::inprocess_transport net;
  std::vector<slow_baseline_store> stores(2);
  checking_log log{durability::memory_commit_log(), stores};
  refit::sender_options so;
  so.owners = 2;
  so.receivers = 1;
  so.max_frame_input_bytes = 2048;
  so.poll = 1ms;
  so.transition_timeout = 60s;
  refit::sender<transport::inprocess_transport, checking_log, slow_baseline_store> tx(truth.m, net, log, stores, so);
  tx.start(truth.source());
  layout::canonical_store engine(truth.m);
  std::atomic<bool> stop{false};
  std::thread rollout([&] {
    refit::receiver_options ro;
    ro.poll = 1ms;
    refit::receiver<layout::canonical_store, transport::inprocess_transport, checking_log> r(engine, net, log, ro);
    r.start();
    while (!stop) r.step(1ms);
  });
  ASSERT_TRUE(tx.wait_for_members(60s));
  for (version_t v = 1; v <= 2; ++v) {
    truth.step();
    const auto st = tx.refit(truth.source());
    EXPECT_TRUE(st.committed);
    EXPECT_GE(st.phases.persist_s, 0.15) << "the owners' saves are counted";
  }
  stop = true;
  rollout.join();
  EXPECT_GE(log.cas->load(), 2);
  EXPECT_EQ(log.early->load(), 0) << "a compare-and-set named a version some owner could not recover";
  for (auto& t : truth.m.tensors())
    EXPECT_TRUE(std::equal(engine.bytes(t.name).begin(), engine.bytes(t.name).end(), truth.bits.at(t.name).begin())) << t.name;
}

// ---- sender takeover (finding B1, DESIGN op 7) ----------------------------------------------------
// The whole sender process (coordinator + owners) dies in transition v2 at an engine crash point;
// a successor built from the commit log and the owners' baseline stores alone takes over while the
// trainer has moved on (its bits for "v2" are no longer the frozen ones). v2 must commit exactly
// the bits its first attempt froze (memcmp of every receiver against that full copy) — never the
// trainer's newer bits, never a mix — in both gate modes, with attestation on and OFF (off, only
// the protocol stands between a wrong takeover and silent corruption). v3 then carries the
// trainer's current bits. Reverting the engine's takeover (recover_owner's retain_only(K.v) and a
// fresh owner) makes every case here fail: the retry finds no frozen set and the transition aborts.
namespace {

using bits_t = std::map<std::string, std::vector<std::byte>>;

struct takeover_case {
  const char* what;
  refit::fault_point point;
  std::uint64_t n;          // the n-th pass of `point` crashes the sender
  bool receiver_crash;      // a receiver dies mid-attempt first (so the coordinator stops the attempt)
};

void sender_dies_and_is_taken_over(protocol::gate_policy gate, bool attest, const takeover_case& k) {
  SCOPED_TRACE(std::string(k.what) + (attest ? ", attestation on" : ", attestation off"));
  cluster c(gate, {}, 0, attest);
  c.refit_once();
  c.expect_all_bit_exact(1);
  c.truth.step();
  const bits_t frozen = c.truth.bits;  // what v2's first attempt freezes
  if (k.receiver_crash) c.faults.arm(refit::fault_point::receiver_applied, 3, "receiver/1");
  c.faults.arm(k.point, k.n, "coordinator");
  EXPECT_THROW(c.tx->refit(c.truth.source()), refit::injected_crash);
  c.faults.disarm_all();
  c.tx.reset();  // the sender process is gone, with every volatile bit (its owners' frozen sets too)
  c.truth.step();
  const bits_t moved = c.truth.bits;  // the trainer kept training
  c.tx = c.make_sender();
  c.tx->start(nullptr);
  c.truth.bits = frozen;
  c.expect_all_bit_exact(2);  // the takeover finished v2 with the frozen bits
  c.truth.bits = moved;
  const auto st = c.tx->refit(c.truth.source());
  EXPECT_TRUE(st.committed);
  EXPECT_EQ(st.version, 3u);
  c.expect_all_bit_exact(3);
}

const takeover_case takeover_cases[] = {
    // (a) ../shared/findings/protocol/failover_mid_attempt.cpp: some receivers applied (and one
    // acked) the attempt, no compare-and-set yet
    {"(a) after the first ack, before compare-and-set", refit::fault_point::coordinator_before_ack, 1, false},
    {"(a') every receiver applied, before compare-and-set", refit::fault_point::coordinator_before_ack, 3, false},
    // (b) a receiver died mid-attempt; the sender dies while stopping the attempt
    {"(b) during stop_and_wait", refit::fault_point::coordinator_stopping, 1, true},
    // (c) K names v2 already; the successor announces it
    {"(c) after compare-and-set, before announcing", refit::fault_point::coordinator_after_cas, 1, false},
};

}  // namespace

TEST_P(Refit, SenderTakeoverCommitsExactlyTheFrozenBitsAttestationOn) {
  for (const auto& k : takeover_cases) sender_dies_and_is_taken_over(GetParam(), true, k);
}
TEST_P(Refit, SenderTakeoverCommitsExactlyTheFrozenBitsAttestationOff) {
  for (const auto& k : takeover_cases) sender_dies_and_is_taken_over(GetParam(), false, k);
}

// The frozen image of v2 is lost or replaced (other bits of v2) in owner 0's store when the
// successor starts: no attempt can deliver the admitted bits, so the transition ends by abort with
// an error naming the owner — nothing commits, receivers restore K = v1 — and the next refit
// commits the trainer's v2 bit-exactly.
TEST_P(Refit, SenderTakeoverWithoutTheFrozenImageAbortsNeverCommitsOtherBits) {
  for (bool replaced : {false, true})
    for (bool attest : {true, false}) {
      SCOPED_TRACE(std::string(replaced ? "replaced" : "lost") + (attest ? ", attestation on" : ", attestation off"));
      cluster c(GetParam(), {}, 0, attest);
      c.refit_once();
      c.expect_all_bit_exact(1);
      const bits_t v1 = c.truth.bits;
      c.truth.step();
      c.faults.arm(refit::fault_point::coordinator_before_ack, 1, "coordinator");
      EXPECT_THROW(c.tx->refit(c.truth.source()), refit::injected_crash);
      c.faults.disarm_all();
      c.truth.step();
      durability::baseline_image other;  // owner 0's tensors with the trainer's newer bits
      for (const tensor_info* t : c.tx->shard(0).owned()) other[t->name] = c.truth.bits.at(t->name);
      c.tx.reset();
      c.stores[0].save(2, replaced ? other : durability::baseline_image{});
      c.tx = c.make_sender();
      std::vector<std::uint64_t> restores_before;
      for (auto& r : c.rx) restores_before.push_back(r->restores.load());
      c.tx->start(nullptr);
      try {
        c.tx->refit(c.truth.source());
        ADD_FAILURE() << "the takeover must abort, not commit";
      } catch (const error& e) {
        EXPECT_EQ(e.code(), errc::mismatch);
        EXPECT_NE(std::string(e.what()).find("owner 0 lost the frozen change set of v2"), std::string::npos) << e.what();
      }
      EXPECT_EQ(durability::read_log(c.log).snapshot.record.version, 1u);
      const bits_t moved = c.truth.bits;
      // Every member was fenced by the abort: it restores K = v1 densely (its `at` still says v1
      // meanwhile, so wait for the restore itself) and rejoins as a new incarnation.
      const auto restored_by = std::chrono::steady_clock::now() + 60s;
      auto all_restored = [&] {
        for (std::size_t r = 0; r < c.rx.size(); ++r)
          if (c.rx[r]->restores.load() <= restores_before[r] || c.rx[r]->at.load() != 1) return false;
        return true;
      };
      while (!all_restored() && std::chrono::steady_clock::now() < restored_by) c.tx->pump(5ms);
      ASSERT_TRUE(all_restored()) << "aborted members did not restore K = v1";
      c.truth.bits = v1;
      c.expect_all_bit_exact(1);  // aborted members restored K = v1
      c.truth.bits = moved;
      EXPECT_TRUE(c.tx->refit(c.truth.source()).committed);
      c.expect_all_bit_exact(2);
    }
}
