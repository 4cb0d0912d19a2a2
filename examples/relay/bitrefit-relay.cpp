// bitrefit-relay — the root relay of a relay tree, as its own process (and a throwaway CA).
//
//   bitrefit-relay serve --listen HOST:PORT --cluster NAME --ca ca.pem --cert relay.pem --key relay.key
//                        [--fanout K] [--retain-mib M] [--spool-dir D] [--stats-every S]
//   bitrefit-relay pki DIR --cluster NAME NODE...     (a CA in DIR and one certificate per node)
//
// Run `serve` on a host of the rollout cluster that the trainer cluster can reach: owners (the
// trainer's refit sender, relay::node_role::owner) send each payload frame to it once, and it
// fans out to the rollout processes (relay::node_role::member), which relay further down a tree of
// fanout K. It keeps the active attempt's frames (beyond --retain-mib in a spool file) so children
// that rejoin get what they missed, and it prints one line of link counters every S seconds.
// The relay README (include/bitrefit/transport/relay/README.md) shows a whole deployment.
#include <utility>  // Boost 1.74's Asio wants <utility> before it

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "bitrefit/transport/relay/pki.hpp"
#include "bitrefit/transport/relay/tree_transport.hpp"

namespace relay = bitrefit::transport::relay;
using namespace std::chrono_literals;

namespace {

volatile std::sig_atomic_t stop = 0;

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bitrefit-relay: %s\n"
               "usage: bitrefit-relay serve --listen HOST:PORT --cluster NAME --ca ca.pem --cert relay.pem --key relay.key\n"
               "                            [--fanout K] [--retain-mib M] [--spool-dir D] [--stats-every S]\n"
               "       bitrefit-relay pki DIR --cluster NAME NODE...\n",
               why.c_str());
  std::exit(2);
}

int serve(int argc, char** argv) {
  relay::node_options o;
  o.role = relay::node_role::root;
  o.name = "root";
  int stats_every = 10;
  bool have_listen = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--listen") {
      const auto ep = relay::parse_endpoint(next());
      o.listen_host = ep.host;
      o.listen_port = ep.port;
      have_listen = true;
    } else if (a == "--cluster") o.cluster = next();
    else if (a == "--ca") o.tls.ca = next();
    else if (a == "--cert") o.tls.cert = next();
    else if (a == "--key") o.tls.key = next();
    else if (a == "--fanout") o.fanout = static_cast<std::uint32_t>(std::stoul(next()));
    else if (a == "--retain-mib") o.retain_memory_bytes = std::stoull(next()) << 20;
    else if (a == "--spool-dir") o.spool_dir = next();
    else if (a == "--stats-every") stats_every = std::stoi(next());
    else usage("unknown option " + a);
  }
  if (!have_listen) usage("--listen is required");
  relay::tree_transport root(o);
  std::printf("bitrefit-relay: root of cluster '%s' listening on %s, fanout %u\n", o.cluster.c_str(), root.listening().to_string().c_str(), o.fanout);
  std::fflush(stdout);
  std::signal(SIGINT, [](int) { stop = 1; });
  std::signal(SIGTERM, [](int) { stop = 1; });
  auto next_stats = std::chrono::steady_clock::now() + std::chrono::seconds(stats_every);
  while (!stop) {
    std::this_thread::sleep_for(100ms);
    if (stats_every > 0 && std::chrono::steady_clock::now() >= next_stats) {
      next_stats += std::chrono::seconds(stats_every);
      const auto st = root.stats();
      std::printf("frames held %zu (%.1f MiB in memory, %.1f MiB spilled)", st.frames, double(st.memory_bytes) / 1048576.0, double(st.spilled_bytes) / 1048576.0);
      for (auto& p : st.peers)
        std::printf("; %s %s: in %.1f MiB, out %.1f MiB, behind %.1f MiB", p.kind.c_str(), p.name.c_str(), double(p.counters.frame_bytes_in) / 1048576.0,
                    double(p.counters.frame_bytes_out) / 1048576.0, double(p.lag_bytes) / 1048576.0);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

int pki(int argc, char** argv) {
  if (argc < 4) usage("pki needs a directory");
  const std::string dir = argv[2];
  std::string cluster = "bitrefit";
  std::vector<std::string> nodes;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cluster" && i + 1 < argc) cluster = argv[++i];
    else nodes.push_back(a);
  }
  relay::pki::make_cluster_ca(dir, cluster);
  for (auto& n : nodes) {
    const auto f = relay::pki::issue(dir, n);
    std::printf("%s: --ca %s --cert %s --key %s\n", n.c_str(), f.ca.c_str(), f.cert.c_str(), f.key.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) usage("a command is required");
    const std::string cmd = argv[1];
    if (cmd == "serve") return serve(argc, argv);
    if (cmd == "pki") return pki(argc, argv);
    usage("unknown command " + cmd);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bitrefit-relay: %s\n", e.what());
    return 1;
  }
}
