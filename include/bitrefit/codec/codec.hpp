// bitrefit/codec/codec.hpp — the codec in one include: change detection and encoding into payload
// frames, verified in-place apply, attestation digests, delta bundles, the host backend.
#pragma once

#include "bitrefit/codec/apply.hpp"
#include "bitrefit/codec/attestation.hpp"
#include "bitrefit/codec/bundle.hpp"
#include "bitrefit/codec/concepts.hpp"
#include "bitrefit/codec/encoder.hpp"
#include "bitrefit/codec/entropy.hpp"
#include "bitrefit/codec/frame.hpp"
#include "bitrefit/codec/hash.hpp"
#include "bitrefit/codec/host_backend.hpp"
#include "bitrefit/codec/location.hpp"
#include "bitrefit/codec/types.hpp"
