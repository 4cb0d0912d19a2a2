// relay_bench — one process of the relay-tree measurements (bench/relay/measure.sh drives it).
//
//   --role root    the root relay; on exit writes <out>: its peak RSS (VmHWM), its RSS when idle,
//                  and the bytes each of its links carried (framing, payload, TCP payload).
//   --role sink    a member that records, per frame, when it completed here (CLOCK_MONOTONIC, the
//                  same clock in every namespace of one host) and drops it (discard) so a long run
//                  does not accumulate; writes <out> as JSON lines {seq, t_ns, bytes, depth}.
//   --role source  an owner that publishes --frames frames of --frame-kib KiB (random bytes, one
//                  stream per frame, "a1.<seq>") as fast as the tree takes them, --gap-ms apart;
//                  writes <out> with the publish start times and its link counters.
// Frames are opaque here: this measures the transport alone (no encoder), so what is measured is
// the link, the relays and TLS, not the codec.
#include <utility>  // Boost 1.74's Asio wants <utility> before it

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "../common/process_memory.hpp"
#include "bitrefit/transport/relay/pki.hpp"
#include "bitrefit/transport/relay/tree_transport.hpp"

namespace fs = std::filesystem;
namespace relay = bitrefit::transport::relay;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

struct options {
  std::string role, name = "node", listen = "127.0.0.1", out;
  relay::endpoint_spec root;
  fs::path pki, port_file, stop_file;
  std::uint32_t fanout = 4, frames = 16;
  std::uint64_t frame_kib = 4096, retain_mib = 64, window_kib = 4096, block_kib = 256;
  int gap_ms = 0;
  bool discard = true;  // sinks drop each frame once recorded (relaying sinks must keep them)
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "relay_bench: %s\n", why.c_str());
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
    else if (a == "--name") o.name = next();
    else if (a == "--listen") o.listen = next();
    else if (a == "--root") o.root = relay::parse_endpoint(next());
    else if (a == "--pki") o.pki = next();
    else if (a == "--port-file") o.port_file = next();
    else if (a == "--stop-file") o.stop_file = next();
    else if (a == "--out") o.out = next();
    else if (a == "--fanout") o.fanout = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--frames") o.frames = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--frame-kib") o.frame_kib = std::stoull(next());
    else if (a == "--retain-mib") o.retain_mib = std::stoull(next());
    else if (a == "--window-kib") o.window_kib = std::stoull(next());
    else if (a == "--block-kib") o.block_kib = std::stoull(next());
    else if (a == "--gap-ms") o.gap_ms = std::stoi(next());
    else if (a == "--keep") o.discard = false;
    else usage("unknown option " + a);
  }
  return o;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using bitrefit_bench::status_kib;

/// CPU seconds this process used (user + system), all threads.
double cpu_seconds() {
  std::ifstream in("/proc/self/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream f(s.substr(s.rfind(')') + 2));
  std::string x;
  unsigned long long ut = 0, st = 0;
  for (int i = 3; i <= 15; ++i) {
    f >> x;
    if (i == 14) ut = std::stoull(x);
    if (i == 15) st = std::stoull(x);
  }
  return double(ut + st) / double(::sysconf(_SC_CLK_TCK));
}

relay::node_options node_opts(const options& o, relay::node_role role) {
  relay::node_options n;
  n.role = role;
  n.name = o.name;
  n.cluster = "bench";
  n.tls = relay::pki::files(o.pki, o.name);
  n.fanout = o.fanout;
  n.root = o.root;
  n.listen_host = o.listen;
  n.retain_memory_bytes = o.retain_mib << 20;
  n.link_window_bytes = o.window_kib << 10;
  n.block_bytes = o.block_kib << 10;
  n.max_child_lag_bytes = 1ull << 40;  // measure, do not police
  n.owner_queue_bytes = 64ull << 20;
  n.log = [name = o.name](std::string_view l) { std::fprintf(stderr, "[%s] %.*s\n", name.c_str(), int(l.size()), l.data()); };
  return n;
}

json links_of(const relay::node_stats& st) {
  json a = json::array();
  auto all = st.closed;
  all.insert(all.end(), st.peers.begin(), st.peers.end());
  for (auto& p : all)
    a.push_back({{"name", p.name}, {"kind", p.kind}, {"bytes_in", p.counters.bytes_in}, {"bytes_out", p.counters.bytes_out},
                 {"frame_bytes_in", p.counters.frame_bytes_in}, {"frame_bytes_out", p.counters.frame_bytes_out},
                 {"control_bytes_in", p.counters.control_bytes_in}, {"control_bytes_out", p.counters.control_bytes_out},
                 {"wire_bytes_in", p.counters.wire_bytes_in}, {"wire_bytes_out", p.counters.wire_bytes_out}, {"lag_bytes", p.lag_bytes}});
  return a;
}

void write_json(const std::string& path, const json& j) { std::ofstream(path) << j.dump() << "\n"; }

int run_root(const options& o) {
  relay::tree_transport root(node_opts(o, relay::node_role::root));
  std::ofstream(o.port_file) << root.listening().port << "\n";
  std::this_thread::sleep_for(200ms);
  const std::uint64_t idle_rss = status_kib("VmRSS:");
  json samples = json::array();
  while (!fs::exists(o.stop_file)) {
    std::this_thread::sleep_for(200ms);
    const auto st = root.stats();
    samples.push_back({{"t_ns", now_ns()}, {"rss_kib", status_kib("VmRSS:")}, {"memory_bytes", st.memory_bytes}, {"spilled_bytes", st.spilled_bytes}});
  }
  const auto st = root.stats();
  write_json(o.out, {{"idle_rss_kib", idle_rss}, {"peak_rss_kib", status_kib("VmHWM:")}, {"cpu_s", cpu_seconds()}, {"links", links_of(st)},
                     {"retain_memory_bytes", o.retain_mib << 20}, {"link_window_bytes", o.window_kib << 10}, {"fanout", o.fanout},
                     {"block_bytes", o.block_kib << 10}, {"samples", samples}});
  return 0;
}

int run_sink(const options& o) {
  relay::tree_transport t(node_opts(o, relay::node_role::member));
  if (!t.wait_attached(20s)) usage("could not attach");
  std::ofstream(o.out + ".ready") << t.stats().depth << "\n";
  std::ofstream out(o.out);
  std::uint32_t next = 0;
  auto last_dump = std::chrono::steady_clock::now();
  while (next < o.frames && !fs::exists(o.stop_file)) {
    if (std::chrono::steady_clock::now() - last_dump > 1s) {
      last_dump = std::chrono::steady_clock::now();
      const auto st = t.stats();
      write_json(o.out + ".progress", {{"next", next}, {"frames", st.frames}, {"memory_bytes", st.memory_bytes}, {"spilled_bytes", st.spilled_bytes}, {"links", links_of(st)}});
    }
    (void)t.receive("sink", 100ms);  // wakes when a frame completed here
    for (;;) {
      const bitrefit::transport::stream_key s{"a1." + std::to_string(next)};
      const auto keys = t.list(s);
      if (keys.empty()) break;
      const auto at = now_ns();
      const auto st = t.stats();
      out << json{{"seq", next}, {"t_ns", at}, {"depth", st.depth}, {"frames", keys.size()}}.dump() << "\n";
      if (o.discard) t.discard(s);
      ++next;
    }
  }
  out.flush();
  write_json(o.out + ".links", {{"links", links_of(t.stats())}, {"peak_rss_kib", status_kib("VmHWM:")}, {"cpu_s", cpu_seconds()}});
  return next == o.frames ? 0 : 1;
}

int run_source(const options& o) {
  relay::tree_transport t(node_opts(o, relay::node_role::owner));
  if (!t.wait_attached(20s)) usage("could not attach");
  std::vector<std::byte> frame(o.frame_kib << 10);
  std::mt19937_64 rng(1);
  for (auto& b : frame) b = static_cast<std::byte>(rng());
  json starts = json::array();
  const auto t0 = now_ns();
  for (std::uint32_t i = 0; i < o.frames; ++i) {
    starts.push_back(now_ns());
    t.publish({{"a1." + std::to_string(i)}, 0, i}, frame);  // returns once queued (backpressure)
    if (o.gap_ms) std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
  }
  const auto queued = now_ns();
  // wait until the root link drained
  for (int i = 0; i < 6000; ++i) {
    const auto st = t.stats();
    std::uint64_t out = 0;
    for (auto& p : st.peers) out += p.counters.frame_bytes_out;
    if (out >= std::uint64_t(o.frames) * frame.size()) break;
    std::this_thread::sleep_for(5ms);
  }
  std::this_thread::sleep_for(300ms);
  write_json(o.out, {{"t0_ns", t0}, {"queued_ns", queued}, {"cpu_s", cpu_seconds()}, {"starts_ns", starts}, {"frame_bytes", frame.size()}, {"frames", o.frames},
                     {"links", links_of(t.stats())}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    if (o.role == "pki") {  // --pki DIR --name a,b,c
      relay::pki::make_cluster_ca(o.pki, "bench");
      std::string cur;
      for (char c : o.name + ",") {
        if (c == ',') {
          if (!cur.empty()) relay::pki::issue(o.pki, cur);
          cur.clear();
        } else {
          cur += c;
        }
      }
      return 0;
    }
    if (o.role == "root") return run_root(o);
    if (o.role == "sink") return run_sink(o);
    if (o.role == "source") return run_source(o);
    usage("--role must be pki, root, sink or source");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relay_bench: %s\n", e.what());
    return 1;
  }
}
