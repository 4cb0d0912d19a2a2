// libFuzzer target: protocol wire messages on the control plane (wire/control.hpp).
// Laws: only bitrefit::error escapes; an accepted message re-encodes to bytes that decode to the
// same envelope (no field is silently wrapped or rounded on the way in).
#include <cstddef>
#include <cstdint>
#include <span>

#include "bitrefit/wire/control.hpp"

using namespace bitrefit;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  protocol::envelope env;
  try {
    env = wire::decode({reinterpret_cast<const std::byte*>(data), size});
  } catch (const error&) {
    return 0;
  }
  if (!(wire::decode(wire::encode(env)) == env)) __builtin_trap();
  return 0;
}
