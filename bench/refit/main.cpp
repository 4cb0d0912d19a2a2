// bitrefit-bench-refit — end-to-end refit over a rate-limited link: dense vs overwrite vs bitrefit.
//
//   bitrefit-bench-refit [--methods dense,overwrite,bitrefit] [--link 200mbit,1gbit]
//                        [--changes adamw:3,0,0.01,0.03,0.05] [--model-mib 1024] [--receivers 3]
//                        [--transport dir,relay,s3] [--net auto|netns|loopback] [--out DIR]
//   /usr/bin/python3 bench/refit/plot.py DIR        # PNGs, the paper-style table, the projection
//
// One binary, four roles. The orchestrator (default role) builds the link (link.hpp: two network
// namespaces and a veth pair with tbf on the trainer's egress; loopback + token bucket without
// root), then runs one SESSION per (link, method): the transport's rollout-side service, R rollout
// processes and one trainer process (trainer.hpp, rollout.hpp), each session replaying the same version sequence
// (workload.hpp) from the same version 0 (trainer.hpp, rollout.hpp). The trainer writes one JSON object per refit; the
// orchestrator gathers them into DIR/runs.jsonl and DIR/results.csv. Methods of one link run one
// after the other, so their times are measured side by side on the same machine state.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rollout.hpp"
#include "trainer.hpp"

namespace bench {

namespace {

std::atomic<bool> interrupted{false};

pid_t spawn(const std::vector<std::string>& args, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid < 0) throw error(errc::io, "fork failed");
  if (pid == 0) {
    if (!log.empty()) {  // every role of the session writes to the session's log
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::perror("execvp");
    ::_exit(127);
  }
  return pid;
}

/// Sends SIGTERM to each live child, waits up to 10 s, then SIGKILLs what is left.
void stop_all(std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (p > 0) ::kill(p, SIGTERM);
  const auto until = steady::now() + 10s;
  for (pid_t& p : pids) {
    while (p > 0) {
      int st = 0;
      const pid_t r = ::waitpid(p, &st, WNOHANG);
      if (r == p || r < 0) {
        p = -1;
        break;
      }
      if (steady::now() > until) {
        ::kill(p, SIGKILL);
        ::waitpid(p, &st, 0);
        p = -1;
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
}

std::string read_file_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct net_setup {
  std::unique_ptr<netns_pair> ns;
  std::string label;
};

net_setup make_net(const options& o) {
  net_setup n;
  if (o.net != "loopback") {
    if (::geteuid() != 0) {
      if (o.net == "netns") usage("--net netns needs root (network namespaces, tc)");
      std::fprintf(stderr, "bitrefit-bench-refit: not root, so no network namespaces: running on LOOPBACK with a token-bucket "
                           "limiter in the trainer's transport (results are labelled net=loopback+token-bucket)\n");
    } else {
      try {
        n.ns = std::make_unique<netns_pair>(std::to_string(::getpid()));
        n.label = "netns-veth-tbf";
        return n;
      } catch (const std::exception& e) {
        if (o.net == "netns") throw;
        std::fprintf(stderr, "bitrefit-bench-refit: cannot create network namespaces (%s): running on LOOPBACK with a "
                             "token-bucket limiter in the trainer's transport (net=loopback+token-bucket)\n", e.what());
      }
    }
  }
  n.label = "loopback+token-bucket";
  return n;
}

/// One method over one link: service, receivers, trainer. Returns the trainer's JSON lines.
std::vector<std::string> run_session(const options& o, const net_setup& net, const std::string& self, const fs::path& work,
                                     const std::string& link, const std::string& method, int rep) {
  const fs::path dir = work / (o.transport + "-" + link + "-" + method + "-" + std::to_string(rep));  // also the s3 key prefix
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path log = dir / "session.log";
  auto in_ns = [&](const std::string& ns, std::vector<std::string> cmd) {
    if (!net.ns) return cmd;
    auto full = netns_pair::exec_in(ns);
    full.insert(full.end(), cmd.begin(), cmd.end());
    return full;
  };
  const std::string rollout_ns = net.ns ? net.ns->rollout_ns : "", trainer_ns = net.ns ? net.ns->trainer_ns : "";
  std::vector<pid_t> services, receivers;
  pid_t trainer = -1;
  auto cleanup = [&] {
    std::vector<pid_t> all = receivers;
    all.insert(all.end(), services.begin(), services.end());
    if (trainer > 0) all.push_back(trainer);
    stop_all(all);
    trainer = -1;
    receivers.clear();
    services.clear();
  };
  try {
    const fs::path port_file = dir / "port";
    services.push_back(spawn(in_ns(rollout_ns, service_command(o, o.transport, self, dir.string(), port_file.string())), log));
    const auto until = steady::now() + 120s;  // moto takes seconds to start on a loaded machine
    while (!fs::exists(port_file)) {
      int st = 0;
      if (::waitpid(services.back(), &st, WNOHANG) == services.back()) {
        services.back() = -1;
        throw error(errc::io, "the rollout-side service exited at start; see the log", {.file = log.string(), .tensor = {}, .field = {}});
      }
      if (steady::now() > until) throw error(errc::io, "the rollout-side service did not start", {.file = log.string(), .tensor = {}, .field = {}});
      std::this_thread::sleep_for(20ms);
    }
    const std::string port = read_file_text(port_file);
    auto common = common_args(o);
    for (int i = 0; i < o.receivers; ++i) {
      std::vector<std::string> cmd{self, "--role", "rollout", "--method", method, "--index", std::to_string(i),
                                   "--host", "127.0.0.1", "--port", port, "--session", dir.string()};
      cmd.insert(cmd.end(), common.begin(), common.end());
      receivers.push_back(spawn(in_ns(rollout_ns, cmd), log));
    }
    std::vector<std::string> cmd{self, "--role", "trainer", "--method", method, "--one-link", link, "--net-label", net.label,
                                 "--host", net.ns ? net.ns->rollout_ip : "127.0.0.1", "--port", port, "--session", dir.string()};
    if (net.ns) cmd.insert(cmd.end(), {"--shape-dev", net.ns->trainer_dev});
    cmd.insert(cmd.end(), common.begin(), common.end());
    trainer = spawn(in_ns(trainer_ns, cmd), log);
    const auto deadline = steady::now() + std::chrono::seconds(o.session_timeout_s);
    std::uint64_t shown = 0;
    auto show_progress = [&] {  // the trainer's per-refit lines and any error, as they come
      const std::string text = read_file_text(log);
      std::size_t end = text.rfind('\n');
      if (end == std::string::npos || end + 1 <= shown) return;
      std::istringstream lines(text.substr(shown, end + 1 - shown));
      for (std::string line; std::getline(lines, line);)
        if (line.rfind("bench trainer", 0) == 0 || line.rfind("bitrefit-bench-refit", 0) == 0) std::fprintf(stderr, "%s\n", line.c_str());
      shown = end + 1;
    };
    for (;;) {
      show_progress();
      int st = 0;
      if (::waitpid(trainer, &st, WNOHANG) == trainer) {
        trainer = -1;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
          throw error(errc::protocol, "the trainer of session " + dir.filename().string() + " failed (status " + std::to_string(st) + "); see the log",
                      {.file = log.string(), .tensor = {}, .field = {}});
        break;
      }
      for (pid_t p : receivers)
        if (::waitpid(p, &st, WNOHANG) == p)
          throw error(errc::protocol, "a rollout process of session " + dir.filename().string() + " exited early; see the log",
                      {.file = log.string(), .tensor = {}, .field = {}});
      if (interrupted) throw error(errc::io, "interrupted");
      if (steady::now() > deadline) throw error(errc::protocol, "session timed out (--session-timeout-s)", {.file = log.string(), .tensor = {}, .field = {}});
      std::this_thread::sleep_for(200ms);
    }
    show_progress();
    cleanup();
  } catch (...) {
    cleanup();
    std::fprintf(stderr, "---- %s (tail) ----\n", log.c_str());
    const std::string text = read_file_text(log);
    std::fprintf(stderr, "%s\n", text.substr(text.size() > 4000 ? text.size() - 4000 : 0).c_str());
    throw;
  }
  std::vector<std::string> lines;
  std::ifstream in(dir / "runs.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  if (!o.keep) fs::remove_all(dir);
  return lines;
}

std::string csv_field(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_float()) {
    char b[40];
    std::snprintf(b, sizeof b, "%.10g", v.get<double>());
    return b;
  }
  return v.dump();
}

void write_csv(const fs::path& path, const std::vector<json>& runs) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cols{
      {"method", {"inputs", "method"}},         {"transport", {"inputs", "transport"}},  {"net", {"inputs", "net"}},
      {"link", {"inputs", "link"}},             {"link_bits_per_s", {"inputs", "link_bits_per_s"}},
      {"receivers", {"inputs", "receivers"}},   {"mode", {"inputs", "mode"}},          {"model_bytes", {"inputs", "model", "bytes"}},
      {"params", {"inputs", "model", "params"}}, {"step", {"change", "step"}},          {"version", {"version"}},
      {"change_rate", {"change_rate"}},         {"changed", {"changed"}},              {"payload_bytes", {"payload_bytes"}},
      {"dense_bytes", {"dense_bytes"}},         {"frames", {"frames"}},                {"attempts", {"attempts"}},
      {"committed", {"committed"}},             {"bit_exact", {"bit_exact"}},          {"total_s", {"total_s"}},
      {"compare_s", {"phases_s", "compare"}},   {"encode_s", {"phases_s", "encode"}},  {"transfer_s", {"phases_s", "transfer"}},
      {"apply_s", {"phases_s", "apply"}},       {"sync_s", {"phases_s", "sync"}},      {"commit_s", {"phases_s", "commit"}},
      {"persist_s", {"phases_s", "persist"}},   {"wire_s", {"wire_s"}},                {"gate_closed_s", {"gate_closed_s"}},
      {"link_t2r_bytes", {"bytes_per_link", "trainer_to_rollout"}},
      {"link_r2t_bytes", {"bytes_per_link", "rollout_to_trainer"}},
      {"app_t2r_bytes", {"bytes_per_link", "app_trainer_to_rollout"}},
      {"app_r2t_bytes", {"bytes_per_link", "app_rollout_to_trainer"}},
      {"trainer_cpu_s", {"trainer_cpu_s"}},     {"loadavg_1m", {"loadavg_1m"}},        {"repeat", {"repeat"}}};
  std::ofstream out(path);
  for (std::size_t i = 0; i < cols.size(); ++i) out << (i ? "," : "") << cols[i].first;
  out << "\n";
  for (const json& r : runs) {
    for (std::size_t i = 0; i < cols.size(); ++i) {
      const json* v = &r;
      for (const auto& k : cols[i].second) {
        if (!v->is_object() || !v->contains(k)) {
          static const json null_value;
          v = &null_value;
          break;
        }
        v = &(*v)[k];
      }
      out << (i ? "," : "") << csv_field(*v);
    }
    out << "\n";
  }
}

int run_orchestrator(const options& o, int argc, char** argv) {
  std::signal(SIGINT, [](int) { interrupted = true; });
  std::signal(SIGTERM, [](int) { interrupted = true; });
  const auto steps = parse_changes(o.changes);
  for (const auto& l : o.links) parse_link_rate(l);  // fail early on a bad rate
  std::vector<std::string> transports;  // the ones this machine can run, in the order asked
  for (const auto& t : o.transports) {
    if (std::find(known_transports.begin(), known_transports.end(), t) == known_transports.end())
      usage("unknown transport '" + t + "' (known: dir, relay, s3)");
    if (const auto why = transport_unavailable(t); !why.empty())
      std::fprintf(stderr, "bitrefit-bench-refit: SKIPPING transport %s: %s\n", t.c_str(), why.c_str());
    else
      transports.push_back(t);
  }
  if (transports.empty()) usage("none of the transports asked for can run here");
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const fs::path out = o.out;
  fs::create_directories(out);
  const fs::path work = o.workdir.empty() ? fs::temp_directory_path() / ("bitrefit-bench-refit-" + std::to_string(::getpid())) : fs::path(o.workdir);
  fs::create_directories(work);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  {
    std::ofstream(out / "command.txt", o.append ? std::ios::app : std::ios::trunc) << command << "\n";
  }
  const net_setup net = make_net(o);
  const auto man = manifest_of(sim::llama_like(dims_for_bytes(o.model_mib << 20)));
  std::fprintf(stderr,
               "bitrefit-bench-refit: model %.1f MiB BF16 (%llu params), %d receivers, transports %zu, net %s, links %zu, "
               "methods %zu, %zu versions per session\n",
               double(man.total_bytes()) / 1048576.0, static_cast<unsigned long long>(man.total_elements()), o.receivers,
               transports.size(), net.label.c_str(), o.links.size(), o.methods.size(), steps.size());
  std::vector<json> runs;
  if (o.append) {  // earlier invocations' runs stay, and count in results.csv and the summary
    std::ifstream in(out / "runs.jsonl");
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) runs.push_back(json::parse(line));
  }
  std::ofstream jsonl(out / "runs.jsonl", o.append ? std::ios::app : std::ios::trunc);
  int status = 0;
  try {
    for (int rep = 0; rep < o.repeat; ++rep)
      for (const auto& tr : transports)
      for (const auto& link : o.links)
        for (const auto& method : o.methods) {
          options so = o;  // the session's roles get this one transport
          so.transport = tr;
          std::fprintf(stderr, "== session: %s over %s (%s), repeat %d/%d\n", method.c_str(), link.c_str(), tr.c_str(), rep + 1,
                       o.repeat);
          for (const auto& line : run_session(so, net, self, work, link, method, rep)) {
            json j = json::parse(line);
            j["repeat"] = rep;
            jsonl << j.dump() << "\n";
            jsonl.flush();
            runs.push_back(std::move(j));
          }
        }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bitrefit-bench-refit: %s\n", e.what());
    status = 1;
  }
  write_csv(out / "results.csv", runs);
  if (o.workdir.empty() && !o.keep) fs::remove_all(work);
  // the side-by-side ratios, per link and change step
  using case_key = std::tuple<std::string, std::string, std::string, std::string>;  // transport, link, step, method
  std::map<case_key, std::vector<double>> times;
  for (const auto& r : runs)
    times[{r["inputs"]["transport"], r["inputs"]["link"], r["change"]["step"], r["inputs"]["method"]}].push_back(r["total_s"].get<double>());
  std::map<case_key, double> t;  // best of the repeats (as plot.py)
  for (auto& [k, v] : times) t[k] = *std::min_element(v.begin(), v.end());
  std::fprintf(stderr, "%-6s %-10s %-16s %10s %10s %10s %12s %14s\n", "trans", "link", "change", "dense s", "overwrite s", "bitrefit s", "dense/bitref",
               "bitref/overwr");
  for (const auto& tr : transports)
  for (const auto& link : o.links)
    for (const auto& s : steps) {
      auto get = [&](const char* m) {
        auto it = t.find({tr, link, s.label(), m});
        return it == t.end() ? 0.0 : it->second;
      };
      const double d = get("dense"), w = get("overwrite"), b = get("bitrefit");
      std::fprintf(stderr, "%-6s %-10s %-16s %10.3f %10.3f %10.3f %12.1f %14.2f\n", tr.c_str(), link.c_str(), s.label().c_str(), d, w, b,
                   b > 0 ? d / b : 0.0, w > 0 ? b / w : 0.0);
    }
  std::fprintf(stderr, "bitrefit-bench-refit: %zu runs -> %s/runs.jsonl, %s/results.csv\n", runs.size(), out.c_str(), out.c_str());
  return status;
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  using namespace bench;
  const options o = parse_options(argc, argv);
  try {
    if (o.role == "orchestrator") return run_orchestrator(o, argc, argv);
    if (o.role == "trainer") return run_trainer(o);
    if (o.role == "rollout") return run_rollout(o);
    if (o.role == "store") return run_store(o);
    if (o.role == "relay-root" || o.role == "s3-server") {
      install_stop_handler();
      return o.role == "relay-root" ? run_relay_root(o, stop_requested) : run_s3_server(o, stop_requested);
    }
    usage("unknown role " + o.role);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bitrefit-bench-refit (%s): %s\n", o.role.c_str(), e.what());
    return 1;
  }
}
