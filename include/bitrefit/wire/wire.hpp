// bitrefit/wire/wire.hpp — bytes that leave a process, in one include: the JSON spelling of protocol
// values, control-plane envelopes, the engine's side messages, and recorded traces.
#pragma once

#include "bitrefit/wire/control.hpp"
#include "bitrefit/wire/engine.hpp"
#include "bitrefit/wire/json.hpp"
#include "bitrefit/wire/trace.hpp"
