// The S3 object store and transport against a real S3 server (moto on loopback, label dist): the
// same conformance checks the directory store passes, multipart uploads in parallel parts, ranged
// reads, pagination, throttling (503 SlowDown), server errors and connections dropped in the middle
// of an upload (through a fault proxy) that retries absorb, errors that no retry fixes surfacing at
// once by name, and abandoned multipart uploads cleaned when their stream is discarded.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <set>

#include "../fixtures/fault_proxy.hpp"
#include "../fixtures/servers.hpp"
#include "bitrefit/transport/s3_store.hpp"
#include "transport_laws.hpp"

using namespace bitrefit;
using namespace bitrefit::transport;
using bitrefit::testing::fault_proxy;

namespace {

class S3 : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    server_ = bitrefit::testing::moto_server::get(why);
    if (!server_) GTEST_SKIP() << why;
  }

  /// Options for a fresh bucket of its own (created here) on `endpoint` (default: moto itself).
  s3_options fresh_bucket(const std::string& endpoint = {}) {
    static std::atomic<int> n{0};
    s3_options o;
    o.endpoint = server_->endpoint();
    o.bucket = "bitrefit-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    o.region = "us-east-1";
    o.credentials = s3_credentials{"testing", "testing", ""};
    o.retry.base_delay = std::chrono::milliseconds(5);
    o.retry.max_delay = std::chrono::milliseconds(100);
    s3_store(o).create_bucket();
    if (!endpoint.empty()) o.endpoint = endpoint;
    return o;
  }

  bitrefit::testing::moto_server* server_ = nullptr;
};

bytes random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  bytes b(n);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

}  // namespace

TEST_F(S3, TransportAndObjectStoreLawsAsTheDirectoryStore) {
  check_transport_laws(s3_transport(s3_store(fresh_bucket())));
  auto o = fresh_bucket();
  o.list_page = 2;  // every listing spans several pages
  check_object_store_laws(s3_store(o));
}

TEST_F(S3, KeysLiveUnderThePrefixAndListingsPaginate) {
  auto o = fresh_bucket();
  o.list_page = 3;
  o.prefix = "run-7/";
  s3_store s(o);
  std::vector<std::string> want;
  for (int i = 0; i < 10; ++i) {
    char k[32];
    std::snprintf(k, sizeof k, "payloads/a1.1/%08x.%08x", i % 3, i);
    s.put(k, make_bytes(5, i));
    want.push_back(k);
  }
  std::sort(want.begin(), want.end());
  const auto before = s.counters();
  EXPECT_EQ(s.list("payloads/a1.1/"), want);
  EXPECT_EQ((s.counters() - before).list, 4u);  // ceil(10 / 3) pages
  // another prefix in the same bucket sees nothing of it
  auto other = o;
  other.prefix = "run-8/";
  EXPECT_TRUE(s3_store(other).list("payloads/").empty());
  EXPECT_EQ(s3_store(other).get("payloads/a1.1/00000000.00000000"), std::nullopt);
}

TEST_F(S3, LargeObjectsGoUpInParallelPartsAndReadBackByRange) {
  auto o = fresh_bucket();
  o.part_size = 5 << 20;  // S3's smallest part
  o.parallel_parts = 3;
  s3_store s(o);
  const bytes big = random_bytes((5 << 20) * 4 + 12345, 1);  // 5 parts, the last one short
  auto before = s.counters();
  s.put("big", big);
  const auto up = s.counters() - before;
  EXPECT_EQ(up.multipart, 1u + 5u + 1u);  // create, 5 parts, complete
  EXPECT_EQ(up.put, 0u);
  auto got = s.get("big");
  ASSERT_TRUE(got);
  EXPECT_TRUE(*got == big);
  auto mid = s.get_range("big", (5 << 20) - 7, 20);  // across a part boundary
  ASSERT_TRUE(mid);
  EXPECT_TRUE(std::equal(mid->begin(), mid->end(), big.begin() + (5 << 20) - 7) && mid->size() == 20);
  auto tail = s.get_tail("big", 8);
  ASSERT_TRUE(tail);
  EXPECT_TRUE(std::equal(tail->begin(), tail->end(), big.end() - 8) && tail->size() == 8);
  EXPECT_EQ(s.get_range("absent", 0, 4), std::nullopt);
  EXPECT_EQ(s.get_tail("absent", 8), std::nullopt);
  // a stream of unknown size: parts leave while it is written
  auto w = s.open("streamed");
  for (std::size_t at = 0; at < big.size(); at += 777777) w.write(std::span(big).subspan(at, std::min<std::size_t>(777777, big.size() - at)));
  w.commit();
  EXPECT_TRUE(*s.get("streamed") == big);
  auto small = s.open("small");
  small.write(make_bytes(10, 1));
  small.commit();  // one PUT
  EXPECT_EQ(*s.get("small"), make_bytes(10, 1));
  EXPECT_TRUE(s.incomplete_uploads("").empty());
}

TEST_F(S3, AWriterDestroyedBeforeCommitLeavesNothing) {
  auto o = fresh_bucket();
  o.part_size = 5 << 20;
  s3_store s(o);
  {
    auto w = s.open("torn");
    w.write(random_bytes(11 << 20, 2));  // two parts went up
  }
  EXPECT_EQ(s.get("torn"), std::nullopt);
  EXPECT_TRUE(s.incomplete_uploads("").empty());  // the upload was aborted
}

TEST_F(S3, ThrottlingServerErrorsAndDroppedUploadsAreRetried) {
  fault_proxy proxy(server_->port());
  auto o = fresh_bucket(proxy.endpoint());
  o.part_size = 5 << 20;
  o.parallel_parts = 2;
  std::atomic<int> slowdowns{0}, errors{0}, drops{0};
  proxy.set_rule([&](const fault_proxy::request_info& r) {
    if (r.index % 5 == 1) return ++slowdowns, fault_proxy::action::slow_down;
    if (r.index % 7 == 3) return ++errors, fault_proxy::action::server_error;
    if (r.method == "PUT" && r.content_length > 1000 && r.index % 3 == 0) return ++drops, fault_proxy::action::drop_mid_body;
    return fault_proxy::action::forward;
  });
  s3_transport t{s3_store(o)};
  const attempt_id a{1, 1};
  std::vector<bytes> frames;
  for (std::uint32_t i = 0; i < 12; ++i) {
    frames.push_back(random_bytes(i == 5 ? (11 << 20) : 20000 + i, i));  // one frame in 3 parts
    t.publish(key_of({a, i % 2, i}), frames.back());
  }
  for (std::uint32_t i = 0; i < 12; ++i) {
    auto got = t.fetch(key_of({a, i % 2, i}));
    ASSERT_TRUE(got) << i;
    EXPECT_TRUE(*got == frames[i]) << "frame " << i;
  }
  EXPECT_EQ(t.list(attempt_stream(a)).size(), 12u);
  EXPECT_GT(slowdowns.load(), 0);
  EXPECT_GT(errors.load(), 0);
  EXPECT_GT(drops.load(), 0);
  EXPECT_GE(t.store().counters().retries, std::uint64_t(slowdowns + errors + drops));
  t.discard(attempt_stream(a));
  EXPECT_TRUE(t.list(attempt_stream(a)).empty());
}

TEST_F(S3, EveryBodyIsSignedWithItsOwnSha256) {
  // moto trusts x-amz-content-sha256 as sent; AWS checks it against the body. Check it on the wire.
  fault_proxy proxy(server_->port());
  auto o = fresh_bucket(proxy.endpoint());
  std::mutex mu;
  std::vector<std::string> wrong;
  std::atomic<int> checked{0};
  proxy.set_rule([&](const fault_proxy::request_info& r) {
    if (r.content_length <= (1u << 20)) {
      std::string lower = r.head;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      const std::string name = "\r\nx-amz-content-sha256: ";
      const auto at = lower.find(name);
      const std::string want = s3_detail::sha256_hex(std::as_bytes(std::span(r.body.data(), r.body.size())));
      if (at == std::string::npos || lower.substr(at + name.size(), 64) != want) {
        std::lock_guard lock(mu);
        wrong.push_back(r.method + " " + r.target + "\n" + r.head + "\nwant " + want);
      }
      ++checked;
    }
    return fault_proxy::action::forward;
  });
  s3_transport t{s3_store(o)};
  t.publish(key_of({{1, 1}, 0, 0}), make_bytes(5000, 1));
  t.post("coordinator", make_bytes(10, 2));
  t.receive("coordinator", std::chrono::milliseconds(100));
  t.discard(attempt_stream({1, 1}));  // DeleteObjects: a POST body
  EXPECT_GE(checked.load(), 5);
  EXPECT_TRUE(wrong.empty()) << wrong.front();
  // the hash itself, against the FIPS 180-2 test vector
  EXPECT_EQ(s3_detail::sha256_hex(std::as_bytes(std::span("abc", 3))), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_F(S3, ACompletionWhoseAnswerWasLostIsRecognizedWhenRetried) {
  // CompleteMultipartUpload reaches the server and succeeds; its answer is lost. S3 answers the
  // retry with 404 NoSuchUpload (the proxy plays that part: moto completes twice): the object must
  // then be there with the multipart ETag these very parts give, and it is.
  fault_proxy proxy(server_->port());
  auto o = fresh_bucket(proxy.endpoint());
  o.part_size = 5 << 20;
  std::atomic<int> completes{0}, heads{0};
  auto rule = [&](fault_proxy::action first) {
    completes = heads = 0;
    proxy.set_rule([&, first](const fault_proxy::request_info& r) {
      heads += r.method == "HEAD";
      if (r.method != "POST" || r.target.find("uploadId=") == std::string::npos) return fault_proxy::action::forward;
      return completes++ == 0 ? first : fault_proxy::action::no_such_upload;
    });
  };
  rule(fault_proxy::action::lose_answer);
  s3_store s(o);
  const bytes big = random_bytes((5 << 20) * 2 + 99, 8);
  s.put("k", big);
  EXPECT_EQ(completes.load(), 2);
  EXPECT_EQ(heads.load(), 1) << "recognized by the object's multipart ETag";
  EXPECT_TRUE(*s.get("k") == big);
  // the Complete never reached the server and the upload is gone (a cleanup aborted it): the same
  // NoSuchUpload is then a failure, named, not a success
  rule(fault_proxy::action::cut_before);
  try {
    s.put("gone", big);
    FAIL() << "expected NoSuchUpload";
  } catch (const s3_error& e) {
    EXPECT_EQ(e.s3_code(), "NoSuchUpload") << e.what();
    EXPECT_NE(std::string(e.what()).find("vanished"), std::string::npos) << e.what();
  }
  EXPECT_EQ(completes.load(), 2);
  EXPECT_EQ(s.get("gone"), std::nullopt);
}

TEST_F(S3, ErrorsNoRetryFixesSurfaceAtOnceByName) {
  fault_proxy proxy(server_->port());
  auto o = fresh_bucket(proxy.endpoint());
  o.retry.base_delay = std::chrono::milliseconds(200);  // a retry would show in the request count and the time
  proxy.set_rule([](const fault_proxy::request_info& r) {
    return r.target.find("/denied") != std::string::npos ? fault_proxy::action::access_denied : fault_proxy::action::forward;
  });
  s3_store s(o);
  const auto n0 = proxy.requests();
  try {
    s.put("denied", make_bytes(10, 1));
    FAIL() << "expected AccessDenied";
  } catch (const s3_error& e) {
    EXPECT_EQ(e.status(), 403);
    EXPECT_EQ(e.s3_code(), "AccessDenied");
    EXPECT_FALSE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("s3://" + o.bucket + "/denied"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("PutObject"), std::string::npos) << e.what();
  }
  EXPECT_EQ(proxy.requests() - n0, 1u);
  EXPECT_EQ(s.counters().retries, 0u);
  // a bucket that does not exist: 404 NoSuchBucket, at once (a missing OBJECT is an answer: nullopt)
  auto nb = o;
  nb.bucket = "bitrefit-no-such-bucket";
  try {
    s3_store(nb).get("x");
    FAIL() << "expected NoSuchBucket";
  } catch (const s3_error& e) {
    EXPECT_EQ(e.status(), 404);
    EXPECT_EQ(e.s3_code(), "NoSuchBucket");
  }
  // throttling that never stops: the tries run out, and the error says so
  auto limited = o;
  limited.retry = {.max_attempts = 3, .base_delay = std::chrono::milliseconds(1), .max_delay = std::chrono::milliseconds(5)};
  proxy.set_rule([](const fault_proxy::request_info&) { return fault_proxy::action::slow_down; });
  const auto n1 = proxy.requests();
  try {
    s3_store(limited).put("k", make_bytes(10, 1));
    FAIL() << "expected SlowDown";
  } catch (const s3_error& e) {
    EXPECT_EQ(e.s3_code(), "SlowDown");
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("gave up after 3 tries"), std::string::npos) << e.what();
  }
  EXPECT_EQ(proxy.requests() - n1, 3u);
  // no server at all: the network error is named
  auto dead = o;
  dead.endpoint = "http://127.0.0.1:" + std::to_string(bitrefit::testing::free_port());
  dead.retry = limited.retry;
  try {
    s3_store(dead).get("k");
    FAIL() << "expected a connection error";
  } catch (const s3_error& e) {
    EXPECT_EQ(e.status(), 0);
    EXPECT_NE(std::string(e.what()).find("not sent"), std::string::npos) << e.what();
  }
}

TEST_F(S3, AnAbandonedUploadIsAbortedWhenItsStreamIsDiscarded) {
  // A sender crashed in the middle of a multipart upload of attempt (4, 2)'s frame: the upload is
  // neither completed nor aborted. The next coordinator's cleanup discards that attempt's stream.
  auto o = fresh_bucket();
  s3_transport t{s3_store(o)};
  const std::string key = "payloads/a4.2/" + frame_object_name(0, 3);
  const auto& c = t.store().client();
  const auto r = c.call(s3_call::make("CreateMultipartUpload", "POST", key).param("uploads", ""));
  const std::string id = s3_detail::parse_xml(r, key).child("InitiateMultipartUploadResult").child_value("UploadId");
  const bytes part = random_bytes(5 << 20, 3);
  c.call(s3_call::make("UploadPart", "PUT", key).param("partNumber", "1").param("uploadId", id).with_body(part));
  t.publish(key_of({{4, 2}, 0, 1}), make_bytes(9, 9));
  t.publish(key_of({{4, 3}, 0, 0}), make_bytes(9, 9));  // the next attempt's stream is not touched
  ASSERT_EQ(t.store().incomplete_uploads("payloads/").size(), 1u);
  t.discard(attempt_stream({4, 2}));
  EXPECT_TRUE(t.store().incomplete_uploads("payloads/").empty());
  EXPECT_TRUE(t.list(attempt_stream({4, 2})).empty());
  EXPECT_EQ(t.list(attempt_stream({4, 3})).size(), 1u);
}

// moto in its authenticated mode verifies every signature with botocore's signer: requests signed
// by libcurl's SigV4 (with our payload hash and canonical query) are accepted, uploads in parts
// included, and a wrong secret or an unknown key is refused at once, by name, without a retry.
TEST(S3Signing, SigV4RequestsAreAcceptedAndBadCredentialsRefusedAtOnce) {
  std::string why;
  auto* server = bitrefit::testing::moto_server::get(why, /*authenticated=*/true);
  if (!server) GTEST_SKIP() << why;
  s3_options o;
  o.endpoint = server->endpoint();
  o.bucket = "bitrefit-signed";
  o.region = "us-east-1";
  o.credentials = s3_credentials{server->access_key(), server->secret_key(), ""};
  o.part_size = 5 << 20;
  s3_store s(o);
  s.create_bucket();
  const bytes small = random_bytes(1000, 4), big = random_bytes((5 << 20) + 4321, 5);
  s.put("payloads/a1.1/00000000.00000000", small);
  s.put("payloads/a1.1/00000000.00000001", big);  // CreateMultipartUpload, UploadPart x2, Complete
  EXPECT_TRUE(*s.get("payloads/a1.1/00000000.00000000") == small);
  EXPECT_TRUE(*s.get("payloads/a1.1/00000000.00000001") == big);
  EXPECT_EQ(s.get_tail("payloads/a1.1/00000000.00000001", 8)->size(), 8u);
  EXPECT_EQ(s.list(""), (std::vector<std::string>{"payloads/a1.1/00000000.00000000", "payloads/a1.1/00000000.00000001"}));
  s.remove("payloads/a1.1/00000000.00000000");
  EXPECT_EQ(s.get("payloads/a1.1/00000000.00000000"), std::nullopt);
  EXPECT_EQ(s.counters().retries, 0u);

  for (const auto& [creds, code] : {std::pair{s3_credentials{server->access_key(), "not-the-secret", ""}, "SignatureDoesNotMatch"},
                                    std::pair{s3_credentials{"AKIANOSUCHKEY0000000", "whatever", ""}, "InvalidAccessKeyId"}}) {
    auto bad = o;
    bad.credentials = creds;
    bad.retry.base_delay = std::chrono::milliseconds(500);
    s3_store b(bad);
    try {
      b.put("x", small);
      FAIL() << "expected " << code;
    } catch (const s3_error& e) {
      EXPECT_EQ(e.status(), 403);
      EXPECT_EQ(e.s3_code(), code) << e.what();
      EXPECT_FALSE(e.retryable());
    }
    EXPECT_EQ(b.counters().requests, 1u) << code << ": surfaced at once";
  }
}
