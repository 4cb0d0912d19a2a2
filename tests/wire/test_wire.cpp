// Tests of bitrefit/wire/: the one JSON spelling of protocol values (named and positional), the
// control-plane envelope codec, the engine's typed side messages, and trace files. Label protocol.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "bitrefit/protocol/protocol.hpp"
#include "bitrefit/wire/wire.hpp"

using namespace bitrefit;

namespace {
std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

template <class T>
void expect_round_trip(const T& x) {
  const auto j = wire::value_to_json(x);
  EXPECT_EQ(wire::value_from_json<T>(wire::json::parse(j.dump())), x) << j.dump();
}
}  // namespace

TEST(Wire, EveryMessageRoundTripsAndGarbageIsRefused) {
  protocol::prepare_record p;
  p.attempt = {3, 4};
  p.base = {7, baseline_id{99}};
  p.target = 8;
  p.next = protocol::baseline_of(p.attempt);
  p.mode = protocol::mode::xor_mask;
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
      protocol::announce_msg{{8, baseline_id{12}}, std::nullopt, false, false},
      protocol::announce_msg{{8, baseline_id{12}}, protocol::member{2, 6}, false, false},
      protocol::announce_msg{{8, baseline_id{12}}, protocol::member{2, 5}, true, false},
      protocol::announce_msg{{8, baseline_id{12}}, protocol::member{2, 6}, false, true, 3},
      protocol::roll_call_msg{9},
      protocol::abort_msg{2, {3, 4}},
      protocol::manifest_msg{{3, 4}, 1, 17},
      protocol::arrived_msg{{3, 4}, {2, 5}},
      protocol::ack_msg{{3, 4}, {2, 5}, digest128{5, 6}},
      protocol::ack_msg{{3, 4}, {2, 5}, std::nullopt},
      protocol::stopped_msg{{3, 4}, {2, 5}},
      protocol::failed_msg{{3, 4}, {2, 5}, protocol::failure_reason::conflicting_payload},
      protocol::join_msg{{2, 6}, {8, baseline_id{12}}},
      protocol::join_msg{{2, 6}, {8, baseline_id{12}}, 3},
      protocol::baseline_msg{1, {8, baseline_id{12}}},
      protocol::payload_msg{payload_id{{3, 4}, 1, 2}, 7, 8, protocol::mode::overwrite, digest128{7, 8}},
  };
  std::set<std::size_t> covered;  // a new protocol message must be added here (and to wire/json.hpp)
  for (const auto& m : all) {
    covered.insert(m.index());
    const protocol::envelope e{protocol::endpoint::receiver_(2), protocol::endpoint::coord(), m};
    EXPECT_EQ(wire::decode(wire::encode(e)), e);
  }
  EXPECT_EQ(covered.size(), std::variant_size_v<protocol::message>);
  for (std::string bad : {"", "{", "{\"wire\":1}", "{\"wire\":1,\"from\":[0,0],\"to\":[0,0],\"msg\":{\"type\":\"nope\"}}",
                          "{\"wire\":1,\"from\":[7,0],\"to\":[0,0],\"msg\":{\"type\":\"flush\",\"attempt\":[1,1]}}"}) {
    try {
      wire::decode(std::as_bytes(std::span(bad.data(), bad.size())));
      FAIL() << bad;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::format) << bad;
    }
  }
}


TEST(Wire, EveryEventAndActionRoundTripsThroughTheTraceForm) {
  // One value of every alternative of every event and action variant (a new alternative must be
  // added here: the size checks fail otherwise). Field lists drive the form, so no field is lost.
  protocol::prepare_record p;
  p.attempt = {3, 4};
  p.members = {{0, 1}};
  p.expected = {digest128{1, 2}};
  const protocol::envelope env{protocol::endpoint::coord(), protocol::endpoint::receiver_(1), protocol::prepare_msg{p}};
  const protocol::log_reply reply{protocol::compare_and_set_request{2, {2, 1}, {1, baseline_id{3}}, {2, baseline_id{9}}},
                                  protocol::log_outcome::conflict, {2, {1, baseline_id{3}}, p}};
  const std::vector<protocol::coordinator_event> ce{protocol::start_event{}, protocol::begin_transition_event{4, false, {digest128{5, 6}}, {}},
                                                    protocol::message_event{env}, protocol::log_event{reply}, protocol::deadline_event{},
                                                    protocol::operator_abort_event{}};
  const std::vector<protocol::owner_event> oe{protocol::message_event{env}, protocol::chunk_encoded_event{{1, 2}, 3, {4, 5}, protocol::mode::xor_mask},
                                              protocol::encode_finished_event{{1, 2}, 7}};
  const std::vector<protocol::receiver_event> re{protocol::boot_event{}, protocol::message_event{env}, protocol::drained_event{},
                                                 protocol::device_synced_event{digest128{1, 1}}, protocol::device_synced_event{},
                                                 protocol::commit_read_event{{3, baseline_id{4}}, 2}, protocol::restored_event{{3, baseline_id{4}}},
                                                 protocol::deadline_event{}};
  const std::vector<protocol::coordinator_action> ca{
      protocol::log_action{protocol::persist_prepare_request{2, p}}, protocol::send_action{env}, protocol::arm_deadline_action{},
      protocol::disarm_deadline_action{}, protocol::fence_receiver_action{{1, 2}}, protocol::cleanup_action{{1, 2}},
      protocol::committed_action{{1, baseline_id{2}}}, protocol::deposed_action{}, protocol::aborted_action{{1, 2}, {}},
      protocol::needs_operator_action{"why \"quoted\""}};
  const std::vector<protocol::owner_action> oa{protocol::send_action{env}, protocol::advance_baseline_action{{1, baseline_id{2}}},
                                               protocol::freeze_change_set_action{1, 2}, protocol::encode_action{{1, 2}, protocol::mode::overwrite, 1, 2},
                                               protocol::cancel_encoding_action{{1, 2}}};
  const std::vector<protocol::receiver_action> ra{
      protocol::send_action{env}, protocol::persist_incarnation_action{5}, protocol::close_gate_action{}, protocol::drain_requests_action{},
      protocol::stage_payload_action{{{1, 2}, 3, 4}}, protocol::apply_payload_action{{{1, 2}, 3, 4}, protocol::mode::xor_mask, 1, 2},
      protocol::discard_staged_action{{1, 2}}, protocol::sync_device_action{false}, protocol::open_gate_action{true},
      protocol::read_commit_action{}, protocol::dense_restore_action{{1, baseline_id{2}}}, protocol::arm_deadline_action{},
      protocol::disarm_deadline_action{}};
  EXPECT_EQ(ce.size(), std::variant_size_v<protocol::coordinator_event>);
  EXPECT_EQ(oe.size(), std::variant_size_v<protocol::owner_event>);
  EXPECT_EQ(re.size() - 1, std::variant_size_v<protocol::receiver_event>);  // device_synced twice
  EXPECT_EQ(ca.size(), std::variant_size_v<protocol::coordinator_action>);
  EXPECT_EQ(oa.size(), std::variant_size_v<protocol::owner_action>);
  EXPECT_EQ(ra.size(), std::variant_size_v<protocol::receiver_action>);
  for (const auto& x : ce) expect_round_trip(x);
  for (const auto& x : oe) expect_round_trip(x);
  for (const auto& x : re) expect_round_trip(x);
  expect_round_trip(ca);
  expect_round_trip(oa);
  expect_round_trip(ra);
  expect_round_trip(protocol::protocol_config{protocol::gate_policy::asynchronous, 3, 4, false, 2});
  // A value of another shape is refused by name.
  try {
    (void)wire::value_from_json<protocol::coordinator_event>(wire::json::parse("[3, [1]]"));
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), errc::format);
  }
}

TEST(Wire, EngineMessagesRoundTripAndForeignOnesAreRefusedByName) {
  EXPECT_EQ(wire::decode<wire::restore_request>(wire::encode(wire::restore_request{2, 7})), (wire::restore_request{2, 7}));
  EXPECT_EQ(wire::decode<wire::restore_offer>(wire::encode(wire::restore_offer{{4, baseline_id{9}}, {3, 0, 5}})),
            (wire::restore_offer{{4, baseline_id{9}}, {3, 0, 5}}));
  EXPECT_EQ(wire::decode<wire::stats_report>(wire::encode(wire::stats_report{1, {2, 3}, 0.5, 0.25, 1.5})),
            (wire::stats_report{1, {2, 3}, 0.5, 0.25, 1.5}));
  EXPECT_EQ(wire::decode<wire::placement_announcement>(wire::encode(wire::placement_announcement{1, {7, 8}})),
            (wire::placement_announcement{1, {7, 8}}));
  // a message of another type on a mailbox, garbage, a missing field: errc::format naming it
  const auto offer = wire::encode(wire::restore_offer{{4, baseline_id{9}}, {3}});
  for (const auto& bad : {std::vector<std::byte>(offer), [] {
                            const std::string s = "{\"type\":\"restore_request\",\"receiver\":1}";
                            auto b = bytes_of(s);
                            return std::vector<std::byte>(b.begin(), b.end());
                          }(),
                          std::vector<std::byte>{std::byte{'{'}}}) {
    try {
      (void)wire::decode<wire::restore_request>(bad);
      FAIL();
    } catch (const error& e) {
      EXPECT_EQ(e.code(), errc::format);
    }
  }
}

TEST(Wire, UndecodableMessagesAreCountedLoggedAndDropped) {
  std::vector<std::vector<std::byte>> items{wire::encode(wire::restore_request{1, 1}), std::vector<std::byte>{std::byte{'x'}},
                                            wire::encode(wire::restore_request{2, 1})};
  std::uint64_t undecodable = 0;
  std::vector<std::uint32_t> got;
  ::testing::internal::CaptureStderr();
  wire::for_each_decoded(items, "engine/restore", undecodable, [](const auto& b) { return wire::decode<wire::restore_request>(b); },
                         [&](const wire::restore_request& q) { got.push_back(q.receiver); });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(undecodable, 1u);
  EXPECT_EQ(got, (std::vector<std::uint32_t>{1, 2}));
  EXPECT_NE(log.find("engine/restore"), std::string::npos) << log;  // the line names the mailbox
}

TEST(Wire, TraceFilesKeepEveryLineAndIgnoreOnlyATornTail) {
  const auto dir = std::filesystem::temp_directory_path() / ("bitrefit-wire-trace-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    wire::trace_file_writer w(dir, "r0-i1");
    w.line({{"init", {{"role", "receiver"}}}});
    w.step(protocol::receiver_event{protocol::boot_event{}}, std::vector<protocol::receiver_action>{protocol::read_commit_action{}});
  }
  std::ofstream(dir / "r0-i1.jsonl", std::ios::app) << "{\"seq\": 9, \"eve";  // a killed writer's last bytes
  const auto files = wire::read_trace_dir(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_TRUE(files[0].torn_tail);
  ASSERT_EQ(files[0].lines.size(), 2u);
  EXPECT_LT(files[0].lines[0].seq, files[0].lines[1].seq);
  EXPECT_EQ(wire::value_from_json<protocol::receiver_event>(files[0].lines[1].body.at("event")), protocol::receiver_event{protocol::boot_event{}});
  // a broken line that is not the last one is an error naming the file and line
  std::ofstream(dir / "r0-i1.jsonl", std::ios::app) << "\n{\"seq\": 10}\n";
  EXPECT_THROW(wire::read_trace_dir(dir), error);
  std::filesystem::remove_all(dir);
}
