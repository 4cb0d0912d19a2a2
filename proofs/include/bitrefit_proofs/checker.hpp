// bitrefit_proofs/checker.hpp — an exhaustive explicit-state model checker, generic over the world
// it explores (stateright / TLC style, breadth first).
//
// A world is a plain value: copyable, ==, std::hash, with
//   enabled_moves() const   -> a range of moves (every nondeterministic choice in this state)
//   apply(move)              -> the successor (deterministic: same state + same move = same successor)
//   check_invariants() const -> std::optional<std::string>: the first violated safety invariant
//   transition_done() const  -> bool: the goal ("the transition ended")
// The checker visits every state reachable from the initial one, checks the invariants in every state
// (so the first violation found is one of the shortest), and, with `liveness`, checks that a goal state
// stays reachable from every reachable state (reverse reachability over the whole state graph: no
// deadlock, no livelock, no trap). A counterexample is the move sequence from the initial state, which
// the caller replays on a fresh world to print (the world is deterministic).
//
// Deduplication: `exact` keeps every state and compares with == (memory ~ states * sizeof(world));
// otherwise states are identified by their 64-bit std::hash fingerprint (TLC's default: the chance that
// two of n distinct states collide, which would hide the successors of one of them, is about
// n^2 / 2^65; printed as `collision_bound`). Tests run small worlds in both modes and require the
// same counts.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bitrefit_proofs/packed_frontier.hpp"

namespace bitrefit::proofs {

template <class W>
using move_of = std::ranges::range_value_t<decltype(std::declval<const W&>().enabled_moves())>;

template <class W>
concept checkable_world = std::copyable<W> && std::equality_comparable<W> && requires(const W& cw, W& w) {
  { cw.enabled_moves() } -> std::ranges::range;
  w.apply(std::declval<const move_of<W>&>());
  { cw.check_invariants() } -> std::convertible_to<std::optional<std::string>>;
  { cw.transition_done() } -> std::convertible_to<bool>;
  { std::hash<W>{}(cw) } -> std::convertible_to<std::size_t>;
};

/// A snapshot of a running search (check_options::progress).
struct check_progress {
  const char* phase;             // "search" (during or after a BFS level) or "liveness" (search done)
  std::uint32_t depth;           // BFS levels done
  std::uint64_t states;          // unique states so far
  std::uint64_t transitions;     // moves applied so far
  std::uint64_t frontier;        // states in the next level (so far, while a level is expanded)
  std::size_t frontier_bytes;    // their encodings as held (compact frontier, compressed), else 0
  double seconds;                // since the search began
  std::uint64_t level_expanded = 0;  // states of the level being expanded that are done (== level_size:
  std::uint64_t level_size = 0;      // the level ended; both 0 in the liveness phase)
  std::uint32_t liveness_sweeps = 0;  // liveness phase: passes over the state graph done
};

struct check_options {
  bool liveness = true;            // reverse reachability of a goal state from every state
  bool exact = false;              // keep states (exact ==) instead of 64-bit fingerprints
  std::uint64_t max_states = 20'000'000;  // give up (verdict state_limit) beyond this
  /// Worker threads that expand states (0: every core). The counts, the verdict and the
  /// counterexample do not depend on it: workers only compute successors; ids are assigned by one
  /// thread in the order a sequential breadth-first search would (see `check`).
  unsigned threads = 0;
  /// Keep the frontier encoded (compact_world only; not with `exact`). Same counts either way.
  bool compact = true;
  /// Compact frontier: its encodings compressed in blocks (packed_frontier.hpp). Same counts either way.
  bool compress_frontier = true;
  /// Called after each batch of a BFS level (a wide level of a large world takes minutes), after
  /// each level, and once before the liveness pass, with what is known so far, for progress lines
  /// on long runs; the callee decides how often to print. Empty: silent.
  std::function<void(const check_progress&)> progress{};
  /// Keep each state's parent and the move from it, so that a violation comes with its path from
  /// the initial state (check_result::counterexample). Off: 16 fewer bytes per state, and none of
  /// their reallocation peaks, for by-hand runs of hundreds of millions of states; a violation is
  /// then reported without its path (rerun with it on and max_states just past that state's id).
  /// The counts and the verdict do not depend on it.
  bool trace = true;
  /// Most bytes the fingerprint table's slots may take (0: as many as the machine has available
  /// when the table would grow, /proc/meminfo MemAvailable). A batch whose new states would make
  /// the table grow past it stops the search first (verdict state_limit, saying so), with the
  /// counts so far: a run of hours then ends with a report instead of being killed for memory
  /// while the table doubles (the new slots are allocated while the old ones are alive).
  std::uint64_t max_table_bytes = 0;
  /// Sleep sets (sleep_world only; safety only: not with `liveness`, which needs every edge). A
  /// move b taken from state p puts to sleep in p.b every move a of p independent of b that p
  /// explored before b or that slept in p already: p.b.a = p.a.b is reached from p.a. A state's
  /// sleep set is the intersection over the edges that reach it from the level above (moves named
  /// by ids that are the same in every member of a symmetry class). Every reachable
  /// state is still visited, at the same depth (proofs/README.md "Sleep sets": the argument), so
  /// states, depth, verdict and counterexample length do not change; transitions count the moves
  /// explored, `slept` the ones skipped.
  bool sleep_sets = false;
};

enum class verdict { ok, invariant_violated, end_unreachable, state_limit };

constexpr const char* to_string(verdict v) noexcept {
  switch (v) {
    case verdict::ok: return "ok";
    case verdict::invariant_violated: return "invariant violated";
    case verdict::end_unreachable: return "end of transition unreachable";
    case verdict::state_limit: return "state limit reached";
  }
  return "?";
}

template <class Move>
struct check_result {
  verdict outcome = verdict::ok;
  std::uint64_t states = 0;       // unique states
  std::uint64_t transitions = 0;  // edges explored (moves applied), including to known states
  std::uint32_t depth = 0;        // longest shortest path from the initial state (BFS levels - 1)
  std::uint64_t goal_states = 0;  // states where transition_done()
  std::uint64_t terminal_states = 0;  // states with no enabled move
  std::string violation;          // what is wrong (invariant message, or why the end is unreachable)
  std::vector<Move> counterexample;  // moves from the initial state to the offending state
  double seconds = 0;
  double collision_bound = 0;     // fingerprint mode: ~ states^2 / 2^65
  unsigned threads = 1;           // worker threads used
  std::uint32_t liveness_sweeps = 0;  // passes over the state graph the liveness check took (0: no liveness)
  bool liveness_reverse_graph = false;  // the sweeps did not settle; a reverse reachability finished
  std::uint64_t slept = 0;        // check_options::sleep_sets: enabled moves not explored (asleep)

  bool ok() const noexcept { return outcome == verdict::ok; }
};

/// A world may name its own fingerprint (e.g. one taken after canonicalising symmetric parts, see
/// cluster_world.hpp); otherwise std::hash is the fingerprint.
template <class W>
std::uint64_t fingerprint_of(const W& w) {
  if constexpr (requires { { w.fingerprint() } -> std::convertible_to<std::uint64_t>; }) return w.fingerprint();
  else return static_cast<std::uint64_t>(std::hash<W>{}(w));
}

/// A world with symmetry (interchangeable parts, e.g. receivers) names a canonical fingerprint:
/// `w.canonicalize(true)` renames w in place to a canonical image of its symmetry class and returns
/// that image's fingerprint, the same for every world of the class (`false`: the fingerprint only;
/// w is left exactly as it was, so the successor need not be rebuilt). The checker then keys states
/// by it (exact mode: by the canonical image) but keeps and expands the REAL successors, so every
/// stored state is one reached by the recorded moves and counterexamples replay unchanged; only
/// states equivalent to one already seen are not explored again (proofs/README.md, "Symmetry
/// reduction": sound when the permutations commute with the moves and leave the invariants and
/// the goal unchanged).
template <class W>
concept symmetric_world = requires(W& w, const W& cw) {
  { w.canonicalize(true) } -> std::convertible_to<std::uint64_t>;
  { cw.symmetric() } -> std::convertible_to<bool>;  // reduction switched on for this run
};
/// Optionally, `succ.canonicalize_successor(parent, leave)` returns what succ.canonicalize(leave)
/// would (and renames alike), given the state succ was made from by one move: a world can take
/// over the parts of the fingerprint it shares with its parent (cluster_world.hpp).
template <class W>
concept incremental_symmetric_world = symmetric_world<W> && requires(W& w, const W& parent) {
  { w.canonicalize_successor(parent, true) } -> std::convertible_to<std::uint64_t>;
};

/// A world that can be made equal to the state it was built from again by copying only what the
/// successor changed (e.g. cluster_world): `w.restore_to(parent)`, where w was copied from parent,
/// moves applied, and then canonicalize_successor(parent, ...) called, with parent unchanged since.
/// Law: afterwards w == parent (in any other case restore_to must copy the whole parent). A
/// compact world must also keep the law for any w when parent was decoded (compact_world) and
/// not changed since: the checker then calls restore_to for every successor, also the first ones
/// of a state (cluster_world tells by its parent's bytes).
template <class W>
concept restorable_world = incremental_symmetric_world<W> && requires(W& w, const W& parent) { w.restore_to(parent); };

/// A world that encodes itself compactly (e.g. bitrefit_proofs/compact.hpp): the checker keeps its
/// breadth-first frontier as bytes instead of live worlds (a few hundred bytes a state instead of
/// kilobytes of heap) and decodes each state into a per-thread scratch world to expand it.
/// `decode` must overwrite every part of the state (the scratch world held another one).
template <class W>
concept compact_world = requires(const W& cw, W& w, std::vector<std::uint8_t>& out, const std::uint8_t* p) {
  cw.encode(out);
  w.decode(p, p);
};

/// Optionally, a compact world encodes a successor faster from the bytes its parent was decoded
/// from: `succ.encode_successor(out, parent)`, where succ was made from parent as restore_to
/// requires (copied, moves applied, then canonicalize_successor(parent, ...)) and parent was
/// decoded and has not changed since, copies the parts the two share. Law: it appends exactly
/// the bytes `succ.encode(out)` would, in that case and in every other (where it encodes in full).
template <class W>
concept incremental_compact_world = compact_world<W> && requires(const W& cw, const W& parent, std::vector<std::uint8_t>& out) {
  cw.encode_successor(out, parent);
};

/// A world whose moves can be put to sleep (sleep sets, `check_options::sleep_sets`;
/// proofs/README.md "Sleep sets"):
///   `w.independent(a, b)`: moves a and b, both enabled in w, are independent: in every state where
///     both are enabled, each stays enabled after the other and the two orders lead to the same
///     state. The relation must depend on the moves' identities only (what they touch), not on w's
///     other parts: the soundness argument swaps independent moves along a path.
///   `w.sleep_frame()` and `w.sleep_id(m, frame)`: a move's identity as a number that names the
///     same move in every member of w's symmetry class and in every state the move stays enabled
///     in: `sleep_frame()` is the renaming w's last canonicalize chose (0: none, the identity),
///     and sleep_id(m, frame) digests what m acts on (its message, its receiver), renamed by that
///     frame, i.e. m as a move of the canonical image. So a sleep set found on one member is read
///     on another.
/// Laws (tested, not assumed: test_checker, `Sleep.*`): for every reachable state p and enabled
/// a, b with p.independent(a, b): p.b has exactly one enabled move a' with a's id (in any
/// frame), p.a one b' with b's, and p.b.a' == p.a.b'; distinct enabled moves of a state have
/// distinct ids.
template <class W>
concept sleep_world = requires(const W& w, const move_of<W>& m, std::uint32_t frame) {
  { w.independent(m, m) } -> std::convertible_to<bool>;
  { w.sleep_frame() } -> std::convertible_to<std::uint32_t>;
  { w.sleep_id(m, frame) } -> std::convertible_to<std::uint64_t>;
};

namespace detail {
/// A slot of the fingerprint table: the fingerprint and the state's id (liveness keeps edges by
/// id, the trace keeps parents by id), or the fingerprint alone when neither is on.
struct fingerprint_id_slot {
  std::uint64_t fp = 0;  // 0: empty
  std::uint32_t id = 0;
};
struct fingerprint_only_slot {
  std::uint64_t fp = 0;  // 0: empty
};

/// Fingerprint -> state id, open addressing (linear probing), no per-entry allocation. Lookups are
/// safe from many threads, also beside one inserting thread while the table is pinned (reserve()).
/// With fingerprint_only_slot no id is kept: a known fingerprint's id reads as 0 (8 bytes a slot
/// instead of 16, so twice the states in the same memory; see fingerprint_table).
template <class Slot>
class open_fingerprint_table {
 public:
  static constexpr bool keeps_ids = requires(Slot s) { s.id; };
  static constexpr std::uint32_t none = ~std::uint32_t{0};
  open_fingerprint_table() { slots_.assign(std::size_t{1} << 16, Slot{}); }
  /// The id of `fp`, or `none`. May run while one thread inserts (between reserve() and
  /// unpin()): it then sees each entry either whole or not yet, never a torn one (the id is
  /// stored before the fingerprint that publishes it).
  std::uint32_t find(std::uint64_t fp) const noexcept {
    fp = fix(fp);
    for (std::size_t i = fp & mask(); ; i = (i + 1) & mask()) {
      const std::uint64_t at = shared(slots_[i].fp).load(std::memory_order_acquire);
      if (at == fp) return id_at(i);
      if (at == 0) return none;
    }
  }
  /// (id, fresh): inserts `fp` with `id` unless present. Only one thread inserts.
  std::pair<std::uint32_t, bool> insert(std::uint64_t fp, std::uint32_t id) {
    if (overfull(size_ + 1, slots_.size())) {
      if (pinned_) throw std::logic_error("fingerprint_table: would grow while others read it (reserve too small)");
      grow();
    }
    fp = fix(fp);
    for (std::size_t i = fp & mask(); ; i = (i + 1) & mask()) {
      if (slots_[i].fp == fp) return {id_at(i), false};
      if (slots_[i].fp == 0) {
        if constexpr (keeps_ids) shared(slots_[i].id).store(id, std::memory_order_relaxed);
        shared(slots_[i].fp).store(fp, std::memory_order_release);
        ++size_;
        return {id, true};
      }
    }
  }
  /// Starts loading the slot where find(fp) begins (a hint: no effect on what find returns).
  void prefetch(std::uint64_t fp) const noexcept { __builtin_prefetch(&slots_[fix(fp) & mask()]); }
  /// Makes room for `extra` more inserts and pins the slots until unpin(): finds may then run
  /// beside those inserts (a grow would move the slots under the readers, so it throws instead).
  void reserve(std::size_t extra) {
    while (overfull(size_ + extra + 1, slots_.size())) grow();
    pinned_ = true;
  }
  void unpin() noexcept { pinned_ = false; }
  std::size_t slot_bytes() const noexcept { return slots_.size() * sizeof(Slot); }
  /// slot_bytes() once room is made for `extra` more inserts (what reserve(extra) would grow to).
  std::size_t slot_bytes_for(std::size_t extra) const noexcept {
    std::size_t n = slots_.size();
    while (overfull(size_ + extra + 1, n)) n *= 2;
    return n * sizeof(Slot);
  }

 private:
  /// The table's load limit: `entries` in `slots` slots past 3/4 means it must grow first.
  static bool overfull(std::size_t entries, std::size_t slots) noexcept { return entries * 4 > slots * 3; }
  // 0 marks an empty slot: fingerprint 0 is stored as 1 (one more collision pair of 2^64, which
  // the collision bound already covers). The bits are spread once more so the low bits index well.
  static std::uint64_t fix(std::uint64_t fp) noexcept {
    fp ^= fp >> 31;
    fp *= 0xbf58476d1ce4e5b9ull;
    fp ^= fp >> 29;
    return fp ? fp : 1;
  }
  std::uint32_t id_at(std::size_t i) const noexcept {
    if constexpr (keeps_ids) return shared(slots_[i].id).load(std::memory_order_relaxed);
    else return 0;
  }
  std::size_t mask() const noexcept { return slots_.size() - 1; }
  // A slot field as an atomic (plain loads and stores on x86-64; they keep the compiler from
  // tearing or caching them, and tell ThreadSanitizer what is shared).
  template <class T>
  static std::atomic_ref<T> shared(const T& x) noexcept { return std::atomic_ref<T>(const_cast<T&>(x)); }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const auto& s : old)
      if (s.fp)
        for (std::size_t i = s.fp & mask(); ; i = (i + 1) & mask())
          if (slots_[i].fp == 0) { slots_[i] = s; break; }
  }
  std::vector<Slot> slots_;
  std::size_t size_ = 0;
  bool pinned_ = false;
};

/// The search's table: with ids (16-byte slots: 2^29 slots, 8.6 GB, hold 402 M states) when
/// liveness or the trace needs them, else fingerprints alone (8-byte slots: the same 8.6 GB hold
/// 805 M). The choice is made once per search; each call takes one predictable branch.
class fingerprint_table {
 public:
  static constexpr std::uint32_t none = open_fingerprint_table<fingerprint_id_slot>::none;  // the same for both slots
  explicit fingerprint_table(bool keep_ids = true) : keep_ids_(keep_ids) {
    if (keep_ids) with_ids_.emplace();
    else bare_.emplace();
  }
  bool keeps_ids() const noexcept { return keep_ids_; }
  std::uint32_t find(std::uint64_t fp) const noexcept { return keep_ids_ ? with_ids_->find(fp) : bare_->find(fp); }
  std::pair<std::uint32_t, bool> insert(std::uint64_t fp, std::uint32_t id) {
    return keep_ids_ ? with_ids_->insert(fp, id) : bare_->insert(fp, id);
  }
  void prefetch(std::uint64_t fp) const noexcept { keep_ids_ ? with_ids_->prefetch(fp) : bare_->prefetch(fp); }
  void reserve(std::size_t extra) { keep_ids_ ? with_ids_->reserve(extra) : bare_->reserve(extra); }
  void unpin() noexcept { keep_ids_ ? with_ids_->unpin() : bare_->unpin(); }
  std::size_t slot_bytes() const noexcept { return keep_ids_ ? with_ids_->slot_bytes() : bare_->slot_bytes(); }
  std::size_t slot_bytes_for(std::size_t extra) const noexcept {
    return keep_ids_ ? with_ids_->slot_bytes_for(extra) : bare_->slot_bytes_for(extra);
  }

 private:
  bool keep_ids_;
  std::optional<open_fingerprint_table<fingerprint_id_slot>> with_ids_;
  std::optional<open_fingerprint_table<fingerprint_only_slot>> bare_;
};

/// The fingerprints one thread kept in one batch: open addressing with generation stamps, so that
/// `clear` is O(1) and nothing is allocated per entry (a node-based set allocated a node per fresh
/// successor on the worker and freed it on the merging thread at the next batch).
class batch_filter {
 public:
  batch_filter() { slots_.assign(std::size_t{1} << 10, slot{}); }
  /// True when `fp` was not inserted since the last clear().
  bool insert(std::uint64_t fp) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    for (std::size_t i = spread(fp) & mask(); ; i = (i + 1) & mask()) {
      slot& s = slots_[i];
      if (s.generation != generation_) {
        s = slot{fp, generation_};
        ++size_;
        return true;
      }
      if (s.fp == fp) return false;
    }
  }
  void clear() noexcept {
    ++generation_;  // every slot of an older generation is empty
    size_ = 0;
  }

 private:
  struct slot {
    std::uint64_t fp = 0;
    std::uint64_t generation = 0;
  };
  static std::uint64_t spread(std::uint64_t fp) noexcept { return (fp ^ (fp >> 29)) * 0x9e3779b97f4a7c15ull >> 20; }
  std::size_t mask() const noexcept { return slots_.size() - 1; }
  void grow() {
    std::vector<slot> old(slots_.size() * 2);
    old.swap(slots_);
    size_ = 0;
    for (const auto& s : old)
      if (s.generation == generation_) insert(s.fp);
  }
  std::vector<slot> slots_;
  std::size_t size_ = 0;
  std::uint64_t generation_ = 1;  // slots start at generation 0: empty
};

/// An append-only array of 32-bit values in blocks of 4 MiB: no reallocation, so no moment with
/// the old and the new copy both alive (a doubling vector of the liveness edges peaked at three
/// times their size on runs of tens of millions of transitions).
class chunked_u32 {
 public:
  void push_back(std::uint32_t v) {
    if ((n_ & (block - 1)) == 0) blocks_.push_back(std::make_unique_for_overwrite<std::uint32_t[]>(block));
    blocks_.back()[n_ & (block - 1)] = v;
    ++n_;
  }
  std::uint32_t operator[](std::uint64_t i) const noexcept { return blocks_[i / block][i & (block - 1)]; }
  std::uint64_t size() const noexcept { return n_; }
  void clear() noexcept {
    blocks_.clear();
    blocks_.shrink_to_fit();
    n_ = 0;
  }

 private:
  static constexpr std::uint64_t block = std::uint64_t{1} << 20;
  std::vector<std::unique_ptr<std::uint32_t[]>> blocks_;
  std::uint64_t n_ = 0;
};

/// One thread's object on cache lines of its own (no false sharing with its neighbours' objects).
template <class T>
struct alignas(64) per_thread {
  T v{};
};

/// A fixed set of worker threads that run f(k) for k in [0, n) together with the calling thread,
/// claiming indices in increasing order from a shared counter (so each thread sees its indices in
/// increasing order). One pool per search: threads are started once, not per batch.
///
/// Hand-overs spin before they sleep. The search hands batches over thousands of times a second
/// (64 states per thread each) and a waiter usually waits for one merge (~100 us) or the last
/// state of a batch; a futex sleep and wake each time costs syscalls and a reschedule, dear on
/// this project's paravirtualised VMs (proofs/README.md "The merge overlaps the next batch"). A
/// waiter spins (yielding now and then, for runs with more threads than free cores) up to
/// `spin_for` and only then sleeps in atomic::wait, so an idle pool still costs nothing.
class worker_pool {
 public:
  explicit worker_pool(unsigned threads) {
    for (unsigned t = 1; t < threads; ++t)
      pool_.emplace_back([this, t] { loop(t); });
  }
  ~worker_pool() {
    wait();  // a batch handed over with start() still runs: it reads the caller's buffers
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
  }
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;
  unsigned size() const noexcept { return static_cast<unsigned>(pool_.size()) + 1; }

  /// Hands f(thread index, k), k in [0, n), to the workers and returns at once: the caller may do
  /// other work (which must not touch what f writes) and then join(). `f` must live until then.
  /// Without workers nothing runs before join().
  template <class F>
  void start(std::size_t n, F& f) {
    wait();
    // The workers are between batches (busy_ == 0, they read nothing below until the generation
    // moves), so the job is written plainly; the release on generation_ publishes it.
    job_ = [&f](unsigned t, std::size_t k) { f(t, k); };
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    if (pool_.empty()) return;
    busy_.store(static_cast<unsigned>(pool_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
  }
  /// The calling thread (index 0) takes what the workers have not claimed yet, then waits until
  /// every call of the last start() returned.
  void join() {
    work(0);
    wait();
  }
  /// Waits until the workers are done with the last start(), taking no part in it (what they have
  /// not claimed is then done by them).
  void wait() {
    for (unsigned b; (b = busy_.load(std::memory_order_acquire)) != 0;) wait_while(busy_, b);
  }

 private:
  static constexpr auto spin_for = std::chrono::microseconds(200);
  /// Returns once `a` no longer holds `old`: spins (pause) up to spin_for, then sleeps.
  static void wait_while(const std::atomic<unsigned>& a, unsigned old) {
    const auto until = std::chrono::steady_clock::now() + spin_for;
    for (unsigned i = 1;; ++i) {
      if (a.load(std::memory_order_acquire) != old) return;
      if (i % 64 == 0) {
        if (std::chrono::steady_clock::now() > until) break;
        std::this_thread::yield();  // more threads than free cores: let the one we wait for run
      }
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    a.wait(old, std::memory_order_acquire);
  }
  void work(unsigned t) {
    for (std::size_t k; (k = next_.fetch_add(1, std::memory_order_relaxed)) < n_;) job_(t, k);
  }
  void loop(unsigned t) {
    unsigned seen = 0;
    for (;;) {
      unsigned g;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) wait_while(generation_, g);
      seen = g;
      if (stop_.load(std::memory_order_relaxed)) return;
      work(t);
      if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_.notify_one();
    }
  }
  std::vector<std::jthread> pool_;
  std::function<void(unsigned, std::size_t)> job_;
  std::size_t n_ = 0;
  alignas(64) std::atomic<std::size_t> next_{0};
  alignas(64) std::atomic<unsigned> generation_{0};
  alignas(64) std::atomic<unsigned> busy_{0};
  std::atomic<bool> stop_{false};
};
/// /proc/meminfo's MemAvailable in bytes (what can be allocated without swapping), or the
/// largest value where it cannot be read (no limit then).
inline std::uint64_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return ~std::uint64_t{0};
  char line[256];
  unsigned long long kib = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
  std::fclose(f);
  return found ? std::uint64_t{kib} * 1024 : ~std::uint64_t{0};
}
}  // namespace detail

/// Breadth-first search over every reachable state.
///
/// Parallel and deterministic. The frontier (one BFS level) is cut into batches; in each batch the
/// workers expand states (copy, apply every enabled move, fingerprint once, check invariants and
/// the goal on successors not seen before), each into its own slot, while the table of known
/// fingerprints is only read. Then one thread walks the slots in frontier order and move order —
/// exactly the order of a sequential search — assigning ids, counting transitions and recording
/// edges. So states, transitions, depth, the first violation (the smallest id at the smallest
/// depth) and the counterexample are the same for any number of threads, and with threads = 1 this
/// is the sequential search.
template <checkable_world W>
check_result<move_of<W>> check(const W& initial, const check_options& opt = {}) {
  using Move = move_of<W>;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  check_result<Move> res;
  const unsigned threads = opt.threads ? opt.threads : std::max(1u, std::thread::hardware_concurrency());
  res.threads = threads;
  bool sleep = false;  // sleep sets (check_options::sleep_sets)
  if (opt.sleep_sets) {
    if constexpr (!sleep_world<W>) throw std::invalid_argument("check: sleep_sets needs a world that names independent moves (sleep_world)");
    if (opt.liveness) throw std::invalid_argument("check: sleep_sets skips edges that the liveness check needs: turn liveness off");
    if constexpr (symmetric_world<W>)
      if (opt.exact && initial.symmetric())
        throw std::invalid_argument("check: sleep_sets with exact keys and symmetry: not supported (exact mode renames successors in place)");
    sleep = true;
  }

  constexpr std::uint32_t none = ~std::uint32_t{0};
  // Per state id (ids are assigned in BFS order): with opt.liveness its goal flag, with opt.trace
  // its parent and the move from it (the counterexample's path). `found` states so far: the next id.
  std::vector<std::uint32_t> parent;
  std::vector<Move> via;
  std::vector<std::uint8_t> goal;
  std::uint64_t found = 0;
  auto add_state = [&](std::uint32_t from, const Move& m, bool is_goal) {
    if (opt.trace) parent.push_back(from), via.push_back(m);
    if (opt.liveness) goal.push_back(is_goal ? 1 : 0);
    res.goal_states += is_goal;
    ++found;
  };
  // Liveness only: the state graph's edges, forward, as compressed rows. States are expanded in id
  // order (the frontier holds ids in increasing order), so the edges of state s are the targets
  // out_to[out_start[s] .. out_start[s + 1]): 4 bytes per edge and 8 per state.
  std::vector<std::uint64_t> out_start;
  detail::chunked_u32 out_to;
  // Ids in the table only where something reads them: liveness (its edges) or the trace (parents).
  detail::fingerprint_table by_fingerprint(opt.liveness || opt.trace);
  std::unordered_map<W, std::uint32_t> by_state;

  auto path_to = [&](std::uint32_t id) {
    std::vector<Move> p;
    if (!opt.trace) return p;  // not kept (check_options::trace)
    for (std::uint32_t s = id; parent[s] != none; s = parent[s]) p.push_back(via[s]);
    return std::vector<Move>(p.rbegin(), p.rend());
  };
  auto finish = [&]() {
    res.states = found;
    res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
    if (!opt.exact) res.collision_bound = double(res.states) * double(res.states) / 36893488147419103232.0;
    return res;
  };
  // The id of a state known already, or `none` (workers; in fingerprint mode it may run beside the
  // merge of the batch before, and then misses what that merge has not inserted yet).
  auto known = [&](const W& w, std::uint64_t fp) -> std::uint32_t {
    if (opt.exact) {
      const auto it = by_state.find(w);
      return it == by_state.end() ? none : it->second;
    }
    return by_fingerprint.find(fp);
  };
  // Returns (id, fresh); the next id if fresh.
  auto intern = [&](const W& w, std::uint64_t fp) -> std::pair<std::uint32_t, bool> {
    const auto id = static_cast<std::uint32_t>(found);
    if (opt.exact) {
      auto [it, fresh] = by_state.try_emplace(w, id);
      return {it->second, fresh};
    }
    return by_fingerprint.insert(fp, id);
  };

  // What a worker leaves for the merge, per frontier state: every successor in move order as an
  // `edge` and, only for those it found new, the rest in a separate list (`successor`). An edge to
  // a state known before the batch (most of them) carries that state's id, which the worker's
  // lookup found: the merge, the one serial part of the search, needs no second lookup for it. The
  // merge runs on another core than most expansions, so each byte a worker writes here crosses
  // between the cores' caches: 16 bytes per known successor instead of the ~120-byte record each
  // successor had (measured: the 2-thread search 0.91x the time, the 1-thread one -1.7 %
  // instructions).
  static constexpr std::uint32_t no_detail = ~std::uint32_t{0};    // not known, but not new in this thread's share
  static constexpr std::uint32_t known_before = no_detail - 1;     // `id` is its state id
  struct edge {
    std::uint64_t fp = 0;
    std::uint32_t detail = no_detail;  // index into expanded::details, no_detail or known_before
    std::uint32_t id = 0;              // known_before: the state's id
  };
  struct successor {  // not in the table before the batch (fingerprint mode: and the first of its fingerprint in this thread's share)
    Move move;
    bool goal = false;
    std::optional<std::string> violation;
    // Whole worlds (over a kilobyte each) only where a mode needs them, on the heap.
    std::unique_ptr<W> state;
    std::unique_ptr<W> key;  // exact mode with symmetry: the canonical image (the table's key)
    // compact frontier: the fresh successor's encoding, in its thread's output
    std::size_t bytes_at = 0, bytes_size = 0;
  };
  // Fingerprint (and, exact with symmetry, the key) of a state; renames `w` to its canonical image
  // only in exact mode with symmetry (fingerprint mode hashes the image without building it).
  bool reduce = false;
  if constexpr (symmetric_world<W>) reduce = initial.symmetric();
  auto fingerprint_in_place = [&](W& w) -> std::uint64_t {
    if constexpr (symmetric_world<W>)
      if (reduce) return w.canonicalize(opt.exact);  // exact: the canonical image is the key; else w is unchanged
    return opt.exact ? 0 : fingerprint_of(w);
  };
  // The same for a successor of `parent`.
  auto fingerprint_successor = [&](W& w, const W& parent) -> std::uint64_t {
    if constexpr (incremental_symmetric_world<W>)
      if (reduce) return w.canonicalize_successor(parent, opt.exact);
    (void)parent;
    return fingerprint_in_place(w);
  };
  // Sleep sets: what an edge puts to sleep in its successor (move ids sleep_ids[at, at + n) of its
  // thread's output, sleep_world::sleep_id: the same in every member of the successor's class),
  // and the successor's frame (the renaming its fingerprint chose).
  struct edge_sleep {
    std::uint32_t at = 0, n = 0;
    std::uint32_t frame = 0;
  };
  // What one thread made in a batch: the edges of the states it expanded, one run per state, and
  // the records of its fresh successors (edge::detail indexes them). Per thread, not per state:
  // neighbouring states are expanded by different threads, and per-state vectors put both threads'
  // writes on shared cache lines (the vectors' ends, and the buffers' edges where the allocator
  // placed two states' buffers side by side): proofs/README.md "The merge overlaps the next batch".
  struct thread_output {
    std::vector<edge> edges;
    std::vector<successor> details;
    std::vector<std::uint8_t> bytes;  // compact frontier: the fresh successors' encodings
    // Sleep sets: per edge (parallel to `edges`) the ids of the moves asleep in its successor.
    std::vector<edge_sleep> edge_sleeps;
    std::vector<std::uint64_t> sleep_ids;
    // Fingerprints this thread kept in this batch. A thread claims states in increasing order, so
    // the first copy it keeps is merged before the ones it drops (which the merge then finds in
    // the table): a duplicate within one thread's share costs no copy.
    detail::batch_filter kept;
    void clear() {
      edges.clear(), details.clear(), bytes.clear();
      edge_sleeps.clear(), sleep_ids.clear();
      kept.clear();
    }
  };
  struct alignas(64) expanded {  // a state's run of edges in its thread's output
    unsigned thread = 0;
    std::uint32_t begin = 0, end = 0;
    std::uint32_t slept = 0;  // sleep sets: its enabled moves not explored
    bool terminal = false;    // no enabled move (with sleep sets, no edge does not mean that)
  };
  struct batch_buffers {  // one batch: frontier states [first, first + n)
    std::size_t first = 0, n = 0;
    std::vector<expanded> out;
    std::vector<detail::per_thread<thread_output>> made;
  };

  // The frontier (this BFS level) and the next one: ids, and the states as live worlds or, compact,
  // as encodings in compressed blocks (packed_frontier.hpp).
  bool packed = false;
  if constexpr (compact_world<W>) packed = opt.compact && !opt.exact;
  struct level_states {
    explicit level_states(bool compress) : encoded(compress) {}
    std::vector<std::uint32_t> ids;
    std::vector<W> states;
    packed_frontier encoded;
    // Sleep sets, per state in ids' order: the ids of the moves asleep in it so far (intersected
    // over its edges), sleep_ids[sleep_at[i], sleep_at[i] + sleep_n[i]), and the frame to read
    // them in (the one of the member kept).
    std::vector<std::uint32_t> sleep_frame, sleep_n;
    std::vector<std::uint64_t> sleep_at, sleep_ids;
    void push_sleep(std::uint32_t frame, const std::uint64_t* ids, std::uint32_t n) {
      sleep_frame.push_back(frame), sleep_n.push_back(n), sleep_at.push_back(sleep_ids.size());
      sleep_ids.insert(sleep_ids.end(), ids, ids + n);
    }
    std::size_t size() const noexcept { return ids.size(); }
    bool empty() const noexcept { return ids.empty(); }
    void clear() {
      ids.clear();
      states.clear();
      encoded.clear();
      sleep_frame.clear(), sleep_n.clear(), sleep_at.clear(), sleep_ids.clear();
    }
  };
  level_states frontier(opt.compress_frontier), next(opt.compress_frontier);
  // Either `w` (a live state) or `enc` (its encoding) is given.
  std::vector<std::uint8_t> initial_bytes;
  auto push_state = [&](level_states& l, std::uint32_t id, W* w, const std::uint8_t* enc, std::size_t enc_size) {
    l.ids.push_back(id);
    if constexpr (compact_world<W>) {
      if (packed) {
        if (!enc) {
          initial_bytes.clear();
          w->encode(initial_bytes);
          enc = initial_bytes.data(), enc_size = initial_bytes.size();
        }
        l.encoded.push(enc, enc_size);
        return;
      }
    }
    (void)enc, (void)enc_size;
    l.states.push_back(std::move(*w));
  };
  // Per thread: the decoded state it expands, its frontier reader and the successor it builds,
  // each on its own cache lines, and the worlds first built ON that thread (lazily, below) so that
  // their heap blocks come from the thread's own allocator pages. Built here by the calling thread,
  // two threads' small vectors shared cache lines and every successor write bounced them between
  // the cores: the 2-thread search spent 1.6x the CPU of the 1-thread one on the same work.
  std::vector<detail::per_thread<std::optional<W>>> scratch(std::max(1u, threads));  // decoded state
  std::vector<detail::per_thread<packed_frontier::reader>> readers(std::max(1u, threads));
  std::vector<detail::per_thread<std::array<std::optional<W>, 2>>> successors(std::max(1u, threads));  // successors being built
  auto state_at = [&](unsigned t, std::size_t k) -> const W& {
    if constexpr (compact_world<W>) {
      if (packed) {
        const auto [p, end] = readers[t].v.at(frontier.encoded, k);
        auto& w = scratch[t].v;
        if (!w) w.emplace(initial);
        w->decode(p, end);
        return *w;
      }
    }
    (void)t;
    return frontier.states[k];
  };
  {
    W w0 = initial;
    {
      W k0 = initial;
      const std::uint64_t fp0 = fingerprint_in_place(k0);
      intern(k0, fp0);
    }
    add_state(none, Move{}, w0.transition_done());
    if (auto v = w0.check_invariants()) {
      res.outcome = verdict::invariant_violated;
      res.violation = *v;
      return finish();
    }
    push_state(frontier, 0, &w0, nullptr, 0);
    if (sleep) frontier.push_sleep(0, nullptr, 0);
    frontier.encoded.seal();
  }
  // States per batch: enough to keep every thread busy between two hand-overs, few enough that
  // the successors held between the two phases (full states) stay in cache: measured, 256 states
  // per batch and thread without the per-thread filter below cost twice the time of 16.
  const std::size_t batch = std::size_t{64} * threads;
  // Two sets of batch buffers: with fingerprints, the workers expand batch i+1 into one while this
  // thread merges batch i out of the other (proofs/README.md "The merge overlaps the next batch").
  // Exact mode merges into a node map that readers cannot share with a writer: one batch at a time.
  const bool overlap = !opt.exact;
  std::array<batch_buffers, 2> buffers;
  for (auto& b : buffers) b.made.resize(threads);
  // Phase 1 (parallel): expand, fingerprint, check what is new. With `overlap`, this runs while
  // the merge of the batch before inserts into the table: a lookup may then miss a state the merge
  // is adding, and the successor goes to the merge as new, which finds it (the table only grows,
  // so an id found is final): the merge's decisions, and so every count, do not change.
  //
  // Sleep sets: what one successor's edge puts to sleep in it (ids in the successor's frame).
  struct sleep_made {
    std::uint32_t frame = 0;
    std::vector<std::uint64_t> ids;
  };
  // Per thread, for the state w being expanded: the two successors' sleep_made; the positions in
  // w's enabled moves explored so far, asleep in w, and put to sleep by the last move; and the
  // ids of w's moves per frame used (0: not computed yet), each computed once.
  struct sleep_scratch_t {
    std::array<sleep_made, 2> made;
    std::vector<std::uint32_t> explored, asleep, putting;
    std::vector<std::uint8_t> is_asleep;
    std::vector<std::pair<std::uint32_t, std::vector<std::uint64_t>>> ids;
    std::size_t frames = 0;  // entries of `ids` in use
  };
  std::vector<detail::per_thread<sleep_scratch_t>> sleep_scratch(sleep ? std::max(1u, threads) : 0u);
  // What a worker does with one successor once it has its fingerprint: look it up, and record it
  // as known, as a duplicate within this thread's share, or as new (with what the merge needs).
  auto record = [&](thread_output& o, const W& w, W& succ, const Move& m, std::uint64_t fp, const sleep_made* made) {
    if (made) {  // sleep sets: one record per edge, beside it
      o.edge_sleeps.push_back({static_cast<std::uint32_t>(o.sleep_ids.size()), static_cast<std::uint32_t>(made->ids.size()), made->frame});
      o.sleep_ids.insert(o.sleep_ids.end(), made->ids.begin(), made->ids.end());
    }
    if (const std::uint32_t id = known(succ, fp); id != none) {
      o.edges.push_back({fp, known_before, id});
      return;
    }
    if (!opt.exact && !o.kept.insert(fp)) {  // exact mode: the merge compares the states
      o.edges.push_back({fp, no_detail});
      return;
    }
    // new: the merge may give it an id
    o.edges.push_back({fp, static_cast<std::uint32_t>(o.details.size())});
    successor& s = o.details.emplace_back();
    s.move = m;
    if (reduce && opt.exact) {
      // succ is the canonical image now (the table's key): the state kept is the real
      // successor. (Fingerprint mode: canonicalize(false) left succ as it was.)
      s.key = std::make_unique<W>(succ);
      succ = w;
      succ.apply(m);
    }
    s.goal = succ.transition_done();
    s.violation = succ.check_invariants();
    if constexpr (compact_world<W>) {
      if (packed) {
        s.bytes_at = o.bytes.size();
        if constexpr (incremental_compact_world<W>) succ.encode_successor(o.bytes, w);  // w: decoded by state_at
        else succ.encode(o.bytes);
        s.bytes_size = o.bytes.size() - s.bytes_at;
        return;
      }
    }
    s.state = std::make_unique<W>(std::move(succ));
  };
  // A successor's lookup in the table is a cache miss once the table outgrows the caches (8 MiB
  // at a quarter of a million states). So each successor's slot is prefetched as soon as its
  // fingerprint is known and looked up one move later, after the next successor was built in the
  // thread's other scratch world: the miss overlaps that work (proofs/README.md "The lookup is
  // prefetched"). Edges are still recorded in move order.
  auto expand = [&](batch_buffers& bb, unsigned t, std::size_t k) {
    const W& w = state_at(t, bb.first + k);
    auto& o = bb.made[t].v;
    bb.out[k].thread = t;
    bb.out[k].begin = static_cast<std::uint32_t>(o.edges.size());
    bb.out[k].slept = 0;
    auto& own = successors[t].v;
    if (!own[0]) own[0].emplace(w), own[1].emplace(w);  // first use, on this thread (see above)
    std::optional<Move> pending;  // the move built into own[cur ^ 1], not yet looked up
    std::uint64_t pending_fp = 0;
    unsigned cur = 0;
    std::array<bool, 2> from_w{};  // own[i] holds a successor of w (not of the state before)
    // Sleep sets: the moves asleep in w (read from their ids in w's frame), and those explored
    // from it so far.
    sleep_scratch_t* sl = sleep ? &sleep_scratch[t].v : nullptr;
    const auto moves = w.enabled_moves();
    bb.out[k].terminal = moves.empty();
    // The id of w's move at `pos` in `frame`, computed once per state and frame.
    auto id_of = [&](std::uint32_t pos, std::uint32_t frame) -> std::uint64_t {
      if constexpr (sleep_world<W>) {
        std::size_t f = 0;
        while (f < sl->frames && sl->ids[f].first != frame) ++f;
        if (f == sl->frames) {
          if (sl->ids.size() == f) sl->ids.emplace_back();
          sl->ids[f].first = frame;
          sl->ids[f].second.assign(moves.size(), 0);
          ++sl->frames;
        }
        std::uint64_t& id = sl->ids[f].second[pos];
        if (id == 0) id = w.sleep_id(moves[pos], frame);
        return id;
      } else {
        (void)pos, (void)frame;
        return 0;
      }
    };
    if (sl) {
      sl->explored.clear(), sl->asleep.clear(), sl->frames = 0;
      sl->is_asleep.assign(moves.size(), 0);
      const std::size_t zi = bb.first + k;
      const std::uint64_t* z = frontier.sleep_ids.data() + frontier.sleep_at[zi];
      const std::uint32_t zn = frontier.sleep_n[zi];
      if (zn)
        for (std::uint32_t i = 0; i < moves.size(); ++i)
          if (std::find(z, z + zn, id_of(i, frontier.sleep_frame[zi])) != z + zn) sl->asleep.push_back(i), sl->is_asleep[i] = 1;
      if (sl->asleep.size() > zn)  // two moves of w with one id: a digest collision
        throw std::logic_error("check: two enabled moves of one state share a sleep id");
    }
    auto made_at = [&](unsigned i) -> const sleep_made* { return sl ? &sl->made[i] : nullptr; };
    for (std::uint32_t pos = 0; pos < moves.size(); ++pos) {
      const Move& m = moves[pos];
      if (sl && sl->is_asleep[pos]) {
        ++bb.out[k].slept;  // its successor is reached from elsewhere (proofs/README.md "Sleep sets")
        continue;
      }
      W& succ = *own[cur];
      // A copy of w into the thread's scratch world (reusing its heap blocks), or where the world
      // can, only the parts the last successor built there changed (restorable_world). With the
      // compact frontier w was decoded, which the world checks for itself: it also restores from
      // a successor of the state this thread expanded before (restorable_world, decoded parent).
      if constexpr (restorable_world<W>) {
        if (from_w[cur] || packed) succ.restore_to(w);
        else succ = w;
        from_w[cur] = true;
      } else {
        succ = w;
      }
      succ.apply(m);
      if constexpr (sleep_world<W>) {
        if (sl) {
          // what this edge puts to sleep in succ: the moves of w independent of m explored before
          // it, and those asleep in w already (each stays enabled in succ, with its id)
          sl->putting.clear();
          for (const std::uint32_t a : sl->explored)
            if (w.independent(moves[a], m)) sl->putting.push_back(a);
          for (const std::uint32_t a : sl->asleep)
            if (w.independent(moves[a], m)) sl->putting.push_back(a);
          sl->explored.push_back(pos);
        }
      }
      const std::uint64_t fp = fingerprint_successor(succ, w);
      if (!opt.exact) by_fingerprint.prefetch(fp);
      if constexpr (sleep_world<W>) {
        if (sl) {  // their ids in the frame the successor's fingerprint chose
          sleep_made& sm = sl->made[cur];
          sm.frame = succ.sleep_frame();
          sm.ids.clear();
          for (const std::uint32_t a : sl->putting) sm.ids.push_back(id_of(a, sm.frame));
        }
      }
      if (pending) record(o, w, *own[cur ^ 1], *pending, pending_fp, made_at(cur ^ 1));
      pending = m, pending_fp = fp, cur ^= 1;
    }
    if (pending) record(o, w, *own[cur ^ 1], *pending, pending_fp, made_at(cur ^ 1));
    bb.out[k].end = static_cast<std::uint32_t>(o.edges.size());
  };
  std::array<std::function<void(unsigned, std::size_t)>, 2> expand_into;
  for (std::size_t i = 0; i < 2; ++i)
    expand_into[i] = [&, i](unsigned t, std::size_t k) { expand(buffers[i], t, k); };
  // Declared after everything its workers touch, so that it is destroyed (and waits for a batch
  // still running, e.g. when the merge throws) before any of it.
  detail::worker_pool pool(threads);
  auto launch = [&](std::size_t slot, std::size_t first) {
    auto& bb = buffers[slot];
    bb.first = first;
    bb.n = std::min(batch, frontier.size() - first);
    if (bb.out.size() < bb.n) bb.out.resize(bb.n);
    for (auto& t : bb.made) t.v.clear();  // keeps the capacity
    pool.start(bb.n, expand_into[slot]);
  };
  std::uint32_t level = 0;
  while (!frontier.empty()) {
    const std::uint64_t next_first = found;  // the next level's ids start here
    std::size_t cur = 0;
    launch(cur, 0);
    for (std::size_t b0 = 0; b0 < frontier.size(); b0 += batch, cur ^= 1) {
      pool.join();
      batch_buffers& bb = buffers[cur];
      const std::size_t n = bb.n;
      const bool more = b0 + n < frontier.size();
      // The merge below inserts at most one entry per fresh record.
      std::size_t fresh = 0;
      for (const auto& t : bb.made) fresh += t.v.details.size();
      if (!opt.exact) {
        // Growing the table allocates the new slots while the old ones are alive: stop with a
        // report before a growth that does not fit (nothing of this batch is merged yet).
        const std::size_t now = by_fingerprint.slot_bytes(), after = by_fingerprint.slot_bytes_for(fresh);
        const std::uint64_t room = after == now ? after : opt.max_table_bytes ? opt.max_table_bytes : detail::available_memory_bytes();
        if (after > room) {
          pool.wait();
          res.outcome = verdict::state_limit;
          res.violation = "the fingerprint table would grow from " + std::to_string(now) + " to " + std::to_string(after) +
                          " bytes for up to " + std::to_string(fresh) + " new states, past " +
                          (opt.max_table_bytes ? "max_table_bytes " + std::to_string(opt.max_table_bytes)
                                               : "the memory available (" + std::to_string(room) + " bytes)");
          return finish();
        }
      }
      if (more && overlap) {
        // Room for the merge's inserts now, so the table does not move under the next batch's lookups.
        by_fingerprint.reserve(fresh);
        launch(cur ^ 1, b0 + n);
      }
      // Phase 2 (this thread): ids in sequential BFS order.
      for (std::size_t k = 0; k < n; ++k) {
        const std::uint32_t id = frontier.ids[b0 + k];
        const auto& o = bb.made[bb.out[k].thread].v;
        const std::span<const edge> edges(o.edges.data() + bb.out[k].begin, bb.out[k].end - bb.out[k].begin);
        if (bb.out[k].terminal) ++res.terminal_states;
        res.slept += bb.out[k].slept;
        if (opt.liveness) out_start.push_back(out_to.size());  // == state id's row (ids expand in order)
        for (std::size_t j = 0; j < edges.size(); ++j) {
          const edge& e = edges[j];
          ++res.transitions;
          const successor* s = e.detail < known_before ? &o.details[e.detail] : nullptr;
          const auto [sid, fresh] = e.detail == known_before ? std::pair{e.id, false}
                                    : opt.exact              ? intern(s->key ? *s->key : *s->state, 0)
                                                             : by_fingerprint.insert(e.fp, std::uint32_t(found));
          if (opt.liveness) out_to.push_back(sid);
          const edge_sleep* es = sleep ? &o.edge_sleeps[bb.out[k].begin + j] : nullptr;
          if (!fresh) {
            if (es && sid >= next_first) {
              // another edge from the level above into a state of the next level: only what both
              // edges put to sleep stays asleep (ids name the same move in every member)
              const std::size_t zi = sid - next_first;
              std::uint64_t* z = next.sleep_ids.data() + next.sleep_at[zi];
              const std::uint64_t* from = o.sleep_ids.data() + es->at;
              next.sleep_n[zi] = static_cast<std::uint32_t>(
                  std::remove_if(z, z + next.sleep_n[zi], [&](std::uint64_t a) { return std::find(from, from + es->n, a) == from + es->n; }) - z);
            }
            continue;
          }
          // New to the table after the merge of earlier slots: it was new before the batch, and the
          // first of its fingerprint in its thread's share (an earlier one is merged first).
          if (!s) throw std::logic_error("check: a successor new to the table was dropped by its worker");
          add_state(id, s->move, s->goal);
          res.depth = level + 1;
          if (s->violation || found > opt.max_states) {
            pool.wait();  // the next batch, if one was handed over, still reads the table
            by_fingerprint.unpin();
            if (s->violation) {
              res.outcome = verdict::invariant_violated;
              res.violation = *s->violation;
              res.counterexample = path_to(sid);
            } else {
              res.outcome = verdict::state_limit;
              res.violation = "more than " + std::to_string(opt.max_states) + " states";
            }
            return finish();
          }
          if (packed) push_state(next, sid, nullptr, o.bytes.data() + s->bytes_at, s->bytes_size);
          else push_state(next, sid, &*s->state, nullptr, 0);
          if (es) next.push_sleep(es->frame, o.sleep_ids.data() + es->at, es->n);
        }
      }
      by_fingerprint.unpin();
      if (more && !overlap) launch(cur ^ 1, b0 + n);
      if (opt.progress && more)
        opt.progress(check_progress{"search", level, found, res.transitions, next.size(), next.encoded.bytes_held(),
                                    std::chrono::duration<double>(clock::now() - t0).count(), b0 + n, frontier.size()});
    }
    next.encoded.seal();
    const std::uint64_t previous_level = frontier.size();
    frontier.clear();
    std::swap(frontier, next);
    ++level;
    if (opt.progress)
      opt.progress(check_progress{"search", level, found, res.transitions, frontier.size(), frontier.encoded.bytes_held(),
                                  std::chrono::duration<double>(clock::now() - t0).count(), previous_level, previous_level});
  }
  if (opt.progress && opt.liveness)
    opt.progress(check_progress{"liveness", res.depth, found, res.transitions, 0, 0,
                                std::chrono::duration<double>(clock::now() - t0).count()});

  if (opt.liveness) {
    // Mark every state from which a goal state is reachable, first without a reverse graph. That
    // set is the least fixed point of X = goal ∪ {s : some successor of s is in X}. Each sweep walks
    // the forward rows from the last id to the first and adds every state with a successor already
    // in X, until a sweep adds nothing. Every state added reaches a goal (by induction over the
    // order of adding), and when a sweep adds nothing, X holds every state with a successor in X,
    // so X contains the whole set: exactly what a reverse reachability marks. Ids are BFS order,
    // so most edges go to larger ids, and a sweep from the last id settles every path whose ids
    // increase in one pass; each edge to a smaller id that every path to a goal needs costs another
    // sweep (the protocol's pinned worlds take 2 to 6, the last adding nothing). Memory: the
    // forward rows alone; the reverse graph took 4 more bytes per edge and 8 per state, held
    // together with the forward rows while it was built: the largest block of a big run. A graph
    // that needs more than max_sweeps (a long chain of edges to smaller ids) finishes with that
    // reverse reachability, seeded with what the sweeps marked, so the cost stays bounded.
    const std::size_t n = found;
    out_start.push_back(out_to.size());
    if (out_start.size() != n + 1) throw std::logic_error("check: states were not expanded in id order");
    std::vector<std::uint8_t> reaches = std::move(goal);  // goal_states is counted; the flags seed the set
    constexpr std::uint32_t max_sweeps = 16;
    bool grew = true;
    while (grew && res.liveness_sweeps < max_sweeps) {
      grew = false;
      ++res.liveness_sweeps;
      for (std::size_t s = n; s-- > 0;) {
        if (reaches[s]) continue;
        for (std::uint64_t e = out_start[s]; e < out_start[s + 1]; ++e)
          if (reaches[out_to[e]]) {
            reaches[s] = 1, grew = true;
            break;
          }
      }
      if (opt.progress)
        opt.progress(check_progress{"liveness", res.depth, found, res.transitions, 0, 0,
                                    std::chrono::duration<double>(clock::now() - t0).count(), 0, 0, res.liveness_sweeps});
    }
    if (grew) {  // not settled within max_sweeps: reverse reachability from every state marked so far
      res.liveness_reverse_graph = true;
      std::vector<std::uint64_t> start(n + 1, 0);
      for (std::uint64_t e = 0; e < out_to.size(); ++e) ++start[out_to[e] + 1];
      for (std::size_t i = 0; i < n; ++i) start[i + 1] += start[i];
      std::vector<std::uint32_t> rev(out_to.size());
      {
        std::vector<std::uint64_t> fill(start.begin(), start.end() - 1);
        for (std::uint32_t from = 0; from < n; ++from)
          for (std::uint64_t e = out_start[from]; e < out_start[from + 1]; ++e) rev[fill[out_to[e]]++] = from;
      }
      out_to.clear();
      out_start.clear();
      out_start.shrink_to_fit();
      std::vector<std::uint32_t> work;
      for (std::uint32_t i = 0; i < n; ++i)
        if (reaches[i]) work.push_back(i);
      while (!work.empty()) {
        const std::uint32_t s = work.back();
        work.pop_back();
        for (std::uint64_t k = start[s]; k < start[s + 1]; ++k)
          if (!reaches[rev[k]]) reaches[rev[k]] = 1, work.push_back(rev[k]);
      }
    }
    for (std::uint32_t i = 0; i < n; ++i)
      if (!reaches[i]) {  // the smallest id is one of the shallowest such states
        res.outcome = verdict::end_unreachable;
        res.violation = "no move sequence from this state ends the transition";
        res.counterexample = path_to(i);
        return finish();
      }
  }
  return finish();
}

/// Breadth-first search for a shortest path from `initial` to a state where `pred` holds (a witness:
/// "this behaviour is possible"). nullopt if no reachable state satisfies it within `max_states`.
template <checkable_world W, class Pred>
std::optional<std::vector<move_of<W>>> find_witness(const W& initial, Pred pred, std::uint64_t max_states = 20'000'000) {
  using Move = move_of<W>;
  constexpr std::uint32_t none = ~std::uint32_t{0};
  std::vector<std::uint32_t> parent{none};
  std::vector<Move> via(1);
  std::unordered_map<std::uint64_t, std::uint32_t> seen{{static_cast<std::uint64_t>(std::hash<W>{}(initial)), 0}};
  auto path_to = [&](std::uint32_t id) {
    std::vector<Move> p;
    for (std::uint32_t s = id; parent[s] != none; s = parent[s]) p.push_back(via[s]);
    return std::vector<Move>(p.rbegin(), p.rend());
  };
  if (pred(initial)) return std::vector<Move>{};
  std::vector<std::pair<std::uint32_t, W>> frontier{{0, initial}}, next;
  while (!frontier.empty() && parent.size() <= max_states) {
    for (auto& [id, w] : frontier)
      for (const auto& m : w.enabled_moves()) {
        W succ = w;
        succ.apply(m);
        const auto sid = static_cast<std::uint32_t>(parent.size());
        if (!seen.try_emplace(static_cast<std::uint64_t>(std::hash<W>{}(succ)), sid).second) continue;
        parent.push_back(id);
        via.push_back(m);
        if (pred(succ)) return path_to(sid);
        next.emplace_back(sid, std::move(succ));
      }
    frontier.clear();
    std::swap(frontier, next);
  }
  return std::nullopt;
}

/// Replays `path` from `initial` (each move must be enabled where it is applied); returns the final
/// world. Used to print and to re-verify counterexamples.
template <checkable_world W>
W replay(const W& initial, const std::vector<move_of<W>>& path) {
  W w = initial;
  for (const auto& m : path) w.apply(m);
  return w;
}

}  // namespace bitrefit::proofs
