// python/src/refit.cpp — bitrefit.Sender (trainer side) and bitrefit.Receiver (rollout side).
//
// Sender: the trainer's state_dict (canonical names -> CPU tensors, e.g. the BF16 export) is read
// in place through DLPack / the buffer protocol; refit() runs one transition of refit::sender
// (compare, encode, transfer, commit) with the GIL released and returns its statistics as a dict.
// Between refits a background thread keeps serving the protocol (roll calls, dense restores of
// restarted rollout processes), so a rollout can restart while the trainer trains.
// Receiver: the rollout engine's own tensors (model.state_dict()) become a layout::borrowed_store,
// so every refit is written straight into the model's parameters: no copy of the model exists.
// It is stepped either by the caller (step(), wait()) or by a background thread
// (start(background=True)); the request gate (`with receiver.serving(): generate(...)`) makes a
// refit wait for requests in flight and requests wait for the refit, so generation never sees a
// half-applied version.
// Both hold the C++ engine behind a mutex; the GIL is released around every engine call and taken
// back only to call Python callbacks (on_gate, drain, on_commit).
#include "refit.hpp"

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/io/atomic_file.hpp"
#include "engine.hpp"
#include "json.hpp"
#include "tensors.hpp"

namespace py = pybind11;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace bitrefit::python {
namespace {

using clock = std::chrono::steady_clock;

[[noreturn]] void fail(errc code, const char* field, const std::string& message, std::string file = {}) {
  throw error(code, message, {.file = std::move(file), .tensor = {}, .field = field});
}

protocol::gate_policy parse_gate(const std::string& g) {
  if (g == "sync") return protocol::gate_policy::synchronous;
  if (g == "async") return protocol::gate_policy::asynchronous;
  fail(errc::invalid_argument, "gate", "gate must be 'sync' or 'async', not '" + g + "'");
}
const char* gate_name(protocol::gate_policy g) { return g == protocol::gate_policy::synchronous ? "sync" : "async"; }

std::chrono::milliseconds to_ms(double seconds, const char* field) {
  if (!(seconds > 0) || seconds > 86400.0) fail(errc::invalid_argument, field, std::string(field) + " must be in (0, 86400] seconds");
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0 + 0.5));
}

/// Waits `timeout` seconds at most (None: forever) while checking for Ctrl-C. Called with the GIL
/// held; `poll` runs with it released and returns true when done.
template <class Poll>
bool wait_interruptibly(std::optional<double> timeout, Poll poll) {
  const auto until = timeout ? clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(*timeout))
                             : clock::time_point::max();
  for (;;) {
    bool done;
    {
      py::gil_scoped_release nogil;
      done = poll();
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (clock::now() >= until) return false;
  }
}

// ---- deployment.json ---------------------------------------------------------------------------

nlohmann::json describe(const model_manifest& m, const engine::sender_settings& s) {
  nlohmann::json ts = nlohmann::json::array();
  for (const auto& t : m.tensors()) ts.push_back({{"name", t.name}, {"dtype", std::string(dtype_name(t.type))}, {"shape", t.shape}});
  return {{"format", "bitrefit-deployment-1"}, {"receivers", s.receivers}, {"owners", s.owners}, {"gate", gate_name(s.gate)}, {"tensors", ts}};
}

struct deployment_description {
  model_manifest model;
  std::uint32_t receivers = 0;
  protocol::gate_policy gate = protocol::gate_policy::synchronous;
};

std::optional<deployment_description> read_description(const engine::deployment& d) {
  std::ifstream in(d.description());
  if (!in) return std::nullopt;
  const std::string file = d.description().string();
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.at("format") != "bitrefit-deployment-1") fail(errc::unsupported, "format", "unknown deployment format " + j.at("format").dump(), file);
    std::vector<tensor_info> ts;
    for (const auto& t : j.at("tensors")) {
      const auto dt = parse_dtype(t.at("dtype").get<std::string>());
      if (!dt) fail(errc::format, "tensors.dtype", "unknown dtype " + t.at("dtype").dump(), file);
      ts.push_back({t.at("name").get<std::string>(), *dt, t.at("shape").get<shape_t>()});
    }
    return deployment_description{model_manifest(std::move(ts)), j.at("receivers").get<std::uint32_t>(),
                                  parse_gate(j.at("gate").get<std::string>())};
  } catch (const nlohmann::json::exception& e) {
    fail(errc::format, "deployment", std::string("unreadable deployment description: ") + e.what(), file);
  }
}

// ---- the request gate ----------------------------------------------------------------------------

/// A rollout engine's request gate as a counting gate: requests enter while it is open; closing it
/// waits until the requests inside have left (the drain); it starts closed (the parameters are
/// garbage until the first dense restore).
class request_gate {
 public:
  /// Enters when open (callers poll: they must check for signals while they wait).
  bool try_enter() {
    std::lock_guard l(m_);
    if (!open_) return false;
    ++inside_;
    return true;
  }
  void leave() {
    std::lock_guard l(m_);
    --inside_;
    cv_.notify_all();
  }
  void close() {
    std::unique_lock l(m_);
    open_ = false;
    cv_.wait(l, [&] { return inside_ == 0; });
  }
  void open() {
    std::lock_guard l(m_);
    open_ = true;
    cv_.notify_all();
  }
  bool is_open() const {
    std::lock_guard l(m_);
    return open_;
  }

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
  int inside_ = 0;
};

/// The C++ engine's mutex, held in short slices by a background thread: a caller announces that
/// it waits and the background thread backs off, so a call from Python waits about one slice at
/// most (std::mutex is not fair; a thread that relocks at once could starve the caller).
class engine_mutex {
 public:
  std::unique_lock<std::mutex> lock() {
    ++waiting_;
    std::unique_lock l(mu_);
    --waiting_;
    return l;
  }
  /// For the background thread: the lock, or (after a short pause) none while someone waits.
  std::unique_lock<std::mutex> lock_unless_wanted() {
    if (waiting_ > 0) {
      std::this_thread::sleep_for(1ms);
      return {};
    }
    return std::unique_lock(mu_);
  }

 private:
  std::mutex mu_;
  std::atomic<int> waiting_{0};
};

thread_local int serving_depth = 0;  // how many serving() blocks this thread is inside

/// Every open Sender and Receiver, closed by an atexit hook: their threads must stop before the
/// interpreter finalizes (a thread that takes the GIL for a callback after that would hang).
template <class T>
struct registry {
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::set<T*>& live() {
    static std::set<T*> s;
    return s;
  }
  static void add(T* x) {
    std::lock_guard l(mu());
    live().insert(x);
  }
  static void remove(T* x) {
    std::lock_guard l(mu());
    live().erase(x);
  }
  static void close_all() {
    std::vector<T*> all;
    {
      std::lock_guard l(mu());
      all.assign(live().begin(), live().end());
    }
    for (T* x : all) x->close();
  }
};

// ---- Sender ----------------------------------------------------------------------------------------

class py_sender {
 public:
  py_sender(py::object state_dict, const fs::path& directory, std::uint32_t receivers, std::uint32_t owners, unsigned threads,
            const std::string& gate, std::uint64_t frame_bytes, int zstd_level, bool attest, double deadline, bool serve) {
    settings_.gate = parse_gate(gate);
    if (receivers == 0) fail(errc::invalid_argument, "receivers", "a deployment needs at least one receiver");
    if (owners == 0) fail(errc::invalid_argument, "owners", "a deployment needs at least one owner");
    if (threads == 0) fail(errc::invalid_argument, "threads", "threads must be at least 1");
    if (frame_bytes == 0) fail(errc::invalid_argument, "frame_bytes", "frame_bytes must be positive");
    if (zstd_level < 1 || zstd_level > 22) fail(errc::invalid_argument, "zstd_level", "zstd_level must be between 1 and 22");
    settings_.receivers = receivers;
    settings_.owners = owners;
    settings_.threads = threads;
    settings_.frame_bytes = frame_bytes;
    settings_.zstd_level = zstd_level;
    settings_.attest = attest;
    settings_.deadline = to_ms(deadline, "deadline");
    refs_ = resolve_mapping(state_dict, access::read);
    if (refs_.empty()) fail(errc::invalid_argument, "state_dict", "the state_dict holds no tensors");
    manifest_ = manifest_of(refs_);
    deployment_ = engine::deployment{directory};
    deployment_.create();
    // The same directory may be reused by a restarted trainer, but only for the same model.
    if (auto old = read_description(deployment_)) check_matches(old->model, refs_, "the Sender's state_dict (vs " + deployment_.description().string() + ")");
    const std::string text = describe(manifest_, settings_).dump(1) + "\n";
    io::write_file_atomically(deployment_.description(), std::as_bytes(std::span(text.data(), text.size())));
    engine_ = engine::make_sender(deployment_, manifest_, settings_);
    {
      py::gil_scoped_release nogil;
      auto l = mu_.lock();
      engine_->start(source(refs_));
    }
    if (serve) server_ = std::thread([this] { serve_loop(); });
    registry<py_sender>::add(this);
  }
  py_sender(const py_sender&) = delete;
  ~py_sender() { close(); }

  py::object refit(py::object state_dict) {
    check_open();
    std::vector<tensor_ref> next;
    if (state_dict.is_none()) {
      next = refs_;
    } else {
      next = resolve_mapping(state_dict, access::read);
      check_matches(manifest_, next, "the state_dict given to refit()");  // nothing happens on a mismatch
    }
    engine::transition_stats st;
    {
      py::gil_scoped_release nogil;
      auto l = lock_engine();
      st = engine_->refit(source(next));
    }
    refs_ = std::move(next);
    return to_python(st.to_json());
  }

  bool wait_for_receivers(double timeout) {
    check_open();
    py::gil_scoped_release nogil;
    auto l = lock_engine();
    return engine_->wait_for_members(to_ms(timeout, "timeout"));
  }

  void pump(double seconds) {
    check_open();
    py::gil_scoped_release nogil;
    auto l = lock_engine();
    engine_->pump(to_ms(seconds, "seconds"));
  }

  std::uint64_t version() {
    check_open();
    py::gil_scoped_release nogil;
    auto l = lock_engine();
    return engine_->committed().version;
  }

  py::list manifest() const {
    py::list out;
    for (const auto& t : manifest_.tensors()) {
      py::dict d;
      d["name"] = t.name;
      d["dtype"] = std::string(dtype_name(t.type));
      d["shape"] = py::tuple(py::cast(t.shape));
      out.append(d);
    }
    return out;
  }

  const engine::sender_settings& settings() const { return settings_; }
  const fs::path& directory() const { return deployment_.root; }

  void close() {
    if (!engine_) return;
    registry<py_sender>::remove(this);
    {
      py::gil_scoped_release nogil;
      stop_ = true;
      if (server_.joinable()) server_.join();
      engine_.reset();
    }
    refs_.clear();
  }

 private:
  /// The trainer's bits of each canonical tensor, read from the resolved tensors (name order ==
  /// manifest order). Valid while `refs` lives; called from the engine's threads, without the GIL.
  refit::tensor_source source(const std::vector<tensor_ref>& refs) const {
    return refit::copy_from([this, &refs](const tensor_info& t) -> std::span<const std::byte> {
      const auto i = manifest_.index_of(t.name);
      if (!i || refs[*i].bytes.size() != t.bytes())
        throw error(errc::mismatch, "no tensor of this size in the state_dict", {.file = {}, .tensor = t.name, .field = "state_dict"});
      return refs[*i].bytes;
    });
  }

  /// The engine, taken from the background server; raises what ended the server.
  std::unique_lock<std::mutex> lock_engine() {
    auto l = mu_.lock();
    if (server_error_) std::rethrow_exception(server_error_);
    return l;
  }

  void serve_loop() {
    while (!stop_) {
      auto l = mu_.lock_unless_wanted();
      if (!l) continue;
      try {
        engine_->pump(2ms);  // short slices: a refit() waits at most about one for the engine
      } catch (...) {
        server_error_ = std::current_exception();  // raised by the next call from Python
        return;
      }
    }
  }

  void check_open() const {
    if (!engine_) fail(errc::invalid_argument, "sender", "the Sender is closed");
  }

  engine::sender_settings settings_;
  model_manifest manifest_;
  engine::deployment deployment_;
  std::vector<tensor_ref> refs_;  // the state_dict of the committed version (or the last refit's)
  std::unique_ptr<engine::sender_t> engine_;
  engine_mutex mu_;
  std::atomic<bool> stop_{false};
  std::exception_ptr server_error_;
  std::thread server_;
};

// ---- Receiver --------------------------------------------------------------------------------------

class py_receiver {
 public:
  py_receiver(py::object state_dict, const fs::path& directory, std::uint32_t index, std::optional<std::string> gate, bool attest,
              double deadline, py::object on_gate, py::object drain, py::object on_commit)
      : on_gate_(std::move(on_gate)), drain_(std::move(drain)), on_commit_(std::move(on_commit)) {
    refs_ = resolve_mapping(state_dict, access::write);
    if (refs_.empty()) fail(errc::invalid_argument, "state_dict", "the state_dict holds no tensors");
    std::vector<mutable_tensor_view> views;
    for (const auto& r : refs_) views.push_back(r.mutable_view());
    store_ = std::make_unique<layout::borrowed_store>(std::move(views));  // refuses tensors sharing memory
    deployment_ = engine::deployment{directory};
    settings_.index = index;
    settings_.attest = attest;
    settings_.deadline = to_ms(deadline, "deadline");
    if (gate) settings_.gate = parse_gate(*gate);
    gate_given_ = gate.has_value();
    if (auto d = read_description(deployment_)) check_deployment(*d);
    for (auto* f : {&on_gate_, &drain_, &on_commit_})
      if (!f->is_none() && !PyCallable_Check(f->ptr())) fail(errc::invalid_argument, "callback", "on_gate, drain and on_commit must be callables or None");
    registry<py_receiver>::add(this);
  }
  py_receiver(const py_receiver&) = delete;
  ~py_receiver() { close(); }

  void start(bool background, double timeout) {
    if (closed_) fail(errc::invalid_argument, "receiver", "the Receiver is closed");
    if (engine_) fail(errc::invalid_argument, "start", "the Receiver was started already");
    // The trainer may still be starting: wait for its deployment description, then check it.
    std::optional<deployment_description> d;
    const bool found = wait_interruptibly(timeout, [&] {
      if ((d = read_description(deployment_))) return true;
      std::this_thread::sleep_for(10ms);
      return false;
    });
    if (!found)
      fail(errc::io, "deployment", "no Sender has created this deployment yet (waited " + std::to_string(timeout) + " s)",
           deployment_.description().string());
    check_deployment(*d);
    // A fresh process is a new incarnation, recorded durably before anything is sent under it.
    incarnation_ = read_incarnation() + 1;
    persist_incarnation(incarnation_);
    engine::receiver_settings s = settings_;
    s.on_gate = [this](bool open) { gate_changed(open); };
    s.drain = [this] { call_python(drain_); };
    s.on_commit = [this](std::uint64_t v) {
      call_python(on_commit_, v);
      finish_opening();
    };
    engine_ = engine::make_receiver(deployment_, *store_, incarnation_, s, [this](std::uint64_t n) { persist_incarnation(n); });
    {
      py::gil_scoped_release nogil;
      auto l = lock_engine();
      guarded([&] { engine_->start(); });
    }
    if (background) stepper_ = std::thread([this] { step_loop(); });
  }

  void step(double timeout) {
    check_started();
    if (stepper_.joinable()) fail(errc::invalid_argument, "step", "step() while the background thread steps this Receiver");
    if (serving_depth > 0)
      fail(errc::invalid_argument, "step", "step() inside a serving() block would wait for itself: leave the block first");
    const auto wait = to_ms(timeout, "timeout");
    py::gil_scoped_release nogil;
    auto l = lock_engine();
    guarded([&] { engine_->step(wait); });
  }

  bool wait(std::optional<std::uint64_t> version, std::optional<double> timeout) {
    check_started();
    const bool foreground = !stepper_.joinable();
    if (foreground && serving_depth > 0) fail(errc::invalid_argument, "wait", "wait() inside a serving() block: leave the block first");
    return wait_interruptibly(timeout, [&] {
      if (foreground) {
        auto l = lock_engine();
        guarded([&] { engine_->step(2ms); });
      } else {
        std::this_thread::sleep_for(2ms);
      }
      const snapshot now = read_snapshot();
      return now.state.serving && now.state.gate_open && (!version || now.state.version >= *version);
    });
  }

  /// Background mode: waits (up to `timeout`) for the stepping thread to open the gate. Foreground
  /// mode: the caller's own step()/wait() open it, so a closed gate is an error, not a wait.
  void enter_serving(std::optional<double> timeout) {
    check_started();
    if (!stepper_.joinable()) {
      if (!gate_.try_enter())
        fail(errc::invalid_argument, "serving", "the request gate is closed and nothing else steps this Receiver: call wait() first");
    } else {
      const bool ok = wait_interruptibly(timeout, [&] {
        if (gate_.try_enter()) return true;
        read_snapshot();  // raises the stepping thread's failure
        std::this_thread::sleep_for(1ms);
        return false;
      });
      if (!ok) {
        PyErr_SetString(PyExc_TimeoutError, "the request gate stayed closed");
        throw py::error_already_set();
      }
    }
    ++serving_depth;
  }
  void leave_serving() {
    --serving_depth;
    gate_.leave();
  }

  py::dict stats() {
    check_started();
    const snapshot now = read_snapshot();
    py::dict d;
    d["index"] = settings_.index;
    d["incarnation"] = now.state.incarnation;
    d["version"] = now.state.version;
    d["baseline"] = now.state.baseline;
    d["phase"] = now.state.phase;
    d["serving"] = now.state.serving;
    d["gate_open"] = now.state.gate_open;
    d["delivered"] = now.counters.delivered;
    d["undelivered"] = now.counters.undelivered;
    d["applied"] = now.counters.applied;
    d["duplicates_seen"] = now.counters.duplicates_seen;
    d["restores"] = now.counters.restores;
    d["attestation"] = now.attestation ? py::object(py::str(now.attestation->to_hex())) : py::object(py::none());
    return d;
  }

  std::uint64_t version() {
    check_started();
    return read_snapshot().state.version;
  }

  /// The attestation digest of the tensors now (read outside the engine: a receiver that is not
  /// serving may be mid-apply, so call it while serving, e.g. inside serving()).
  std::string attest() {
    if (closed_) fail(errc::invalid_argument, "receiver", "the Receiver is closed");
    py::gil_scoped_release nogil;
    std::vector<tensor_view> views;
    for (const auto& r : refs_) views.push_back(r.view());
    return codec::attestation_digest(std::span<const tensor_view>(views)).to_hex();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    registry<py_receiver>::remove(this);
    {
      py::gil_scoped_release nogil;
      stop_ = true;
      if (stepper_.joinable()) stepper_.join();
      engine_.reset();
      store_.reset();
    }
    refs_.clear();
  }

  std::uint32_t index() const { return settings_.index; }
  const fs::path& directory() const { return deployment_.root; }
  bool gate_open() const { return gate_.is_open(); }

 private:
  void check_deployment(const deployment_description& d) {
    check_matches(d.model, refs_, "the Receiver's state_dict (vs " + deployment_.description().string() + ")");
    if (settings_.index >= d.receivers)
      fail(errc::invalid_argument, "index",
           "receiver index " + std::to_string(settings_.index) + " but the Sender serves " + std::to_string(d.receivers) + " receivers");
    if (gate_given_ && settings_.gate != d.gate)
      fail(errc::mismatch, "gate", std::string("gate '") + gate_name(settings_.gate) + "' but the Sender runs '" + gate_name(d.gate) + "'");
    settings_.gate = d.gate;
  }

  std::uint64_t read_incarnation() const {
    std::ifstream in(deployment_.incarnation(settings_.index));
    std::uint64_t v = 0;
    in >> v;
    return v;
  }
  void persist_incarnation(std::uint64_t n) const {
    const std::string s = std::to_string(n);
    fs::create_directories(deployment_.incarnation(settings_.index).parent_path());
    io::write_file_atomically(deployment_.incarnation(settings_.index), std::as_bytes(std::span(s.data(), s.size())));
  }

  /// The engine's gate actions: close waits for the requests inside serving() blocks to leave
  /// BEFORE the first apply; open lets requests in AFTER the Python callbacks saw the new version.
  /// The engine's open action calls on_gate(true) and then, on a committed version, on_commit(v):
  /// the opening finishes after both (finish_opening), so that neither a request nor wait(v) sees
  /// version v before on_commit(v) has returned.
  void gate_changed(bool open) {
    if (!open) {
      opening_ = false;
      gate_.close();
    }
    call_python(on_gate_, open);
    if (open) opening_ = true;
  }
  /// Called with the engine lock held: after on_commit, and after every engine step (a restore
  /// that reopens the gate calls no on_commit).
  void finish_opening() {
    if (!opening_) return;
    opening_ = false;
    publish();  // a request that enters now must already see the version it is served
    gate_.open();
  }

  template <class... Args>
  void call_python(const py::object& fn, Args... args) {
    if (fn.is_none()) return;
    py::gil_scoped_acquire gil;
    fn(args...);
  }

  /// Runs engine work; a failure (an exception from a callback or the engine) leaves the receiver
  /// failed: like a crashed process, it cannot go on — a new Receiver is the next incarnation.
  /// Called with the engine lock held. Publishes a snapshot of the engine's state afterwards, so
  /// that stats(), version and wait() never need the engine (a callback or a serving() block may
  /// ask while the stepping thread waits for it).
  template <class F>
  void guarded(F f) {
    if (failure_) std::rethrow_exception(failure_);
    try {
      f();
      finish_opening();
    } catch (...) {
      failure_ = std::current_exception();
      std::lock_guard l(snap_mu_);
      snap_.failure = failure_;
      throw;
    }
    publish();
  }
  /// Called with the engine lock held.
  void publish() {
    std::lock_guard l(snap_mu_);
    snap_.state = engine::state_of(*engine_);
    snap_.counters = engine_->counters();
    snap_.attestation = engine_->last_attestation();
  }

  struct snapshot {
    engine::receiver_state state;
    refit::receiver_counters counters;
    std::optional<digest128> attestation;
    std::exception_ptr failure;
  };
  /// The last published state; raises the receiver's failure if it failed.
  snapshot read_snapshot() {
    std::lock_guard l(snap_mu_);
    if (snap_.failure) std::rethrow_exception(snap_.failure);
    return snap_;
  }

  std::unique_lock<std::mutex> lock_engine() { return mu_.lock(); }

  void step_loop() {
    while (!stop_) {
      auto l = mu_.lock_unless_wanted();
      if (!l) continue;
      try {
        guarded([&] { engine_->step(2ms); });
      } catch (...) {
        return;  // the snapshot holds the failure; every later call raises it
      }
    }
  }

  void check_started() const {
    if (closed_) fail(errc::invalid_argument, "receiver", "the Receiver is closed");
    if (!engine_) fail(errc::invalid_argument, "receiver", "the Receiver is not started: call start()");
  }

  py::object on_gate_, drain_, on_commit_;
  engine::receiver_settings settings_;
  bool gate_given_ = false;
  engine::deployment deployment_;
  std::vector<tensor_ref> refs_;
  std::unique_ptr<layout::borrowed_store> store_;
  std::uint64_t incarnation_ = 0;
  std::unique_ptr<engine::receiver_t> engine_;
  engine_mutex mu_;  // the engine (taken without the GIL)
  std::exception_ptr failure_;  // under mu_
  std::mutex snap_mu_;
  snapshot snap_;
  request_gate gate_;
  bool opening_ = false;  // under mu_: on_gate(true) was called, the request gate is not open yet
  std::atomic<bool> stop_{false};
  bool closed_ = false;
  std::thread stepper_;
};

/// `with receiver.serving(timeout=None):` — holds the request gate open for the block.
struct serving_block {
  py_receiver* receiver;
  std::optional<double> timeout;
};

}  // namespace

void register_refit(py::module_& m) {
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    registry<py_receiver>::close_all();
    registry<py_sender>::close_all();
  }));
  py::class_<py_sender>(m, "Sender", R"doc(The trainer side of bit-exact delta refits (coordinator + owners).

Sender(state_dict, directory, *, receivers, owners=1, threads=2, gate='sync', frame_bytes=8 MiB,
       zstd_level=3, attest=True, deadline=5.0, serve_in_background=True)

state_dict maps canonical (Hugging Face) names to CPU tensors: torch tensors, numpy arrays, or
bitrefit.with_dtype(...) views; they are read in place (DLPack / buffer protocol). The first start
in `directory` commits them as version 0; a Sender restarted on the same directory recovers the
committed version from its durable baselines (then state_dict must describe the same model).
`directory` is the deployment (object store, commit log, baselines) shared with every Receiver.
)doc")
      .def(py::init<py::object, const fs::path&, std::uint32_t, std::uint32_t, unsigned, const std::string&, std::uint64_t, int,
                    bool, double, bool>(),
           py::arg("state_dict"), py::arg("directory"), py::kw_only(), py::arg("receivers"), py::arg("owners") = 1u,
           py::arg("threads") = 2u, py::arg("gate") = "sync", py::arg("frame_bytes") = std::uint64_t{8} << 20,
           py::arg("zstd_level") = 3, py::arg("attest") = true, py::arg("deadline") = 5.0, py::arg("serve_in_background") = true)
      .def("refit", &py_sender::refit, py::arg("state_dict") = py::none(),
           R"doc(Runs one transition K.v -> K.v+1 to its commit and returns its statistics as a dict.

state_dict: the trainer's tensors of the new version (same names, dtypes and shapes as the model;
a mismatch raises MismatchError and changes nothing), or None to re-read the last one given (e.g.
tensors the trainer updates in place). The tensors must not change until refit() returns.
The dict: version, attempts, elements, changed, change_rate, payload_bytes, dense_bytes, frames,
mode, committed, phases_s (compare, encode, transfer, apply, sync, commit, persist: seconds), total_s,
gate_closed_s. The GIL is released throughout.)doc")
      .def("wait_for_receivers", &py_sender::wait_for_receivers, py::arg("timeout") = 60.0,
           "Serves the protocol until every receiver slot holds the committed version (or timeout seconds pass); returns whether they do.")
      .def("pump", &py_sender::pump, py::arg("seconds"),
           "Serves the protocol for `seconds` (only needed with serve_in_background=False).")
      .def_property_readonly("version", &py_sender::version, "The committed version K.v.")
      .def_property_readonly("manifest", &py_sender::manifest, "The model: a list of {name, dtype, shape}, in name order.")
      .def_property_readonly("directory", &py_sender::directory)
      .def_property_readonly("receivers", [](const py_sender& s) { return s.settings().receivers; })
      .def_property_readonly("gate", [](const py_sender& s) { return std::string(gate_name(s.settings().gate)); })
      .def("close", &py_sender::close, "Stops serving and releases the tensors (also on garbage collection).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_sender& s, py::args) { s.close(); });

  py::class_<serving_block>(m, "ServingBlock", "Context manager returned by Receiver.serving().")
      .def("__enter__", [](serving_block& b) { b.receiver->enter_serving(b.timeout); })
      .def("__exit__", [](serving_block& b, py::args) { b.receiver->leave_serving(); });

  py::class_<py_receiver>(m, "Receiver", R"doc(One rollout engine's side of bit-exact delta refits.

Receiver(state_dict, directory, *, index, gate=None, attest=True, deadline=5.0,
         on_gate=None, drain=None, on_commit=None)

state_dict: the engine's own tensors (model.state_dict() of a CPU model in the served dtype);
every refit is written straight into them, in place. `index` is this rollout slot (0 <=
index < the Sender's receivers). gate: 'sync' or 'async' (None: the Sender's). Callbacks, called
from the thread that steps the receiver: on_gate(open) when the request gate closes (before any
apply) and reopens (after a commit or restore; invalidate KV caches then); drain() in 'async' mode
once the gate closed (requests of the old version must have finished when it returns);
on_commit(version) whenever the gate reopens on a committed version (the first restore included);
requests (serving()) and wait() see that version only after on_commit has returned. A callback that raises fails the Receiver (as a crash).
Each start() is a new incarnation: a restarted process restores the committed version densely
from the trainer and rejoins at the next refit.)doc")
      .def(py::init<py::object, const fs::path&, std::uint32_t, std::optional<std::string>, bool, double, py::object, py::object,
                    py::object>(),
           py::arg("state_dict"), py::arg("directory"), py::kw_only(), py::arg("index"), py::arg("gate") = py::none(),
           py::arg("attest") = true, py::arg("deadline") = 5.0, py::arg("on_gate") = py::none(), py::arg("drain") = py::none(),
           py::arg("on_commit") = py::none())
      .def("start", &py_receiver::start, py::kw_only(), py::arg("background") = false, py::arg("timeout") = 60.0,
           "Announces this receiver and begins the dense restore of the committed version. background=True steps it\n"
           "on its own thread from now on; otherwise call step() or wait(). timeout: how long to wait for the Sender's\n"
           "deployment description.")
      .def("step", &py_receiver::step, py::arg("timeout") = 0.005,
           "One round of the receiver's loop (foreground mode): messages, payloads, applies, timers; waits at most `timeout` s.")
      .def("wait", &py_receiver::wait, py::arg("version") = py::none(), py::arg("timeout") = py::none(),
           "Until the receiver serves (gate open) at `version` or later (None: any); returns False on timeout.")
      .def(
          "serving", [](py_receiver& r, std::optional<double> timeout) { return serving_block{&r, timeout}; },
          py::arg("timeout") = py::none(), py::keep_alive<0, 1>(),
          "`with receiver.serving(): ...` runs the block while the request gate is open and keeps refits from applying\n"
          "until it leaves. Raises TimeoutError if the gate stays closed for `timeout` seconds.")
      .def("stats", &py_receiver::stats,
           "A dict: index, incarnation, version, baseline, phase, serving, gate_open, delivered, undelivered, applied,\n"
           "duplicates_seen, restores, attestation (hex digest of the last device sync, or None).")
      .def("attest", &py_receiver::attest, "The attestation digest (hex) of the tensors now.")
      .def_property_readonly("version", &py_receiver::version, "The committed version the receiver knows of.")
      .def_property_readonly("index", &py_receiver::index)
      .def_property_readonly("directory", &py_receiver::directory)
      .def_property_readonly("gate_open", &py_receiver::gate_open)
      .def("close", &py_receiver::close, "Stops stepping and releases the tensors (also on garbage collection).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_receiver& r, py::args) { r.close(); });
}

}  // namespace bitrefit::python
