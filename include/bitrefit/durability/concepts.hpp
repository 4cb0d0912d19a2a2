// bitrefit/durability/concepts.hpp — the durable commit log and the owners' baseline store.
//
// The commit log holds the coordinator epoch (fence), K = (v, g) — the version every member shares
// and the id of that baseline — and the latest prepare record. K is durable BEFORE anyone is told
// of a commit. Its semantics are not restated here: a durable log must behave exactly like the pure
// `protocol::commit_log::apply` (protocol/commit_log.hpp), request for request, and the shipped
// models run that very function on the state they read under their lock. What durability adds:
//
// CommitLog laws:
//  1. apply(req) is linearizable and atomic across threads and processes: a crash at any point
//     leaves either the state before or the state after the request, never a mix.
//  2. Outcomes ok / fenced / conflict carry the snapshot after the request (as the pure log).
//     `failed` means the request certainly did not take effect (e.g. the lock was not acquired
//     before the deadline, the temp file could not be written); `unknown` means it may have (the
//     rename happened but the directory fsync failed): resolve with a read_request.
//  3. After a crash and restart, a read returns the last state whose request reported ok.
//
// BaselineStore laws (the owners' B^v, kept consistent with the commit log across crashes). Images
// are keyed by VERSION: every attempt that commits v+1 commits the same frozen bits, whatever its g'.
//  1. save(v, image) is atomic and durable before it returns; load(v) then returns the same image.
//  2. An owner makes the frozen target of v+1 durable BEFORE it encodes anything of the transition
//     (so before any commit record can name v+1, and a crashed owner recovers its frozen set as
//     protocol::owner::recovered assumes), and keeps K.v's image until it has read
//     K = (v+1, g'); so after any crash, load(K.v) returns K.v's baseline — or nullopt, which the
//     owner reports as a lost state. Never another version's bits, never a mix.
//  3. retain_only(v) drops every image that load(v) does not need: every version above v, and every
//     version below v except the links of v's delta chain (DeltaBaselineStore; at most the store's
//     chain bound). It never changes what load(v) returns and is idempotent; a store may rewrite
//     v's image in another form there (fold a delta chain into a full image).
//
// DeltaBaselineStore (a BaselineStore that persists a transition in proportion to its CHANGES, not
// to the model: DESIGN's owner freezes "positions and absolute new values against K.v"):
//  4. save_changes(b, t, cs) requires that load(b) returns an image I (else it throws
//     errc::mismatch and changes nothing); it is atomic and durable before it returns, and load(t)
//     then returns exactly apply_changes(I, cs) (change_set.hpp). A later save or save_changes of t
//     replaces the earlier one (a failed transition's frozen target is never reused); no crash
//     point leaves load(t) returning the replaced bits or a mix.
//  5. A change set is bound to the very image it was computed against: if b's image is replaced or
//     damaged afterwards, load(t) reports loss (nullopt) rather than applying cs to other bits.
//
// ChangeSetStore (a DeltaBaselineStore that also hands a stored change set back as it is, so a
// restarted owner recovers its frozen target in memory O(changes), never as a second image):
//  6. load_changes(b, t) returns the change set t is stored as, against the image load(b) returns
//     now, or nullopt (t held as a full image, absent, a delta on another base or on bits that are
//     gone, or damaged). A returned cs is read from the delta alone, so the caller checks that it
//     fits load(b) (check_fits): if it does, load(t) == apply_changes(load(b), cs); if it does not,
//     load(t) reports loss. A nullopt is not loss: the caller then loads the image, and that load
//     names any loss.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bitrefit/core/ids.hpp"
#include "bitrefit/durability/change_set.hpp"
#include "bitrefit/protocol/commit_log.hpp"

namespace bitrefit::durability {

template <class L>
concept CommitLog = requires(L& l, const protocol::log_request& req) {
  { l.apply(req) } -> std::same_as<protocol::log_reply>;
};

template <class S>
concept BaselineStore = requires(S& s, version_t v, const baseline_image& img) {
  { s.save(v, img) } -> std::same_as<void>;
  { s.load(v) } -> std::same_as<std::optional<baseline_image>>;
  { s.retain_only(v) } -> std::same_as<void>;
};

template <class S>
concept DeltaBaselineStore = BaselineStore<S> && requires(S& s, version_t v, const change_set& cs) {
  { s.save_changes(v, v, cs) } -> std::same_as<void>;
};

template <class S>
concept ChangeSetStore = DeltaBaselineStore<S> && requires(S& s, version_t v) {
  { s.load_changes(v, v) } -> std::same_as<std::optional<change_set>>;
};

/// Where a store keeps the files of baseline_format.hpp (a directory, a bucket prefix), as the
/// chain walk reads them. Laws: digest_of(n) is nullopt iff no file n exists, else the digest its
/// last 8 bytes claim (0 when it is shorter: it then fails verification); read(n) returns the whole
/// file (nullopt when absent); read_head(n, k) its first min(k, size) bytes; where(n) names n in
/// errors (a path, an s3:// URL). A file is written atomically: readers see all of it or nothing.
template <class F>
concept BaselineFiles = requires(F& f, const std::string& name, std::size_t n) {
  { f.digest_of(name) } -> std::same_as<std::optional<std::uint64_t>>;
  { f.read(name) } -> std::same_as<std::optional<std::vector<std::byte>>>;
  { f.read_head(name, n) } -> std::same_as<std::vector<std::byte>>;
  { f.where(name) } -> std::convertible_to<std::string>;
};

/// Convenience for callers outside the protocol driver (tools, tests): the current contents.
template <CommitLog L>
protocol::log_reply read_log(L& l) {
  return l.apply(protocol::read_request{});
}

}  // namespace bitrefit::durability
