// bitrefit/bitrefit.hpp — the host library in one include (target bitrefit::bitrefit).
// Each area's own umbrella is listed here as the area provides one; Thrust/CUDA headers
// (codec/thrust/) and test simulators (protocol/model, testing/) are included apart.
#pragma once

#include "bitrefit/codec/codec.hpp"
#include "bitrefit/core/core.hpp"
#include "bitrefit/io/io.hpp"
#include "bitrefit/layout/layout.hpp"
#include "bitrefit/protocol/protocol.hpp"
#include "bitrefit/durability/durability.hpp"
#include "bitrefit/refit/refit.hpp"
#include "bitrefit/transport/transport.hpp"
