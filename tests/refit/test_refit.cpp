// End-to-end refits in one process: a sender (coordinator + 2 owners) and 3 receiver threads over
// the in-process transport, with every fault the engine can inject, in synchronous and
// asynchronous mode. After every commit, every receiver is compared with the trainer's truth bit
// for bit (memcmp of every tensor) and by attestation digest; the log is checked for what
// committed. Label e2e.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/durability/memory.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/testing/crash_points.hpp"
#include "bitrefit/transport/faulty.hpp"
#include "bitrefit/transport/inprocess.hpp"
#include "bitrefit_proofs/trace_check.hpp"
#include "truth_model.hpp"

using namespace bitrefit;
using namespace std::chrono_literals;
using bitrefit::testing::test_model;
using bitrefit::testing::truth_model;

namespace {

using net_t = transport::faulty_transport<transport::inprocess_transport>;
using sender_t = refit::sender<net_t, durability::memory_commit_log, durability::memory_baseline_store, refit::identity_projection,
                               codec::host_backend, bitrefit::testing::crash_points>;
using receiver_t = refit::receiver<layout::canonical_store, net_t, durability::memory_commit_log, bitrefit::testing::crash_points>;

/// A fresh directory for one test's trace (removed when the test passed).
struct trace_dir {
  std::filesystem::path path;
  trace_dir() {
    static std::atomic<int> n{0};
    path = std::filesystem::temp_directory_path() /
           ("bitrefit-trace-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(path);
  }
  bool keep = false;
  ~trace_dir() {
    if (!keep && !::testing::Test::HasFailure()) std::filesystem::remove_all(path);
  }
};

struct receiver_slot {
  std::thread thread;
  std::mutex mu;
  std::unique_ptr<layout::canonical_store> store;  // replaced (zeroed) when the receiver crashes
  std::atomic<std::uint64_t> at{~0ull};            // version its parameters hold, ~0 while restoring
  std::atomic<std::uint64_t> incarnation{1};
  std::atomic<int> crashes{0};
  std::atomic<std::uint64_t> undelivered{0}, duplicates{0}, restores{0}, applied{0}, decodes{0};
};

struct cluster {
  static constexpr std::uint32_t receivers = 3;
  protocol::gate_policy gate;
  truth_model truth;
  net_t net;
  durability::memory_commit_log log;
  std::vector<durability::memory_baseline_store> stores{2};
  bitrefit::testing::crash_points faults;
  trace_dir trace;  // every machine's steps, validated against the pure machines at the end
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
    sopt.max_attempts = max_attempts;
    sopt.trace_dir = trace.path.string();
    sopt.attest = attest;
    sopt.transition_timeout = 60s;
    tx = make_sender();
    tx->start(truth.source());
    // every slot exists before any receiver thread reads rx (a push_back may move the vector's
    // elements under a running thread: ThreadSanitizer reported it)
    for (std::uint32_t r = 0; r < receivers; ++r) rx.push_back(std::make_unique<receiver_slot>());
    for (std::uint32_t r = 0; r < receivers; ++r) rx[r]->thread = std::thread([this, r] { run_receiver(r); });
    EXPECT_TRUE(tx->wait_for_members(60s));  // returns as soon as all are known; generous under load
    expect_all_bit_exact(0);
  }
  ~cluster() {
    stop = true;
    for (auto& s : rx) s->thread.join();
    tx.reset();
    // The run, replayed through the pure machines, with the cross-role invariants on the merge.
    const auto report = proofs::traces::check_dir(trace.path);
    EXPECT_TRUE(report.ok()) << report.text() << "\ntrace kept in " << trace.path;
  }

  std::unique_ptr<sender_t> make_sender() {
    return std::make_unique<sender_t>(truth.m, net, log, stores, sopt, faults);
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
      o.trace_dir = trace.path.string();
      o.attest = attest;
      o.persist_incarnation = [&slot](std::uint64_t n) { slot.incarnation = n; };
      o.on_commit = [&slot](const protocol::commit_record& k) { slot.at.store(k.version, std::memory_order_release); };
      receiver_t rcv(*slot.store, net, log, o, faults);
      try {
        rcv.start();
        while (!stop) {
          rcv.step(1ms);
          slot.undelivered = rcv.counters().undelivered;
          slot.duplicates = rcv.counters().duplicates_seen;
          slot.restores = rcv.counters().restores;
          slot.applied = rcv.counters().applied;
          slot.decodes = rcv.counters().decodes;
        }
      } catch (const bitrefit::testing::injected_crash&) {
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
    for (std::uint32_t r = 0; r < rx.size(); ++r) {
      std::lock_guard lock(rx[r]->mu);
      truth.expect_held_by(*rx[r]->store, "receiver " + std::to_string(r) + " at v" + std::to_string(v));
    }
    EXPECT_EQ(durability::read_log(log).snapshot.record.version, v);
  }
};

std::string gate_name(const ::testing::TestParamInfo<protocol::gate_policy>& i) {
  return i.param == protocol::gate_policy::synchronous ? "sync" : "async";
}

}  // namespace

// Outside the anonymous namespace: the tests derive from it, and in the unity build this file is
// an included one, where g++ warns about a derived type whose base has internal linkage.
class Refit : public ::testing::TestWithParam<protocol::gate_policy> {};

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
  // Each payload frame was parsed and matched when it arrived and decoded exactly once, when it was
  // applied; the only other decodes are the dense frames of each restore (once each).
  const std::uint64_t dense_frames = c.tx->shard(0).chunk_count() + c.tx->shard(1).chunk_count();
  for (auto& s : c.rx) {
    EXPECT_GT(s->applied.load(), 0u);
    EXPECT_EQ(s->decodes.load(), s->applied.load() + s->restores.load() * dense_frames);
  }
}

TEST_P(Refit, ReceiverKilledAfterSomePayloadsAppliedRetriesInOverwrite) {
  cluster c(GetParam());
  c.refit_once();
  c.expect_all_bit_exact(1);
  c.faults.arm("receiver_applied", 3, "receiver/1");  // mid-refit: 3 of ~20 applied
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
  c.faults.arm("coordinator_after_cas", 1);
  c.truth.step();
  EXPECT_THROW(c.tx->refit(c.truth.source()), bitrefit::testing::injected_crash);
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
  c.faults.arm("owner_mid_stream", 2, "owner/0");
  c.truth.step();
  std::atomic<std::uint64_t> read_elements{0};
  const auto st = c.tx->refit([&, src = c.truth.source()](const tensor_info& t, layout::index_range r, std::span<std::byte> out) {
    read_elements += r.size();
    src(t, r, out);
  });
  EXPECT_EQ(c.faults.fired(), 1u);
  EXPECT_GE(st.attempts, 2u);
  std::uint64_t elements = 0;
  for (const auto& t : c.truth.m.tensors()) elements += t.elements();
  EXPECT_EQ(read_elements.load(), elements)
      << "every element is read once, by the freeze: the restarted owner recovers its frozen set from its durable store, not from the trainer";
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

// ---- trace validation: a real run is accepted, a doctored one is not -------------------------------

namespace {
/// Changes one step of the first file whose name starts with `prefix` where `pick(actions)` finds
/// something to change; returns whether it did.
template <class Pick>
bool doctor(std::vector<wire::trace_file>& files, const std::string& prefix, Pick pick) {
  for (auto& f : files)
    if (f.name.rfind(prefix, 0) == 0)
      for (auto& l : f.lines)
        if (l.body.contains("actions") && pick(l.body["actions"])) return true;
  return false;
}
}  // namespace

TEST(TraceCheck, ARealRunIsAcceptedAndAnyAlteredRemovedOrReorderedActionIsRejected) {
  std::filesystem::path dir;
  {
    cluster c(protocol::gate_policy::synchronous);
    c.refit_once();
    c.expect_all_bit_exact(1);
    c.faults.arm("receiver_applied", 3, "receiver/1");  // a crash and an overwrite retry in the trace too
    c.refit_once();
    c.expect_all_bit_exact(2);
    c.trace.keep = true;
    dir = c.trace.path;
  }  // the cluster's own check of this trace ran here
  const auto original = wire::read_trace_dir(dir);
  const auto good = proofs::traces::check(original);
  ASSERT_TRUE(good.ok()) << good.text();
  EXPECT_GT(good.steps, 100u);
  EXPECT_GE(good.commits, 2u);
  auto expect_rejected = [&](const char* what, const std::vector<wire::trace_file>& files, const std::string& needle) {
    const auto r = proofs::traces::check(files);
    EXPECT_FALSE(r.ok()) << what << " was accepted";
    EXPECT_NE(r.text().find(needle), std::string::npos) << what << ":\n" << r.text();
  };
  {  // altered: an XOR apply recorded as overwrite (receiver_action 5 = apply_payload_action{id, mode, base, target})
    auto files = original;
    ASSERT_TRUE(doctor(files, "r", [](wire::json& acts) {
      for (auto& a : acts)
        if (a[0] == 5 && a[1][1] == 0) return a[1][1] = 1, true;
      return false;
    }));
    expect_rejected("an altered action", files, "divergence");
  }
  {  // removed: the compare-and-set request of a commit (coordinator_action 0 = log_action)
    auto files = original;
    ASSERT_TRUE(doctor(files, "c-", [](wire::json& acts) {
      for (std::size_t k = 0; k < acts.size(); ++k)
        if (acts[k][0] == 0 && acts[k][1][0][0] == 2) return acts.erase(k), true;  // [log_action, [[compare_and_set, ...]]]
      return false;
    }));
    expect_rejected("a removed action", files, "divergence");
  }
  {  // reordered: two different actions of one step swapped (e.g. close_gate after the apply)
    auto files = original;
    ASSERT_TRUE(doctor(files, "r", [](wire::json& acts) {
      for (std::size_t k = 0; k + 1 < acts.size(); ++k)
        if (acts[k] != acts[k + 1]) return std::swap(acts[k], acts[k + 1]), true;
      return false;
    }));
    expect_rejected("reordered actions", files, "divergence");
  }
  {  // a cross-role invariant: without the owners' traces nobody sent the payloads the receivers got
    auto files = original;
    std::erase_if(files, [](const wire::trace_file& f) { return f.name.rfind("o", 0) == 0; });
    expect_rejected("payloads from nowhere", files, "which no traced machine sent");
  }
  std::filesystem::remove_all(dir);
}

// ---- the receiver's data path on its own ---------------------------------------------------------

// The owner keeps the frozen target as its change set against B^v, never as a dense copy: every
// thing read from it — the whole image, the frozen identity, the expected attestation, each
// chunk's frame, a restarted owner's reload, and B := frozen — equals the same computed from the
// dense target. Tensors span many 64 KiB blocks/leaves; every dtype, with -0.0, NaN payloads,
// infinities and subnormals among the changes.
namespace {
/// A truth model over every checkpoint dtype, `scale` elements per unit of size, random bits.
void every_dtype_model(truth_model& truth, std::uint64_t scale) {
  truth.m = model_manifest({{"model.big", dtype::BF16, {3 * scale, 1000}},
                            {"model.norm.bias", dtype::F32, {400 * scale}},
                            {"model.steps", dtype::I64, {16}},
                            {"model.fp8.weight", dtype::F8_E4M3, {700 * scale}},
                            {"model.half", dtype::F16, {77}},
                            {"model.wide", dtype::F64, {200 * scale}},
                            {"model.empty", dtype::BF16, {0, 4}}});
  truth.bits.clear();
  for (auto& t : truth.m.tensors()) {
    auto& b = truth.bits[t.name];
    b.resize(t.bytes());
    for (auto& x : b) x = static_cast<std::byte>(truth.rng());
  }
}
}  // namespace

TEST(OwnerShard, FrozenChangeSetActsAsTheDenseTarget) {
  truth_model truth;
  every_dtype_model(truth, 100);
  refit::owner_shard shard(truth.m, 0, 1, 1 << 16);
  shard.load_baseline(truth.source());
  const durability::baseline_image base = shard.baseline();
  truth.step();
  const std::uint64_t n = shard.freeze(truth.source());
  durability::baseline_image dense;
  for (auto& t : truth.m.tensors()) dense[t.name] = truth.bits.at(t.name);
  const auto es = [&](const std::string& name) { return element_size(truth.m.at(name).type); };
  EXPECT_EQ(shard.changes(), durability::diff_images(base, dense, es));
  EXPECT_EQ(n, durability::changed_elements(shard.changes()));
  EXPECT_GT(n, 1000u);
  EXPECT_EQ(shard.frozen_image(), dense);
  // the frozen identity, by its definition over the dense bytes
  codec::xxh3_128_stream h;
  h.update_u64(0);
  for (const tensor_info* t : shard.owned()) {
    h.update_string(t->name);
    h.update_u64(t->bytes());
    h.update(dense.at(t->name));
  }
  EXPECT_EQ(refit::frozen_identity(shard), h.digest());
  // the expected attestation from B^v + changes == the one from the dense target's bytes
  const digest128 from_dense =
      refit::expected_attestation(truth.m, refit::placement{}, [&](const tensor_info& t) { return std::span<const std::byte>(dense.at(t.name)); });
  EXPECT_EQ(refit::expected_attestation(truth.m, refit::placement{}, [&](const tensor_info& t) { return shard.frozen_patch(t.name); }),
            from_dense);
  EXPECT_NE(refit::expected_attestation(truth.m, refit::placement{}, [&](const tensor_info& t) { return std::span<const std::byte>(base.at(t.name)); }),
            from_dense);
  // every chunk from the known changes == encode() of B^v and the dense target, in both policies
  for (auto policy : {codec::mode_policy::xor_allowed, codec::mode_policy::overwrite_only}) {
    codec::chunk_encoder<> known_enc(codec::encode_options{.policy = policy, .max_frame_input_bytes = 1 << 16});
    codec::chunk_encoder<> dense_enc(codec::encode_options{.policy = policy, .max_frame_input_bytes = 1 << 16});
    ASSERT_GT(shard.chunk_count(), 8u);
    for (std::uint32_t seq = 0; seq < shard.chunk_count(); ++seq) {
      const codec::frame_header fh{codec::frame_kind::delta, payload_id{{1, 1}, 0, seq}, 0, 1};
      codec::byte_buffer a, b;
      shard.encode(seq, fh, known_enc, a);
      std::vector<codec::chunk_piece> pieces;
      for (const auto& r : shard.chunk(seq)) {
        const tensor_info& t = truth.m.at(r.tensor);
        const std::size_t E = element_size(t.type);
        pieces.push_back({t.name, t.type, t.elements(), r.begin, r.end, std::span<const std::byte>(base.at(t.name)).subspan(r.begin * E, r.size() * E),
                          std::span<const std::byte>(dense.at(t.name)).subspan(r.begin * E, r.size() * E)});
      }
      dense_enc.encode(fh, pieces, b);
      ASSERT_EQ(a.size(), b.size()) << "chunk " << seq;
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size())) << "chunk " << seq;
    }
  }
  // a restarted owner reloads the durable image as the same change set
  refit::owner_shard again(truth.m, 0, 1, 1 << 16);
  ASSERT_TRUE(again.load_baseline(base));
  ASSERT_TRUE(again.load_frozen(dense));
  EXPECT_EQ(again.changes(), shard.changes());
  EXPECT_EQ(refit::frozen_identity(again), refit::frozen_identity(shard));
  // B := frozen, in place
  shard.advance();
  EXPECT_FALSE(shard.frozen());
  EXPECT_EQ(shard.baseline(), dense);
  shard.advance();  // idempotent
  EXPECT_EQ(shard.baseline(), dense);
}

namespace {
/// A store that counts the images it hands out per version (test policy over any store): a
/// restarted owner must not build its frozen target's image when the store keeps the change set.
template <class S>
struct counting_store {
  S inner;
  std::map<version_t, int> image_loads;
  void save(version_t v, const durability::baseline_image& img) { inner.save(v, img); }
  void save_changes(version_t b, version_t t, const durability::change_set& cs) { inner.save_changes(b, t, cs); }
  std::optional<durability::baseline_image> load(version_t v) {
    ++image_loads[v];
    return inner.load(v);
  }
  void retain_only(version_t v) { inner.retain_only(v); }
  std::optional<durability::change_set> load_changes(version_t b, version_t t)
    requires durability::ChangeSetStore<S>
  {
    return inner.load_changes(b, t);
  }
};
static_assert(durability::ChangeSetStore<counting_store<durability::filesystem_baseline_store>>);
static_assert(!durability::ChangeSetStore<counting_store<durability::memory_baseline_store>>);
}  // namespace

// Issue 18 item 4: a restarted owner recovers its frozen target from the stored change set
// (durability law 6), holding O(changes), never a second image of its tensors; from a store that
// keeps images only, from the image. Either way the same frozen set and identity, every dtype.
TEST(OwnerShard, RestartedOwnerLoadsItsFrozenTargetAsTheStoredChangeSet) {
  truth_model truth;
  every_dtype_model(truth, 10);
  refit::owner_shard shard(truth.m, 0, 1, 1 << 16);
  shard.load_baseline(truth.source());
  const durability::baseline_image base = shard.baseline();
  truth.step();
  ASSERT_GT(shard.freeze(truth.source()), 100u);
  const auto dir = std::filesystem::temp_directory_path() / ("bitrefit-test-frozen-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto restart = [&](auto& store) {
    store.save(4, base);
    store.save_changes(4, 5, shard.changes());
    auto b = store.load(4);
    refit::owner_shard again(truth.m, 0, 1, 1 << 16);
    EXPECT_TRUE(b && again.load_baseline(*b));
    EXPECT_TRUE(refit::load_frozen_target(store, again, 4, 5));
    EXPECT_EQ(again.changes(), shard.changes());
    EXPECT_EQ(refit::frozen_identity(again), refit::frozen_identity(shard));
    EXPECT_EQ(again.frozen_image(), shard.frozen_image());
    return store.image_loads[5];
  };
  counting_store<durability::filesystem_baseline_store> fs_store{durability::filesystem_baseline_store(dir), {}};
  EXPECT_EQ(restart(fs_store), 0) << "the target's image was built although the store holds its change set";
  counting_store<durability::memory_baseline_store> mem_store{durability::memory_baseline_store(), {}};
  EXPECT_EQ(restart(mem_store), 1);
  // a change set that does not fit the owned tensors is refused, and the image path decides
  refit::owner_shard again(truth.m, 0, 1, 1 << 16);
  ASSERT_TRUE(again.load_baseline(base));
  auto cs = shard.changes();
  auto wrong_width = cs;
  wrong_width.begin()->second.element_size *= 2, wrong_width.begin()->second.elements /= 2;
  wrong_width.begin()->second.positions.resize(wrong_width.begin()->second.values.size() / wrong_width.begin()->second.element_size);
  for (std::size_t k = 0; k < wrong_width.begin()->second.positions.size(); ++k) wrong_width.begin()->second.positions[k] = k;
  EXPECT_FALSE(again.load_frozen(wrong_width));
  auto foreign = cs;
  foreign["not.owned"] = cs.begin()->second;
  EXPECT_FALSE(again.load_frozen(foreign));
  // entries with the base's own bits are no change: dropped, as the image form would never list them
  auto padded = cs;
  auto& [name, c] = *padded.begin();
  const std::size_t E = c.element_size;
  std::vector<std::uint64_t> pos;
  std::vector<std::byte> val;
  std::size_t k = 0;
  for (std::uint64_t p = 0; p < c.elements; ++p) {
    if (k < c.positions.size() && c.positions[k] == p) {
      pos.push_back(p), val.insert(val.end(), c.values.begin() + k * E, c.values.begin() + (k + 1) * E), ++k;
    } else if (p % 7 == 0) {
      pos.push_back(p), val.insert(val.end(), base.at(name).begin() + p * E, base.at(name).begin() + (p + 1) * E);
    }
  }
  ASSERT_GT(pos.size(), c.positions.size());
  c.positions = pos, c.values = val;
  ASSERT_TRUE(again.load_frozen(padded));
  EXPECT_EQ(again.changes(), shard.changes());
  std::filesystem::remove_all(dir);
}

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
  const char* point;
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
  if (k.receiver_crash) c.faults.arm("receiver_applied", 3, "receiver/1");
  c.faults.arm(k.point, k.n, "coordinator");
  EXPECT_THROW(c.tx->refit(c.truth.source()), bitrefit::testing::injected_crash);
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
    {"(a) after the first ack, before compare-and-set", "coordinator_before_ack", 1, false},
    {"(a') every receiver applied, before compare-and-set", "coordinator_before_ack", 3, false},
    // (b) a receiver died mid-attempt; the sender dies while stopping the attempt
    {"(b) during stop_and_wait", "coordinator_stopping", 1, true},
    // (c) K names v2 already; the successor announces it
    {"(c) after compare-and-set, before announcing", "coordinator_after_cas", 1, false},
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
      c.faults.arm("coordinator_before_ack", 1, "coordinator");
      EXPECT_THROW(c.tx->refit(c.truth.source()), bitrefit::testing::injected_crash);
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
