// Scripted scenarios (etcd-raft datadriven style): every file in scenarios/ is a list of
//   command / ---- / expected output / blank line
// run against model::cluster (the real coordinator, owners, receivers and commit log). With
// BITREFIT_REWRITE=1 the expected outputs are rewritten from the actual ones (review the diff!).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bitrefit/protocol/model/script.hpp"

namespace {

namespace fs = std::filesystem;
using bitrefit::protocol::model::script_runner;

struct scenario_case {
  std::vector<std::string> comments;  // lines before the command
  std::string command;
  std::string expected;
  int line = 0;
};

std::vector<scenario_case> parse(const std::string& text) {
  std::vector<scenario_case> cases;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  scenario_case cur;
  enum { want_command, want_sep, in_output } st = want_command;
  while (std::getline(in, line)) {
    ++n;
    if (st == want_command) {
      if (line.empty() || line[0] == '#') {
        cur.comments.push_back(line);
        continue;
      }
      cur.command = line;
      cur.line = n;
      st = want_sep;
    } else if (st == want_sep) {
      if (line != "----") throw std::runtime_error("line " + std::to_string(n) + ": expected ---- after command");
      st = in_output;
    } else {
      if (line.empty()) {
        cases.push_back(cur);
        cur = {};
        st = want_command;
      } else {
        cur.expected += (cur.expected.empty() ? "" : "\n") + line;
      }
    }
  }
  if (st == in_output) cases.push_back(cur);
  else if (st == want_sep) throw std::runtime_error("file ends after a command without ----");
  return cases;
}

std::string render(const std::vector<scenario_case>& cases) {
  std::string s;
  for (const auto& c : cases) {
    for (const auto& l : c.comments) s += l + "\n";
    s += c.command + "\n----\n" + c.expected + "\n\n";
  }
  return s;
}

std::vector<fs::path> scenario_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(BITREFIT_SOURCE_DIR) / "tests/protocol/scenarios"))
    if (e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

class Scenario : public ::testing::TestWithParam<fs::path> {};

TEST_P(Scenario, Replays) {
  const fs::path path = GetParam();
  std::ifstream f(path);
  ASSERT_TRUE(f) << "cannot read " << path;
  std::stringstream buf;
  buf << f.rdbuf();
  auto cases = parse(buf.str());
  ASSERT_FALSE(cases.empty()) << path;
  const char* rw = std::getenv("BITREFIT_REWRITE");
  const bool rewrite = rw && std::string(rw) == "1";
  script_runner runner;
  for (auto& c : cases) {
    std::string got = runner.run(c.command);
    if (rewrite) c.expected = got;
    else EXPECT_EQ(got, c.expected) << path.filename() << ":" << c.line << ": " << c.command;
  }
  if (rewrite) {
    std::ofstream(path) << render(cases);
  }
}

std::string name_of(const ::testing::TestParamInfo<fs::path>& info) {
  std::string s = info.param.stem().string();
  for (auto& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Files, Scenario, ::testing::ValuesIn(scenario_files()), name_of);

// Every scenario the protocol issue lists exists.
TEST(Scenario, RequiredScenariosExist) {
  const char* required[] = {"sync_happy_path",           "async_happy_path",
                            "duplicate_payload",         "conflicting_duplicate",
                            "corrupt_copy_then_resend",  "receiver_crash_mid_xor_overwrite_retry",
                            "commit_unknown_read_commit", "failover_between_cas_and_announce",
                            "fenced_old_coordinator",    "eviction_and_rejoin",
                            "late_ack_dead_incarnation", "lost_commit_announcement"};
  for (const char* r : required)
    EXPECT_TRUE(fs::exists(fs::path(BITREFIT_SOURCE_DIR) / "tests/protocol/scenarios" / (std::string(r) + ".txt")))
        << r;
}

// A world needs a receiver, an owner and a chunk per owner: a world line or a config without one
// is refused by name, at parse time and when the world is built (check_protocol builds worlds from
// its own arguments; owners=0 or chunks=0 crashed it and receivers=0 came out "ok").
TEST(World, BadBoundsAreRefusedByName) {
  namespace model = bitrefit::protocol::model;
  const auto refusal = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(accepted)";
  };
  for (const std::string key : {"receivers", "owners", "chunks"}) {
    const std::string expected = "world: " + key + "=0: must be at least 1";
    EXPECT_EQ(refusal([&] { model::parse_world("receivers=2 owners=1 chunks=1 " + key + "=0"); }), expected);
    model::world_config c;
    if (key == "receivers") c.protocol.receivers = 0;
    if (key == "owners") c.protocol.owners = 0;
    if (key == "chunks") c.chunks_per_owner = 0;
    EXPECT_EQ(refusal([&] { model::cluster w(c); }), expected);
  }
  EXPECT_EQ(refusal([] { model::cluster w(model::parse_world("receivers=1 owners=1 chunks=1")); }), "(accepted)");
  // Counts are read whole: a sign, trailing text or a value past 32 bits is refused, not wrapped round.
  for (const std::string v : {"-1", "+2", "2x", "4294967296", ""})
    EXPECT_EQ(refusal([&] { model::parse_world("receivers=" + v); }),
              "world: key 'receivers' needs a whole number from 0 to 4294967295, got '" + v + "'");
}

}  // namespace
