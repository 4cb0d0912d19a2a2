// libFuzzer entry point for the relay link's framing decoder and handshake admission
// (include/bitrefit/transport/relay/framing.hpp, handshake.hpp): both are pure functions of bytes.
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude
//       tests/fuzz/fuzz_relay_framing.cpp -o fuzz_relay_framing && ./fuzz_relay_framing
// The first input byte picks the chunk size the rest is fed in (the decoder must not care).
// Checked: no crash, no unbounded allocation (lengths are limited from the header alone), every
// decoded message re-encodes to bytes that decode to the same message, and the same input fed
// whole gives the same messages and the same first error.
// tests/transport/relay/test_relay_framing.cpp links this file and runs it on random inputs, so it
// keeps compiling without a fuzzing toolchain.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "bitrefit/transport/relay/framing.hpp"
#include "bitrefit/transport/relay/handshake.hpp"

namespace {
using namespace bitrefit::transport::relay;

struct run_result {
  std::vector<framing::decoded> msgs;
  std::optional<framing::error_info> err;
};

run_result run(std::span<const std::byte> in, std::size_t chunk) {
  framing::limits lim;
  lim.max_block = 64 << 10;
  lim.max_control = 1 << 20;
  framing::decoder d(lim);
  run_result r;
  for (std::size_t at = 0; at < in.size() && !r.err; at += chunk)
    r.err = d.feed(in.subspan(at, std::min(chunk, in.size() - at)), [&](framing::decoded&& m) { r.msgs.push_back(std::move(m)); });
  return r;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t chunk = 1 + data[0] % 61;
  const auto in = std::as_bytes(std::span(data + 1, size - 1));
  const run_result a = run(in, chunk), b = run(in, in.size() + 1);
  if (a.msgs.size() != b.msgs.size() || a.err.has_value() != b.err.has_value()) std::abort();
  if (a.err && a.err->code != b.err->code) std::abort();
  for (std::size_t i = 0; i < a.msgs.size(); ++i) {
    if (a.msgs[i].channel != b.msgs[i].channel || !(a.msgs[i].msg == b.msgs[i].msg)) std::abort();
    if (auto* h = std::get_if<framing::hello>(&a.msgs[i].msg)) (void)admit(*h, "fuzz", node_role::root);
    const auto again = framing::encode(a.msgs[i].msg, a.msgs[i].channel);
    const run_result c = run(again, again.size());
    if (c.err || c.msgs.size() != 1 || !(c.msgs[0].msg == a.msgs[i].msg)) std::abort();
  }
  return 0;
}
