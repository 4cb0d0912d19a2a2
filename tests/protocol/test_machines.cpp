// Unit tests of the individual machines and of the value semantics the model checker relies on:
// copies are equal and independent, equal states hash equally, the in-flight multiset is
// canonical (delivery order of independent messages does not create distinct states), and the
// commit log obeys its compare-and-set laws (RapidCheck).
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <iostream>
#include <type_traits>

#include "bitrefit/protocol/protocol.hpp"
#include "bitrefit/protocol/model/cluster.hpp"

namespace {

using namespace bitrefit;
using namespace bitrefit::protocol;

protocol_config two_by_two() {
  protocol_config c;
  c.owners = 2;
  c.receivers = 2;
  return c;
}

prepare_record record_of(attempt_id a, mode m, std::vector<member> members) {
  prepare_record p;
  p.attempt = a;
  p.base = commit_record{0, baseline_id{0}};
  p.target = 1;
  p.next = baseline_of(a);
  p.mode = m;
  p.members = std::move(members);
  return p;
}

message_event from_coord(std::uint32_t r, message m) {
  return message_event{envelope{endpoint::coord(), endpoint::receiver_(r), std::move(m)}};
}
message_event payload_to(std::uint32_t r, payload_msg p) {
  return message_event{envelope{endpoint::owner_(p.id.owner), endpoint::receiver_(r), p}};
}

template <class A, class V>
std::size_t count_of(const std::vector<V>& actions) {
  std::size_t n = 0;
  for (const auto& a : actions) n += std::holds_alternative<A>(a);
  return n;
}
template <class M, class V>
std::vector<M> sent(const std::vector<V>& actions) {
  std::vector<M> out;
  for (const auto& a : actions)
    if (const auto* s = std::get_if<send_action>(&a))
      if (const auto* m = std::get_if<M>(&s->env.msg)) out.push_back(*m);
  return out;
}

// ----- value semantics --------------------------------------------------------------------------

TEST(ValueSemantics, CopiesAreEqualIndependentAndHashEqually) {
  model::world_config cfg;
  cfg.chunks_per_owner = 2;
  model::cluster a(cfg);
  a.apply(*a.find_move("log ok claim_epoch"));
  a.apply(*a.find_move("begin"));
  a.apply(*a.find_move("log ok persist_prepare"));
  model::cluster b = a;
  const std::size_t in_flight = a.inflight.size();
  EXPECT_TRUE(a == b);
  EXPECT_EQ(hash_of(a), hash_of(b));
  EXPECT_EQ(std::hash<model::cluster>{}(a), std::hash<model::cluster>{}(b));
  b.apply(*b.find_move("deliver c->o0 prepare"));
  EXPECT_FALSE(a == b);
  EXPECT_NE(hash_of(a), hash_of(b));
  EXPECT_EQ(a.inflight.size(), in_flight);  // a unchanged
  EXPECT_TRUE(a.find_move("deliver c->o0 prepare").has_value());
}

// The proofs' compact decoding (proofs/include/bitrefit_proofs/compact.hpp) rebuilds a world field
// by field and emplaces each optional part before filling it, so an optional part of the world
// must be default-constructible under every compiler we build with. clang 14 answered "no" for
// owner_store's frozen image while it was a class nested in owner_store (its default member
// initializers are not usable before the enclosing class is complete, and clang caches the
// answer): the proofs did not compile with clang. This checks that part; the others are plain
// namespace-scope types. This tree is built by clang in CI (ASan).
static_assert(std::is_default_constructible_v<model::owner_store::frozen_image>);
TEST(ValueSemantics, OptionalPartsOfTheWorldAreRebuiltInPlace) {
  model::owner_store s;
  s.frozen.emplace();
  s.frozen->target = 3;
  s.frozen->flavor = 7;
  model::owner_store t;
  t.frozen.emplace();
  EXPECT_FALSE(s == t);
  *t.frozen = *s.frozen;
  EXPECT_TRUE(s == t);
}

TEST(ValueSemantics, IndependentDeliveriesCommute) {
  model::world_config cfg;
  model::cluster w(cfg);
  w.apply(*w.find_move("log ok claim_epoch"));
  w.apply(*w.find_move("begin"));
  w.apply(*w.find_move("log ok persist_prepare"));
  model::cluster x = w, y = w;
  x.apply(*x.find_move("deliver c->o0 prepare"));
  x.apply(*x.find_move("deliver c->r1 prepare"));
  y.apply(*y.find_move("deliver c->r1 prepare"));
  y.apply(*y.find_move("deliver c->o0 prepare"));
  EXPECT_TRUE(x == y);
  EXPECT_EQ(hash_of(x), hash_of(y));
}

TEST(ValueSemantics, ReplayingTheSameMovesIsDeterministic) {
  model::world_config cfg;
  cfg.drops = 1;
  cfg.duplicates = 2;
  cfg.crashes = 1;
  model::cluster a(cfg), b(cfg);
  for (int i = 0; i < 200; ++i) {
    auto moves = a.enabled_moves();
    ASSERT_EQ(moves, b.enabled_moves());
    if (moves.empty()) break;
    const auto m = moves[(i * 7919u) % moves.size()];
    ASSERT_EQ(a.describe(m), b.describe(m));
    a.apply(m);
    b.apply(m);
    ASSERT_TRUE(a == b);
  }
  EXPECT_EQ(hash_of(a), hash_of(b));
}

TEST(ValueSemantics, StepDoesNotTouchOtherCopies) {
  receiver r(0, 0, two_by_two());
  const receiver before = r;
  auto acts = r.step(from_coord(0, prepare_msg{record_of({1, 1}, mode::xor_mask, {{0, 0}})}));
  EXPECT_EQ(count_of<close_gate_action>(acts), 1u);
  EXPECT_NE(r, before);
  EXPECT_EQ(before.phase, receiver_phase::serving);
  EXPECT_EQ(r.phase, receiver_phase::member);
}

// ----- receiver ---------------------------------------------------------------------------------

struct ReceiverTest : ::testing::Test {
  receiver r{0, 0, two_by_two()};
  attempt_id tau{1, 1};
  void SetUp() override {
    r.step(from_coord(0, prepare_msg{record_of(tau, mode::xor_mask, {{0, 0}, {1, 0}})}));
    r.step(from_coord(0, open_msg{tau, {1, 1}}));
  }
  payload_msg payload(std::uint32_t owner, digest128 content = {1, 2}) {
    return payload_msg{payload_id{tau, owner, 0}, 0, 1, mode::xor_mask, content};
  }
};

TEST_F(ReceiverTest, AppliesInOwnerSeqOrderAndAcksAfterSync) {
  auto a1 = r.step(payload_to(0, payload(1)));  // owner 1 first: staged, not applied (order)
  EXPECT_EQ(count_of<stage_payload_action>(a1), 1u);
  EXPECT_EQ(count_of<apply_payload_action>(a1), 0u);
  auto a0 = r.step(payload_to(0, payload(0)));
  ASSERT_EQ(count_of<apply_payload_action>(a0), 2u);
  std::vector<payload_id> order;
  for (const auto& a : a0)
    if (const auto* ap = std::get_if<apply_payload_action>(&a)) order.push_back(ap->id);
  EXPECT_EQ(order[0].owner, 0u);
  EXPECT_EQ(order[1].owner, 1u);
  EXPECT_EQ(count_of<sync_device_action>(a0), 1u);
  EXPECT_TRUE(sent<ack_msg>(a0).empty());  // not before the device is synchronised
  auto s = r.step(device_synced_event{digest128{7, 7}});
  auto acks = sent<ack_msg>(s);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].attempt, tau);
  EXPECT_EQ(acks[0].from, (member{0, 0}));
  EXPECT_EQ(acks[0].attestation, (digest128{7, 7}));
}

TEST_F(ReceiverTest, DuplicateIgnoredConflictFailsOtherAttemptDropped) {
  r.step(payload_to(0, payload(0)));
  const receiver after_first = r;
  EXPECT_TRUE(r.step(payload_to(0, payload(0))).empty());  // identical duplicate
  EXPECT_EQ(r, after_first);
  payload_msg other = payload(1);
  other.id.attempt = attempt_id{0, 7};
  EXPECT_TRUE(r.step(payload_to(0, other)).empty());  // an older (dead) attempt: dropped
  EXPECT_EQ(r, after_first);
  auto c = r.step(payload_to(0, payload(0, digest128{9, 9})));  // same id, other bytes
  auto f = sent<failed_msg>(c);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].reason, failure_reason::conflicting_payload);
}

// Found by the exhaustive checker: without this a payload or open that overtakes its prepare was
// dropped, nobody sent it again, and the last allowed attempt could never end.
TEST(ReceiverEarly, MessagesBeforeThePrepareAreKeptAndReplayedInOrder) {
  receiver r{0, 0, two_by_two()};
  const attempt_id tau{1, 1};
  auto pay = [&](std::uint32_t owner) { return payload_msg{payload_id{tau, owner, 0}, 0, 1, mode::xor_mask, {owner + 1u, 2}}; };
  auto s1 = r.step(payload_to(1, pay(1)));
  ASSERT_EQ(s1.size(), 1u);
  EXPECT_EQ(std::get<stage_payload_action>(s1[0]).id, pay(1).id);  // staged at once: the frame verified
  EXPECT_TRUE(r.step(payload_to(1, pay(1))).empty());               // identical duplicate: ignored
  EXPECT_TRUE(r.step(from_coord(0, open_msg{tau, {1, 1}})).empty());
  EXPECT_EQ(r.phase, receiver_phase::serving);                      // nothing applied before admission
  EXPECT_TRUE(r.gate_open);
  ASSERT_TRUE(r.early.has_value());
  EXPECT_EQ(r.early->payloads.size(), 1u);
  EXPECT_TRUE(r.step(payload_to(0, pay(0))).size() == 1u);
  auto a = r.step(from_coord(0, prepare_msg{record_of(tau, mode::xor_mask, {{0, 0}, {1, 0}})}));
  EXPECT_FALSE(r.early.has_value());
  ASSERT_GE(a.size(), 4u);
  EXPECT_TRUE(std::holds_alternative<close_gate_action>(a[0]));  // the gate closes BEFORE any apply
  std::vector<payload_id> order;
  for (const auto& x : a)
    if (const auto* ap = std::get_if<apply_payload_action>(&x)) order.push_back(ap->id);
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0].owner, 0u);
  EXPECT_EQ(order[1].owner, 1u);
  EXPECT_EQ(count_of<stage_payload_action>(a), 0u);  // staged once, when they arrived
  EXPECT_EQ(count_of<sync_device_action>(a), 1u);
}

TEST(ReceiverEarly, BufferHoldsOneAttemptAndIsDroppedWhenPassed) {
  receiver r{0, 0, two_by_two()};
  const attempt_id t1{1, 1}, t2{1, 2};
  auto pay = [&](attempt_id t) { return payload_msg{payload_id{t, 0, 0}, 0, 1, mode::overwrite, {5, 5}}; };
  r.step(payload_to(0, pay(t2)));
  EXPECT_TRUE(r.step(payload_to(0, pay(t1))).empty());  // older than the kept attempt: dropped
  EXPECT_EQ(r.early->attempt, t2);
  // A conflicting copy is remembered and fails the attempt once it is admitted.
  auto conflicting = pay(t2);
  conflicting.content = digest128{6, 6};
  EXPECT_TRUE(r.step(payload_to(0, conflicting)).empty());
  EXPECT_TRUE(r.early->conflict);
  // obsolete of t2 drops the buffer and its staged frames; the receiver answers stopped.
  auto o = r.step(from_coord(0, obsolete_msg{t2}));
  EXPECT_FALSE(r.early.has_value());
  ASSERT_GE(o.size(), 1u);
  EXPECT_EQ(std::get<discard_staged_action>(o[0]).attempt, t2);
  EXPECT_EQ(sent<stopped_msg>(o).size(), 1u);
  EXPECT_TRUE(r.step(payload_to(0, pay(t2))).empty());  // t2 is dead here now
  // A prepare that does not name this member drops what was kept for it.
  const attempt_id t3{1, 3};
  r.step(payload_to(0, pay(t3)));
  auto p = r.step(from_coord(0, prepare_msg{record_of(t3, mode::overwrite, {{1, 0}})}));
  EXPECT_FALSE(r.early.has_value());
  EXPECT_EQ(count_of<discard_staged_action>(p), 1u);
}

TEST(ReceiverEarly, ConflictKeptBeforeThePrepareFailsTheAttempt) {
  receiver r{0, 0, two_by_two()};
  const attempt_id tau{1, 1};
  payload_msg m{payload_id{tau, 0, 0}, 0, 1, mode::xor_mask, {1, 1}};
  r.step(payload_to(0, m));
  m.content = digest128{2, 2};
  r.step(payload_to(0, m));
  auto a = r.step(from_coord(0, prepare_msg{record_of(tau, mode::xor_mask, {{0, 0}})}));
  auto f = sent<failed_msg>(a);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].reason, failure_reason::conflicting_payload);
  EXPECT_EQ(count_of<apply_payload_action>(a), 0u);
}

TEST_F(ReceiverTest, XorOnAnotherBaseIsRefused) {
  payload_msg p = payload(0);
  p.base = 5;
  auto f = sent<failed_msg>(r.step(payload_to(0, p)));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].reason, failure_reason::wrong_base);
}

TEST_F(ReceiverTest, OverwritePayloadRidesInAnXorAttemptAndAppliesAsOverwrite) {
  // An encoder may code a whole chunk as overwrite inside an XOR attempt (smaller, or a tensor a
  // receiver places non-bit-preservingly): valid on any base, applied as overwrite.
  payload_msg p = payload(0);
  p.mode = mode::overwrite;
  p.base = 5;  // an overwrite payload does not depend on the base
  auto a = r.step(payload_to(0, p));
  EXPECT_TRUE(sent<failed_msg>(a).empty());
  ASSERT_EQ(count_of<apply_payload_action>(a), 1u);
  for (const auto& x : a)
    if (const auto* ap = std::get_if<apply_payload_action>(&x)) {
      EXPECT_EQ(ap->mode, mode::overwrite);
    }
}

TEST(Receiver, XorPayloadInAnOverwriteAttemptFails) {
  receiver r{0, 0, two_by_two()};
  const attempt_id tau{1, 2};
  r.step(from_coord(0, prepare_msg{record_of(tau, mode::overwrite, {{0, 0}, {1, 0}})}));
  auto f = sent<failed_msg>(r.step(payload_to(0, payload_msg{payload_id{tau, 0, 0}, 0, 1, mode::xor_mask, {1, 2}})));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].reason, failure_reason::wrong_base);
}

TEST(Receiver, TimerWatchesKOutsideARestore) {
  // Admitted: the timer is armed; at every deadline the receiver reads K and re-arms (a lost
  // announcement or obsolete costs one deadline); while restoring it does nothing.
  receiver r{0, 0, two_by_two()};
  auto adm = r.step(from_coord(0, prepare_msg{record_of({1, 1}, mode::xor_mask, {{0, 0}, {1, 0}})}));
  EXPECT_EQ(count_of<arm_deadline_action>(adm), 1u);
  auto d = r.step(deadline_event{});
  EXPECT_EQ(count_of<read_commit_action>(d), 1u);
  EXPECT_EQ(count_of<arm_deadline_action>(d), 1u);
  auto booting = receiver::restarted(0, 1, two_by_two());
  EXPECT_TRUE(booting.step(deadline_event{}).empty());
}

TEST(Owner, DenseRestoreIsServedOnlyWhileEveryBaselineIsK) {
  const commit_record k0{0, baseline_id{0}}, k1{1, baseline_id{7}};
  EXPECT_TRUE(serves_dense_restore(k1, {k1, k1}));
  EXPECT_FALSE(serves_dense_restore(k1, {k1, k0}));  // owner 1 has not advanced yet
  EXPECT_FALSE(serves_dense_restore(k1, {}));
}

TEST_F(ReceiverTest, ObsoleteWaitsForTheDeviceBeforeStopped) {
  r.step(payload_to(0, payload(0)));  // one apply issued, not synced
  auto o = r.step(from_coord(0, obsolete_msg{tau}));
  EXPECT_TRUE(sent<stopped_msg>(o).empty());
  EXPECT_EQ(count_of<sync_device_action>(o), 1u);
  EXPECT_EQ(r.phase, receiver_phase::stopping);
  auto s = r.step(device_synced_event{});
  ASSERT_EQ(sent<stopped_msg>(s).size(), 1u);
  // A payload of the obsolete attempt arriving late is dropped.
  EXPECT_TRUE(r.step(payload_to(0, payload(1))).empty());
  // Obsolete again (duplicate): answered at once, idempotently.
  EXPECT_EQ(sent<stopped_msg>(r.step(from_coord(0, obsolete_msg{tau}))).size(), 1u);
}

TEST(Receiver, MissedCommitMeansDenseRestoreUnderANewIncarnation) {
  receiver r(1, 3, two_by_two());
  auto a = r.step(from_coord(1, announce_msg{commit_record{1, baseline_id{42}}, std::nullopt, false, false}));
  ASSERT_EQ(count_of<persist_incarnation_action>(a), 1u);
  EXPECT_EQ(r.incarnation, 4u);
  EXPECT_EQ(count_of<dense_restore_action>(a), 1u);
  // persist BEFORE anything is sent under the new incarnation
  auto b = r.step(restored_event{commit_record{1, baseline_id{42}}});
  auto j = sent<join_msg>(b);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0].from, (member{1, 4}));
  EXPECT_EQ(j[0].at, (commit_record{1, baseline_id{42}}));
}

TEST(Receiver, AnswersAnAnnouncementThatAsksItToConfirm) {
  // Finding B7: a coordinator that took over holds this incarnation only because the log named it;
  // the receiver says it is alive (a join at its K). Otherwise an announcement naming it is silent.
  receiver r(1, 3, two_by_two());
  EXPECT_TRUE(sent<join_msg>(r.step(from_coord(1, announce_msg{commit_record{}, member{1, 3}, false, false}))).empty());
  const auto j = sent<join_msg>(r.step(from_coord(1, announce_msg{commit_record{}, member{1, 3}, false, true})));
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0].from, (member{1, 3}));
  EXPECT_EQ(j[0].at, commit_record{});
  EXPECT_EQ(r.phase, receiver_phase::serving);
}

TEST(Receiver, ItsJoinsNameTheNewestCoordinatorItKnowsAndOnlyThatOneConfirmsThem) {
  // Finding B7b: a join proves the incarnation alive to the coordinator of the epoch it names.
  const commit_record k{1, baseline_id{42}};
  auto r = receiver::restarted(1, 4, two_by_two());
  r.step(boot_event{});
  r.step(commit_read_event{k, 2});  // the log's epoch: coordinator 1 is fenced
  auto j = sent<join_msg>(r.step(restored_event{k}));
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0].epoch, 2u);
  // A late announcement of fenced coordinator 1 naming this incarnation does not confirm the join.
  r.step(from_coord(1, announce_msg{k, member{1, 4}, false, false, 1}));
  EXPECT_EQ(r.phase, receiver_phase::joining);
  EXPECT_EQ(sent<join_msg>(r.step(deadline_event{})).size(), 1u);  // joins again
  // Coordinator 3 took over and holds it as a guess: confirmed, and it answers under epoch 3.
  j = sent<join_msg>(r.step(from_coord(1, announce_msg{k, member{1, 4}, false, true, 3})));
  EXPECT_EQ(r.phase, receiver_phase::serving);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0].epoch, 3u);
  // Coordinator 4 names a dead incarnation (a late join's): this one joins, under epoch 4.
  j = sent<join_msg>(r.step(from_coord(1, announce_msg{k, member{1, 3}, false, true, 4})));
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0].from, (member{1, 4}));
  EXPECT_EQ(j[0].epoch, 4u);
}

// ----- coordinator ------------------------------------------------------------------------------

struct CoordinatorTest : ::testing::Test {
  coordinator c{two_by_two(), 1, {{0, 0}, {1, 0}}};
  commit_log log{commit_record{}};
  std::vector<coordinator_action> feed_log(const std::vector<coordinator_action>& acts) {
    std::vector<coordinator_action> out;
    for (const auto& a : acts)
      if (const auto* l = std::get_if<log_action>(&a)) {
        auto more = c.step(log_event{log.apply(l->request)});
        out.insert(out.end(), more.begin(), more.end());
        auto deeper = feed_log(more);
        out.insert(out.end(), deeper.begin(), deeper.end());
      }
    return out;
  }
  message_event to_coord(message m, endpoint from = endpoint::receiver_(0)) {
    return message_event{envelope{from, endpoint::coord(), std::move(m)}};
  }
  void admit() {
    feed_log(c.step(start_event{}));
    auto acts = c.step(begin_transition_event{1, true, {}, {}});
    // persist BEFORE send: the only action of begin is the log request
    ASSERT_EQ(acts.size(), 1u);
    ASSERT_TRUE(std::holds_alternative<log_action>(acts[0]));
    auto sends = feed_log(acts);
    EXPECT_EQ(sent<prepare_msg>(sends).size(), 4u);
    c.step(to_coord(manifest_msg{c.attempt->attempt, 0, 1}, endpoint::owner_(0)));
    c.step(to_coord(manifest_msg{c.attempt->attempt, 1, 1}, endpoint::owner_(1)));
  }
  /// Both members ack the first attempt and it commits (the log holds K afterwards): the set-up
  /// of the takeover tests, whose successor rebuilds its roster from that attempt.
  commit_record commit_first_transition() {
    admit();
    const attempt_id tau = c.attempt->attempt;
    c.step(to_coord(ack_msg{tau, member{0, 0}, std::nullopt}));
    feed_log(c.step(to_coord(ack_msg{tau, member{1, 0}, std::nullopt}, endpoint::receiver_(1))));
    const commit_record k{1, baseline_of(tau)};
    EXPECT_EQ(log.state.record, k);
    return k;
  }
};

TEST_F(CoordinatorTest, CommitsOnlyWithEveryMembersAckOfThisIncarnation) {
  admit();
  const attempt_id tau = c.attempt->attempt;
  EXPECT_TRUE(c.step(to_coord(ack_msg{tau, member{0, 0}, std::nullopt})).empty());
  // An ack of another incarnation of r1 counts for nothing.
  EXPECT_TRUE(c.step(to_coord(ack_msg{tau, member{1, 5}, std::nullopt})).empty());
  // Nor does an ack of another attempt.
  EXPECT_TRUE(c.step(to_coord(ack_msg{attempt_id{1, 9}, member{1, 0}, std::nullopt})).empty());
  auto acts = c.step(to_coord(ack_msg{tau, member{1, 0}, std::nullopt}));
  ASSERT_FALSE(acts.empty());
  ASSERT_TRUE(std::holds_alternative<log_action>(acts.back()));  // K durable BEFORE announcing
  EXPECT_TRUE(sent<announce_msg>(acts).empty());
  auto after = feed_log(acts);
  EXPECT_EQ(sent<announce_msg>(after).size(), 4u);
  EXPECT_EQ(log.state.record, (commit_record{1, baseline_of(tau)}));
}

TEST_F(CoordinatorTest, ATakeoverAsksTheRosterItRebuiltFromTheLogToConfirm) {
  // Finding B7: the successor's roster comes from the log's last attempt (r0#0, r1#0), which may
  // name incarnations that are dead; each entry is a guess (it lags, and is announced to with
  // `confirm`) until that receiver answers, and a newer incarnation's answer replaces a dead one.
  const commit_record k = commit_first_transition();
  EXPECT_TRUE(c.roster[0].confirmed && c.roster[1].confirmed);  // given to the first coordinator
  c = coordinator{two_by_two(), 2};
  const auto acts = feed_log(c.step(start_event{}));
  std::vector<announce_msg> to_receivers;
  for (const auto& a : sent<announce_msg>(acts))
    if (a.roster) to_receivers.push_back(a);
  ASSERT_EQ(to_receivers.size(), 2u);
  for (const auto& a : to_receivers) EXPECT_TRUE(a.confirm && !a.evicted && a.roster->incarnation == 0u);
  EXPECT_TRUE(!c.roster[0].confirmed && !c.roster[1].confirmed);
  const auto answer = sent<announce_msg>(c.step(to_coord(join_msg{member{0, 0}, k, 2})));
  ASSERT_EQ(answer.size(), 1u);
  EXPECT_FALSE(answer[0].confirm);  // heard from: nothing more to ask
  EXPECT_EQ(answer[0].epoch, 2u);
  EXPECT_TRUE(c.roster[0].confirmed);
  EXPECT_FALSE(c.roster[1].confirmed);  // r1 has not answered
  c.step(to_coord(join_msg{member{1, 2}, k, 2}, endpoint::receiver_(1)));
  EXPECT_EQ(c.roster[1].incarnation, 2u);
  EXPECT_TRUE(c.roster[1].confirmed);
}

TEST_F(CoordinatorTest, AJoinOfAnOlderEpochIsAGuessUntilItsIncarnationAnswers) {
  // Finding B7b: a join proves its incarnation alive only to the coordinator whose epoch it names.
  // A copy sent under epoch 1 may reach coordinator 2 after that incarnation died, while the live
  // one was answered by coordinator 1 only and never joins again by itself.
  const commit_record k = commit_first_transition();
  c = coordinator{two_by_two(), 2};
  c.step(start_event{});  // claim_epoch in flight
  ASSERT_EQ(c.phase, coordinator_phase::claiming);
  // Not the coordinator yet: K and the roster are unknown, so nothing answers (the receiver joins
  // again at its deadline, or answers the roll call).
  EXPECT_TRUE(c.step(to_coord(join_msg{member{0, 5}, k, 1})).empty());
  EXPECT_EQ(c.roster[0].incarnation, 0u);
  feed_log(std::vector<coordinator_action>{log_action{claim_epoch_request{2}}});
  ASSERT_EQ(c.phase, coordinator_phase::idle);
  const auto answer = sent<announce_msg>(c.step(to_coord(join_msg{member{0, 5}, k, 1})));
  ASSERT_EQ(answer.size(), 1u);
  EXPECT_TRUE(answer[0].confirm);  // a guess: that incarnation must answer this epoch
  EXPECT_EQ(c.roster[0].incarnation, 5u);
  EXPECT_FALSE(c.roster[0].confirmed);
  bool asked_again = false;  // the idle timer keeps asking
  for (const auto& a : sent<announce_msg>(c.step(deadline_event{}))) asked_again |= a.roster == member{0, 5} && a.confirm;
  EXPECT_TRUE(asked_again);
  c.step(to_coord(join_msg{member{0, 5}, k, 2}));  // the answer, sent under epoch 2
  EXPECT_TRUE(c.roster[0].confirmed);
  c.step(to_coord(join_msg{member{0, 5}, k, 1}));  // a late copy of the first changes nothing
  EXPECT_TRUE(c.roster[0].confirmed);
}

TEST_F(CoordinatorTest, MessagesOfAFencedOrReplacedIncarnationCountForNothing) {
  admit();
  const attempt_id tau = c.attempt->attempt;
  c.roster[1].evicted = true;  // r1#0 fenced
  EXPECT_FALSE(c.counts(envelope{endpoint::receiver_(1), endpoint::coord(), ack_msg{tau, member{1, 0}, std::nullopt}}));
  EXPECT_TRUE(c.step(to_coord(failed_msg{tau, member{1, 0}, failure_reason::wrong_base})).empty());
  EXPECT_EQ(c.phase, coordinator_phase::collecting);  // the failure of a fenced incarnation changed nothing
  c.roster[0].incarnation = 3;  // r0 rejoined as #3: #0 is gone
  EXPECT_TRUE(c.step(to_coord(failed_msg{tau, member{0, 0}, failure_reason::wrong_base})).empty());
  EXPECT_EQ(c.phase, coordinator_phase::collecting);
}

TEST_F(CoordinatorTest, AttestationMismatchRetriesInOverwrite) {
  feed_log(c.step(start_event{}));
  feed_log(c.step(begin_transition_event{1, true, {digest128{1, 1}, digest128{1, 2}}, {}}));
  const attempt_id tau = c.attempt->attempt;
  c.step(to_coord(manifest_msg{tau, 0, 1}, endpoint::owner_(0)));
  c.step(to_coord(manifest_msg{tau, 1, 1}, endpoint::owner_(1)));
  auto acts = c.step(to_coord(ack_msg{tau, member{0, 0}, digest128{0xbad, 1}}));
  EXPECT_EQ(sent<obsolete_msg>(acts).size(), 4u);  // 2 owners + 2 members
  c.step(to_coord(stopped_msg{tau, member{0, 0}}));
  auto retry = c.step(to_coord(stopped_msg{tau, member{1, 0}}, endpoint::receiver_(1)));
  EXPECT_EQ(count_of<cleanup_action>(retry), 1u);
  auto sends = feed_log(retry);
  auto prep = sent<prepare_msg>(sends);
  ASSERT_FALSE(prep.empty());
  EXPECT_EQ(prep[0].record.mode, mode::overwrite);
  EXPECT_GT(prep[0].record.attempt, tau);
}

TEST_F(CoordinatorTest, FencedByANewerEpochIsDeposed) {
  admit();
  log.apply(claim_epoch_request{2});  // a newer coordinator took over
  const attempt_id tau = c.attempt->attempt;
  c.step(to_coord(ack_msg{tau, member{0, 0}, std::nullopt}));
  auto acts = c.step(to_coord(ack_msg{tau, member{1, 0}, std::nullopt}));
  auto after = feed_log(acts);
  EXPECT_EQ(count_of<deposed_action>(after), 1u);
  EXPECT_EQ(c.phase, coordinator_phase::deposed);
  EXPECT_EQ(log.state.record, commit_record{});  // nothing changed
}

// ----- owner ------------------------------------------------------------------------------------

TEST(Owner, FreezesOnceAdvancesOnlyOnTheCommitRecord) {
  owner o(0, commit_record{});
  auto p1 = record_of({1, 1}, mode::xor_mask, {{0, 0}});
  auto a = o.step(message_event{envelope{endpoint::coord(), endpoint::owner_(0), prepare_msg{p1}}});
  EXPECT_EQ(count_of<freeze_change_set_action>(a), 1u);
  EXPECT_EQ(count_of<encode_action>(a), 1u);
  auto p2 = record_of({1, 2}, mode::overwrite, {{0, 0}});
  auto b = o.step(message_event{envelope{endpoint::coord(), endpoint::owner_(0), prepare_msg{p2}}});
  EXPECT_EQ(count_of<freeze_change_set_action>(b), 0u);  // same transition: frozen set kept
  EXPECT_EQ(o.baseline, commit_record{});
  o.step(encode_finished_event{{1, 2}, 1});
  EXPECT_EQ(o.baseline, commit_record{});  // B^v unchanged until commit
  const commit_record k{1, baseline_of({1, 2})};
  auto c = o.step(message_event{envelope{endpoint::coord(), endpoint::owner_(0), announce_msg{k, std::nullopt, false, false}}});
  EXPECT_EQ(count_of<advance_baseline_action>(c), 1u);
  EXPECT_EQ(o.baseline, k);
  auto d = o.step(message_event{envelope{endpoint::coord(), endpoint::owner_(0), announce_msg{k, std::nullopt, false, false}}});
  EXPECT_EQ(count_of<advance_baseline_action>(d), 0u);  // idempotent
}

// ----- commit log laws ----------------------------------------------------------------------------

TEST(CommitLog, CompareAndSetLaws) {
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = std::max(params.maxSuccess, 1000);
  rc::detail::TestMetadata md;
  md.id = md.description = "commit log: K changes only by CAS from the previous K in the current epoch";
  const auto result = rc::detail::checkTestable([] {
    commit_log log(commit_record{});
    const auto n = *rc::gen::inRange(1, 60);
    for (int i = 0; i < n; ++i) {
      const auto kind = *rc::gen::inRange(0, 3);
      const std::uint64_t e = *rc::gen::inRange<std::uint64_t>(0, 4);
      const log_snapshot before = log.state;
      log_reply r;
      if (kind == 0) {
        r = log.apply(claim_epoch_request{e});
        RC_ASSERT((r.outcome == log_outcome::ok) == (e > before.epoch));
      } else if (kind == 1) {
        r = log.apply(persist_prepare_request{e, prepare_record{}});
        RC_ASSERT((r.outcome == log_outcome::ok) == (e == before.epoch));
      } else {
        const bool right = *rc::gen::arbitrary<bool>();
        commit_record expected = right ? before.record : commit_record{before.record.version + 7, {}};
        commit_record desired{before.record.version + 1, baseline_id{*rc::gen::inRange<std::uint64_t>(1, 99)}};
        r = log.apply(compare_and_set_request{e, {}, expected, desired});
        const bool should = e == before.epoch && right;
        RC_ASSERT((r.outcome == log_outcome::ok) == should);
        if (!should) RC_ASSERT(log.state.record == before.record);
        else RC_ASSERT(log.state.record == desired);
      }
      RC_ASSERT(log.state.epoch >= before.epoch);
      RC_ASSERT(r.snapshot == log.state);
    }
  }, md, params);
  rc::detail::printResultMessage(result, std::cerr);
  std::cerr << "\n";
  EXPECT_TRUE(result.template is<rc::detail::SuccessResult>());
}

TEST(CommitLog, BlindWriteMutationIgnoresFenceAndExpectation) {
  basic_commit_log<runtime_mutation> log(commit_record{}, runtime_mutation{protocol_mutation::blind_write_commit});
  log.apply(claim_epoch_request{3});
  auto r = log.apply(compare_and_set_request{1, {}, commit_record{9, {}}, commit_record{5, {}}});
  EXPECT_EQ(r.outcome, log_outcome::ok);
  EXPECT_EQ(log.state.record.version, 5u);  // the broken variant writes anyway
}

}  // namespace
