// bench/refit/options.hpp — the bench's command line (one struct for every role of the binary).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace bench {

struct options {
  // --- what is compared ---
  std::vector<std::string> methods{"dense", "overwrite", "bitrefit"};
  std::vector<std::string> links{"200mbit", "1gbit"};
  std::string changes = "adamw:3,0,0.01,0.03,0.05";  // the version sequence every method replays
  std::vector<std::string> transports{"dir"};  // --transport dir,relay,s3: one set of sessions each
  std::string transport = "dir";               // the transport of this session (roles get one)
  std::uint64_t model_mib = 1024;  // BF16 bytes of the model (about model_mib * 2^19 parameters)
  int receivers = 3;
  std::string mode = "sync";  // sync | async (gate policy)
  std::string net = "auto";   // auto | netns | loopback
  // --- engine knobs ---
  std::uint32_t owners = 2;
  unsigned threads = 2;
  std::uint64_t frame_kib = 8192;
  int zstd_level = 3;
  int poll_ms = 2;  // the engine's default poll (sender_options/receiver_options)
  int deadline_ms = 60000;
  std::uint64_t seed = 42;
  bool attest = true;  // receivers attest every refit (DESIGN: every refit, every k-th, or off)
  int repeat = 1;      // the whole grid this many times (plots and table take the best run)
  // --- where results go ---
  std::string out = "bench-refit-out";
  std::string workdir;  // scratch (object store, commit log, baselines); default under /tmp
  bool keep = false;
  bool append = false;  // add to DIR/runs.jsonl instead of starting it afresh (e.g. dense once, engine methods repeated)
  int session_timeout_s = 3600;
  // --- internal: roles started by the orchestrator ---
  std::string role = "orchestrator";  // orchestrator | trainer | rollout | store | relay-root | s3-server
  std::string method;                 // trainer/rollout: the one method of this session
  std::string link;                   // trainer: the one link of this session
  std::string net_label;              // trainer: how the link is made (for the JSON)
  std::string host = "127.0.0.1";     // where this role reaches the rollout-side service
  int port = 0;
  std::string session;                // session directory
  std::string shape_dev;              // trainer, netns mode: its veth end to shape with tc
  int index = 0;                      // rollout: receiver index
  std::string port_file;              // store, relay-root, s3-server: where it writes the port it listens on
};

[[noreturn]] inline void usage(const std::string& why) {
  std::fprintf(stderr,
               "bitrefit-bench-refit: %s\n"
               "usage: bitrefit-bench-refit [--methods dense,overwrite,bitrefit] [--link 200mbit,1gbit]\n"
               "         [--changes adamw:3,0,0.01,0.03,0.05] [--transport dir,relay,s3] [--model-mib 1024]\n"
               "         [--receivers 3] [--mode sync|async] [--net auto|netns|loopback] [--owners 2]\n"
               "         [--threads 2] [--frame-kib 8192] [--zstd-level 3] [--poll-ms 2] [--deadline-ms 60000]\n"
               "         [--seed 42] [--attest on|off] [--repeat 1] [--out DIR] [--append] [--workdir DIR] [--keep]\n"
               "         [--session-timeout-s 3600]\n"
               "Writes DIR/runs.jsonl (one JSON object per refit) and DIR/results.csv; plot with\n"
               "  /usr/bin/python3 bench/refit/plot.py DIR\n",
               why.c_str());
  std::exit(2);
}

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) out.push_back(std::exchange(cur, {}));
    else cur.push_back(c);
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

inline std::uint64_t parse_uint(const std::string& s, const std::string& flag) {
  try {
    std::size_t used = 0;
    const unsigned long long v = std::stoull(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  usage(flag + " needs a non-negative integer, got '" + s + "'");
}

inline options parse_options(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    auto num = [&] { return parse_uint(next(), a); };
    if (a == "--methods") o.methods = split(next(), ',');
    else if (a == "--link") o.links = split(next(), ',');
    else if (a == "--changes" || a == "--change") o.changes = next();
    else if (a == "--transport") {
      o.transports = split(next(), ',');
      if (o.transports.empty()) usage("--transport needs at least one of dir, relay, s3");
      o.transport = o.transports.front();
    }
    else if (a == "--model-mib") o.model_mib = num();
    else if (a == "--receivers") o.receivers = static_cast<int>(num());
    else if (a == "--mode") o.mode = next();
    else if (a == "--net") o.net = next();
    else if (a == "--owners") o.owners = static_cast<std::uint32_t>(num());
    else if (a == "--threads") o.threads = static_cast<unsigned>(num());
    else if (a == "--frame-kib") o.frame_kib = num();
    else if (a == "--zstd-level") o.zstd_level = static_cast<int>(num());
    else if (a == "--poll-ms") o.poll_ms = static_cast<int>(num());
    else if (a == "--deadline-ms") o.deadline_ms = static_cast<int>(num());
    else if (a == "--seed") o.seed = num();
    else if (a == "--attest") {
      const std::string v = next();
      if (v != "on" && v != "off") usage("--attest must be on or off");
      o.attest = v == "on";
    } else if (a == "--repeat") o.repeat = static_cast<int>(num());
    else if (a == "--out") o.out = next();
    else if (a == "--workdir") o.workdir = next();
    else if (a == "--keep") o.keep = true;
    else if (a == "--append") o.append = true;
    else if (a == "--session-timeout-s") o.session_timeout_s = static_cast<int>(num());
    else if (a == "--role") o.role = next();
    else if (a == "--method") o.method = next();
    else if (a == "--one-link") o.link = next();
    else if (a == "--net-label") o.net_label = next();
    else if (a == "--host") o.host = next();
    else if (a == "--port") o.port = static_cast<int>(num());
    else if (a == "--session") o.session = next();
    else if (a == "--shape-dev") o.shape_dev = next();
    else if (a == "--index") o.index = static_cast<int>(num());
    else if (a == "--port-file") o.port_file = next();
    else if (a == "--help" || a == "-h") usage("help");
    else usage("unknown option " + a);
  }
  for (const auto& m : o.methods)
    if (m != "dense" && m != "overwrite" && m != "bitrefit") usage("unknown method '" + m + "' (dense, overwrite, bitrefit)");
  if (o.methods.empty() || o.links.empty()) usage("--methods and --link need at least one entry");
  if (o.receivers < 1) usage("--receivers must be at least 1");
  if (o.owners < 1 || o.threads < 1 || o.frame_kib < 64) usage("--owners and --threads must be >= 1, --frame-kib >= 64");
  if (o.model_mib < 1) usage("--model-mib must be at least 1");
  if (o.repeat < 1) usage("--repeat must be at least 1");
  if (o.mode != "sync" && o.mode != "async") usage("--mode must be sync or async");
  if (o.net != "auto" && o.net != "netns" && o.net != "loopback") usage("--net must be auto, netns or loopback");
  return o;
}

/// The options every role shares, as arguments (the orchestrator starts roles with these).
inline std::vector<std::string> common_args(const options& o) {
  return {"--changes",   o.changes,     "--transport",  o.transport,
          "--model-mib", std::to_string(o.model_mib), "--receivers", std::to_string(o.receivers),
          "--mode",      o.mode,        "--owners",     std::to_string(o.owners),
          "--threads",   std::to_string(o.threads),   "--frame-kib", std::to_string(o.frame_kib),
          "--zstd-level", std::to_string(o.zstd_level), "--poll-ms", std::to_string(o.poll_ms),
          "--deadline-ms", std::to_string(o.deadline_ms), "--seed", std::to_string(o.seed),
          "--attest", o.attest ? "on" : "off"};
}

}  // namespace bench
