// libFuzzer target: delta bundle, single-file form (codec/bundle.hpp): header, manifest JSON under
// its limits, every integer field checked, frame list against the file, then apply_bundle onto a
// scratch model of the manifest's tensors filled with zeros (the seeds' base). Each input runs as
// it is and resealed (manifest digest recomputed, reseal.hpp) so JSON mutations reach the parser.
// Laws: only bitrefit::error escapes; a refused bundle leaves the model untouched unless the
// refusal is the final target-digest check (which runs after writing, by contract).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bitrefit/codec/bundle.hpp"
#include "reseal.hpp"

using namespace bitrefit;

namespace {

constexpr std::uint64_t max_model_bytes = 8u << 20;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

void run(std::span<const std::byte> bytes) {
  codec::delta_bundle b;
  try {
    b = codec::read_bundle_bytes(bytes, "fuzz.bundle");
  } catch (const error&) {
    return;
  }
  std::uint64_t total = 0;
  for (const auto& t : b.manifest.tensors.tensors()) {
    if (t.bytes() > max_model_bytes - total) return;  // too large for a scratch model (no wrap-around)
    total += t.bytes();
  }
  std::vector<std::vector<std::byte>> store;
  std::vector<mutable_tensor_view> views;
  store.reserve(b.manifest.tensors.size());  // views point into store: no reallocation
  for (const auto& t : b.manifest.tensors.tensors()) {
    store.emplace_back(t.bytes());
    views.emplace_back(t.name, t.type, t.shape, std::span<std::byte>(store.back()));
  }
  const auto before = store;
  try {
    codec::apply_bundle(b, views, "fuzz.bundle");
  } catch (const error& e) {
    if (e.where().field != "target_digest") require(store == before);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  run(in);
  const auto sealed = fuzz::reseal_bundle(in);
  if (!std::equal(sealed.begin(), sealed.end(), in.begin(), in.end())) run(sealed);
  return 0;
}
