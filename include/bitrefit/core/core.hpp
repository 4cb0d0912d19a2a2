// bitrefit/core/core.hpp — the core vocabulary in one include.
#pragma once

#include "bitrefit/core/bit_diff.hpp"
#include "bitrefit/core/canonical.hpp"
#include "bitrefit/core/crash_points.hpp"
#include "bitrefit/core/digest.hpp"
#include "bitrefit/core/dtype.hpp"
#include "bitrefit/core/error.hpp"
#include "bitrefit/core/fields.hpp"
#include "bitrefit/core/ids.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/core/tensor.hpp"
#include "bitrefit/core/value_mode.hpp"
