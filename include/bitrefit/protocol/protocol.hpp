// bitrefit/protocol/protocol.hpp — the pure refit protocol in one include.
//
// The protocol is three state machines (coordinator, owner, receiver) plus the commit log's
// semantics, all plain values: `step(event) -> actions`, copyable, ==, hashable (protocol::hash_of),
// with no I/O, clocks, threads or randomness. Time enters only as deadline_event. The vocabulary is
// documented in each header and in include/bitrefit/protocol/README.md.
//
// THE DRIVER LOOP (what the engine, the RapidCheck world and the model checker all do)
//  1. Deliver one input to one machine as an event: a message from the transport (payloads only
//     after their frame verified), a log reply, a local completion (drained, device_synced,
//     commit_read, restored, chunk_encoded, encode_finished), a deadline, start/boot, or a
//     trainer/operator command (begin_transition, operator_abort). Step only that machine.
//  2. Perform the returned actions IN LIST ORDER. An action that completes later (log_action,
//     sync_device, drain_requests, read_commit, dense_restore, encode) produces exactly one event
//     (or, for encode, one per chunk plus encode_finished) that goes back to step 1 for the SAME
//     machine; never fabricate or reorder those completions.
//  3. Durable first: a log_action is the last action of its step and nothing that depends on its
//     outcome is sent before its reply is stepped (prepare is persisted BEFORE being sent; K is
//     durable BEFORE anyone is told). persist_incarnation is durable BEFORE anything is sent under
//     the new incarnation; advance_baseline is durable BEFORE the baseline is used as a delta base.
//  4. Sends may go out in any order relative to other machines' sends, be lost, duplicated,
//     delayed or reordered by the transport; the machines tolerate all of it.
//  5. apply_payload may complete asynchronously and out of order within one attempt; only
//     sync_device (and dense_restore) wait for it. Never report device_synced before every
//     earlier apply took effect.
//  6. Keep one timer per machine: arm_deadline (re)starts it, disarm_deadline cancels it; when it
//     expires, step deadline_event. Deadlines are hints: stepping one early is safe.
//  7. A machine that crashes is replaced by a fresh value: a coordinator with a higher epoch (then
//     start_event), a receiver from receiver::restarted with the next durable incarnation (then
//     boot_event), an owner from its durable baseline.
#pragma once

#include "bitrefit/protocol/commit_log.hpp"
#include "bitrefit/protocol/coordinator.hpp"
#include "bitrefit/protocol/format.hpp"
#include "bitrefit/protocol/messages.hpp"
#include "bitrefit/protocol/owner.hpp"
#include "bitrefit/protocol/receiver.hpp"
#include "bitrefit/protocol/types.hpp"
