// bitrefit/bitrefit.hpp — the whole host library in one include (target bitrefit::bitrefit).
// Each area's own umbrella is listed here as the area lands; CUDA-only headers are not included.
#pragma once

#include "bitrefit/core/core.hpp"
#include "bitrefit/io/io.hpp"
