// bitrefit/layout/layout.hpp — the layout area in one include (standard library + core/ only).
// layout/frame_apply.hpp, the bridge to codec frames, needs bitrefit::codec and is included apart.
#pragma once

#include "bitrefit/layout/apply.hpp"
#include "bitrefit/layout/borrowed_store.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/layout/change_set.hpp"
#include "bitrefit/layout/concepts.hpp"
#include "bitrefit/layout/delta_build.hpp"
#include "bitrefit/layout/fp8.hpp"
#include "bitrefit/layout/megatron.hpp"
#include "bitrefit/layout/model_spec.hpp"
#include "bitrefit/layout/ownership.hpp"
#include "bitrefit/layout/runs.hpp"
#include "bitrefit/layout/serving_report.hpp"
#include "bitrefit/layout/vllm_layout.hpp"
