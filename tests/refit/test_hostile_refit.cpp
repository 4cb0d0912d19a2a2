// Hostile inputs on the receiving path (label e2e). A store that, before the genuine copy of each
// payload, serves hostile ones — forged (valid digest, another payload id), truncated, replayed
// from an older attempt, oversized, a declared-size bomb, a frame for tensors nobody serves — that
// lists every stream in reverse order, and that slips control messages into every mailbox (the
// protocol's, and the engine's placement, stats and restore mailboxes): with
// wrong (older) epochs and attempts, from unknown members, from old incarnations, and malformed,
// out-of-range or oversized JSON. Every hostile input must be refused by name (the engine's
// on_refused hooks), nothing of it applied, every process keeps running, and every refit commits,
// bit-exact against the trainer's truth.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "../fuzz/reseal.hpp"
#include "bitrefit/durability/memory.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/transport/inprocess.hpp"
#include "bitrefit/wire/control.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HOSTILE_UNDER_SANITIZER 1
#elif defined(__has_feature)
#define HOSTILE_UNDER_SANITIZER (__has_feature(address_sanitizer) || __has_feature(thread_sanitizer))
#else
#define HOSTILE_UNDER_SANITIZER 0
#endif

using namespace bitrefit;
using namespace std::chrono_literals;

namespace {

/// The kinds of hostile payload copy, each with the error it must be refused with.
enum class copy_kind { forged, truncated, replayed, oversized, bomb, foreign, count };
constexpr std::size_t copy_kinds = static_cast<std::size_t>(copy_kind::count);

/// The refusal ("<errc> <field>") each kind must get from the receiver's verification.
std::string expected_refusal(copy_kind k) {
  switch (k) {
    case copy_kind::forged:
    case copy_kind::replayed: return "mismatch id";  // a valid frame whose id is not its key's
    case copy_kind::truncated:
    case copy_kind::oversized: return "integrity error frame_size";  // bytes differ from the header's size
    case copy_kind::bomb: return "format error range";               // declared size beyond what the item can hold
    case copy_kind::foreign: return "mismatch tensor";               // matched to the engine before decoding
    case copy_kind::count: break;
  }
  return "?";
}

std::string object_of(const transport::frame_key& k) { return k.stream.name + "/" + transport::frame_object_name(k.owner, k.seq); }

std::vector<std::byte> read_corpus(const std::string& name) {
  std::ifstream in(std::filesystem::path(BITREFIT_SOURCE_DIR) / "tests/fuzz/corpus/fuzz_frame" / name, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto b = std::as_bytes(std::span(c));
  return {b.begin(), b.end()};
}

/// A valid frame (own digest) for a tensor no engine serves.
std::vector<std::byte> foreign_frame(const payload_id& id) {
  std::vector<std::byte> a(64, std::byte{1}), b(64, std::byte{2});
  const codec::chunk_piece pc{"not.served.anywhere", dtype::U8, 64, 0, 64, a, b};
  codec::chunk_encoder<> enc;
  codec::byte_buffer out;
  enc.encode({codec::frame_kind::delta, id, 0, 1}, std::span(&pc, 1), out);
  return {out.data(), out.data() + out.size()};
}

/// Test policy around any Transport: serves hostile copies and injects hostile control messages
/// (see the file comment). Deterministic: what is served depends only on the keys and the order
/// of calls, never on a clock.
template <transport::Transport T>
class hostile_transport {
 public:
  struct state {
    std::mutex mu;
    std::map<transport::frame_key, std::vector<std::byte>> published;  // every frame ever published (replays)
    std::map<transport::frame_key, unsigned> fetches;
    std::array<std::uint64_t, copy_kinds> served{};
    std::map<std::string, std::multiset<std::string>> expected;  // object -> refusals its hostile copies must get
    std::uint64_t next_kind = 0;
    std::uint64_t control_injected = 0;
    std::set<std::string> mailboxes_hit;  // mailboxes that got their batch of malformed messages
    std::vector<std::byte> bomb;
  };
  static constexpr unsigned hostile_per_key = 2;

  explicit hostile_transport(T inner) : inner_(std::move(inner)), st_(std::make_shared<state>()) {
    st_->bomb = fuzz::reseal_frame(read_corpus("crash-frame_bomb_1GiB"));
  }

  void publish(const transport::frame_key& k, std::span<const std::byte> b) {
    {
      std::lock_guard lock(st_->mu);
      st_->published[k].assign(b.begin(), b.end());
    }
    inner_.publish(k, b);
  }
  std::vector<transport::frame_key> list(const transport::stream_key& s) {
    auto keys = inner_.list(s);
    std::reverse(keys.begin(), keys.end());  // reordered: the receiver applies in (owner, seq) order anyway
    return keys;
  }
  std::optional<transport::bytes> fetch(const transport::frame_key& k) {
    auto genuine = inner_.fetch(k);
    if (!genuine || k.stream.name.empty() || k.stream.name[0] != 'a') return genuine;  // restores: genuine
    std::lock_guard lock(st_->mu);
    const unsigned n = ++st_->fetches[k];
    if (n > hostile_per_key) return genuine;
    const auto kind = static_cast<copy_kind>(st_->next_kind++ % copy_kinds);  // round robin over the kinds
    ++st_->served[static_cast<std::size_t>(kind)];
    st_->expected[object_of(k)].insert(expected_refusal(kind));
    return hostile_copy(kind, k, *genuine);
  }
  void discard(const transport::stream_key& s) { inner_.discard(s); }
  void post(const std::string& m, std::span<const std::byte> b) { inner_.post(m, b); }
  std::vector<transport::bytes> receive(const std::string& m, std::chrono::milliseconds wait) {
    auto got = inner_.receive(m, wait);
    if (m != "coordinator" && m.rfind("receiver/", 0) != 0 && m.rfind("engine/", 0) != 0) return got;  // every mailbox
    std::vector<transport::bytes> out;
    std::lock_guard lock(st_->mu);
    if (st_->mailboxes_hit.insert(m).second)
      for (auto& bad : malformed()) out.push_back(std::move(bad));
    for (auto& b : got) {
      auto twins = stale_twins(b);  // after the genuine one: then they are provably stale
      out.push_back(std::move(b));
      for (auto& bad : twins) out.push_back(std::move(bad));
    }
    st_->control_injected += out.size() - got.size();
    return out;
  }

  std::shared_ptr<state> stats() const { return st_; }

 private:
  static transport::bytes bytes_of(const std::string& s) {
    const auto b = std::as_bytes(std::span(s.data(), s.size()));
    return {b.begin(), b.end()};
  }

  /// Malformed control messages: the findings' numbers, floats, negatives, nesting, size.
  static std::vector<transport::bytes> malformed() {
    return {bytes_of(R"({"wire":118446744073709551616})"),
            bytes_of(R"({"wire":1e300})"),
            bytes_of(R"({"wire":1,"from":[0,-1],"to":[2,0],"msg":{"type":"flush","attempt":[1,1]}})"),
            bytes_of(R"({"wire":1,"from":[0,0],"to":[2,4294967297],"msg":{"type":"roll_call","epoch":-5}})"),
            bytes_of(std::string(200, '[') + std::string(200, ']')),
            bytes_of("{\"wire\":1,\"pad\":\"" + std::string(5u << 20, 'x') + "\"}"),
            bytes_of("not json at all")};
  }

  /// For a genuine message, twins the protocol must ignore once it has seen the genuine one: its
  /// attempt one epoch older; from an unknown member; from an older incarnation of its sender; an
  /// announcement of an older record. (Without authentication, which is the transport's job, a
  /// well-formed message that is NOT older than anything seen cannot be told from a genuine one.)
  static std::vector<transport::bytes> stale_twins(const transport::bytes& genuine) {
    protocol::envelope env;
    try {
      env = wire::decode(genuine);
    } catch (const error&) {
      return {};
    }
    std::vector<transport::bytes> out;
    auto emit = [&](protocol::envelope e) { out.push_back(wire::encode(e)); };
    std::visit(
        [&](const auto& m) {
          using M = std::decay_t<decltype(m)>;
          if constexpr (requires { m.attempt; }) {
            if (m.attempt.epoch > 0) {
              auto older = env;
              std::get<M>(older.msg).attempt.epoch -= 1;  // a fenced coordinator's attempt
              emit(older);
            }
          }
          if constexpr (std::is_same_v<M, protocol::prepare_msg>) {
            if (m.record.attempt.epoch > 0) {
              auto older = env;
              std::get<M>(older.msg).record.attempt.epoch -= 1;
              emit(older);
            }
          }
          if constexpr (requires { m.from.incarnation; }) {
            auto unknown = env;
            std::get<M>(unknown.msg).from.receiver = 97;  // no such member
            emit(unknown);
            if (m.from.incarnation > 0) {
              auto old = env;
              std::get<M>(old.msg).from.incarnation -= 1;  // a dead incarnation
              emit(old);
            }
          }
          if constexpr (std::is_same_v<M, protocol::announce_msg>) {
            if (m.record.version > 0) {
              auto older = env;
              std::get<M>(older.msg).record.version -= 1;  // old news
              emit(older);
            }
          }
        },
        env.msg);
    return out;
  }

  std::vector<std::byte> hostile_copy(copy_kind kind, const transport::frame_key& k, const transport::bytes& g) {
    switch (kind) {
      case copy_kind::forged: {  // a valid digest over a header naming another seq
        auto f = g;
        fuzz::put_u64_le(f.data() + 24, (std::uint64_t{k.seq + 1000} << 32) | k.owner);  // owner, seq
        return fuzz::reseal_frame(f);
      }
      case copy_kind::truncated: return {g.begin(), g.begin() + static_cast<std::ptrdiff_t>(g.size() / 2)};
      case copy_kind::replayed: {  // the same (owner, seq) of another (older) attempt, as published then
        for (auto& [key, bytes] : st_->published)
          if (key.owner == k.owner && key.seq == k.seq && key.stream.name != k.stream.name && key.stream.name[0] == 'a') return bytes;
        auto f = g;  // first attempt: a copy claiming an older attempt counter
        fuzz::put_u64_le(f.data() + 16, fuzz::get_u64_le(f.data() + 16) + 1000);
        return fuzz::reseal_frame(f);
      }
      case copy_kind::oversized: {
        auto f = g;
        f.resize(f.size() + (4u << 20));  // 4 MiB beyond what its header declares
        return f;
      }
      case copy_kind::bomb: return st_->bomb;
      case copy_kind::foreign: {
        const auto f = codec::frame_view::parse(g);
        return foreign_frame(f.header().id);  // right id, tensors nobody serves
      }
      case copy_kind::count: break;
    }
    return g;
  }

  T inner_;
  std::shared_ptr<state> st_;
};

using hostile_net_t = hostile_transport<transport::inprocess_transport>;
using hostile_sender_t = refit::sender<hostile_net_t, durability::memory_commit_log, durability::memory_baseline_store>;
using hostile_receiver_t = refit::receiver<layout::canonical_store, hostile_net_t, durability::memory_commit_log>;

/// What the engine refused, by name, from every hook (threads: receivers and the sender).
struct refusals {
  std::mutex mu;
  std::map<std::string, std::uint64_t> by_reason;  // "<errc> <field>"
  std::map<std::string, std::multiset<std::string>> payload_by_object;  // object -> its refusals
  std::uint64_t payload = 0, control = 0;
  void add(const error& e) {
    std::lock_guard lock(mu);
    const std::string why = std::string(errc_name(e.code())) + " " + e.where().field;
    ++by_reason[why];
    const bool is_payload = e.where().file.rfind("a", 0) == 0;  // attempt streams; mailboxes are coordinator, receiver/, engine/
    (is_payload ? payload : control) += 1;
    if (is_payload) payload_by_object[e.where().file].insert(why);
  }
};

model_manifest hostile_model() {
  return model_manifest({{"model.embed.weight", dtype::BF16, {48, 64}},
                         {"model.norm.bias", dtype::F32, {300}},
                         {"model.fp8.weight", dtype::F8_E4M3, {200}},
                         {"model.steps", dtype::I64, {16}}});
}

}  // namespace

TEST(HostileRefit, EveryHostileInputIsRefusedByNameAndEveryRefitCommitsBitExact) {
  const model_manifest m = hostile_model();
  std::map<std::string, std::vector<std::byte>> truth;
  std::mt19937_64 rng(77);
  for (auto& t : m.tensors()) {
    auto& b = truth[t.name];
    b.resize(t.bytes());
    for (auto& x : b) x = static_cast<std::byte>(rng());
  }
  auto source = refit::copy_from([&truth](const tensor_info& t) { return std::span<const std::byte>(truth.at(t.name)); });

  hostile_net_t net{transport::inprocess_transport{}};
  durability::memory_commit_log log;
  refusals refused;
  refit::sender_options so;
  so.owners = 2;
  so.receivers = 2;
  so.threads = 2;
  so.max_frame_input_bytes = 2048;
  so.deadline = 400ms;
  so.poll = 1ms;
  so.transition_timeout = 30s;  // a refit that cannot commit fails the test in 30 s (a normal run takes ~0.2 s)
  so.on_refused = [&](const error& e) { refused.add(e); };
  hostile_sender_t tx(m, net, log, std::vector<durability::memory_baseline_store>(2), so);
  tx.start(source);

  std::atomic<bool> stop{false};
  std::atomic<int> died{0};
  std::vector<std::unique_ptr<layout::canonical_store>> stores;
  std::vector<std::atomic<std::uint64_t>> at(2);
  for (auto& a : at) a = ~0ull;
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < 2; ++r) stores.push_back(std::make_unique<layout::canonical_store>(m));
  for (std::uint32_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      refit::receiver_options o;
      o.index = r;
      o.poll = 1ms;
      o.deadline = 300ms;
      o.on_commit = [&, r](const protocol::commit_record& k) { at[r] = k.version; };
      o.on_refused = [&](const error& e) { refused.add(e); };
      try {
        hostile_receiver_t rcv(*stores[r], net, log, o);
        rcv.start();
        while (!stop) rcv.step(1ms);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "receiver " << r << " died: " << e.what();
        ++died;
      }
    });
  ASSERT_TRUE(tx.wait_for_members(60s));

  for (version_t v = 1; v <= 3; ++v) {
    for (auto& [name, b] : truth)  // ~5% of the bytes change
      for (std::size_t i = 0; i < b.size(); i += 1 + rng() % 37) b[i] = static_cast<std::byte>(rng());
    const auto st = tx.refit(source);
    ASSERT_TRUE(st.committed) << "v" << v;
    const auto until = std::chrono::steady_clock::now() + 60s;
    while ((at[0] != v || at[1] != v) && std::chrono::steady_clock::now() < until) tx.pump(5ms);
    ASSERT_EQ(at[0].load(), v);
    ASSERT_EQ(at[1].load(), v);
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(died.load(), 0) << "a hostile input ended a receiver";

  // bit-exact: what each receiver holds is the trainer's truth of v3, byte for byte
  for (std::uint32_t r = 0; r < 2; ++r)
    for (auto& t : m.tensors())
      EXPECT_TRUE(std::ranges::equal(stores[r]->bytes(t.name), truth.at(t.name))) << "receiver " << r << " " << t.name;

  const auto s = net.stats();
  std::lock_guard lock(refused.mu);
  std::string reasons;
  for (auto& [why, n] : refused.by_reason) reasons += "  " + why + ": " + std::to_string(n) + "\n";
  std::uint64_t served = 0;
  for (std::size_t k = 0; k < copy_kinds; ++k) {
    EXPECT_GT(s->served[k], 0u) << "hostile copy kind " << k << " never served";
    served += s->served[k];
  }
  std::printf("hostile payload copies served %llu, control messages injected %llu; refused by name:\n%s",
              static_cast<unsigned long long>(served), static_cast<unsigned long long>(s->control_injected), reasons.c_str());
  // every hostile copy was refused (none was stepped or applied: the refit is bit-exact above), each
  // with the error its kind must get, on the object it was served for (order-free: two receivers)
  EXPECT_EQ(refused.payload, served) << reasons;
  EXPECT_EQ(refused.payload_by_object, s->expected) << reasons;
  // every injected control message was refused or ignored by name (genuine repeats may add more)
  EXPECT_GE(refused.control, s->control_injected) << reasons;
  // bounded memory: the bomb declares 1 GiB of F64 changes and two control messages pad 5 MiB each;
  // nothing may allocate what they claim. The whole process (every test of this binary before
  // this one included) peaks near 50 MiB in a plain build; sanitizer runtimes keep freed memory in
  // quarantine and add shadow, so there the number is printed, not bounded.
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  std::printf("process peak RSS %ld KiB\n", u.ru_maxrss);
#if !HOSTILE_UNDER_SANITIZER
  EXPECT_LT(u.ru_maxrss, 256L << 10) << "KiB: a hostile input's declared size was allocated";
#endif
  for (const char* why : {"mismatch id", "integrity error frame_size", "format error range", "mismatch tensor", "format error json.size",
                          "format error json.depth", "format error wire", "format error endpoint.index", "protocol error message"})
    EXPECT_GT(refused.by_reason.count(why), 0u) << "no refusal '" << why << "'\n" << reasons;
}

// The control-message findings (kept as fuzz regression inputs, tests/fuzz/corpus/fuzz_wire) and
// every integer field: a float, a negative, an out-of-range or a too-large value is refused by
// name, never converted (nlohmann's get<> would wrap "-1" to 4294967295 or hit undefined behaviour
// on 1e300); oversized and deeply nested messages are refused before a tree is built.
TEST(HostileWire, IntegersAreCheckedAndSizeAndNestingBounded) {
  auto decode = [](const std::string& text) { return wire::decode(std::as_bytes(std::span(text.data(), text.size()))); };
  auto field_of = [&](const std::string& text) -> std::string {
    try {
      decode(text);
    } catch (const error& e) {
      EXPECT_TRUE(e.code() == errc::format || e.code() == errc::unsupported) << e.what();
      return e.where().field;
    }
    return "accepted";
  };
  for (const char* name : {"crash-wire_int_overflow", "crash-wire_float_version"}) {
    std::ifstream in(std::filesystem::path(BITREFIT_SOURCE_DIR) / "tests/fuzz/corpus/fuzz_wire" / name);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(field_of(text), "wire") << name;
  }
  const protocol::envelope ok{protocol::endpoint::coord(), protocol::endpoint::receiver_(2),
                              protocol::roll_call_msg{5}};
  const auto good = wire::encode(ok);
  const std::string text(reinterpret_cast<const char*>(good.data()), good.size());
  EXPECT_EQ(decode(text), ok);
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const auto at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from << " in " << t;
    return t.replace(at, from.size(), to);
  };
  EXPECT_EQ(field_of(with("\"from\":[0,0]", "\"from\":[0,-1]")), "endpoint.index");
  EXPECT_EQ(field_of(with("\"to\":[2,2]", "\"to\":[2,4294967297]")), "endpoint.index");
  EXPECT_EQ(field_of(with("\"to\":[2,2]", "\"to\":[2.0,2]")), "endpoint.role");
  EXPECT_EQ(field_of(with("\"to\":[2,2]", "\"to\":[2,2,2]")), "endpoint");
  EXPECT_EQ(field_of(with("\"epoch\":5", "\"epoch\":-5")), "epoch");
  EXPECT_EQ(field_of(with("\"epoch\":5", "\"epoch\":5.5")), "epoch");
  EXPECT_EQ(field_of(with("\"epoch\":5", "\"epoch\":18446744073709551616")), "epoch");
  EXPECT_EQ(field_of(with("\"wire\":1", "\"wire\":1.0")), "wire");
  EXPECT_EQ(field_of(std::string(100, '[') + std::string(100, ']')), "json.depth");
  EXPECT_EQ(field_of("{\"pad\":\"" + std::string(wire::control_json_limits.max_bytes, 'x') + "\"}"), "json.size");
  // every message type's numbers go through the same checks (a payload id with a negative seq)
  const protocol::envelope p{protocol::endpoint::owner_(1), protocol::endpoint::receiver_(0),
                             protocol::payload_msg{payload_id{{3, 4}, 1, 2}, 7, 8, protocol::mode::overwrite, digest128{7, 8}}};
  const auto pb = wire::encode(p);
  std::string pt(reinterpret_cast<const char*>(pb.data()), pb.size());
  pt.replace(pt.find("[3,4,1,2]"), 9, "[3,4,1,-2]");
  EXPECT_EQ(field_of(pt), "id.seq");
}
