// The distributed durability models against real servers (label dist): the commit log on etcd
// (started here on a free loopback port with its own data directory) and the baseline store on S3
// (moto). Both pass the very checks the filesystem models pass (durability_laws.hpp); then what
// only a networked store can do wrong: etcd killed and restarted, or hung, while a compare-and-set
// is in flight (outcome unknown, resolved by a read, never committed twice), writers racing from
// separate handles, an unreachable cluster (failed, nothing written), damaged or abandoned objects
// in the bucket (named loss, cleaned by retain_only).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "../fixtures/fault_proxy.hpp"
#include "../fixtures/servers.hpp"
#include "bitrefit/durability/etcd_commit_log.hpp"
#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/durability/s3_baseline_store.hpp"
#include "durability_laws.hpp"

using namespace bitrefit;
using namespace bitrefit::durability;
using namespace bitrefit::durability::laws;
using bitrefit::testing::fault_proxy;

namespace {

class Etcd : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = etcd_.start(::testing::UnitTest::GetInstance()->current_test_info()->name());
    if (!why.empty()) GTEST_SKIP() << why;
  }
  etcd_commit_log log(const std::string& endpoint = {}, std::chrono::milliseconds timeout = std::chrono::milliseconds(3000)) {
    return etcd_commit_log({.etcd = {.endpoints = {endpoint.empty() ? etcd_.endpoint() : endpoint}, .timeout = timeout,
                                     .connect_timeout = std::chrono::milliseconds(500)},
                            .prefix = "/test"});
  }
  bitrefit::testing::etcd_server etcd_;
};

}  // namespace

TEST_F(Etcd, BehavesLikeThePureLogAcrossHandles) {
  check_log_laws(log(), log());
  // a fresh process reads the last successful state, from the documented key layout
  auto restarted = log();
  EXPECT_EQ(snapshot_of(restarted).record.version, 2u);
  EXPECT_TRUE(snapshot_of(restarted).prepared.has_value());
  etcd_kv kv({.endpoints = {etcd_.endpoint()}});
  const auto raw = kv.range("/test/commit");
  ASSERT_TRUE(raw.ok && raw.kv);
  const auto x = nlohmann::json::parse(raw.kv->data);
  EXPECT_EQ(x.at("version"), 2u);
  EXPECT_EQ(x.at("epoch"), 2u);
  EXPECT_EQ(x.at("generation"), baseline_of({2, 1}).value);
}

TEST_F(Etcd, SurvivesARestartOfTheMember) {
  auto l = log();
  ASSERT_EQ(l.apply(claim_epoch_request{1}).outcome, log_outcome::ok);
  ASSERT_EQ(l.apply(compare_and_set_request{1, {1, 1}, {}, {1, baseline_id{9}}}).outcome, log_outcome::ok);
  etcd_.kill();  // SIGKILL: what etcd acknowledged is in its WAL
  EXPECT_EQ(l.apply(read_request{}).outcome, log_outcome::failed);  // nobody answers: failed, not a guess
  ASSERT_EQ(etcd_.restart(), "");
  EXPECT_EQ(snapshot_of(l).record, (commit_record{1, baseline_id{9}}));
}

TEST_F(Etcd, ConcurrentWritersFromSeparateHandlesCommitOnce) {
  ASSERT_EQ(log().apply(claim_epoch_request{1}).outcome, log_outcome::ok);
  std::atomic<int> ok{0}, conflict{0}, other{0};
  std::vector<std::thread> writers;
  for (std::uint64_t i = 0; i < 8; ++i)
    writers.emplace_back([&, i] {
      auto mine = log();
      const auto o = mine.apply(compare_and_set_request{1, {1, 1 + i}, commit_record{}, {1, baseline_id{100 + i}}}).outcome;
      (o == log_outcome::ok ? ok : o == log_outcome::conflict ? conflict : other)++;
    });
  for (auto& t : writers) t.join();
  EXPECT_EQ(ok.load(), 1);
  EXPECT_EQ(conflict.load(), 7);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(snapshot_of(*std::make_unique<etcd_commit_log>(log())).record.version, 1u);
}

TEST_F(Etcd, AnUnreachableClusterIsAFailedOutcome) {
  auto dead = log("http://127.0.0.1:" + std::to_string(bitrefit::testing::free_port()));
  for (const log_request& q : {log_request{claim_epoch_request{1}}, log_request{read_request{}},
                               log_request{compare_and_set_request{1, {1, 1}, {}, {1, baseline_id{1}}}}}) {
    const auto r = dead.apply(q);
    EXPECT_EQ(r.outcome, log_outcome::failed);
    EXPECT_NE(dead.last_failure().find("not sent"), std::string::npos) << dead.last_failure();
  }
  EXPECT_EQ(snapshot_of(*std::make_unique<etcd_commit_log>(log())), log_snapshot{});  // nothing written
}

TEST_F(Etcd, KilledAndRestartedDuringCompareAndSetIsUnknownAndAReadResolvesIt) {
  // The compare-and-set reaches etcd, which applies it (and makes it durable) — then etcd is
  // killed before its answer leaves, and restarted. The coordinator cannot know: "unknown". A read
  // (read_commit) finds the record committed; the retry a confused coordinator might send is a
  // conflict: it never commits twice.
  fault_proxy proxy(etcd_.port());
  auto l = log(proxy.endpoint());
  ASSERT_EQ(l.apply(claim_epoch_request{1}).outcome, log_outcome::ok);
  const commit_record k0{}, k1{1, baseline_of({1, 1})};
  proxy.on_lost_answer([&] {
    etcd_.kill();
    ASSERT_EQ(etcd_.restart(), "");
  });
  std::atomic<int> txns{0};
  proxy.set_rule([&](const fault_proxy::request_info& r) {
    if (r.target != "/v3/kv/txn") return fault_proxy::action::forward;
    ++txns;
    return fault_proxy::action::lose_answer;
  });
  EXPECT_EQ(l.apply(compare_and_set_request{1, {1, 1}, k0, k1}).outcome, log_outcome::unknown);
  EXPECT_EQ(txns.load(), 1) << "a txn is never sent twice (curl resends on a reused connection that died)";
  proxy.set_rule({});
  const auto r = l.apply(read_request{});
  ASSERT_EQ(r.outcome, log_outcome::ok) << l.last_failure();
  EXPECT_EQ(r.snapshot.record, k1) << "applied before the crash, so durable after it";
  EXPECT_EQ(l.apply(compare_and_set_request{1, {1, 1}, k0, k1}).outcome, log_outcome::conflict);
  EXPECT_EQ(snapshot_of(l).record.version, 1u);

  // The same crash BEFORE the request reaches etcd: unknown again, and the read says it did not
  // happen, so the retry (a new attempt) commits — once.
  const commit_record k2{2, baseline_of({1, 2})};
  proxy.set_rule([](const fault_proxy::request_info& r) {
    return r.target == "/v3/kv/txn" ? fault_proxy::action::cut_before : fault_proxy::action::forward;
  });
  EXPECT_EQ(l.apply(compare_and_set_request{1, {1, 2}, k1, k2}).outcome, log_outcome::unknown);
  proxy.set_rule({});
  EXPECT_EQ(snapshot_of(l).record, k1) << "never reached etcd";
  const commit_record k2b{2, baseline_of({1, 3})};
  EXPECT_EQ(l.apply(compare_and_set_request{1, {1, 3}, k1, k2b}).outcome, log_outcome::ok);
  EXPECT_EQ(snapshot_of(l).record, k2b);
}

TEST_F(Etcd, AHungMemberIsUnknownAndTheReadThatResolvesItIsFinal) {
  // claim_epoch is a txn too. The member hangs (SIGSTOP) right when the claim reaches it: no answer
  // before the deadline, so "unknown". The member resumes later and may still apply the queued
  // claim — after the coordinator's read said "not applied" that would be a second truth. The
  // handle's barrier makes the resolving read final: what it shows stays.
  fault_proxy proxy(etcd_.port());
  auto via = log(proxy.endpoint(), std::chrono::milliseconds(1000));
  ASSERT_EQ(via.apply(claim_epoch_request{1}).outcome, log_outcome::ok);
  std::atomic<bool> hang{true};
  proxy.set_rule([&](const fault_proxy::request_info& q) {
    if (q.target == "/v3/kv/txn" && hang.exchange(false)) etcd_.pause();
    return fault_proxy::action::forward;
  });
  EXPECT_EQ(via.apply(claim_epoch_request{2}).outcome, log_outcome::unknown);
  EXPECT_TRUE(via.unresolved());
  EXPECT_EQ(via.apply(read_request{}).outcome, log_outcome::failed) << "still hung: nothing can be resolved yet";
  etcd_.resume();
  auto resolved = via.apply(read_request{});
  for (int i = 0; i < 10 && resolved.outcome == log_outcome::failed; ++i) resolved = via.apply(read_request{});  // etcd catching up: read again
  ASSERT_EQ(resolved.outcome, log_outcome::ok);
  EXPECT_FALSE(via.unresolved());
  EXPECT_TRUE(resolved.snapshot.epoch == 1 || resolved.snapshot.epoch == 2) << resolved.snapshot.epoch;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // time for a late claim to land, if it could
  EXPECT_EQ(snapshot_of(*std::make_unique<etcd_commit_log>(log())), resolved.snapshot);
  // and the protocol goes on from the resolved state
  const std::uint64_t e = resolved.snapshot.epoch;
  EXPECT_EQ(via.apply(claim_epoch_request{2}).outcome, e == 2 ? log_outcome::fenced : log_outcome::ok);
}

TEST_F(Etcd, ACompareAndSetDeliveredAfterItsResolvingReadChangesNothing) {
  // The network delivers the compare-and-set only after the coordinator timed out ("unknown"),
  // read K ("still the base": the attempt failed) and moved on. Without the barrier the late
  // request would commit then — a second truth after the one the coordinator acted on.
  fault_proxy proxy(etcd_.port());
  auto via = log(proxy.endpoint(), std::chrono::milliseconds(1000));
  ASSERT_EQ(via.apply(claim_epoch_request{1}).outcome, log_outcome::ok);
  const commit_record k0{}, k1{1, baseline_of({1, 1})};
  proxy.set_rule([](const fault_proxy::request_info& q) {
    return q.target == "/v3/kv/txn" ? fault_proxy::action::hold : fault_proxy::action::forward;
  });
  EXPECT_EQ(via.apply(compare_and_set_request{1, {1, 1}, k0, k1}).outcome, log_outcome::unknown);
  proxy.set_rule({});
  const auto resolved = via.apply(read_request{});  // read_commit
  ASSERT_EQ(resolved.outcome, log_outcome::ok);
  EXPECT_EQ(resolved.snapshot.record, k0) << "held by the network: not applied";
  EXPECT_EQ(proxy.release_held(), 1u);  // the late delivery
  EXPECT_EQ(snapshot_of(via).record, k0) << "the read was final: the late compare-and-set did not commit";
}

// ---- the baseline store on S3 ---------------------------------------------------------------------

namespace {

class S3Baselines : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    server_ = bitrefit::testing::moto_server::get(why);
    if (!server_) GTEST_SKIP() << why;
  }
  transport::s3_store bucket(std::size_t part_size = 8 << 20) {
    static std::atomic<int> n{0};
    transport::s3_options o;
    o.endpoint = server_->endpoint();
    o.bucket = "bitrefit-baselines-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    o.credentials = transport::s3_credentials{"testing", "testing", ""};
    o.region = "us-east-1";
    o.part_size = part_size;
    o.list_page = 3;  // listings span pages
    transport::s3_store s(o);
    s.create_bucket();
    return s;
  }
  bitrefit::testing::moto_server* server_ = nullptr;
};

}  // namespace

TEST_F(S3Baselines, LawsAndChainsAsTheFilesystemStore) {
  auto b = bucket();
  check_baseline_laws(s3_baseline_store(b, {.key_prefix = "owner-0", .max_chain = 16}),
                      s3_baseline_store(b, {.key_prefix = "owner-0", .max_chain = 16}));
  for (std::uint32_t max_chain : {1u, 3u}) {
    const std::string prefix = "chain-" + std::to_string(max_chain) + "/";
    check_change_set_chain(s3_baseline_store(b, {.key_prefix = prefix, .max_chain = max_chain}),
                           s3_baseline_store(b, {.key_prefix = prefix, .max_chain = max_chain}), 7);
    // one full image (the last fold's) and a chain shorter than the bound
    std::size_t fulls = 0, deltas = 0;
    for (const auto& k : b.list(prefix)) (k.find("/full-v") != std::string::npos ? fulls : deltas)++;
    EXPECT_EQ(fulls, 1u) << max_chain;
    EXPECT_LT(deltas, max_chain) << max_chain;
  }
  // owners do not see each other's images
  EXPECT_FALSE(s3_baseline_store(b, {.key_prefix = "owner-1", .max_chain = 16}).load(11));
}

TEST_F(S3Baselines, LoadChangesIsTheStoredChangeSet) {
  auto b = bucket();
  check_load_changes(s3_baseline_store(b, {.key_prefix = "changes", .max_chain = 16}), s3_baseline_store(b, {.key_prefix = "changes", .max_chain = 16}));
}

TEST_F(S3Baselines, SameBytesAsTheFilesystemStore) {
  // One format: an image saved to S3 is byte for byte the file the filesystem store writes.
  auto b = bucket();
  image_model m;
  const auto a = m.initial(), next = m.step(a);
  const auto cs = diff_images(a, next, [&](const std::string& n) { return m.width(n); });
  s3_baseline_store s3(b, {.key_prefix = "o", .max_chain = 16});
  const auto dir = bitrefit::testing::temp_dir("fs-twin");
  filesystem_baseline_store local(dir);
  s3.save(0, a);
  s3.save_changes(0, 1, cs);
  local.save(0, a);
  local.save_changes(0, 1, cs);
  EXPECT_EQ(*b.get("o/full-v0.bin"), *io::read_whole_file(local.full_path(0)));
  EXPECT_EQ(*b.get("o/delta-v1.bin"), *io::read_whole_file(local.delta_path(1)));
  std::filesystem::remove_all(dir);
}

TEST_F(S3Baselines, LargeImagesStreamInPartsAndDamageReadsAsNamedLoss) {
  auto b = bucket(5 << 20);
  s3_baseline_store s(b, {.key_prefix = "big", .max_chain = 16});
  baseline_image img;
  std::mt19937_64 rng(3);
  for (int t = 0; t < 3; ++t) {
    auto& bytes = img["t" + std::to_string(t)];
    bytes.resize((4 << 20) + 1000 * t);
    for (auto& x : bytes) x = static_cast<std::byte>(rng());
  }
  const auto before = b.counters();
  s.save(5, img);
  EXPECT_GE((b.counters() - before).multipart, 4u) << "12 MiB in 5 MiB parts: create, 3 parts, complete";
  EXPECT_TRUE(same_bits(s.load(5), img));
  // a flipped byte in the object: refused by its digest, named by its URL
  auto obj = *b.get("big/full-v5.bin");
  obj[obj.size() / 3] ^= std::byte{4};
  b.put("big/full-v5.bin", obj);
  EXPECT_FALSE(s.load(5));
  ASSERT_TRUE(s.last_error());
  EXPECT_EQ(s.last_error()->code(), errc::integrity);
  EXPECT_EQ(s.last_error()->where().file, "s3://" + b.client().options().bucket + "/big/full-v5.bin");
  // a torn object (a server that lost the tail): the same
  obj.resize(obj.size() / 2);
  b.put("big/full-v5.bin", obj);
  EXPECT_FALSE(s.load(5));
  EXPECT_EQ(s.last_error()->code(), errc::integrity);
}

TEST_F(S3Baselines, AnUploadAbandonedByACrashIsInvisibleAndCleanedByRetainOnly) {
  auto b = bucket(5 << 20);
  image_model m;
  const auto a = m.initial();
  s3_baseline_store s(b, {.key_prefix = "owner-0", .max_chain = 16});
  s.save(3, a);
  // the owner crashed while streaming the image of version 4: an upload with one part, never completed
  auto& c = b.client();
  const auto r = c.call(transport::s3_call::make("CreateMultipartUpload", "POST", "owner-0/full-v4.bin").param("uploads", ""));
  const std::string id = transport::s3_detail::parse_xml(r, "x").child("InitiateMultipartUploadResult").child_value("UploadId");
  const std::vector<std::byte> part(5 << 20, std::byte{1});
  c.call(transport::s3_call::make("UploadPart", "PUT", "owner-0/full-v4.bin").param("partNumber", "1").param("uploadId", id).with_body(part));
  s3_baseline_store restarted(b, {.key_prefix = "owner-0", .max_chain = 16});
  EXPECT_FALSE(restarted.load(4));
  EXPECT_TRUE(same_bits(restarted.load(3), a));
  ASSERT_EQ(b.incomplete_uploads("owner-0/").size(), 1u);
  restarted.retain_only(3);
  EXPECT_TRUE(b.incomplete_uploads("owner-0/").empty());
  EXPECT_EQ(b.list("owner-0/"), std::vector<std::string>{"owner-0/full-v3.bin"});
}

TEST_F(S3Baselines, SaveChangesWithoutABaseChangesNothing) {
  auto b = bucket();
  s3_baseline_store s(b, {.key_prefix = "o", .max_chain = 16});
  EXPECT_THROW(s.save_changes(5, 6, {}), error);
  EXPECT_TRUE(b.list("o/").empty());
}
