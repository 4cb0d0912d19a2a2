// python/src/engine.hpp — the one place where the binding names the C++ refit engine's types and
// options. Everything else in python/src speaks of a deployment directory and of the plain
// settings below, so a change of the engine's API (option structs, policies, transports) is
// adapted here and nowhere else.
//
// A deployment directory (shared by the trainer and every rollout process, e.g. on a shared
// filesystem) holds:
//   deployment.json       the model (tensor names, dtypes, shapes), receiver count, gate policy,
//                         owner count: written by the Sender, checked by every Receiver before
//                         it joins, so a mismatched model is a clear error instead of refused frames
//   store/                the directory object store (payload frames, mailboxes)
//   log/                  the filesystem commit log (K = committed version, epoch fencing)
//   baseline/owner-<i>/   each owner's durable baseline (a restarted trainer recovers K.v from it)
//   inc/receiver-<r>      each rollout slot's last incarnation (a restarted process takes the next)
// The same layout as the C++ demo (examples/demo).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bitrefit/core/manifest.hpp"
#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/layout/borrowed_store.hpp"
#include "bitrefit/protocol/types.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/transport/object_store.hpp"

namespace bitrefit::python::engine {

using transport_t = transport::directory_transport;
using commit_log_t = durability::filesystem_commit_log;
using baseline_store_t = durability::filesystem_baseline_store;
using sender_t = refit::sender<transport_t, commit_log_t, baseline_store_t>;
using receiver_t = refit::receiver<layout::borrowed_store, transport_t, commit_log_t>;
using transition_stats = refit::transition_stats;

/// What the trainer side is configured with (Python keyword arguments of bitrefit.Sender).
struct sender_settings {
  protocol::gate_policy gate = protocol::gate_policy::synchronous;
  std::uint32_t receivers = 1;
  std::uint32_t owners = 1;
  unsigned threads = 2;
  std::uint64_t frame_bytes = 8ull << 20;
  int zstd_level = 3;
  bool attest = true;
  std::chrono::milliseconds deadline{5000};
};

/// What one rollout slot is configured with (bitrefit.Receiver). The callbacks are called from the
/// thread that steps the receiver, in the protocol's action order.
struct receiver_settings {
  std::uint32_t index = 0;
  protocol::gate_policy gate = protocol::gate_policy::synchronous;
  bool attest = true;
  std::chrono::milliseconds deadline{5000};
  std::function<void(bool open)> on_gate;                 // close BEFORE any apply; open after the commit/restore
  std::function<void()> drain;                            // asynchronous: in-flight requests of v finish
  std::function<void(std::uint64_t version)> on_commit;  // the parameters are exactly K.v now
};

/// The deployment directory's paths (see the header comment).
struct deployment {
  std::filesystem::path root;

  std::filesystem::path description() const { return root / "deployment.json"; }
  std::filesystem::path store() const { return root / "store"; }
  std::filesystem::path log() const { return root / "log"; }
  std::filesystem::path baseline(std::uint32_t owner) const { return root / "baseline" / ("owner-" + std::to_string(owner)); }
  std::filesystem::path incarnation(std::uint32_t receiver) const {
    return root / "inc" / ("receiver-" + std::to_string(receiver));
  }
  void create() const {
    for (auto sub : {"store", "log", "baseline", "inc"}) std::filesystem::create_directories(root / sub);
  }
};

inline std::unique_ptr<sender_t> make_sender(const deployment& d, const model_manifest& m, const sender_settings& s) {
  refit::sender_options o;
  o.gate = s.gate;
  o.owners = s.owners;
  o.receivers = s.receivers;
  o.threads = s.threads;
  o.max_frame_input_bytes = s.frame_bytes;
  o.zstd_level = s.zstd_level;
  o.attest = s.attest;
  o.deadline = s.deadline;
  o.poll = std::chrono::milliseconds(2);
  std::vector<baseline_store_t> baselines;
  for (std::uint32_t i = 0; i < s.owners; ++i) baselines.emplace_back(d.baseline(i));
  return std::make_unique<sender_t>(m, transport_t{transport::directory_store(d.store()), {std::chrono::milliseconds(2)}},
                                    commit_log_t(d.log()), std::move(baselines), std::move(o));
}

/// @param persist_incarnation records a new incarnation durably (the protocol may ask for one).
inline std::unique_ptr<receiver_t> make_receiver(const deployment& d, layout::borrowed_store& loader, std::uint64_t incarnation,
                                                 const receiver_settings& s,
                                                 std::function<void(std::uint64_t)> persist_incarnation) {
  refit::receiver_options o;
  o.index = s.index;
  o.incarnation = incarnation;
  o.gate = s.gate;
  o.attest = s.attest;
  o.deadline = s.deadline;
  o.poll = std::chrono::milliseconds(2);
  o.persist_incarnation = std::move(persist_incarnation);
  o.on_gate = s.on_gate;
  o.drain = s.drain;
  if (s.on_commit) o.on_commit = [f = s.on_commit](const protocol::commit_record& k) { f(k.version); };
  return std::make_unique<receiver_t>(loader, transport_t{transport::directory_store(d.store()), {std::chrono::milliseconds(5)}},
                                      commit_log_t(d.log()), std::move(o));
}

/// The committed record a receiver knows of, and its phase, as plain values.
struct receiver_state {
  std::uint64_t version = 0, baseline = 0, incarnation = 0;
  std::string phase;
  bool serving = false, gate_open = false;
};

inline receiver_state state_of(const receiver_t& r) {
  const auto& sm = r.state();
  return {sm.committed.version, sm.committed.baseline.value, sm.incarnation, std::string(protocol::to_string(sm.phase)),
          r.serving(), r.gate_open()};
}

}  // namespace bitrefit::python::engine
