// bitrefit/protocol/types.hpp — the protocol's value vocabulary: modes, configuration, the commit
// record K = (v, g), member bindings, the persisted prepare record and the hashing used for state
// deduplication (mutations, a test policy, are in mutation.hpp).
//
// Everything here is a plain value: copyable, equality-comparable (defaulted ==) and hashable with
// `protocol::hash_of(x)`. No clocks, threads, I/O or randomness anywhere under protocol/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include "bitrefit/core/digest.hpp"
#include "bitrefit/core/fields.hpp"
#include "bitrefit/core/ids.hpp"
#include "bitrefit/core/value_mode.hpp"
#include "bitrefit/protocol/mutation.hpp"

namespace bitrefit::protocol {

/// Value coding of one attempt and of each payload (core/value_mode.hpp). XOR (new = old ^ mask) is
/// only valid on a receiver that holds exactly the base version in every position it touches, and
/// only once; OVERWRITE carries absolute values and is idempotent, so it is what every retry uses.
using mode = bitrefit::value_mode;

/// The request gate policy (DESIGN op. 3). synchronous: the gate closes when a receiver is admitted
/// to an attempt and payloads may be applied as they arrive. asynchronous: receivers keep serving v
/// while they stage payloads; the gate closes only after the coordinator's arrival check (flush).
enum class gate_policy : std::uint8_t { synchronous, asynchronous };

using bitrefit::to_string;
constexpr std::string_view to_string(gate_policy g) noexcept {
  return g == gate_policy::synchronous ? "sync" : "async";
}

/// Configuration shared by every role of one cluster. Receivers are numbered 0..receivers-1 and
/// owners 0..owners-1 (an owner is a trainer rank that owns a stable subset of canonical elements).
struct protocol_config {
  gate_policy gate = gate_policy::synchronous;
  std::uint32_t owners = 1;
  std::uint32_t receivers = 1;
  /// Compare receivers' attestation digests against the expected ones before committing.
  bool attest = true;
  /// Attempts per transition before the coordinator stops retrying and waits for an operator
  /// (0: retry forever, which is what DESIGN asks for).
  std::uint32_t max_attempts = 0;
  friend auto operator<=>(const protocol_config&, const protocol_config&) = default;
};

/// The commit record K = (v, g): every member and owner shares baseline version v, identified by g.
struct commit_record {
  version_t version = 0;
  baseline_id baseline{};
  friend constexpr auto operator<=>(const commit_record&, const commit_record&) = default;
};

/// A receiver bound to an attempt by (receiver index, incarnation). Messages from any other
/// incarnation of the same receiver count for nothing within that attempt.
struct member {
  std::uint32_t receiver = 0;
  std::uint64_t incarnation = 0;
  friend constexpr auto operator<=>(const member&, const member&) = default;
};

/// What the coordinator persists (compare-and-set on the epoch) before it announces an attempt.
/// A coordinator that takes over reads it back to finish or retry the transition.
struct prepare_record {
  attempt_id attempt{};
  commit_record base{};          // K when the attempt started
  version_t target = 0;          // base.version + 1
  baseline_id next{};            // g' that K takes if this attempt commits
  protocol::mode mode = mode::overwrite;
  bool xor_allowed = false;      // every member places every XOR tensor bit-preservingly
  std::vector<member> members;   // sorted by receiver
  std::vector<digest128> expected;  // expected attestation per receiver index (empty: not checked)
  /// Identity of each owner's frozen change set (per owner index; empty: not recorded): every
  /// attempt of the transition delivers exactly these bits, whoever runs it (finding B1).
  std::vector<digest128> frozen;
  /// An earlier attempt of this transition was admitted, so receivers may hold a mix of K.v and
  /// these frozen bits: owners encode from the change set they made durable and never freeze the
  /// trainer's (possibly newer) bits for it; an owner that lost it says so (frozen_lost_msg).
  bool retry = false;
  /// The transition ended by abort at this attempt (re-persisted with this set BEFORE any member is
  /// told, so an abort is fenced by the log like every other decision, finding B6).
  bool aborted = false;
  friend auto operator<=>(const prepare_record&, const prepare_record&) = default;
};

/// The baseline id an attempt would commit: fresh per attempt and never 0 (0 is the initial g).
constexpr baseline_id baseline_of(attempt_id a) noexcept { return baseline_id{(a.epoch << 32) | (a.counter & 0xffffffffu)}; }

BITREFIT_FIELDS(commit_record, version, baseline)
BITREFIT_FIELDS(member, receiver, incarnation)
BITREFIT_FIELDS(protocol_config, gate, owners, receivers, attest, max_attempts)
BITREFIT_FIELDS(prepare_record, attempt, base, target, next, mode, xor_allowed, members, expected, frozen, retry, aborted)

// ---------------------------------------------------------------------------------------------
// Hashing for state deduplication (model checker, RapidCheck shrinking caches).

namespace detail {
/// Fields are buffered and folded 16 at a time: each pair of words, keyed by its position in the
/// block, is multiplied 64x64->128 and the halves xored, the eight products summed into the
/// running state (the accumulation step of XXH3 and wyhash). The products do not depend on each
/// other, so the CPU overlaps them; a dependent shift-add-xor step per field, as before, cost the
/// model checker a fifth of its time (a cluster state is about 700 fields). The field count ends
/// the hash, so sequences of different lengths hash apart whatever the padding.
struct hasher {
  std::uint64_t h = 0xcbf29ce484222325ull;
  std::uint64_t count = 0;
  std::uint32_t n = 0;
  std::uint64_t block[16];

  void mix(std::uint64_t v) noexcept {
    block[n++] = v;
    if (n == 16) [[unlikely]] fold(16);
  }
  /// The hash of everything mixed so far (the hasher may go on mixing afterwards).
  std::uint64_t digest() noexcept {
    if (n) fold_partial();
    std::uint64_t x = h ^ count;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
  }

 private:
  static std::uint64_t mum(std::uint64_t a, std::uint64_t b) noexcept {
    __extension__ typedef unsigned __int128 u128;
    const u128 p = static_cast<u128>(a) * b;
    return static_cast<std::uint64_t>(p) ^ static_cast<std::uint64_t>(p >> 64);
  }
  /// A short last block folds only its own pairs (an odd word paired with 0): most hashers of
  /// the model checker's multisets hold a few words each, and padding them to 16 cost 8 products.
  void fold_partial() noexcept {
    if (n & 1) block[n] = 0;
    fold(n + (n & 1));
  }
  void fold(std::uint32_t words) noexcept {
    static constexpr std::uint64_t key[18] = {
        0xe71b9592244ececaull, 0x3fcb4b70f79a7ffcull, 0x3bce14ab261db1d4ull, 0x2a438f2a3172f442ull,
        0xff3f3f8cfe53b312ull, 0xe427f474114d9fceull, 0x15d25341edc5fe85ull, 0x23eb71643ac5c727ull,
        0xf4a3cc3052800e04ull, 0x09c9c31ae2f93909ull, 0x74406663d3e1ec74ull, 0x2cc9d354d76fd970ull,
        0xa946a04e9ff35ab3ull, 0x4dfc3c3b18c1c02bull, 0x2a162b8dc835698dull, 0x89fb1806dc3fe287ull,
        0x8e822f9a9b04393eull, 0xa5ea88f7f5301958ull};
    std::uint64_t acc = 0;  // a short last block: the count tells it apart
    for (std::uint32_t i = 0; i < words; i += 2) acc += mum(block[i] ^ key[i], block[i + 1] ^ key[i + 1]);
    h = mum(h ^ acc ^ key[16], key[17]);
    count += n;
    n = 0;
  }
};

template <class T>
  requires(std::is_integral_v<T> || std::is_enum_v<T>)
inline void hash_append(hasher& h, T v) noexcept {
  h.mix(static_cast<std::uint64_t>(v));
}
/// Every field of every protocol value goes through hash_append, so states that differ anywhere
/// hash apart (fingerprint deduplication in the checker relies on it).
template <class... T>
void hash_all(hasher& h, const T&... fields) {
  (hash_append(h, fields), ...);
}
template <class T>
void hash_append(hasher& h, const std::optional<T>& o);
template <class T>
void hash_append(hasher& h, const std::vector<T>& v);
template <class... T>
void hash_append(hasher& h, const std::variant<T...>& v);

inline void hash_append(hasher& h, const std::string& s) {
  for (char c : s) h.mix(static_cast<unsigned char>(c));
  h.mix(s.size());
}
/// A value with a field list (core/fields.hpp): every field, in order. The field list is the one
/// the trace's JSON uses too, and it cannot leave a field out (it would not compile).
template <has_fields T>
void hash_append(hasher& h, const T& x) {
  std::apply([&h](const auto&... f) { hash_all(h, f...); }, fields_of(x));
}

template <class T>
void hash_append(hasher& h, const std::optional<T>& o) {
  h.mix(o.has_value());
  if (o) hash_append(h, *o);
}
template <class T>
void hash_append(hasher& h, const std::vector<T>& v) {
  h.mix(v.size());
  for (const auto& x : v) hash_append(h, x);
}
template <class... T>
void hash_append(hasher& h, const std::variant<T...>& v) {
  h.mix(v.index());
  std::visit([&](const auto& x) { hash_append(h, x); }, v);
}
}  // namespace detail

/// Hash of any protocol value (states, messages, events, actions, the cluster world). Flattened:
/// every hash_append below is inlined into one function per type, where GCC left the small ones
/// (a digest, a pair of words) as calls; the model checker, which hashes every successor, runs
/// 5.6 % fewer instructions (proofs/README.md "Speed").
template <class T>
[[gnu::flatten]] std::size_t hash_of(const T& x) {
  detail::hasher h;
  using detail::hash_append;
  hash_append(h, x);
  return static_cast<std::size_t>(h.digest());
}

inline std::string to_string(const commit_record& k) {
  return "(v" + std::to_string(k.version) + ",g" + std::to_string(k.baseline.value) + ")";
}
inline std::string to_string(const member& m) {
  return "r" + std::to_string(m.receiver) + "#" + std::to_string(m.incarnation);
}

}  // namespace bitrefit::protocol
