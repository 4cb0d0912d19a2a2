// mapped_store.hpp — the demo rollout engine's weights: every canonical tensor laid out in one
// shared memory mapping (a file under /dev/shm), identity placement.
//
// It is a layout::Loader (bit-preserving, holds everything), so receivers apply payloads straight
// into it. Because the mapping is a file, the demo's trainer can map a receiver's weights
// read-only and compare them byte for byte with its own dense copy after every commit — a check
// that does not trust the receiver's own attestation. A small header in front of the tensors
// carries what the receiver says it holds (version, baseline id, attestation digest).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/core/manifest.hpp"
#include "bitrefit/layout/concepts.hpp"

namespace demo {

using namespace bitrefit;

/// Written by the receiver after every change of what it holds; read by the trainer.
struct mapped_header {
  std::atomic<std::uint64_t> seq;  // odd while the receiver updates the fields below (seqlock)
  std::uint64_t version;
  std::uint64_t baseline;
  std::uint64_t incarnation;
  std::uint64_t attest_low, attest_high;
  std::uint64_t pad[2];
};
static_assert(sizeof(mapped_header) == 64);

struct holding {
  std::uint64_t version = 0, baseline = 0, incarnation = 0;
  digest128 attestation{};
  friend bool operator==(const holding&, const holding&) = default;
};

class mapped_store {
 public:
  /// Creates (truncating) or opens the mapping at `path` for `m`. The data region starts zeroed
  /// when created.
  mapped_store(std::string path, model_manifest m, bool writable, bool create)
      : path_(std::move(path)), manifest_(std::move(m)) {
    std::uint64_t off = sizeof(mapped_header);
    for (const auto& t : manifest_.tensors()) {
      off = (off + 63) / 64 * 64;
      offsets_.push_back(off);
      off += t.bytes();
    }
    size_ = off;
    int fd = ::open(path_.c_str(), (writable ? O_RDWR : O_RDONLY) | (create ? O_CREAT | O_TRUNC : 0) | O_CLOEXEC, 0600);
    if (fd < 0) throw error(errc::io, std::string("cannot open mapping: ") + std::strerror(errno), {.file = path_, .tensor = {}, .field = {}});
    if (create && ::ftruncate(fd, static_cast<off_t>(size_)) != 0) {
      ::close(fd);
      throw error(errc::io, "cannot size mapping", {.file = path_, .tensor = {}, .field = {}});
    }
    void* p = ::mmap(nullptr, size_, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw error(errc::io, "mmap failed", {.file = path_, .tensor = {}, .field = {}});
    base_ = static_cast<std::byte*>(p);
    for (std::size_t i = 0; i < manifest_.size(); ++i) {
      const auto& t = manifest_.tensors()[i];
      held_.push_back({0, t.elements()});
      segs_.push_back({0, t.elements(), base_ + offsets_[i]});
    }
  }
  mapped_store(const mapped_store&) = delete;
  mapped_store& operator=(const mapped_store&) = delete;
  ~mapped_store() {
    if (base_) ::munmap(base_, size_);
  }

  // --- Loader ---
  const model_manifest& canonical() const noexcept { return manifest_; }
  std::span<const layout::index_range> held(std::string_view t) const {
    auto i = index(t);
    return held_[i].empty() ? std::span<const layout::index_range>{} : std::span(&held_[i], 1);
  }
  bool bit_preserving(std::string_view t) const { return (void)index(t), true; }
  std::span<const layout::placement_segment> segments(std::string_view t) const {
    auto i = index(t);
    return segs_[i].size() == 0 ? std::span<const layout::placement_segment>{} : std::span(&segs_[i], 1);
  }
  void write(std::string_view t, layout::index_range r, std::span<const std::byte> in) {
    auto i = index(t);
    std::memcpy(segs_[i].data + r.begin * element_size(manifest_.tensors()[i].type), in.data(), in.size());
  }
  void read(std::string_view t, layout::index_range r, std::span<std::byte> out) const {
    auto i = index(t);
    std::memcpy(out.data(), segs_[i].data + r.begin * element_size(manifest_.tensors()[i].type), out.size());
  }

  // --- demo access ---
  std::span<const std::byte> bytes(std::size_t tensor_index) const {
    return {segs_[tensor_index].data, manifest_.tensors()[tensor_index].bytes()};
  }
  void publish(const holding& h) {
    auto* hd = header();
    hd->seq.fetch_add(1);
    hd->version = h.version;
    hd->baseline = h.baseline;
    hd->incarnation = h.incarnation;
    hd->attest_low = h.attestation.low64;
    hd->attest_high = h.attestation.high64;
    hd->seq.fetch_add(1);
  }
  holding read_holding() const {
    auto* hd = header();
    for (;;) {
      const auto s1 = hd->seq.load();
      holding h{hd->version, hd->baseline, hd->incarnation, {hd->attest_low, hd->attest_high}};
      if (s1 % 2 == 0 && hd->seq.load() == s1) return h;
    }
  }

 private:
  mapped_header* header() const { return reinterpret_cast<mapped_header*>(base_); }
  std::size_t index(std::string_view t) const {
    if (auto i = manifest_.index_of(t)) return *i;
    throw error(errc::mismatch, "tensor is not in this engine", {.file = path_, .tensor = std::string(t), .field = {}});
  }

  std::string path_;
  model_manifest manifest_;
  std::vector<std::uint64_t> offsets_;
  std::uint64_t size_ = 0;
  std::byte* base_ = nullptr;
  std::vector<layout::index_range> held_;
  std::vector<layout::placement_segment> segs_;
};

static_assert(layout::Loader<mapped_store>);

}  // namespace demo
