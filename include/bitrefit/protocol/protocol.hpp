// bitrefit/protocol/protocol.hpp — the pure refit protocol in one include.
//
// The protocol is three state machines (coordinator, owner, receiver) plus the commit log's
// semantics, all plain values: `step(event) -> actions`, copyable, ==, hashable (protocol::hash_of),
// with no I/O, clocks, threads or randomness. Time enters only as deadline_event. What the actions
// do is carried out by protocol::drive (driver.hpp) through an Effects implementation: the model
// world (model/cluster.hpp, included apart) and the refit engine are the two. The vocabulary is
// documented in each header and in include/bitrefit/protocol/README.md.
#pragma once

#include "bitrefit/protocol/commit_log.hpp"
#include "bitrefit/protocol/coordinator.hpp"
#include "bitrefit/protocol/driver.hpp"
#include "bitrefit/protocol/format.hpp"
#include "bitrefit/protocol/messages.hpp"
#include "bitrefit/protocol/mutation.hpp"
#include "bitrefit/protocol/owner.hpp"
#include "bitrefit/protocol/receiver.hpp"
#include "bitrefit/protocol/types.hpp"
