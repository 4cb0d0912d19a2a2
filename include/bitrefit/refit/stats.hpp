// bitrefit/refit/stats.hpp — what one transition cost: the numbers a refit reports.
//
// Phases (seconds, wall clock of the coordinator's process): compare (change detection), encode
// (location/value coding + zstd), transfer (from the first publish until every member reported
// every payload applied/staged), apply (receivers' decode + placement, summed as reported in acks),
// sync (receivers' flush + attestation), commit (compare-and-set until durable), persist (owners'
// durable baseline store work: the frozen target saved BEFORE encoding — only its change set with a
// durability::DeltaBaselineStore — plus retain_only when the baseline advances, where the
// filesystem store folds its delta chain into a full image every max_chain versions). compare and
// encode run fused per chunk on the pool and are summed over threads; they overlap transfer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "bitrefit/core/ids.hpp"

namespace bitrefit::refit {

struct phase_times {
  double compare_s = 0, encode_s = 0, transfer_s = 0, apply_s = 0, sync_s = 0, commit_s = 0, persist_s = 0;
};

struct transition_stats {
  version_t version = 0;           // the version committed (v+1)
  std::uint32_t attempts = 0;      // 1 = committed at the first attempt
  std::uint64_t elements = 0;      // canonical elements compared
  std::uint64_t changed = 0;       // elements whose stored bits changed
  std::uint64_t payload_bytes = 0; // frame bytes published, all attempts
  std::uint64_t dense_bytes = 0;   // bytes of the model (what a dense refit would send)
  std::uint64_t frames = 0;
  phase_times phases;
  double total_s = 0;
  double gate_closed_s = 0;        // asynchronous mode: longest time a receiver's gate was closed
  bool committed = false;
  std::string mode = "sync";

  double change_rate() const { return elements ? double(changed) / double(elements) : 0.0; }

  nlohmann::json to_json() const {
    return {{"version", version},
            {"attempts", attempts},
            {"elements", elements},
            {"changed", changed},
            {"change_rate", change_rate()},
            {"payload_bytes", payload_bytes},
            {"dense_bytes", dense_bytes},
            {"frames", frames},
            {"mode", mode},
            {"committed", committed},
            {"phases_s",
             {{"compare", phases.compare_s},
              {"encode", phases.encode_s},
              {"transfer", phases.transfer_s},
              {"apply", phases.apply_s},
              {"sync", phases.sync_s},
              {"commit", phases.commit_s},
              {"persist", phases.persist_s}}},
            {"total_s", total_s},
            {"gate_closed_s", gate_closed_s}};
  }

  /// One human line: "v=3 attempts=1 changed=2.10% payload=1.2 MiB dense=64.0 MiB (53.3x) ...".
  std::string line() const {
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "v=%llu attempts=%u changed=%.2f%% payload=%.2f MiB dense=%.2f MiB (%.1fx) "
                  "compare=%.3fs encode=%.3fs transfer=%.3fs apply=%.3fs sync=%.3fs commit=%.3fs persist=%.3fs total=%.3fs%s",
                  static_cast<unsigned long long>(version), attempts, 100.0 * change_rate(),
                  double(payload_bytes) / 1048576.0, double(dense_bytes) / 1048576.0,
                  payload_bytes ? double(dense_bytes) / double(payload_bytes) : 0.0, phases.compare_s,
                  phases.encode_s, phases.transfer_s, phases.apply_s, phases.sync_s, phases.commit_s, phases.persist_s, total_s,
                  mode == "async" ? (" gate_closed=" + std::to_string(gate_closed_s) + "s").c_str() : "");
    return buf;
  }
};

}  // namespace bitrefit::refit
