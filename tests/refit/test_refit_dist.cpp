// End-to-end refits over the distributed stores (label dist): payload frames and control messages
// on S3 (moto on loopback), the commit log on etcd, the owners' baselines in the bucket. A sender
// (coordinator + 2 owners) and 3 receiver threads, each with handles of its own (no state shared in
// memory: every byte goes through the servers). After every commit each receiver is compared with
// the trainer's truth bit for bit and by attestation digest.
//   - happy path, bit-exact, with the S3 requests each refit costs;
//   - S3 answering 503 SlowDown / 500 and dropping connections mid-upload: still commits, bit-exact;
//   - etcd killed and restarted while the compare-and-set is in flight: unknown -> read_commit
//     resolves it; committed exactly once (and a compare-and-set lost before etcd saw it retries);
//   - two coordinators racing for the epoch: exactly one commits, the other is fenced, changes nothing;
//   - the trainer restarted with an empty local disk recovers from S3 + etcd alone.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "../fixtures/fault_proxy.hpp"
#include "../fixtures/servers.hpp"
#include "bitrefit/durability/etcd_commit_log.hpp"
#include "bitrefit/durability/s3_baseline_store.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/transport/s3_store.hpp"
#include "truth_model.hpp"

using namespace bitrefit;
using namespace std::chrono_literals;
using bitrefit::testing::fault_proxy;
using bitrefit::testing::truth_model;

namespace {

using net_t = transport::s3_transport;
using log_t = durability::etcd_commit_log;
using store_t = durability::s3_baseline_store;
using sender_t = refit::sender<net_t, log_t, store_t>;
using receiver_t = refit::receiver<layout::canonical_store, net_t, log_t>;

/// The servers of one test: moto (shared by the binary) and an etcd of its own, each optionally
/// behind a fault proxy.
struct servers {
  bitrefit::testing::moto_server* moto = nullptr;
  bitrefit::testing::etcd_server etcd;
  std::string skip;  // why the test cannot run here

  servers() {
    moto = bitrefit::testing::moto_server::get(skip);
    if (!moto) return;
    skip = etcd.start("refit");
  }
};

struct rx_slot {
  std::thread thread;
  std::mutex mu;
  std::unique_ptr<layout::canonical_store> store;
  std::atomic<std::uint64_t> at{~0ull};  // the version its parameters hold (published at each commit)
  std::atomic<std::uint64_t> requests{0};
};

struct dist_cluster {
  static constexpr std::uint32_t receivers = 3, owners = 2;
  truth_model truth;
  transport::s3_options s3;     // the sender's view of the bucket (possibly through a proxy)
  transport::s3_options s3_rx;  // the receivers' view (direct)
  log_t::options log_opt;       // the sender's view of etcd (possibly through a proxy)
  log_t::options log_rx;
  refit::sender_options sopt;
  std::vector<std::unique_ptr<rx_slot>> rx;
  std::unique_ptr<sender_t> tx;
  std::atomic<bool> stop{false};

  dist_cluster(servers& env, const std::string& s3_endpoint = {}, const std::string& etcd_endpoint = {}) {
    static std::atomic<int> n{0};
    s3.endpoint = env.moto->endpoint();
    s3.bucket = "bitrefit-refit-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    s3.region = "us-east-1";
    s3.credentials = transport::s3_credentials{"testing", "testing", ""};
    s3.retry.base_delay = 5ms;
    s3.retry.max_delay = 100ms;
    transport::s3_store(s3).create_bucket();
    s3_rx = s3;
    if (!s3_endpoint.empty()) s3.endpoint = s3_endpoint;
    log_rx = {.etcd = {.endpoints = {env.etcd.endpoint()}, .timeout = 2000ms, .connect_timeout = 500ms}, .prefix = "/" + s3.bucket};
    log_opt = log_rx;
    if (!etcd_endpoint.empty()) log_opt.etcd.endpoints = {etcd_endpoint};
    sopt.owners = owners;
    sopt.receivers = receivers;
    sopt.threads = 2;
    sopt.max_frame_input_bytes = 4096;  // ~10 frames per refit
    sopt.deadline = 4s;
    sopt.poll = 2ms;
    sopt.transition_timeout = 90s;
  }
  ~dist_cluster() {
    stop = true;
    for (auto& s : rx)
      if (s->thread.joinable()) s->thread.join();
  }

  /// A trainer process: every handle fresh (a new process on any host has nothing else).
  std::unique_ptr<sender_t> make_sender(const std::string& baseline_root = "baseline/") {
    const transport::s3_store bucket(s3);  // one client (and one set of counters) for frames and baselines
    std::vector<store_t> stores;
    for (std::uint32_t i = 0; i < owners; ++i)
      stores.emplace_back(bucket, store_t::options{.key_prefix = baseline_root + "owner-" + std::to_string(i), .max_chain = 3});
    return std::make_unique<sender_t>(truth.m, net_t{bucket}, log_t(log_opt), std::move(stores), sopt);
  }

  /// The first deployment: the sender takes the trainer's copy of version 0; receivers join.
  void deploy() {
    tx = make_sender();
    tx->start(truth.source());
    // every slot exists before any receiver thread reads rx (a push_back may move its elements)
    for (std::uint32_t r = 0; r < receivers; ++r) rx.push_back(std::make_unique<rx_slot>());
    for (std::uint32_t r = 0; r < receivers; ++r) rx[r]->thread = std::thread([this, r] { run_receiver(r); });
    ASSERT_TRUE(tx->wait_for_members(60s));
    expect_all_bit_exact(0);
  }

  void run_receiver(std::uint32_t r) {
    auto& slot = *rx[r];
    {
      std::lock_guard lock(slot.mu);
      slot.store = std::make_unique<layout::canonical_store>(truth.m);
    }
    refit::receiver_options o;
    o.index = r;
    o.incarnation = 1;
    o.poll = 5ms;
    o.deadline = 2s;
    o.persist_incarnation = [](std::uint64_t) {};
    o.on_commit = [&slot](const protocol::commit_record& k) { slot.at.store(k.version, std::memory_order_release); };
    try {
      net_t net{transport::s3_store(s3_rx)};
      receiver_t rcv(*slot.store, net, log_t(log_rx), o);
      rcv.start();
      while (!stop) {
        std::lock_guard lock(slot.mu);
        rcv.step(5ms);
        slot.requests = rcv.transport().store().counters().requests;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "receiver " << r << " failed: " << e.what();
    }
  }

  refit::transition_stats refit_once() {
    truth.step();
    return tx->refit(truth.source());
  }

  std::uint64_t receiver_requests() const {
    std::uint64_t n = 0;
    for (auto& s : rx) n += s->requests;
    return n;
  }

  /// Waits (pumping the sender, which serves restores) until every receiver holds v, then compares
  /// every byte and the attestation digest with the truth, and K in etcd.
  void expect_all_bit_exact(version_t v) {
    const auto until = std::chrono::steady_clock::now() + 60s;
    auto all_at = [&] {
      for (auto& s : rx)
        if (s->at.load(std::memory_order_acquire) != v) return false;
      return true;
    };
    while (!all_at() && std::chrono::steady_clock::now() < until) {
      if (tx) tx->pump(10ms);
      else std::this_thread::sleep_for(10ms);
    }
    ASSERT_TRUE(all_at()) << "not every receiver reached v" << v;
    for (std::uint32_t r = 0; r < rx.size(); ++r) {
      std::lock_guard lock(rx[r]->mu);
      truth.expect_held_by(*rx[r]->store, "receiver " + std::to_string(r) + " at v" + std::to_string(v));
    }
    log_t log(log_rx);
    EXPECT_EQ(durability::read_log(log).snapshot.record.version, v);
  }
};

class RefitDist : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = std::make_unique<servers>();
    if (!env_->skip.empty()) GTEST_SKIP() << env_->skip;
  }
  std::unique_ptr<servers> env_;
};

/// Whether an etcd txn body writes a commit log whose K has this version (the compare-and-set).
bool writes_version(const std::string& txn_body, version_t v) {
  try {
    const auto q = nlohmann::json::parse(txn_body);
    const auto value = transport::http::base64_decode(q.at("success").at(0).at("request_put").at("value").get<std::string>());
    return nlohmann::json::parse(value).at("version") == v;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

TEST_F(RefitDist, ThreeReceiversOverS3AndEtcdEveryCommitBitExact) {
  dist_cluster c(*env_);
  c.deploy();
  for (version_t v = 1; v <= 3; ++v) {
    const auto s0 = c.tx->transport().store().counters();  // frames, control messages and baselines
    const auto r0 = c.receiver_requests();
    const auto st = c.refit_once();
    const auto sent = c.tx->transport().store().counters() - s0;
    EXPECT_TRUE(st.committed);
    EXPECT_EQ(st.version, v);
    EXPECT_EQ(st.attempts, 1u);
    EXPECT_GT(st.frames, 0u);
    c.expect_all_bit_exact(v);
    // what a refit costs in S3 requests (the closing note's "requests per refit")
    std::printf("[ refit v%llu ] frames %llu, payload %llu B, commit %.1f ms; sender S3 requests %llu (put %llu, get %llu, list %llu, "
                "delete %llu), receivers %llu\n",
                (unsigned long long)v, (unsigned long long)st.frames, (unsigned long long)st.payload_bytes, st.phases.commit_s * 1e3,
                (unsigned long long)sent.requests, (unsigned long long)sent.put, (unsigned long long)sent.get, (unsigned long long)sent.list,
                (unsigned long long)sent.remove, (unsigned long long)(c.receiver_requests() - r0));
    EXPECT_GE(sent.put, st.frames) << "every frame went up as an object";
  }
  EXPECT_EQ(c.tx->retries_total(), 0u);
}

TEST_F(RefitDist, S3ThrottlingErrorsAndDroppedUploadsStillCommitBitExact) {
  fault_proxy proxy(env_->moto->port());
  std::atomic<int> payload_faults{0};
  proxy.set_rule([&](const fault_proxy::request_info& r) {
    const bool payload = r.method == "PUT" && r.target.find("/payloads/") != std::string::npos;
    fault_proxy::action a = fault_proxy::action::forward;
    if (r.index % 11 == 4) a = fault_proxy::action::slow_down;
    else if (r.index % 13 == 6) a = fault_proxy::action::server_error;
    else if (payload && r.index % 5 == 2) a = fault_proxy::action::drop_mid_body;
    if (payload && a != fault_proxy::action::forward) ++payload_faults;
    return a;
  });
  dist_cluster c(*env_, proxy.endpoint());
  c.deploy();
  for (version_t v = 1; v <= 2; ++v) {
    const auto st = c.refit_once();
    EXPECT_TRUE(st.committed);
    c.expect_all_bit_exact(v);
  }
  EXPECT_GT(payload_faults.load(), 2) << "faults must land on payload uploads";
  EXPECT_GE(c.tx->transport().store().counters().retries, proxy.faults());
}

TEST_F(RefitDist, EtcdKilledAndRestartedDuringCompareAndSetCommitsExactlyOnce) {
  fault_proxy proxy(env_->etcd.port());
  dist_cluster c(*env_, {}, proxy.endpoint());
  c.deploy();
  proxy.on_lost_answer([&] {
    env_->etcd.kill();
    ASSERT_EQ(env_->etcd.restart(), "");
  });
  // The compare-and-set to v1 reaches etcd and is applied; etcd dies before answering and comes
  // back. The coordinator sees "unknown", read_commit finds K = v1: committed, in one attempt.
  std::atomic<int> hit{0};
  proxy.set_rule([&](const fault_proxy::request_info& r) {
    return r.target == "/v3/kv/txn" && writes_version(r.body, 1) && hit++ == 0 ? fault_proxy::action::lose_answer
                                                                                : fault_proxy::action::forward;
  });
  auto st = c.refit_once();
  EXPECT_EQ(hit.load(), 1);
  EXPECT_TRUE(st.committed);
  EXPECT_EQ(st.attempts, 1u) << "the unknown outcome was resolved by reading K, not by retrying";
  c.expect_all_bit_exact(1);
  // The compare-and-set to v2 is lost BEFORE etcd sees it (etcd restarts meanwhile): unknown,
  // read_commit finds the base, the attempt is retried and commits once.
  hit = 0;
  proxy.set_rule([&](const fault_proxy::request_info& r) {
    return r.target == "/v3/kv/txn" && writes_version(r.body, 2) && hit++ == 0 ? fault_proxy::action::cut_before
                                                                                : fault_proxy::action::forward;
  });
  st = c.refit_once();
  EXPECT_EQ(hit.load(), 2) << "one compare-and-set lost, one more by the retry";
  EXPECT_TRUE(st.committed);
  EXPECT_EQ(st.attempts, 2u);
  c.expect_all_bit_exact(2);
  log_t log(c.log_rx);
  EXPECT_EQ(durability::read_log(log).snapshot.record.version, 2u) << "K rose by exactly one per transition";
}

TEST_F(RefitDist, TwoCoordinatorsRaceForTheEpochOneCommitsTheOtherIsFencedAndChangesNothing) {
  dist_cluster c(*env_);
  c.deploy();
  c.refit_once();
  c.expect_all_bit_exact(1);
  c.tx.reset();  // the trainer process is gone; two successors race to take over
  c.truth.step();
  std::unique_ptr<sender_t> a = c.make_sender(), b = c.make_sender();
  struct outcome {
    bool committed = false, fenced = false;
    std::string other;
  } oa, ob;
  auto race = [&](sender_t& s, outcome& o) {
    try {
      s.start();
      s.wait_for_members(3s);
      o.committed = s.refit(c.truth.source()).committed;
    } catch (const error& e) {
      if (e.code() == errc::fenced) o.fenced = true;
      else o.other = e.what();
    }
  };
  std::thread ta([&] { race(*a, oa); }), tb([&] { race(*b, ob); });
  ta.join();
  tb.join();
  EXPECT_TRUE(oa.other.empty()) << oa.other;
  EXPECT_TRUE(ob.other.empty()) << ob.other;
  ASSERT_NE(oa.committed, ob.committed) << "exactly one commits";
  EXPECT_NE(oa.fenced, ob.fenced) << "the other is fenced";
  sender_t& winner = oa.committed ? *a : *b;
  sender_t& loser = oa.committed ? *b : *a;
  log_t log(c.log_rx);
  const auto k = durability::read_log(log).snapshot;
  EXPECT_EQ(k.record.version, 2u);
  EXPECT_EQ(k.epoch, winner.coordinator().epoch);
  ASSERT_TRUE(k.prepared);
  EXPECT_EQ(k.prepared->attempt.epoch, winner.coordinator().epoch) << "the fenced coordinator persisted no attempt";
  // nor published a single frame: nothing in the bucket under its epoch's attempt streams (when
  // both claimed the same epoch, the loser's claim itself was refused: it never got that far)
  transport::s3_store bucket(c.s3_rx);
  if (loser.coordinator().epoch != winner.coordinator().epoch) {
    EXPECT_TRUE(bucket.list("payloads/a" + std::to_string(loser.coordinator().epoch) + ".").empty());
  }
  a.reset();
  b.reset();
  c.tx = c.make_sender();  // the receivers end at v2 (served by a live sender)
  c.tx->start();
  c.expect_all_bit_exact(2);
}

TEST_F(RefitDist, TrainerRestartedWithAnEmptyLocalDiskRecoversFromS3AndEtcdAlone) {
  dist_cluster c(*env_);
  c.deploy();
  for (version_t v = 1; v <= 2; ++v) {
    c.refit_once();
    c.expect_all_bit_exact(v);
  }
  // A trainer process on a fresh host: no trainer copy of K.v, no local files — it has the bucket
  // and etcd. Without the bucket's baselines it could not start (lost state, named):
  c.tx.reset();
  {
    auto nothing = c.make_sender("elsewhere/");
    try {
      nothing->start();
      FAIL() << "started without any baseline";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::mismatch);
      EXPECT_NE(std::string(e.what()).find("lost its state"), std::string::npos) << e.what();
    }
  }
  c.tx = c.make_sender();
  c.tx->start();  // recovers K.v = 2 from the bucket, K from etcd
  EXPECT_EQ(c.tx->committed().version, 2u);
  ASSERT_TRUE(c.tx->wait_for_members(30s));
  for (version_t v = 3; v <= 4; ++v) {
    const auto st = c.refit_once();
    EXPECT_TRUE(st.committed);
    c.expect_all_bit_exact(v);
  }
}
