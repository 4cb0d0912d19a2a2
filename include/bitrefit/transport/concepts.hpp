// bitrefit/transport/concepts.hpp — what the refit engine needs from a network.
//
// A transport has two planes:
//  * the DATA plane carries payload frames. Frames live in streams: one stream per refit attempt
//    (named after the attempt id τ) and one per dense restore of a committed record K = (v, g).
//    A frame is addressed by (stream, owner, seq) — for an attempt that is exactly the payload id,
//    so re-publishing a re-encoded chunk lands on the same key with the same bytes.
//  * the CONTROL plane carries protocol messages (prepare, ack, commit announcements, ...) as
//    opaque byte strings to named mailboxes ("coordinator", "receiver/2", ...).
// The transport holds no protocol state: it only moves bytes (Boost.Asio's rule for adapters).
//
// Laws (the engine relies on these and on nothing stronger):
//  1. publish(k, b) then fetch(k) yields b, or a copy that fails frame verification (a faulty
//     network may corrupt); it never yields bytes of another key.
//  2. publish is idempotent for equal bytes: publishing (k, b) twice is the same as once.
//  3. list(s) returns only keys of stream s (a faulty network may repeat or reorder them); a key
//     published before the call may be missing (eventual visibility) but shows up in a later call
//     unless discard(s) ran.
//  4. discard(s) removes the stream's frames; later fetches of its keys may return nullopt.
//  5. post(m, b) delivers b to mailbox m at least once unless the network loses it; copies may be
//     duplicated, delayed and reordered (the protocol tolerates all of these).
//  6. receive(m, wait) returns what arrived for m (consuming it) and blocks at most about `wait`
//     when nothing is there; polling implementations sleep with a bounded interval. It may return
//     early with nothing (a push transport does so when a payload frame arrived, so an engine
//     loop that lists frames after each receive reacts at once instead of after `wait`).
// Models: in-process (inprocess.hpp), object store with a directory as the embedded default
// (object_store.hpp), the same over S3 (s3_store.hpp: s3_transport), the relay tree over TCP
// (relay/tree_transport.hpp).
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/core/ids.hpp"

namespace bitrefit::transport {

using bytes = std::vector<std::byte>;

/// Names one stream of frames: an attempt's payloads or a dense restore of a committed record.
struct stream_key {
  std::string name;  // "a<epoch>.<counter>" or "r<version>.<baseline>"; safe as a path component
  friend auto operator<=>(const stream_key&, const stream_key&) = default;
};

struct frame_key {
  stream_key stream;
  std::uint32_t owner = 0;
  std::uint32_t seq = 0;
  friend auto operator<=>(const frame_key&, const frame_key&) = default;
};

inline stream_key attempt_stream(const attempt_id& a) {
  return {"a" + std::to_string(a.epoch) + "." + std::to_string(a.counter)};
}
inline stream_key restore_stream(version_t v, baseline_id g) {
  return {"r" + std::to_string(v) + "." + std::to_string(g.value)};
}
/// The data-plane key of a payload: derived from the payload id only.
inline frame_key key_of(const payload_id& p) { return {attempt_stream(p.attempt), p.owner, p.seq}; }

/// Object-name spelling of (owner, seq): fixed width so byte-wise name order is (owner, seq) order.
inline std::string frame_object_name(std::uint32_t owner, std::uint32_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08x.%08x", owner, seq);
  return buf;
}

template <class T>
concept Transport = requires(T& t, const frame_key& k, const stream_key& s, std::span<const std::byte> b,
                             const std::string& mailbox, std::chrono::milliseconds wait) {
  { t.publish(k, b) } -> std::same_as<void>;
  { t.list(s) } -> std::same_as<std::vector<frame_key>>;
  { t.fetch(k) } -> std::same_as<std::optional<bytes>>;
  { t.discard(s) } -> std::same_as<void>;
  { t.post(mailbox, b) } -> std::same_as<void>;
  { t.receive(mailbox, wait) } -> std::same_as<std::vector<bytes>>;
};

/// Optional refinement for event-driven callers: the waits of a Transport as asynchronous
/// operations in the Asio style, each taking a completion token (a callback as below,
/// asio::use_future, asio::use_awaitable, ...). Laws, beyond Transport's: each completion runs
/// exactly once, never inside the initiating call, on the handler's associated executor;
/// async_receive completes with what receive() would have returned (an empty vector after `wait`
/// or on an early wake-up), async_fetch with what fetch() would have returned. The engine uses the
/// blocking members only, so every Transport works with it; this concept is for callers that
/// multiplex many nodes on one event loop.
template <class T>
concept AsyncTransport = Transport<T> && requires(T& t, const std::string& mailbox, std::chrono::milliseconds wait, const frame_key& k) {
  t.async_receive(mailbox, wait, [](auto /*error_code*/, std::vector<bytes>) {});
  t.async_fetch(k, [](auto /*error_code*/, std::optional<bytes>) {});
};

/// A key/value object store (a directory, S3, ...). Laws: put is atomic (a reader sees the old
/// object, nothing, or the whole new one, never a prefix); get after put returns the bytes put;
/// list(prefix) returns every visible key starting with prefix, sorted byte-wise; remove of an
/// absent key is a no-op.
template <class S>
concept ObjectStore = requires(S& s, const std::string& key, std::span<const std::byte> b) {
  { s.put(key, b) } -> std::same_as<void>;
  { s.get(key) } -> std::same_as<std::optional<bytes>>;
  { s.list(key) } -> std::same_as<std::vector<std::string>>;
  { s.remove(key) } -> std::same_as<void>;
};

}  // namespace bitrefit::transport
