// libFuzzer target: the safetensors single-file header (io/safetensors.hpp) and
// model.safetensors.index.json (io/checkpoint.hpp parse_index). The first input byte selects the
// decoder (even: a whole .safetensors file in memory; odd: index JSON text), the rest is its input.
// Laws: only bitrefit::error escapes; an accepted file round-trips — serializing its tensors and
// metadata and parsing that again gives the same manifest, metadata and bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "bitrefit/io/checkpoint.hpp"
#include "bitrefit/io/safetensors.hpp"

using namespace bitrefit;

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

void safetensors_file(std::span<const std::byte> bytes) {
  std::optional<io::safetensors_view> v;
  try {
    v.emplace(bytes, "fuzz.safetensors");
  } catch (const error&) {
    return;
  }
  const auto tensors = v->tensors();
  const auto again = io::serialize_safetensors(tensors, v->metadata());
  const io::safetensors_view w(again, "again");
  require(w.manifest() == v->manifest() && w.metadata() == v->metadata());
  for (const auto& t : tensors) require(std::ranges::equal(w.tensor(t.name()).bytes(), t.bytes()));
}

void index_json(std::string_view text) {
  try {
    const auto idx = io::parse_index(text, "fuzz.index.json");
    for (const auto& [tensor, shard] : idx.weight_map) require(!shard.empty() && shard.find('/') == std::string::npos);
  } catch (const error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto* rest = reinterpret_cast<const std::byte*>(data + 1);
  if (data[0] % 2 == 0) safetensors_file({rest, size - 1});
  else index_json({reinterpret_cast<const char*>(rest), size - 1});
  return 0;
}
