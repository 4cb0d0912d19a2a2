// bitrefit/durability/concepts.hpp — the durable commit log and the owners' baseline store.
//
// The commit log holds K = (v, g): the version every member shares and the id of that baseline,
// plus the coordinator epoch and the attempt currently prepared. It is the single source of truth
// for "did version v+1 commit?": K is durable BEFORE anyone is told of the commit.
//
// CommitLog laws:
//  1. begin_epoch() returns a number larger than every epoch returned before (by any process), and
//     from then on every prepare / compare_and_set from a smaller epoch is refused with `fenced`
//     and changes nothing.
//  2. prepare(e, a) records the attempt a only if e is the current epoch and a.base equals the
//     committed record; it never changes K.
//  3. compare_and_set(e, expected, desired, by) changes K from expected to desired atomically and
//     only if K == expected and e is current; `success` means it is durable. `conflict`: K was not
//     `expected` (nothing changed). `failed`: it certainly did not happen. `unknown`: it may or may
//     not have happened — resolve with read() (DESIGN's read_commit): the committed record carries
//     the attempt that wrote it.
//  4. read() after a crash returns the last successful state (durable implementations).
//
// BaselineStore laws (the owners' B^v, kept consistent with the commit log across crashes):
//  1. save(g, image) is atomic and durable before it returns; load(g) then returns the same image.
//  2. An owner saves the next baseline under the attempt's fresh g' BEFORE the commit record can
//     name g', and retains K.g until it has read K = (v+1, g'); so after any crash, load(K.g)
//     returns K.v's baseline — or nullopt, which the owner reports as a lost state.
//  3. retain_only(g) removes every other image; it is idempotent.
#pragma once

#include <compare>
#include <concepts>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bitrefit/core/ids.hpp"

namespace bitrefit::durability {

/// K = (v, g) plus the attempt τ that committed it (how read_commit tells "mine" from "someone's").
struct commit_record {
  version_t version = 0;
  baseline_id baseline{};
  attempt_id committed_by{};
  friend bool operator==(const commit_record&, const commit_record&) = default;
};

/// What prepare persists: the attempt, its target, its member set and per-tensor modes summary.
struct attempt_record {
  attempt_id attempt{};
  version_t base_version = 0;
  baseline_id base{};
  baseline_id next{};  // g', fresh per attempt
  std::vector<std::string> members;
  bool overwrite = false;  // retry attempts are overwrite-only
  friend bool operator==(const attempt_record&, const attempt_record&) = default;
};

struct log_state {
  std::uint64_t epoch = 0;
  commit_record committed{};
  std::optional<attempt_record> prepared;
  friend bool operator==(const log_state&, const log_state&) = default;
};

enum class cas_outcome { success, failed, unknown, conflict, fenced };

constexpr const char* cas_outcome_name(cas_outcome o) {
  switch (o) {
    case cas_outcome::success: return "success";
    case cas_outcome::failed: return "failed";
    case cas_outcome::unknown: return "unknown";
    case cas_outcome::conflict: return "conflict";
    case cas_outcome::fenced: return "fenced";
  }
  return "?";
}

template <class L>
concept CommitLog = requires(L& l, std::uint64_t epoch, const attempt_record& a, const commit_record& k) {
  { l.read() } -> std::same_as<log_state>;
  { l.begin_epoch() } -> std::same_as<std::uint64_t>;
  { l.prepare(epoch, a) } -> std::same_as<cas_outcome>;
  { l.compare_and_set(epoch, k, k) } -> std::same_as<cas_outcome>;
};

/// An owner's baseline image: tensor name -> stored bytes of the canonical ranges it owns.
using baseline_image = std::map<std::string, std::vector<std::byte>>;

template <class S>
concept BaselineStore = requires(S& s, baseline_id g, const baseline_image& img) {
  { s.save(g, img) } -> std::same_as<void>;
  { s.load(g) } -> std::same_as<std::optional<baseline_image>>;
  { s.retain_only(g) } -> std::same_as<void>;
};

}  // namespace bitrefit::durability
