// bitrefit/refit/refit.hpp — the refit engine (sender, receiver and what they compose) in one include.
#pragma once

#include "bitrefit/durability/durability.hpp"
#include "bitrefit/refit/concepts.hpp"
#include "bitrefit/refit/encode_pipeline.hpp"
#include "bitrefit/refit/owner_shard.hpp"
#include "bitrefit/refit/placement.hpp"
#include "bitrefit/refit/projection.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/receiver_store.hpp"
#include "bitrefit/refit/restore_server.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/refit/sender_effects.hpp"
#include "bitrefit/refit/stats.hpp"
#include "bitrefit/refit/thread_pool.hpp"
#include "bitrefit/transport/transport.hpp"
#include "bitrefit/wire/wire.hpp"
