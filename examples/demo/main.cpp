// bitrefit-demo — the main job: one trainer process and R rollout processes refit N times over the
// directory object store, with rollout processes killed mid-refit, and every commit checked
// bit for bit.
//
//   bitrefit-demo [--refits N] [--receivers R] [--kill-every K] [--params P] [--mode sync|async]
//                 [--json] [--dir D] [--threads T] [--owners O] [--frame-kib F] [--deadline-ms MS]
//                 [--restart-trainer-every K] [--crash-owner-every K] [--crash-sender-every K] [--fanout K]
//                 [--transport dir|s3|relay] [--s3-endpoint URL] [--s3-bucket NAME]
//                 [--commit-log file|etcd] [--etcd-endpoints URL[,URL]] [--etcd-prefix P]
//
// Where frames, commit log and baselines live is chosen by flags (stores.hpp): by default the
// directory object store and the filesystem log under --dir; with --transport s3 frames, control
// messages and the owners' baselines go to an S3 bucket, with --commit-log etcd the log is on etcd
// (scripts/demo-dist.sh runs it on moto and etcd on loopback); with --transport relay through the
// relay tree (net.hpp), the root relay in the trainer, --fanout children per relay.
//
// The trainer applies real AdamW steps (FP32 master weights, lr 1e-6, synthetic gradients,
// round-to-nearest-even BF16 export; testing/adamw.hpp) to a Llama-shaped model of about P parameters
// (default 100M) and runs the sender (coordinator + owners). Each rollout process is this binary
// started again with --role receiver: it keeps its weights in a shared mapping under /dev/shm
// (mapped_store.hpp), restores densely from the owners when it starts, and applies refits in place.
// Every K refits, one rollout process is told to die (SIGKILL, by itself, after it applied some but
// not all payloads of that refit); the trainer restarts it and the protocol retries in overwrite.
// After every commit the trainer waits until every rollout process holds the committed version and
// checks it two ways: the attestation digest it reports, and a full byte comparison of its mapped
// weights with the trainer's own dense BF16 copy.
// The owners keep their baselines in the durable filesystem baseline store (<dir>/baseline/owner-i:
// a full image plus each refit's sparse change set since, folded into a new full image every 16
// versions at most; consistent with the filesystem commit log in <dir>/log), so the trainer side survives restarts:
// every K refits (--restart-trainer-every, default 10) the refit engine (coordinator + owners) is
// torn down and started again from the durable state alone — no trainer copy — taking over with a
// new epoch; and with --crash-owner-every K an owner dies mid-stream every K refits and recovers
// K.v's baseline from its store while the coordinator retries the attempt; with
// --crash-sender-every K the whole sender (coordinator and owners) dies every K refits after some
// receivers applied and before compare-and-set, and a new one takes over from the commit log and the
// owners' stores alone, committing exactly the bits frozen at that refit (finding B1).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/testing/adamw.hpp"
#include "bitrefit/testing/crash_points.hpp"
#include "bitrefit/transport/object_store.hpp"
#include "mapped_store.hpp"
#include "net.hpp"
#include "stores.hpp"

namespace fs = std::filesystem;
using namespace bitrefit;
using namespace std::chrono_literals;

namespace {

struct options {
  int refits = 20;
  int receivers = 3;
  int kill_every = 5;  // the main job shows the retry path: kill one rollout mid-refit every 5 refits
  std::uint64_t params = 100'000'000;
  protocol::gate_policy mode = protocol::gate_policy::synchronous;
  bool json = false;
  std::string dir;
  unsigned threads = 2;
  std::uint32_t owners = 1;
  std::uint64_t frame_kib = 8192;
  int deadline_ms = 5000;
  int restart_trainer_every = 10;  // restart the refit engine from durable state before refit K+1, 2K+1, ...
  int crash_owner_every = 0;       // an owner crashes mid-stream in refit K, 2K, ...
  int crash_sender_every = 0;      // the whole sender dies before commit in refit K, 2K, ... and is taken over
  std::uint64_t seed = 42;
  bool keep = false;
  std::string trace;  // record every machine's steps here (wire/trace.hpp); check with bitrefit-check-trace
  demo::net_config net;  // --transport dir|s3|relay and the stores (net.stores), --fanout K
  // receiver role
  std::string role = "trainer";
  int index = 0;
  std::string shm;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bitrefit-demo: %s\n"
               "usage: bitrefit-demo [--refits N] [--receivers R] [--kill-every K] [--params P[K|M|G]]\n"
               "                     [--mode sync|async] [--json] [--dir D] [--threads T] [--owners O]\n"
               "                     [--frame-kib F] [--deadline-ms MS] [--seed S] [--keep]\n"
               "                     [--restart-trainer-every K] [--crash-owner-every K] [--crash-sender-every K] [--trace DIR]\n"
               "                     [--transport dir|s3|relay] [--fanout K] [--s3-endpoint URL] [--s3-bucket NAME]\n"
               "                     [--commit-log file|etcd] [--etcd-endpoints URL[,URL]] [--etcd-prefix P]\n",
               why.c_str());
  std::exit(2);
}

std::uint64_t parse_count(const std::string& s) {
  if (s.empty()) usage("empty number");
  std::uint64_t mult = 1;
  std::string digits = s;
  switch (s.back()) {
    case 'K': case 'k': mult = 1000; digits.pop_back(); break;
    case 'M': case 'm': mult = 1000'000; digits.pop_back(); break;
    case 'G': case 'g': mult = 1000'000'000; digits.pop_back(); break;
  }
  try {
    std::size_t used = 0;
    const double v = std::stod(digits, &used);
    if (used != digits.size() || v < 0) usage("not a number: " + s);
    return static_cast<std::uint64_t>(v * double(mult));
  } catch (const std::exception&) {
    usage("not a number: " + s);
  }
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--refits") o.refits = static_cast<int>(parse_count(next()));
    else if (a == "--receivers") o.receivers = static_cast<int>(parse_count(next()));
    else if (a == "--kill-every") o.kill_every = static_cast<int>(parse_count(next()));
    else if (a == "--params") o.params = parse_count(next());
    else if (a == "--mode") {
      const std::string m = next();
      if (m == "sync") o.mode = protocol::gate_policy::synchronous;
      else if (m == "async") o.mode = protocol::gate_policy::asynchronous;
      else usage("--mode must be sync or async");
    } else if (a == "--json") o.json = true;
    else if (a == "--dir") o.dir = next();
    else if (a == "--threads") o.threads = static_cast<unsigned>(parse_count(next()));
    else if (a == "--owners") o.owners = static_cast<std::uint32_t>(parse_count(next()));
    else if (a == "--frame-kib") o.frame_kib = parse_count(next());
    else if (a == "--deadline-ms") o.deadline_ms = static_cast<int>(parse_count(next()));
    else if (a == "--seed") o.seed = parse_count(next());
    else if (a == "--restart-trainer-every") o.restart_trainer_every = static_cast<int>(parse_count(next()));
    else if (a == "--crash-owner-every") o.crash_owner_every = static_cast<int>(parse_count(next()));
    else if (a == "--crash-sender-every") o.crash_sender_every = static_cast<int>(parse_count(next()));
    else if (a == "--keep") o.keep = true;
    else if (a == "--trace") o.trace = next();
    else if (a == "--transport") o.net.stores.transport = next();
    else if (a == "--s3-endpoint") o.net.stores.s3_endpoint = next();
    else if (a == "--s3-bucket") o.net.stores.s3_bucket = next();
    else if (a == "--s3-prefix") o.net.stores.s3_prefix = next();  // set by the trainer for its rollout processes
    else if (a == "--commit-log") o.net.stores.commit_log = next();
    else if (a == "--etcd-endpoints") o.net.stores.etcd_endpoints = next();
    else if (a == "--etcd-prefix") o.net.stores.etcd_prefix = next();
    else if (a == "--fanout") o.net.fanout = static_cast<std::uint32_t>(parse_count(next()));
    else if (a == "--relay-root") o.net.root = transport::relay::parse_endpoint(next());
    else if (a == "--role") o.role = next();
    else if (a == "--index") o.index = static_cast<int>(parse_count(next()));
    else if (a == "--shm") o.shm = next();
    else if (a == "--help" || a == "-h") usage("help");
    else usage("unknown option " + a);
  }
  if (o.receivers < 1) usage("--receivers must be at least 1");
  if (o.owners < 1 || o.threads < 1 || o.frame_kib < 1) usage("--owners, --threads and --frame-kib must be at least 1");
  if (o.params < 10'000) usage("--params must be at least 10K");
  if (const std::string why = o.net.stores.problem(); !why.empty()) usage(why);
  if (o.net.fanout < 1) usage("--fanout must be at least 1");
  return o;
}

/// A Llama-shaped decoder of about `p` parameters: width by size class, then as many layers as fit.
testing::llama_dims dims_for(std::uint64_t p) {
  testing::llama_dims d;
  if (p < 2'000'000) d = {1, 64, 172, 256, 4, 2, false};
  else if (p < 30'000'000) d = {1, 256, 688, 4096, 8, 4, false};
  else d = {1, 768, 2048, 32000, 12, 4, false};
  const std::uint64_t head = d.hidden / d.heads, kv = d.kv_heads * head;
  const std::uint64_t embed = 2 * d.vocab * d.hidden + d.hidden;
  const std::uint64_t layer = 2 * d.hidden * d.hidden + 2 * kv * d.hidden + 3 * d.hidden * d.intermediate + 2 * d.hidden;
  d.layers = p > embed ? std::max<std::uint64_t>(1, (p - embed + layer / 2) / layer) : 1;
  return d;
}

model_manifest manifest_of(const std::vector<testing::tensor_spec>& specs) {
  std::vector<tensor_info> ts;
  for (const auto& s : specs) ts.push_back({s.name, dtype::BF16, s.shape});
  return model_manifest(std::move(ts));
}

std::string mode_name(protocol::gate_policy g) { return g == protocol::gate_policy::synchronous ? "sync" : "async"; }

std::uint64_t read_number(const fs::path& p) {
  std::ifstream in(p);
  std::uint64_t v = 0;
  in >> v;
  return v;
}
void write_number_durably(const fs::path& p, std::uint64_t v) {
  const std::string s = std::to_string(v);
  io::write_file_atomically(p, std::as_bytes(std::span(s.data(), s.size())));
}

// ================================= rollout process =================================

int run_receiver(const options& o) {
  const fs::path dir = o.dir;
  const auto specs = testing::llama_like(dims_for(o.params));
  const model_manifest m = manifest_of(specs);
  // A (re)started process: a new incarnation, recorded durably before anything is sent under it.
  const fs::path inc_file = dir / "inc" / ("receiver-" + std::to_string(o.index));
  const std::uint64_t incarnation = read_number(inc_file) + 1;
  write_number_durably(inc_file, incarnation);
  demo::mapped_store weights(o.shm, m, /*writable=*/true, /*create=*/true);  // volatile: starts zeroed

  testing::crash_points faults;
  faults.set_on_fire([](const std::string&) { ::kill(::getpid(), SIGKILL); });  // die like a killed process
  demo::net_config nc = o.net;
  nc.dir = dir;
  demo::any_transport net = demo::rollout_net(nc, o.index);
  demo::any_commit_log log = demo::make_commit_log(o.net.stores, dir);

  using receiver_t = refit::receiver<demo::mapped_store, demo::any_transport, demo::any_commit_log, testing::crash_points>;
  receiver_t* self = nullptr;
  refit::receiver_options ro;
  ro.index = static_cast<std::uint32_t>(o.index);
  ro.incarnation = incarnation;
  ro.gate = o.mode;
  ro.poll = 5ms;
  ro.deadline = std::chrono::milliseconds(o.deadline_ms);
  ro.trace_dir = o.trace;
  ro.persist_incarnation = [&](std::uint64_t n) { write_number_durably(inc_file, n); };
  ro.on_commit = [&](const protocol::commit_record& k) {
    weights.publish({k.version, k.baseline.value, self->state().incarnation, self->attest()});
  };
  receiver_t r(weights, net, log, ro, faults);
  self = &r;
  r.start();
  const fs::path kill_order = dir / "kill" / ("receiver-" + std::to_string(o.index));
  const fs::path stop = dir / "stop";
  const pid_t parent = ::getppid();
  while (!fs::exists(stop) && ::getppid() == parent) {
    r.step(5ms);
    if (fs::exists(kill_order)) {  // the trainer wants this process dead after n applied payloads
      const std::uint64_t n = read_number(kill_order);
      fs::remove(kill_order);
      faults.arm("receiver_applied", n);
    }
  }
  return 0;
}

// ================================= trainer process =================================

struct child {
  pid_t pid = -1;
  std::string shm;
};

struct trainer {
  options o;
  std::string self_exe;
  std::vector<child> children;
  std::uint64_t kills = 0;

  void spawn(int i) {
    std::vector<std::string> args{
        self_exe,        "--role",    "receiver",       "--index",       std::to_string(i),
        "--dir",         o.dir,       "--params",       std::to_string(o.params),
        "--mode",        mode_name(o.mode),              "--deadline-ms", std::to_string(o.deadline_ms),
        "--shm",         children[i].shm,                "--fanout",      std::to_string(o.net.fanout),
        "--relay-root",  o.net.root.port ? o.net.root.to_string() : "127.0.0.1:1"};
    for (auto& a : o.net.stores.args()) args.push_back(a);
    if (!o.trace.empty()) args.insert(args.end(), {"--trace", o.trace});
    const pid_t pid = ::fork();
    if (pid < 0) throw error(errc::io, "fork failed");
    if (pid == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(self_exe.c_str(), argv.data());
      std::perror("execv");
      ::_exit(127);
    }
    children[i].pid = pid;
  }

  /// Reaps dead rollout processes and restarts them (a new incarnation restores and rejoins).
  void reap() {
    for (std::size_t i = 0; i < children.size(); ++i) {
      int status = 0;
      if (children[i].pid > 0 && ::waitpid(children[i].pid, &status, WNOHANG) == children[i].pid) {
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ++kills;
        else
          std::fprintf(stderr, "bitrefit-demo: rollout process %zu exited unexpectedly (status %d); restarting\n", i, status);
        spawn(static_cast<int>(i));
      }
    }
  }
};

int run_trainer(options o) {
  const bool own_dir = o.dir.empty();
  if (own_dir) o.dir = (fs::temp_directory_path() / ("bitrefit-demo-" + std::to_string(::getpid()))).string();
  const fs::path dir = o.dir;
  fs::remove_all(dir);
  for (auto sub : {"store", "log", "inc", "kill", "baseline"}) fs::create_directories(dir / sub);
  if (!o.trace.empty()) {  // one run per trace directory: never mix two runs' lines
    std::error_code ec;
    if (fs::exists(o.trace) && !fs::is_empty(o.trace, ec))
      throw error(errc::invalid_argument, "--trace: the directory is not empty (one run per trace directory)",
                  {.file = o.trace, .tensor = {}, .field = "trace"});
    fs::create_directories(o.trace);
  }
  // this run's own corner of the bucket and of etcd (version 0 starts from nothing)
  const std::string run = std::to_string(::getpid()) + "-" + std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  o.net.stores.s3_prefix = "bitrefit-demo/" + run + "/";
  o.net.stores.etcd_prefix += "/" + run;

  const auto dims = dims_for(o.params);
  const auto specs = testing::llama_like(dims);
  const model_manifest m = manifest_of(specs);
  std::map<std::string, std::size_t> sim_index;
  for (std::size_t i = 0; i < specs.size(); ++i) sim_index[specs[i].name] = i;

  if (!o.json)
    std::printf("bitrefit-demo: %" PRIu64 " parameters (%" PRIu64 " layers, hidden %" PRIu64 ", vocab %" PRIu64
                "), BF16 %.1f MiB; %d rollout processes, %d refits, mode %s, kill every %d, "
                "trainer restart every %d, owner crash every %d; transport %s, commit log %s\n",
                m.total_elements(), dims.layers, dims.hidden, dims.vocab, double(m.total_bytes()) / 1048576.0,
                o.receivers, o.refits, mode_name(o.mode).c_str(), o.kill_every, o.restart_trainer_every, o.crash_owner_every,
                o.net.relay() ? ("relay tree, fanout " + std::to_string(o.net.fanout)).c_str()
                : o.net.stores.transport == "s3" ? ("s3://" + o.net.stores.s3_bucket + "/" + o.net.stores.s3_prefix).c_str() : "directory store",
                o.net.stores.commit_log == "etcd" ? ("etcd " + o.net.stores.etcd_endpoints + " " + o.net.stores.etcd_prefix).c_str() : "file");

  testing::adamw_config cfg;
  cfg.lr = 1e-6f;
  cfg.threads = o.threads;
  testing::adamw_sim trainer_sim(specs, o.seed, cfg);
  std::map<std::string, std::vector<std::byte>> dense;  // the trainer's dense BF16 copy of the current version
  auto export_all = [&] {
    for (const auto& t : m.tensors()) {
      auto& b = dense[t.name];
      b.resize(t.bytes());
      trainer_sim.export_bf16(sim_index.at(t.name), std::span<std::byte>(b));
    }
  };
  export_all();
  const refit::tensor_source source = refit::copy_from([&](const tensor_info& t) { return std::span<const std::byte>(dense.at(t.name)); });

  o.net.dir = dir;
  auto root_relay = demo::start_root(o.net, o.receivers);  // relay: the root, in this process, on loopback
  trainer tr;
  tr.o = o;
  tr.self_exe = fs::read_symlink("/proc/self/exe").string();
  for (int i = 0; i < o.receivers; ++i)
    tr.children.push_back({-1, "/dev/shm/bitrefit-demo-" + std::to_string(::getpid()) + "-r" + std::to_string(i)});

  refit::sender_options so;
  so.gate = o.mode;
  so.owners = o.owners;
  so.receivers = static_cast<std::uint32_t>(o.receivers);
  so.threads = o.threads;
  so.max_frame_input_bytes = o.frame_kib << 10;
  so.deadline = std::chrono::milliseconds(o.deadline_ms);
  so.poll = 2ms;
  so.idle = [&] { tr.reap(); };
  so.trace_dir = o.trace;
  testing::crash_points trainer_faults;  // owner crashes: thrown and caught inside the sender
  using sender_t = refit::sender<demo::any_transport, demo::any_commit_log, demo::any_baseline_store, refit::identity_projection,
                                 codec::host_backend, testing::crash_points>;
  // Everything the refit engine keeps across a restart is in these stores (directories, or the
  // bucket and etcd).
  auto make_sender = [&] {
    std::vector<demo::any_baseline_store> baselines;
    for (std::uint32_t i = 0; i < o.owners; ++i) baselines.push_back(demo::make_baseline_store(o.net.stores, dir, i));
    return std::make_unique<sender_t>(m, demo::trainer_net(o.net), demo::make_commit_log(o.net.stores, dir), std::move(baselines), so,
                                      trainer_faults);
  };
  auto tx = make_sender();
  tx->start(source);  // version 0: no durable baseline yet, so the owners take the trainer's copy
  for (int i = 0; i < o.receivers; ++i) tr.spawn(i);
  if (!tx->wait_for_members(std::chrono::minutes(5))) throw error(errc::protocol, "rollout processes did not join");

  std::uint32_t chunks = 0;
  for (std::uint32_t i = 0; i < o.owners; ++i) chunks += tx->shard(i).chunk_count();

  std::uint64_t committed = 0, payload_total = 0, dense_total = 0, retries = 0, trainer_restarts = 0, owner_crashes = 0, sender_crashes = 0;
  bool all_exact = true;
  for (int k = 1; k <= o.refits; ++k) {
    bool restarted = false;
    double restart_s = 0;
    if (o.restart_trainer_every > 0 && k > 1 && (k - 1) % o.restart_trainer_every == 0) {
      // The trainer's refit engine restarts: coordinator and owners lose every volatile bit and
      // come back from the commit log and the owners' durable baselines only (start() without a
      // trainer copy throws "lost state" if a baseline is missing or corrupt).
      const auto tr0 = std::chrono::steady_clock::now();
      tx.reset();
      tx = make_sender();
      tx->start();
      if (!tx->wait_for_members(std::chrono::minutes(5))) throw error(errc::protocol, "rollout processes did not rejoin the restarted coordinator");
      restart_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tr0).count();
      restarted = true;
      ++trainer_restarts;
    }
    int owner_crash = -1;
    if (o.crash_owner_every > 0 && k % o.crash_owner_every == 0) {
      owner_crash = static_cast<int>((k / o.crash_owner_every - 1) % o.owners);
      // after some, but not all, of that owner's frames of the first attempt were published
      trainer_faults.arm("owner_mid_stream", std::max<std::uint32_t>(1, tx->shard(owner_crash).chunk_count() / 2),
                         "owner/" + std::to_string(owner_crash));
    }
    const std::uint64_t fired_before = trainer_faults.fired();
    const auto ts = std::chrono::steady_clock::now();
    trainer_sim.step();
    export_all();
    const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    int victim = -1;
    if (o.kill_every > 0 && k % o.kill_every == 0) {
      victim = (k / o.kill_every - 1) % o.receivers;
      // after some, but not all, of this refit's payloads are applied
      write_number_durably(dir / "kill" / ("receiver-" + std::to_string(victim)), std::max<std::uint32_t>(1, chunks / 2));
    }
    // --crash-sender-every: the whole sender process (coordinator and owners) dies once some
    // receivers applied the first attempt and before compare-and-set (finding B1's point (a)).
    const bool sender_crash = o.crash_sender_every > 0 && k % o.crash_sender_every == 0;
    if (sender_crash) trainer_faults.arm("coordinator_before_ack", 1, "coordinator");
    const version_t target = tx->committed().version + 1;
    refit::transition_stats st;
    bool sender_crashed = false;
    try {
      st = tx->refit(source);
    } catch (const testing::injected_crash&) {
      if (!sender_crash) throw;
      // A new sender takes over from the commit log and the owners' baseline stores alone (no
      // trainer copy): it retries exactly the frozen change set in overwrite mode, so K names
      // the bits frozen at this refit — checked below, like every refit, against `dense`.
      trainer_faults.disarm_all();
      tx.reset();
      tx = make_sender();
      tx->start();  // claims the next epoch and retries the admitted transition from the frozen set
      for (const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(3);
           tx->committed().version < target && std::chrono::steady_clock::now() < until;)
        tx->pump(20ms);
      ++sender_crashes;
      sender_crashed = true;
      st.version = tx->committed().version;
      st.committed = st.version == target;
      st.attempts = 2;
    }
    owner_crashes += trainer_faults.fired() - fired_before - (sender_crashed ? 1 : 0);
    // The check: every rollout process at the committed version, by attestation and by bytes.
    const auto tc = std::chrono::steady_clock::now();
    std::vector<tensor_view> views;
    for (const auto& t : m.tensors()) views.emplace_back(t.name, t.type, t.shape, std::span<const std::byte>(dense.at(t.name)));
    const digest128 expected = codec::attestation_digest(std::span<const tensor_view>(views));
    bool exact = st.committed;
    for (int i = 0; i < o.receivers && exact; ++i) {
      demo::holding h;
      const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(3);
      for (;;) {
        try {
          demo::mapped_store view(tr.children[i].shm, m, /*writable=*/false, /*create=*/false);
          h = view.read_holding();
          if (h.version == st.version) {
            bool bytes_equal = h.attestation == expected;
            for (std::size_t t = 0; t < m.size() && bytes_equal; ++t) {
              const auto& want = dense.at(m.tensors()[t].name);
              bytes_equal = std::memcmp(view.bytes(t).data(), want.data(), want.size()) == 0;
            }
            // re-read the header: the process must not have restarted while we compared
            if (view.read_holding() == h) {
              exact = exact && bytes_equal;
              break;
            }
          }
        } catch (const error&) {
          // the process is (re)creating its mapping
        }
        if (std::chrono::steady_clock::now() > until) {
          exact = false;
          break;
        }
        tx->pump(20ms);
      }
    }
    const double check_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc).count();
    committed += st.committed;
    payload_total += st.payload_bytes;
    dense_total += st.dense_bytes;
    retries += st.attempts > 0 ? st.attempts - 1 : 0;
    all_exact = all_exact && exact;
    if (o.json) {
      auto j = st.to_json();
      j["refit"] = k;
      j["bit_exact"] = exact;
      j["killed_receiver"] = victim;
      j["owner_crash"] = owner_crash;
      j["trainer_restarted"] = restarted;
      j["trainer_restart_s"] = restart_s;
      j["train_s"] = train_s;
      j["check_s"] = check_s;
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::string notes;
      if (restarted) {
        char buf[96];
        std::snprintf(buf, sizeof buf, " [trainer restarted from durable state in %.2f s]", restart_s);
        notes += buf;
      }
      if (victim >= 0) notes += " [killed rollout " + std::to_string(victim) + "]";
      if (owner_crash >= 0) notes += " [owner " + std::to_string(owner_crash) + " crashed mid-stream]";
      std::printf("refit %2d %s%s bit-exact: %s\n", k, st.line().c_str(), notes.c_str(), exact ? "yes" : "NO");
    }
    std::fflush(stdout);
  }

  // shut the rollout processes down
  write_number_durably(dir / "stop", 1);
  for (auto& c : tr.children) {
    int status = 0;
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (::waitpid(c.pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    fs::remove(c.shm);
  }
  const double ratio = payload_total ? double(dense_total) / double(payload_total) : 0.0;
  nlohmann::json summary{{"summary", true},
                         {"refits", o.refits},
                         {"refits_committed", committed},
                         {"bit_exact_all", all_exact},
                         {"kills", tr.kills},
                         {"retries", retries},
                         {"trainer_restarts", trainer_restarts},
                         {"owner_crashes", owner_crashes},
                         {"sender_crashes", sender_crashes},
                         {"payload_bytes_total", payload_total},
                         {"dense_bytes_total", dense_total},
                         {"dense_to_payload_ratio", ratio},
                         {"receivers", o.receivers},
                         {"params", m.total_elements()},
                         {"mode", mode_name(o.mode)},
                         {"transport", o.net.stores.transport}};
  if (o.json) {
    std::printf("%s\n", summary.dump().c_str());
  } else {
    std::printf("summary: %" PRIu64 "/%d refits committed, bit_exact_all=%s, kills=%" PRIu64 ", retries=%" PRIu64
                ", trainer_restarts=%" PRIu64 ", owner_crashes=%" PRIu64 ", payload %.2f MiB vs dense %.2f MiB (dense/payload = %.1fx)\n",
                committed, o.refits, all_exact ? "true" : "false", tr.kills, retries, trainer_restarts, owner_crashes,
                double(payload_total) / 1048576.0,
                double(dense_total) / 1048576.0, ratio);
  }
  if (own_dir && !o.keep) fs::remove_all(dir);
  if (!o.keep) demo::remove_run_state(o.net.stores);
  return committed == static_cast<std::uint64_t>(o.refits) && all_exact ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    if (o.role == "receiver") return run_receiver(o);
    if (o.role != "trainer") usage("unknown role " + o.role);
    return run_trainer(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bitrefit-demo: %s\n", e.what());
    return 1;
  }
}
