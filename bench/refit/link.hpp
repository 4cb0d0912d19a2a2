// bench/refit/link.hpp — the link between the trainer side and the rollout side.
//
// With root (and CAP_NET_ADMIN): two network namespaces, "trainer" and "rollout", joined by one
// veth pair. The trainer's end carries a `tc qdisc tbf` on its egress, so the trainer->rollout
// direction runs at the given rate; rollout->trainer (acks, control replies) and every link inside
// the rollout namespace (receivers <-> the rollout-side service) are unlimited, as intra-cluster
// links are. The kernel paces the bytes on the wire, TCP/IP headers included.
// Without root, or when namespaces cannot be made: everything on loopback and the trainer's own
// transport paces what it sends with a token bucket (token_bucket.hpp) — labelled as such in every
// result ("net": "loopback+token-bucket").
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "bitrefit/core/error.hpp"

extern char** environ;

namespace bench {

/// A link rate as `tc` spells it: "200mbit", "1gbit", "500kbit" (SI: 1 mbit = 10^6 bit/s), or
/// "unlimited".
struct link_rate {
  std::string name;
  double bits_per_s = 0;  // 0: unlimited
  double bytes_per_s() const { return bits_per_s / 8; }
};

inline link_rate parse_link_rate(const std::string& s) {
  if (s == "unlimited" || s == "none") return {"unlimited", 0};
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = s.substr(used);
  double mult = 0;
  if (unit == "kbit") mult = 1e3;
  else if (unit == "mbit") mult = 1e6;
  else if (unit == "gbit") mult = 1e9;
  else if (unit == "bit") mult = 1;
  if (used == 0 || mult == 0 || !(v > 0))
    throw bitrefit::error(bitrefit::errc::invalid_argument, "link rate must look like 200mbit, 1gbit, 500kbit or unlimited: '" + s + "'",
                          {.file = {}, .tensor = {}, .field = "--link"});
  return {s, v * mult};
}

/// tbf's bucket: at least 64 KiB (one GSO segment of a veth) and 4 ms of traffic, so TCP can fill
/// the link without tbf dropping a burst it should have paced.
inline double tbf_burst_bytes(const link_rate& l) { return std::max(64.0 * 1024, l.bytes_per_s() * 0.004); }

/// Runs argv (PATH lookup), waits, returns its exit status (-1 when it could not start).
inline int run_command(const std::vector<std::string>& argv, bool quiet = false) {
  std::vector<char*> a;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) {
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, a[0], &fa, nullptr, a.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline void must(const std::vector<std::string>& argv) {
  if (run_command(argv) != 0) {
    std::string cmd;
    for (auto& s : argv) cmd += (cmd.empty() ? "" : " ") + s;
    throw bitrefit::error(bitrefit::errc::io, "command failed: " + cmd, {.file = {}, .tensor = {}, .field = {}});
  }
}

/// Two namespaces joined by a veth pair; removed (with the pair) when this object goes away.
class netns_pair {
 public:
  std::string trainer_ns, rollout_ns, trainer_dev, rollout_dev;
  std::string trainer_ip = "10.231.0.1", rollout_ip = "10.231.0.2";

  /// Creates both namespaces, the pair and the addresses; throws errc::io naming the failing command.
  explicit netns_pair(const std::string& tag) {
    trainer_ns = "brbench-" + tag + "-t";
    rollout_ns = "brbench-" + tag + "-r";
    trainer_dev = ("brt" + tag).substr(0, 15);
    rollout_dev = ("brr" + tag).substr(0, 15);
    try {
      must({"ip", "netns", "add", trainer_ns});
      made_t_ = true;
      must({"ip", "netns", "add", rollout_ns});
      made_r_ = true;
      must({"ip", "link", "add", trainer_dev, "type", "veth", "peer", "name", rollout_dev});
      must({"ip", "link", "set", trainer_dev, "netns", trainer_ns});
      must({"ip", "link", "set", rollout_dev, "netns", rollout_ns});
      must({"ip", "-n", trainer_ns, "addr", "add", trainer_ip + "/24", "dev", trainer_dev});
      must({"ip", "-n", rollout_ns, "addr", "add", rollout_ip + "/24", "dev", rollout_dev});
      for (auto [ns, dev] : {std::pair{trainer_ns, trainer_dev}, std::pair{rollout_ns, rollout_dev}}) {
        must({"ip", "-n", ns, "link", "set", "lo", "up"});
        must({"ip", "-n", ns, "link", "set", dev, "up"});
      }
    } catch (...) {
      remove();
      throw;
    }
  }
  netns_pair(const netns_pair&) = delete;
  netns_pair& operator=(const netns_pair&) = delete;
  ~netns_pair() { remove(); }

  /// argv prefix that runs a command inside namespace `ns`.
  static std::vector<std::string> exec_in(const std::string& ns) { return {"ip", "netns", "exec", ns}; }

 private:
  void remove() {
    if (made_t_) run_command({"ip", "netns", "del", trainer_ns}, true);  // takes the veth pair with it
    if (made_r_) run_command({"ip", "netns", "del", rollout_ns}, true);
    made_t_ = made_r_ = false;
  }
  bool made_t_ = false, made_r_ = false;
};

/// Shapes the egress of `dev` (run inside the namespace that owns it): tbf at `l`, or no qdisc for
/// an unlimited link.
inline void shape_egress(const std::string& dev, const link_rate& l) {
  if (l.bits_per_s <= 0) {
    run_command({"tc", "qdisc", "del", "dev", dev, "root"}, true);  // absent already: fine
    return;
  }
  char rate[64], burst[64];
  std::snprintf(rate, sizeof rate, "%.0fbit", l.bits_per_s);
  std::snprintf(burst, sizeof burst, "%.0fb", tbf_burst_bytes(l));
  must({"tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "latency", "50ms"});
}

/// Byte counters of an interface as the kernel counts them (frames on the wire, headers included).
struct if_counters {
  std::uint64_t tx = 0, rx = 0;
};
inline std::optional<if_counters> read_if_counters(const std::string& dev) {
  auto num = [&](const char* what) -> std::optional<std::uint64_t> {
    std::ifstream in("/sys/class/net/" + dev + "/statistics/" + what);
    std::uint64_t v = 0;
    if (!(in >> v)) return std::nullopt;
    return v;
  };
  auto tx = num("tx_bytes"), rx = num("rx_bytes");
  if (!tx || !rx) return std::nullopt;
  return if_counters{*tx, *rx};
}

}  // namespace bench
