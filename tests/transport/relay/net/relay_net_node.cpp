// relay_net_node — one process of the relay-tree network test (run_net_test.sh drives it).
//
//   --role trainer   the test's driver: creates the cluster PKI, spawns the root relay and R
//                    receivers (each through its own command prefix, e.g. `ip netns exec NS`),
//                    runs the refit engine's sender over an owner node, and after every commit
//                    checks every receiver bit for bit (attestation digest AND byte comparison),
//                    and that every member the coordinator counted at the commit held the version
//                    in the incarnation that acked it. Scripted failures by refit number: kill a
//                    relay mid-payload (a receiver with children dies after applying half of the
//                    refit's payloads), kill a leaf the same way, take a relay's link down for a
//                    second (`--flap-cmd`, or SIGSTOP/SIGCONT on loopback). Prints one JSON line
//                    per refit (bytes per link, tree shape, times) and a summary; exit 0 iff every
//                    refit committed bit-exact and every check held.
//   --role root      the root relay.
//   --role receiver  a rollout process: a member node + the refit engine's receiver over a
//                    canonical_store; after each commit it writes its weights and its node's
//                    counters to <dir>/held/r<i> for the trainer to compare.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/durability/memory.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/testing/adamw.hpp"
#include "bitrefit/testing/crash_points.hpp"
#include "bitrefit/transport/directory_store.hpp"
#include "bitrefit/transport/relay/pki.hpp"
#include "bitrefit/transport/relay/tree_transport.hpp"

namespace fs = std::filesystem;
using namespace bitrefit;
using namespace std::chrono_literals;
namespace relay = bitrefit::transport::relay;
using nlohmann::json;

namespace {

struct options {
  std::string role;
  fs::path dir;
  int index = 0;
  int receivers = 6;
  int refits = 6;
  std::uint32_t fanout = 2;
  std::string root_host = "127.0.0.1";  // the root's address as the trainer dials it
  std::string receiver_root_host;       // ... as receivers dial it (default: root_host)
  std::string listen_host = "127.0.0.1";
  std::vector<std::string> receiver_hosts;  // per receiver: its listen address
  std::string root_prefix;                  // command prefix to start the root (e.g. ip netns exec NS)
  std::string receiver_prefix;              // same for receivers, %d = index
  std::string flap_cmd;                     // %d = receiver index, %s = up|down; empty: SIGSTOP/SIGCONT
  int kill_relay_at = 2, kill_leaf_at = 4, flap_at = 5;
  std::uint64_t hidden = 256, layers = 4, vocab = 4096;
  std::uint64_t frame_kib = 512;
  int deadline_ms = 3000;
  bool loopback = false;
  protocol::gate_policy mode = protocol::gate_policy::synchronous;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "relay_net_node: %s\n", why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--role") o.role = next();
    else if (a == "--dir") o.dir = next();
    else if (a == "--index") o.index = std::stoi(next());
    else if (a == "--receivers") o.receivers = std::stoi(next());
    else if (a == "--refits") o.refits = std::stoi(next());
    else if (a == "--fanout") o.fanout = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--root-host") o.root_host = next();
    else if (a == "--listen-host") o.listen_host = next();
    else if (a == "--receiver-root-host") o.receiver_root_host = next();
    else if (a == "--receiver-hosts") {
      std::string s = next(), cur;
      for (char c : s + ",") {
        if (c == ',') {
          if (!cur.empty()) o.receiver_hosts.push_back(cur);
          cur.clear();
        } else {
          cur += c;
        }
      }
    } else if (a == "--root-prefix") o.root_prefix = next();
    else if (a == "--receiver-prefix") o.receiver_prefix = next();
    else if (a == "--flap-cmd") o.flap_cmd = next();
    else if (a == "--kill-relay-at") o.kill_relay_at = std::stoi(next());
    else if (a == "--kill-leaf-at") o.kill_leaf_at = std::stoi(next());
    else if (a == "--flap-at") o.flap_at = std::stoi(next());
    else if (a == "--hidden") o.hidden = std::stoull(next());
    else if (a == "--layers") o.layers = std::stoull(next());
    else if (a == "--vocab") o.vocab = std::stoull(next());
    else if (a == "--frame-kib") o.frame_kib = std::stoull(next());
    else if (a == "--deadline-ms") o.deadline_ms = std::stoi(next());
    else if (a == "--loopback") o.loopback = true;
    else if (a == "--mode") {
      const std::string m = next();
      if (m != "sync" && m != "async") usage("--mode must be sync or async");
      o.mode = m == "sync" ? protocol::gate_policy::synchronous : protocol::gate_policy::asynchronous;
    }
    else usage("unknown option " + a);
  }
  if (o.dir.empty()) usage("--dir is required");
  if (o.receiver_root_host.empty()) o.receiver_root_host = o.root_host;
  return o;
}

std::vector<testing::tensor_spec> specs_of(const options& o) {
  return testing::llama_like({o.layers, o.hidden, o.hidden * 11 / 4, o.vocab, 4, 2, false});
}
model_manifest manifest_of(const std::vector<testing::tensor_spec>& specs) {
  std::vector<tensor_info> ts;
  for (const auto& s : specs) ts.push_back({s.name, dtype::BF16, s.shape});
  return model_manifest(std::move(ts));
}

relay::node_options node_opts(const options& o, relay::node_role role, const std::string& name) {
  relay::node_options n;
  n.role = role;
  n.name = name;
  n.cluster = "bitrefit-net";
  n.tls = relay::pki::files(o.dir / "pki", name);
  n.fanout = o.fanout;
  n.heartbeat = 250ms;
  n.peer_timeout = 3000ms;  // a link down for one second survives; a dead host is noticed in 3 s
  n.connect_timeout = 700ms;
  n.reconnect_backoff = 50ms;
  n.max_reconnect_backoff = 500ms;
  n.log = [name](std::string_view l) { std::fprintf(stderr, "[%s] %.*s\n", name.c_str(), int(l.size()), l.data()); };
  return n;
}

std::uint64_t read_number(const fs::path& p) {
  std::ifstream in(p);
  std::uint64_t v = 0;
  in >> v;
  return v;
}
void write_file(const fs::path& p, std::span<const std::byte> b) { io::write_file_atomically(p, b, false); }
void write_text(const fs::path& p, const std::string& s) { write_file(p, std::as_bytes(std::span(s.data(), s.size()))); }

bool parent_gone(pid_t parent) { return ::getppid() != parent; }

struct link_totals {
  std::uint64_t frame_bytes = 0, bytes = 0, wire_bytes = 0, control_bytes = 0;
};

std::uint64_t frame_bytes_in(const relay::node_stats& s) {
  std::uint64_t n = s.closed_frame_bytes_in;
  for (auto& p : s.peers) n += p.counters.frame_bytes_in;
  return n;
}

// ================================= root =================================

int run_root(const options& o) {
  auto no = node_opts(o, relay::node_role::root, "root");
  no.listen_host = o.listen_host;
  relay::tree_transport root(no);
  write_text(o.dir / "root.port", std::to_string(root.listening().port));
  const pid_t parent = ::getppid();
  while (!fs::exists(o.dir / "stop") && !parent_gone(parent)) {
    std::this_thread::sleep_for(100ms);
    const auto st = root.stats();
    json peers = json::array();
    for (auto& p : st.peers)
      peers.push_back({{"name", p.name}, {"kind", p.kind}, {"frame_bytes_in", p.counters.frame_bytes_in}, {"frame_bytes_out", p.counters.frame_bytes_out},
                       {"bytes_in", p.counters.bytes_in}, {"wire_bytes_in", p.counters.wire_bytes_in}});
    write_text(o.dir / "root-stats.json", json{{"peers", peers}, {"memory_bytes", st.memory_bytes}, {"spilled_bytes", st.spilled_bytes}}.dump());
  }
  return 0;
}

// ================================= receiver =================================

int run_receiver(const options& o) {
  const auto specs = specs_of(o);
  const model_manifest m = manifest_of(specs);
  const fs::path inc_file = o.dir / "inc" / ("r" + std::to_string(o.index));
  const std::uint64_t incarnation = read_number(inc_file) + 1;
  write_text(inc_file, std::to_string(incarnation));

  const std::string name = "r" + std::to_string(o.index);
  auto no = node_opts(o, relay::node_role::member, name);
  no.root = {o.root_host, static_cast<std::uint16_t>(read_number(o.dir / "root.port"))};
  no.listen_host = o.listen_host;
  no.mailboxes = {"receiver/" + std::to_string(o.index), wire::restore_reply_mailbox(static_cast<std::uint32_t>(o.index))};
  relay::tree_transport net(no);

  layout::canonical_store weights(m);
  testing::crash_points faults;
  faults.set_on_fire([](const std::string&) { ::kill(::getpid(), SIGKILL); });  // die like a killed process
  using receiver_t = refit::receiver<layout::canonical_store, relay::tree_transport, durability::filesystem_commit_log, testing::crash_points>;
  receiver_t* self = nullptr;
  refit::receiver_options ro;
  ro.index = static_cast<std::uint32_t>(o.index);
  ro.incarnation = incarnation;
  ro.gate = o.mode;
  ro.poll = 5ms;
  ro.deadline = std::chrono::milliseconds(o.deadline_ms);
  ro.persist_incarnation = [&](std::uint64_t n) { write_text(inc_file, std::to_string(n)); };
  ro.on_commit = [&](const protocol::commit_record& k) {
    const digest128 att = self->attest();
    const auto st = net.stats();
    std::size_t children = 0;
    for (auto& p : st.peers) children += p.kind == "child";
    const json h{{"version", k.version}, {"baseline", k.baseline.value}, {"incarnation", self->state().incarnation},
                 {"att_low", att.low64}, {"att_high", att.high64}, {"depth", st.depth}, {"children", children},
                 {"frame_bytes_in", frame_bytes_in(st)}, {"rejoins", st.rejoins}, {"pid", ::getpid()}};
    std::string head = h.dump() + "\n";
    std::vector<std::byte> out(head.size());
    std::memcpy(out.data(), head.data(), head.size());
    for (const auto& t : m.tensors()) {
      auto b = weights.bytes(t.name);
      out.insert(out.end(), b.begin(), b.end());
    }
    write_file(o.dir / "held" / name, out);
  };
  receiver_t r(weights, net, durability::filesystem_commit_log(o.dir / "log"), ro, faults);
  self = &r;
  r.start();
  const fs::path kill_order = o.dir / "kill" / name;
  const pid_t parent = ::getppid();
  while (!fs::exists(o.dir / "stop") && !parent_gone(parent)) {
    r.step(5ms);
    if (fs::exists(kill_order)) {  // the trainer wants this process dead after n applied payloads
      const std::uint64_t n = read_number(kill_order);
      fs::remove(kill_order);
      faults.arm("receiver_applied", n);
    }
  }
  return 0;
}

// ================================= trainer =================================

std::string replace_all(std::string s, const std::string& what, const std::string& with) {
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + with.size())) s.replace(at, what.size(), with);
  return s;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s + " ") {
    if (c == ' ') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

struct held_view {
  json head;
  std::vector<std::byte> bytes;
};
std::optional<held_view> read_held(const fs::path& p) {
  auto b = io::read_whole_file(p);
  if (!b) return std::nullopt;
  const auto nl = std::find(b->begin(), b->end(), std::byte{'\n'});
  if (nl == b->end()) return std::nullopt;
  held_view v;
  try {
    v.head = json::parse(std::string(reinterpret_cast<const char*>(b->data()), static_cast<std::size_t>(nl - b->begin())));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  v.bytes.assign(nl + 1, b->end());
  return v;
}

struct trainer {
  options o;
  std::string self_exe;
  pid_t root_pid = -1;
  std::vector<pid_t> pids;
  std::uint64_t kills = 0, unexpected_exits = 0;

  pid_t spawn(const std::string& prefix, std::vector<std::string> args) {
    std::vector<std::string> argv = split_words(prefix);
    argv.push_back(self_exe);
    argv.insert(argv.end(), args.begin(), args.end());
    const pid_t pid = ::fork();
    if (pid < 0) throw error(errc::io, "fork failed");
    if (pid == 0) {
      std::vector<char*> a;
      for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      ::execvp(a[0], a.data());
      std::perror("execvp");
      ::_exit(127);
    }
    return pid;
  }
  std::vector<std::string> common() const {
    return {"--mode", o.mode == protocol::gate_policy::synchronous ? "sync" : "async", "--dir", o.dir.string(), "--fanout", std::to_string(o.fanout), "--hidden", std::to_string(o.hidden),
            "--layers", std::to_string(o.layers), "--vocab", std::to_string(o.vocab), "--deadline-ms", std::to_string(o.deadline_ms)};
  }
  void spawn_receiver(int i) {
    auto args = common();
    for (auto a : {"--role", "receiver", "--index"}) args.push_back(a);
    args.push_back(std::to_string(i));
    args.push_back("--root-host");
    args.push_back(o.receiver_root_host);
    args.push_back("--listen-host");
    args.push_back(o.receiver_hosts.empty() ? "127.0.0.1" : o.receiver_hosts.at(i));
    pids[i] = spawn(replace_all(o.receiver_prefix, "%d", std::to_string(i)), args);
  }
  void reap() {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (pids[i] > 0 && ::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ++kills;
        else {
          ++unexpected_exits;
          std::fprintf(stderr, "relay_net_node: receiver %zu exited unexpectedly (status %d); restarting\n", i, status);
        }
        spawn_receiver(static_cast<int>(i));
      }
    }
  }
  ~trainer() {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, SIGKILL);
    if (root_pid > 0) ::kill(root_pid, SIGKILL);
    for (pid_t p : pids)
      if (p > 0) ::waitpid(p, nullptr, 0);
    if (root_pid > 0) ::waitpid(root_pid, nullptr, 0);
  }
};

int run_trainer(options o) {
  for (auto sub : {"log", "inc", "kill", "held", "pki"}) fs::create_directories(o.dir / sub);
  relay::pki::make_cluster_ca(o.dir / "pki", "bitrefit-net");
  relay::pki::issue(o.dir / "pki", "root");
  relay::pki::issue(o.dir / "pki", "trainer");
  for (int i = 0; i < o.receivers; ++i) relay::pki::issue(o.dir / "pki", "r" + std::to_string(i));

  const auto specs = specs_of(o);
  const model_manifest m = manifest_of(specs);
  std::map<std::string, std::size_t> sim_index;
  for (std::size_t i = 0; i < specs.size(); ++i) sim_index[specs[i].name] = i;
  testing::adamw_sim sim(specs, 7, {});
  std::map<std::string, std::vector<std::byte>> dense;
  auto export_all = [&] {
    for (const auto& t : m.tensors()) {
      auto& b = dense[t.name];
      b.resize(t.bytes());
      sim.export_bf16(sim_index.at(t.name), std::span<std::byte>(b));
    }
  };
  export_all();
  const refit::tensor_source source = refit::copy_from([&](const tensor_info& t) { return std::span<const std::byte>(dense.at(t.name)); });

  trainer tr;
  tr.o = o;
  tr.self_exe = fs::read_symlink("/proc/self/exe").string();
  tr.pids.assign(o.receivers, -1);
  {
    auto args = tr.common();
    for (auto a : {"--role", "root", "--listen-host"}) args.push_back(a);
    args.push_back(o.loopback ? o.root_host : "0.0.0.0");
    tr.root_pid = tr.spawn(o.root_prefix, args);
  }
  const auto until_port = std::chrono::steady_clock::now() + 20s;
  while (!fs::exists(o.dir / "root.port") && std::chrono::steady_clock::now() < until_port) std::this_thread::sleep_for(20ms);
  if (!fs::exists(o.dir / "root.port")) throw error(errc::io, "the root relay did not start");

  auto no = node_opts(o, relay::node_role::owner, "trainer");
  no.root = {o.root_host, static_cast<std::uint16_t>(read_number(o.dir / "root.port"))};
  relay::tree_transport net(no);
  if (!net.wait_attached(10s)) throw error(errc::io, "the trainer could not attach to the root relay");

  refit::sender_options so;
  so.gate = o.mode;
  so.owners = 1;
  so.receivers = static_cast<std::uint32_t>(o.receivers);
  so.threads = 1;
  so.max_frame_input_bytes = o.frame_kib << 10;
  so.deadline = std::chrono::milliseconds(o.deadline_ms);
  so.poll = 2ms;
  so.idle = [&] { tr.reap(); };
  refit::sender<relay::tree_transport, durability::filesystem_commit_log, durability::memory_baseline_store> tx(
      m, net, durability::filesystem_commit_log(o.dir / "log"), {durability::memory_baseline_store{}}, so);
  tx.start(source);
  for (int i = 0; i < o.receivers; ++i) tr.spawn_receiver(i);
  if (!tx.wait_for_members(90s)) throw error(errc::protocol, "receivers did not join");
  const std::uint32_t chunks = tx.shard(0).chunk_count();

  auto held_of = [&](int i) { return read_held(o.dir / "held" / ("r" + std::to_string(i))); };
  auto owner_link = [&] {
    const auto st = net.stats();
    link_totals t;
    t.frame_bytes = st.closed_frame_bytes_out;
    for (auto& p : st.peers) {
      t.frame_bytes += p.counters.frame_bytes_out;
      t.bytes += p.counters.bytes_out;
      t.wire_bytes += p.counters.wire_bytes_out;
      t.control_bytes += p.counters.control_bytes_out;
    }
    return t;
  };

  std::uint64_t committed = 0, retries = 0;
  bool all_ok = true;
  std::vector<std::uint64_t> last_in(o.receivers, 0);
  // Bytes per link are counted from here: wait until every receiver reports the restored version
  // (a join is admitted before the receiver has written its report), so that refit 1 does not
  // count the dense restore.
  for (int i = 0; i < o.receivers; ++i) {
    const auto until = std::chrono::steady_clock::now() + 60s;
    for (;;) {
      auto h = held_of(i);
      if (h && h->head.value("version", std::uint64_t(1)) == tx.committed().version) {
        last_in[i] = h->head.value("frame_bytes_in", std::uint64_t(0));
        break;
      }
      if (std::chrono::steady_clock::now() > until) break;
      tx.pump(20ms);
    }
  }
  for (int k = 1; k <= o.refits; ++k) {
    sim.step();
    export_all();
    // pick the victims from the tree as the receivers last reported it
    std::vector<json> heads(o.receivers);
    for (int i = 0; i < o.receivers; ++i)
      if (auto h = held_of(i)) heads[i] = h->head;
    auto pick = [&](bool relay_node) {
      for (int i = 0; i < o.receivers; ++i)
        if (!heads[i].is_null() && (heads[i].value("children", 0) > 0) == relay_node && heads[i].value("depth", 0) == (relay_node ? 1 : 2)) return i;
      return -1;
    };
    std::string event = "none";
    int victim = -1;
    if (k == o.kill_relay_at) victim = pick(true), event = "kill-relay";
    else if (k == o.kill_leaf_at) victim = pick(false), event = "kill-leaf";
    else if (k == o.flap_at) victim = pick(true), event = o.flap_cmd.empty() ? "stop-cont-1s" : "link-down-1s";
    if ((event == "kill-relay" || event == "kill-leaf") && victim >= 0)
      write_text(o.dir / "kill" / ("r" + std::to_string(victim)), std::to_string(std::max<std::uint32_t>(1, chunks / 2)));
    std::thread flapper;
    if (event.find("1s") != std::string::npos && victim >= 0) {
      flapper = std::thread([&, victim] {
        std::this_thread::sleep_for(30ms);  // once the payload is streaming
        if (o.flap_cmd.empty()) {
          ::kill(tr.pids[victim], SIGSTOP);
          std::this_thread::sleep_for(1s);
          ::kill(tr.pids[victim], SIGCONT);
        } else {
          const std::string i = std::to_string(victim);
          if (std::system(replace_all(replace_all(o.flap_cmd, "%d", i), "%s", "down").c_str()) != 0) std::fprintf(stderr, "flap down failed\n");
          std::this_thread::sleep_for(1s);
          if (std::system(replace_all(replace_all(o.flap_cmd, "%d", i), "%s", "up").c_str()) != 0) std::fprintf(stderr, "flap up failed\n");
        }
      });
    }
    const auto before = owner_link();
    const auto st = tx.refit(source);
    if (flapper.joinable()) flapper.join();
    const auto after = owner_link();
    // Who the coordinator counted as holding K right after the commit, in which incarnation.
    std::map<int, std::uint64_t> members;
    for (std::size_t i = 0; i < tx.coordinator().roster.size(); ++i) {
      const auto& e = tx.coordinator().roster[i];
      if (e.known && !e.evicted && e.at == tx.committed()) members[static_cast<int>(i)] = e.incarnation;
    }
    // The check: every receiver reaches the committed version, bit for bit.
    std::vector<tensor_view> views;
    for (const auto& t : m.tensors()) views.emplace_back(t.name, t.type, t.shape, std::span<const std::byte>(dense.at(t.name)));
    const digest128 expected = codec::attestation_digest(std::span<const tensor_view>(views));
    std::vector<std::byte> all;
    for (const auto& t : m.tensors()) all.insert(all.end(), dense.at(t.name).begin(), dense.at(t.name).end());
    bool exact = st.committed, members_held = true;
    json tree = json::array();
    std::vector<std::uint64_t> received(o.receivers, 0);
    for (int i = 0; i < o.receivers; ++i) {
      const auto until = std::chrono::steady_clock::now() + 60s;
      std::optional<held_view> h;
      for (;;) {
        h = held_of(i);
        if (h && h->head.value("version", std::uint64_t(0)) == st.version) break;
        if (std::chrono::steady_clock::now() > until) break;
        tx.pump(20ms);
      }
      const bool at_v = h && h->head.value("version", std::uint64_t(0)) == st.version;
      const bool ok = at_v && h->head.value("att_low", std::uint64_t(0)) == expected.low64 && h->head.value("att_high", std::uint64_t(0)) == expected.high64 &&
                      h->bytes == all;
      exact = exact && ok;
      if (members.count(i) && (!at_v || h->head.value("incarnation", std::uint64_t(0)) != members[i])) {
        // A member of the commit must hold v in the very incarnation that acked it (a restarted
        // one would have restored, not acked).
        members_held = false;
        std::fprintf(stderr, "refit %d: member r%d (incarnation %" PRIu64 ") does not hold v%" PRIu64 "\n", k, i, members[i], st.version);
      }
      const std::uint64_t in = h ? h->head.value("frame_bytes_in", std::uint64_t(0)) : 0;
      received[i] = in >= last_in[i] ? in - last_in[i] : in;  // a restarted process counts from zero
      last_in[i] = in;
      tree.push_back({{"r", i}, {"depth", h ? h->head.value("depth", 0) : -1}, {"children", h ? h->head.value("children", 0) : -1},
                      {"incarnation", h ? h->head.value("incarnation", 0) : -1}, {"frame_bytes_in", received[i]}, {"bit_exact", ok}});
    }
    // Bytes per link: the owner->root link carries this refit's payload frames exactly once.
    const std::uint64_t frames_out = after.frame_bytes - before.frame_bytes;
    // framing: frame_begin + block headers; control: the protocol's own messages (prepare, ...)
    const std::uint64_t control = after.control_bytes - before.control_bytes;
    const double framing = frames_out ? double(after.bytes - before.bytes - control) / double(frames_out) - 1.0 : 0.0;
    const double wire = after.bytes > before.bytes ? double(after.wire_bytes - before.wire_bytes) / double(after.bytes - before.bytes) - 1.0 : 0.0;
    const bool clean = event == "none" && st.attempts == 1;
    bool links_ok = true;
    if (clean) {
      links_ok = frames_out == st.payload_bytes && framing <= 0.01;
      for (int i = 0; i < o.receivers; ++i) links_ok = links_ok && received[i] == st.payload_bytes;  // each tree edge once
    }
    committed += st.committed;
    retries += st.attempts > 0 ? st.attempts - 1 : 0;
    const bool ok = exact && members_held && links_ok;
    all_ok = all_ok && ok;
    auto j = st.to_json();
    j["refit"] = k;
    j["event"] = event;
    j["victim"] = victim;
    j["bit_exact"] = exact;
    j["members_held_at_commit"] = members_held;
    j["members"] = members.size();
    j["owner_link_frame_bytes"] = frames_out;
    j["owner_link_framing_overhead"] = framing;
    j["owner_link_tls_tcp_overhead"] = wire;
    j["owner_link_control_bytes"] = control;
    j["links_carry_payload_once"] = clean ? json(links_ok) : json("not checked (failure refit)");
    j["tree"] = tree;
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  write_text(o.dir / "stop", "1");
  json summary{{"summary", true}, {"refits", o.refits}, {"refits_committed", committed}, {"all_checks_passed", all_ok},
               {"kills", tr.kills}, {"unexpected_exits", tr.unexpected_exits}, {"retries", retries}, {"receivers", o.receivers},
               {"fanout", o.fanout}, {"params", m.total_elements()}, {"mode", o.mode == protocol::gate_policy::synchronous ? "sync" : "async"}, {"network", o.loopback ? "loopback" : "namespaces"}};
  std::printf("%s\n", summary.dump().c_str());
  return committed == static_cast<std::uint64_t>(o.refits) && all_ok && tr.unexpected_exits == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  try {
    const options o = parse(argc, argv);
    if (o.role == "root") return run_root(o);
    if (o.role == "receiver") return run_receiver(o);
    if (o.role == "trainer") return run_trainer(o);
    usage("--role must be trainer, root or receiver");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relay_net_node: %s\n", e.what());
    return 1;
  }
}
