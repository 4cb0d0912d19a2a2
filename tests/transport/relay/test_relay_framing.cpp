// The pure parts of the relay tree: link framing (round trip, chunking, every rejection with its
// reason), hello admission, tree placement and rejoin order, and the frame store (memory budget,
// spill file, discard). No sockets here; test_relay_node.cpp runs real nodes.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstring>
#include <random>

#include "bitrefit/transport/relay/frame_store.hpp"
#include "bitrefit/transport/relay/framing.hpp"
#include "bitrefit/transport/relay/handshake.hpp"
#include "bitrefit/transport/relay/tree.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

using namespace bitrefit;
using namespace bitrefit::transport;
using namespace bitrefit::transport::relay;

namespace {

std::vector<std::byte> bytes_of(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

std::vector<framing::message> samples() {
  framing::hello h;
  h.cluster = "prod-1";
  h.role = node_role::member;
  h.name = "receiver-3";
  h.listen = {"10.0.0.7", 7001};
  h.subtree = 3;
  h.mailboxes = {"receiver/3", "engine/restored/3"};
  h.inventory = {{{"a1.2"}, 0, 0}, {{"a1.2"}, 1, 4}, {{"r5.9"}, 0, 2}};
  std::vector<std::byte> blob(1000);
  for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = std::byte(i * 7);
  return {h,
          framing::welcome{{{"10.0.0.1", 7000}, {"fe80::1%veth0", 7001}}, {"a1.1", "r4.8"}},
          framing::redirect{{"10.0.0.2", 7002}, "fanout 4 reached"},
          framing::refuse{"peer belongs to another cluster"},
          framing::frame_begin{{{"a1.2"}, 3, 17}, 123456},
          framing::frame_block{blob},
          framing::frame_block{{}},
          framing::frame_abort{},
          framing::control{{{"coordinator", bytes_of("{\"ack\":1}")}, {"receiver/1", {}}}},
          framing::discard{"a1.2"},
          framing::want{{{"r5.9"}, 0, 2}},
          framing::missing{{{"r5.9"}, 0, 2}},
          framing::routes{4, {"receiver/1", "receiver/2"}},
          framing::ping{42},
          framing::pong{42}};
}

struct fed {
  std::vector<framing::decoded> msgs;
  std::optional<framing::error_info> err;
};
fed feed(std::span<const std::byte> in, std::size_t chunk, framing::limits lim = {}) {
  framing::decoder d(lim);
  fed r;
  for (std::size_t at = 0; at < in.size() && !r.err; at += chunk)
    r.err = d.feed(in.subspan(at, std::min(chunk, in.size() - at)), [&](framing::decoded&& m) { r.msgs.push_back(std::move(m)); });
  return r;
}

std::vector<std::byte> stream_of(const std::vector<framing::message>& ms) {
  std::vector<std::byte> out;
  std::uint32_t ch = 0;
  for (auto& m : ms) {
    auto e = framing::encode(m, ch++);
    out.insert(out.end(), e.begin(), e.end());
  }
  return out;
}

}  // namespace

TEST(RelayFraming, EveryMessageRoundTripsInAnyChunking) {
  const auto ms = samples();
  const auto wire = stream_of(ms);
  for (std::size_t chunk : {std::size_t(1), std::size_t(5), std::size_t(12), std::size_t(13), std::size_t(4096), wire.size()}) {
    const auto r = feed(wire, chunk);
    ASSERT_FALSE(r.err) << r.err->to_string();
    ASSERT_EQ(r.msgs.size(), ms.size()) << "chunk " << chunk;
    for (std::size_t i = 0; i < ms.size(); ++i) {
      EXPECT_EQ(r.msgs[i].channel, i);
      EXPECT_TRUE(r.msgs[i].msg == ms[i]) << framing::to_string(framing::type_of(ms[i]));
    }
  }
}

TEST(RelayFraming, BlockHeaderPlusRawBytesIsTheSameAsAnEncodedBlock) {
  std::vector<std::byte> data(777, std::byte{9});
  const auto h = framing::header(framing::type::frame_block, 5, 777);
  std::vector<std::byte> wire(framing::header_size + data.size());
  std::memcpy(wire.data(), h.data(), framing::header_size);
  std::memcpy(wire.data() + framing::header_size, data.data(), data.size());
  EXPECT_EQ(wire, framing::encode(framing::frame_block{data}, 5));
}

RC_GTEST_PROP(RelayFraming, RandomControlBatchesRoundTrip, (std::vector<std::vector<std::uint8_t>> payloads, std::uint8_t chunk)) {
  framing::control c;
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    std::vector<std::byte> m(payloads[i].size());
    if (!m.empty()) std::memcpy(m.data(), payloads[i].data(), m.size());
    c.items.push_back({"receiver/" + std::to_string(i), std::move(m)});
  }
  const auto wire = framing::encode(c, 0);
  const auto r = feed(wire, 1 + chunk % 40);
  RC_ASSERT(!r.err);
  RC_ASSERT(r.msgs.size() == 1u);
  RC_ASSERT(r.msgs[0].msg == framing::message{c});
}

TEST(RelayFraming, AnOversizedLengthIsRejectedFromTheHeaderAlone) {
  framing::limits lim;
  lim.max_block = 1024;
  lim.max_control = 64 << 10;
  // a block header claiming 4 GiB - 1: rejected after 12 bytes, before any body is buffered
  const auto h = framing::header(framing::type::frame_block, 1, 0xFFFFFFFFu);
  const auto r = feed(std::span<const std::byte>(h), 12, lim);
  ASSERT_TRUE(r.err);
  EXPECT_EQ(r.err->code, framing::reason::too_long);
  EXPECT_NE(r.err->to_string().find("frame_block of 4294967295 bytes, limit 1024"), std::string::npos) << r.err->to_string();
  const auto c = framing::header(framing::type::control, 0, (64 << 10) + 1);
  EXPECT_EQ(feed(std::span<const std::byte>(c), 12, lim).err->code, framing::reason::too_long);
  const auto p = framing::header(framing::type::ping, 0, 5000);  // small types are small
  EXPECT_EQ(feed(std::span<const std::byte>(p), 12, lim).err->code, framing::reason::too_long);
}

TEST(RelayFraming, GarbageIsRejectedByName) {
  // plain text where a header belongs
  EXPECT_EQ(feed(bytes_of("GET / HTTP/1.1\r\n\r\n"), 3).err->code, framing::reason::bad_magic);
  auto wire = framing::encode(framing::ping{1});
  wire[2] = std::byte{1};
  EXPECT_EQ(feed(wire, 100).err->code, framing::reason::bad_reserved);
  wire = framing::encode(framing::ping{1});
  wire[1] = std::byte{99};
  EXPECT_EQ(feed(wire, 100).err->code, framing::reason::unknown_type);
  wire[1] = std::byte{0};
  EXPECT_EQ(feed(wire, 100).err->code, framing::reason::unknown_type);
}

TEST(RelayFraming, BodiesAreCheckedFieldByField) {
  // a ping body one byte short / one byte long
  auto h = framing::header(framing::type::ping, 0, 7);
  std::vector<std::byte> w(h.begin(), h.end());
  w.resize(w.size() + 7);
  EXPECT_EQ(feed(w, 100).err->code, framing::reason::truncated);
  h = framing::header(framing::type::ping, 0, 9);
  w.assign(h.begin(), h.end());
  w.resize(w.size() + 9);
  EXPECT_EQ(feed(w, 100).err->code, framing::reason::trailing_bytes);
  // a stream name that is a path
  auto bad = framing::encode(framing::discard{"ok"});
  framing::writer wr;
  wr.str("../../etc/passwd");
  auto hb = framing::header(framing::type::discard, 0, static_cast<std::uint32_t>(wr.bytes().size()));
  bad.assign(hb.begin(), hb.end());
  bad.insert(bad.end(), wr.bytes().begin(), wr.bytes().end());
  const auto r = feed(bad, 100);
  ASSERT_TRUE(r.err);
  EXPECT_EQ(r.err->code, framing::reason::bad_name);
  EXPECT_NE(r.err->to_string().find("discard: stream"), std::string::npos);
  // a control batch that claims 2^32-1 items in a 4-byte body: no allocation, truncated
  framing::writer cw;
  cw.u32(0xFFFFFFFFu);
  auto hc = framing::header(framing::type::control, 0, 4);
  std::vector<std::byte> cb(hc.begin(), hc.end());
  cb.insert(cb.end(), cw.bytes().begin(), cw.bytes().end());
  const auto rc = feed(cb, 100);
  ASSERT_TRUE(rc.err);
  EXPECT_EQ(rc.err->code, framing::reason::truncated);
  // a hello naming role 7
  framing::hello hel;
  hel.cluster = "c";
  hel.name = "n";
  auto hw = framing::encode(hel);
  hw[framing::header_size + 2 + 4 + 1] = std::byte{7};
  EXPECT_EQ(feed(hw, 100).err->code, framing::reason::bad_value);
  // control characters in a refusal reason (log forging)
  auto rw = framing::encode(framing::refuse{"fine"});
  rw.back() = std::byte{'\n'};
  EXPECT_EQ(feed(rw, 100).err->code, framing::reason::bad_name);
}

TEST(RelayFraming, ADecoderStaysFailedAndKnowsWhenItIsMidMessage) {
  framing::decoder d;
  const auto w = framing::encode(framing::ping{3});
  int n = 0;
  EXPECT_FALSE(d.feed(std::span(w).first(5), [&](auto&&) { ++n; }));
  EXPECT_TRUE(d.mid_message());
  EXPECT_FALSE(d.feed(std::span(w).subspan(5), [&](auto&&) { ++n; }));
  EXPECT_FALSE(d.mid_message());
  EXPECT_EQ(n, 1);
  const auto bad = bytes_of("xxxxxxxxxxxxxxxx");
  EXPECT_TRUE(d.feed(bad, [&](auto&&) { ++n; }));
  EXPECT_TRUE(d.feed(w, [&](auto&&) { ++n; }));  // failed for good
  EXPECT_EQ(n, 1);
}

TEST(RelayFraming, FuzzEntryPointHoldsOnSamplesAndMutations) {
  std::mt19937 rng(11);
  auto wire = stream_of(samples());
  std::vector<std::uint8_t> in(wire.size() + 1);
  for (int round = 0; round < 3000; ++round) {
    in[0] = static_cast<std::uint8_t>(rng());
    std::memcpy(in.data() + 1, wire.data(), wire.size());
    const int flips = round == 0 ? 0 : 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) in[1 + rng() % wire.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
    const std::size_t len = round % 3 == 0 ? 1 + rng() % in.size() : in.size();
    ASSERT_EQ(LLVMFuzzerTestOneInput(in.data(), len), 0);
  }
}

// ---- admission ---------------------------------------------------------------------------------

TEST(RelayHandshake, AdmissionNamesEveryReason) {
  framing::hello h;
  h.cluster = "prod";
  h.name = "r1";
  h.role = node_role::member;
  EXPECT_FALSE(admit(h, "prod", node_role::root));
  EXPECT_FALSE(admit(h, "prod", node_role::member));
  auto other = h;
  other.cluster = "staging";
  EXPECT_EQ(*admit(other, "prod", node_role::root), "peer belongs to another cluster: it says 'staging', this relay serves 'prod'");
  auto old = h;
  old.version = 0;
  EXPECT_NE(admit(old, "prod", node_role::root)->find("link version 0"), std::string::npos);
  auto owner = h;
  owner.role = node_role::owner;
  EXPECT_FALSE(admit(owner, "prod", node_role::root));
  EXPECT_EQ(*admit(owner, "prod", node_role::member), "owners attach to the root relay only");
  auto root = h;
  root.role = node_role::root;
  EXPECT_TRUE(admit(root, "prod", node_role::root));
  EXPECT_TRUE(admit(h, "prod", node_role::owner));
}

// ---- tree shape --------------------------------------------------------------------------------

TEST(RelayTree, PlacementFillsLevelByLevel) {
  std::vector<child_view> kids;
  EXPECT_EQ(place(kids, 2).what, placement::kind::accept);
  kids.push_back({1, 1, {"a", 1}});
  EXPECT_EQ(place(kids, 2).what, placement::kind::accept);
  kids.push_back({2, 1, {"b", 2}});
  auto p = place(kids, 2);
  ASSERT_EQ(p.what, placement::kind::redirect);
  EXPECT_EQ(p.to, (endpoint_spec{"a", 1}));  // equal subtrees: the older child
  kids[0].subtree = 2;
  EXPECT_EQ(place(kids, 2).to, (endpoint_spec{"b", 2}));
  kids[1].listen.port = 0;  // takes no children
  EXPECT_EQ(place(kids, 2).to, (endpoint_spec{"a", 1}));
  kids[0].listen.port = 0;
  EXPECT_EQ(place(kids, 2).what, placement::kind::refuse);
}

TEST(RelayTree, RejoinTriesTheNearestAncestorFirstAndTheRootLast) {
  const endpoint_spec root{"r", 1}, a{"a", 2}, b{"b", 3};
  EXPECT_EQ(rejoin_order({root, a, b}, root), (std::vector<endpoint_spec>{b, a, root}));
  EXPECT_EQ(rejoin_order({}, root), (std::vector<endpoint_spec>{root}));
  const endpoint_spec root_alias{"127.0.0.1", 1};
  EXPECT_EQ(rejoin_order({root_alias, a}, root), (std::vector<endpoint_spec>{a, root_alias, root}));
}

TEST(RelayOptions, EndpointsParseOrNameTheText) {
  EXPECT_EQ(parse_endpoint("10.1.2.3:7000"), (endpoint_spec{"10.1.2.3", 7000}));
  EXPECT_EQ(parse_endpoint("[::1]:9"), (endpoint_spec{"::1", 9}));
  EXPECT_EQ(parse_endpoint("[::1]:9").to_string(), "[::1]:9");
  for (auto bad : {"nohost", ":1", "h:", "h:70000", "h:1x", "[::1:2"}) EXPECT_THROW(parse_endpoint(bad), bitrefit::error) << bad;
}

// ---- frame store -------------------------------------------------------------------------------

TEST(RelayFrameStore, KeepsBlocksInMemoryUpToTheBudgetThenSpills) {
  frame_store st(10'000, {});
  const frame_key k{{"a1.1"}, 0, 0};
  std::vector<std::byte> all;
  st.begin(k, 25'000);
  for (int i = 0; i < 5; ++i) {
    auto b = std::make_shared<std::vector<std::byte>>(5'000);
    for (std::size_t j = 0; j < b->size(); ++j) (*b)[j] = std::byte((i * 31 + j) & 0xFF);
    all.insert(all.end(), b->begin(), b->end());
    ASSERT_TRUE(st.append(k, b));
    EXPECT_EQ(st.find(k)->complete(), i == 4);
    EXPECT_EQ(st.list(k.stream).size(), i == 4 ? 1u : 0u);  // only complete frames are listed
  }
  EXPECT_EQ(st.memory_bytes(), 10'000u);
  EXPECT_EQ(st.spilled_bytes(), 15'000u);
  EXPECT_EQ(st.snapshot(k).assemble(), all);  // bit-exact across memory and spool
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(*st.load(st.find(k)->pieces[i]), std::vector<std::byte>(all.begin() + i * 5000, all.begin() + (i + 1) * 5000));
  EXPECT_FALSE(st.append(k, std::make_shared<std::vector<std::byte>>(1)));  // past the announced size
  st.discard(k.stream);
  EXPECT_EQ(st.frames(), 0u);
  EXPECT_EQ(st.memory_bytes(), 0u);
  EXPECT_EQ(st.spilled_bytes(), 0u);
}

TEST(RelayFrameStore, ListIsPerStreamInOwnerSeqOrder) {
  frame_store st(1 << 20, {});
  for (auto [s, o, q] : {std::tuple{"a1.1", 2u, 0u}, {"a1.1", 0u, 5u}, {"a1.10", 0u, 0u}, {"a1.1", 0u, 1u}}) {
    st.begin({{s}, o, q}, 0);
  }
  const auto l = st.list({"a1.1"});
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0], (frame_key{{"a1.1"}, 0, 1}));
  EXPECT_EQ(l[1], (frame_key{{"a1.1"}, 0, 5}));
  EXPECT_EQ(l[2], (frame_key{{"a1.1"}, 2, 0}));
  EXPECT_EQ(st.inventory().size(), 4u);
}
