// One side of bitrefit-paired-encode: the chunk encoder of ONE source tree, compiled into a
// namespace of its own (paired-encode.sh builds this file twice: the baseline's headers with
// -Dbitrefit=bitrefit_base -DPAIRED_SIDE=base_side, the working tree's with -DPAIRED_SIDE=work_side),
// so both encoders live in one process and can be timed alternately on the same data.
#include <cstdint>
#include <cstring>
#include <ctime>
#include <span>
#include <vector>

#include "bitrefit/codec/apply.hpp"
#include "bitrefit/codec/codec.hpp"

namespace PAIRED_SIDE {

using namespace bitrefit;
using namespace bitrefit::codec;

struct state {
  chunk_encoder<host_backend> encoder;
  byte_buffer out;
  std::vector<std::vector<std::byte>> frames;  // one per tensor, for apply()
  frame_applier<host_backend> applier;
  std::vector<std::uint16_t> work;
};

void* make_state() { return new state; }

// This thread's CPU time in seconds.
double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Encodes each tensor (m BF16 elements, old -> new) as one frame, default options; returns the
// thread CPU seconds and sets `bytes` to the frames' total size.
double encode(void* s, const std::vector<const std::uint16_t*>& olds, const std::vector<const std::uint16_t*>& news, std::size_t m,
              std::size_t& bytes) {
  auto& st = *static_cast<state*>(s);
  const double t0 = thread_seconds();
  bytes = 0;
  for (std::size_t t = 0; t < olds.size(); ++t) {
    const chunk_piece pc{.tensor = "t", .type = dtype::BF16, .tensor_elements = m, .begin = 0, .end = m,
                         .old_bytes = std::as_bytes(std::span(olds[t], m)), .new_bytes = std::as_bytes(std::span(news[t], m))};
    st.encoder.encode({frame_kind::delta, payload_id{{1, 0}, 0, static_cast<std::uint32_t>(t)}, 0, 1}, std::span(&pc, 1), st.out);
    bytes += st.out.size();
  }
  return thread_seconds() - t0;
}

// Encodes each tensor as encode() does and keeps the frames for apply() (untimed).
void keep_frames(void* s, const std::vector<const std::uint16_t*>& olds, const std::vector<const std::uint16_t*>& news, std::size_t m) {
  auto& st = *static_cast<state*>(s);
  std::size_t bytes = 0;
  st.frames.clear();
  for (std::size_t t = 0; t < olds.size(); ++t) {
    encode(s, {olds[t]}, {news[t]}, m, bytes);
    st.frames.emplace_back(st.out.data(), st.out.data() + st.out.size());
  }
}

// Applies each kept frame to a copy of its base (the copy untimed): verification, decoding and
// writing, as a receiver does. Returns the thread CPU seconds; `exact` stays true only if every
// result has the new tensor's bits.
double apply(void* s, const std::vector<const std::uint16_t*>& olds, const std::vector<const std::uint16_t*>& news, std::size_t m,
             bool& exact) {
  auto& st = *static_cast<state*>(s);
  st.work.resize(m);
  double total = 0;
  for (std::size_t t = 0; t < olds.size(); ++t) {
    std::memcpy(st.work.data(), olds[t], m * 2);
    const target_map tm({mutable_tensor_view("t", dtype::BF16, shape_t{m}, std::as_writable_bytes(std::span(st.work)))});
    const double t0 = thread_seconds();
    st.applier.apply(st.frames[t], tm);
    total += thread_seconds() - t0;
    exact = exact && std::memcmp(st.work.data(), news[t], m * 2) == 0;
  }
  return total;
}

}  // namespace PAIRED_SIDE
