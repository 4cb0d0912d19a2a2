// libFuzzer target: payload frame parse + decode + apply into a scratch model (codec/frame.hpp,
// codec/apply.hpp). Each input runs twice: as it is (the digest stops almost every mutation), and
// resealed (frame_size and XXH3-128 recomputed, reseal.hpp) so mutations reach every descriptor
// check, the zstd sections, the location decoders and the writes.
// Laws checked on every input (a broken one traps):
//  - only bitrefit::error leaves the decoder (std::bad_alloc or anything else is a crash);
//  - a refused frame leaves the model bit-identical and the decoder holding no more scratch than
//    before it (what earlier accepted frames left is kept for reuse; a decode that fails frees all);
//  - scratch stays within the format's bound (codec/apply.hpp: at most 7 bytes per covered byte);
//  - an accepted frame whose items are all overwrite is idempotent; all XOR: applying it twice
//    restores the model; with a base-conditioned item, applying it again onto its own result is
//    accepted or refused with the model untouched (it may not hold that item's base any more).
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/codec/apply.hpp"
#include "reseal.hpp"

using namespace bitrefit;

namespace {

constexpr std::uint64_t max_model_bytes = 8u << 20;  // larger frames meet an empty model instead

void require(bool ok) {
  if (!ok) __builtin_trap();
}

codec::frame_applier<>& applier() {
  static codec::frame_applier<> a;  // reused across inputs, like a receiver's
  return a;
}

void run(std::span<const std::byte> bytes) {
  std::optional<codec::frame_view> f;
  try {
    f = codec::frame_view::parse(bytes);
  } catch (const error&) {
    return;
  }
  // A model with every tensor the frame names (pattern bytes), unless it would be too large: then
  // no tensor at all, and the applier must refuse the frame before decoding anything.
  std::map<std::string, std::vector<std::byte>> store;
  std::vector<mutable_tensor_view> views;
  std::uint64_t total = 0;
  bool small = true;
  for (const auto& it : f->items()) {
    if (store.count(it.tensor)) continue;
    const std::uint64_t E = element_size(it.type);
    if (it.tensor_elements > (max_model_bytes - total) / E) {
      small = false;
      break;
    }
    auto& b = store[it.tensor];
    b.resize(it.tensor_elements * E);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 131 + it.tensor.size());
    total += b.size();
    views.emplace_back(it.tensor, it.type, shape_t{it.tensor_elements}, std::span<std::byte>(b));
  }
  if (!small) views.clear();
  std::optional<codec::target_map> targets;
  try {
    targets.emplace(views);
  } catch (const error&) {
    return;
  }
  std::map<std::string, std::vector<std::byte>> before = small ? store : decltype(store){};
  auto& ap = applier();
  const std::size_t scratch_before = ap.scratch_bytes();  // kept from earlier accepted frames
  try {
    ap.apply(bytes, *targets);
  } catch (const error&) {
    if (small) require(store == before);               // nothing written
    require(ap.scratch_bytes() <= scratch_before);      // a refused frame never grows what is kept
    return;
  }
  require(small);  // a frame naming tensors the model lacks must be refused
  require(ap.scratch_bytes() <= 8 * codec::frame_input_bytes_limit);
  bool all_overwrite = true, all_xor = true, conditioned = false;
  for (const auto& it : f->items()) {
    all_overwrite = all_overwrite && it.mode == codec::value_mode::overwrite;
    all_xor = all_xor && it.mode == codec::value_mode::xor_mask;
    conditioned = conditioned || it.mode == codec::value_mode::base_conditioned;
  }
  const auto once = store;
  if (conditioned) {
    // A base-conditioned item decodes against the base it was coded from. Applied again, onto its
    // own result, it may be refused as a wrong base (an escape equal to its base, a step out of the
    // finite range, a rank past its class): then nothing is written. Or it decodes to other bits.
    try {
      ap.apply(bytes, *targets);
    } catch (const error&) {
      require(store == once);
    }
    return;
  }
  ap.apply(bytes, *targets);  // accepted once: accepted again
  if (all_overwrite) require(store == once);
  if (all_xor && !f->items().empty()) require(store == before);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  run(in);
  const auto sealed = fuzz::reseal_frame(in);
  if (!std::equal(sealed.begin(), sealed.end(), in.begin(), in.end())) run(sealed);
  return 0;
}
