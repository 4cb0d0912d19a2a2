// bitrefit/transport/relay/frame_store.hpp — the frames a relay node holds, in blocks.
//
// A frame is kept as the blocks it arrived in (framing::frame_block), so a relay forwards a block
// to its children the moment it arrived (cut-through) without assembling the frame, and every
// child's queue shares the same immutable block (std::shared_ptr): fanout costs no copies.
// Blocks are kept in memory up to `memory_budget` bytes; later blocks are written to an unlinked
// spool file and read back when a lagging or rejoining child or the engine asks for them, so the
// memory of a relay does not grow with the payload (README: "Memory").
// Frames stay until their stream is discarded (the coordinator's cleanup of an attempt, relayed
// down the tree): that retention is what a rejoining child fetches the frames it missed from.
// Not thread-safe: a node uses it from its strand only; snapshot() hands an engine thread what it
// needs to copy a frame out without the strand.
#pragma once

#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/transport/concepts.hpp"

namespace bitrefit::transport::relay {

using block = std::shared_ptr<const std::vector<std::byte>>;

/// An unlinked temporary file: nothing is left behind when the process dies.
class spool_file {
 public:
  explicit spool_file(const std::filesystem::path& dir) {
    const auto d = dir.empty() ? std::filesystem::temp_directory_path() : dir;
    fd_ = ::open(d.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd_ < 0) {  // filesystems without O_TMPFILE: create, then unlink at once
      std::string tmpl = (d / "bitrefit-relay-spool-XXXXXX").string();
      fd_ = ::mkstemp(tmpl.data());
      if (fd_ >= 0) ::unlink(tmpl.c_str());
    }
    if (fd_ < 0) throw error(errc::io, std::string("cannot create the relay spool file: ") + std::strerror(errno), {.file = d.string(), .tensor = {}, .field = "spool_dir"});
  }
  spool_file(const spool_file&) = delete;
  spool_file& operator=(const spool_file&) = delete;
  ~spool_file() { ::close(fd_); }

  /// Appends; offsets are never reused, so a reader holding an old offset never sees other bytes.
  std::uint64_t append(std::span<const std::byte> b) {
    const std::uint64_t off = end_;
    std::size_t done = 0;
    while (done < b.size()) {
      const ssize_t n = ::pwrite(fd_, b.data() + done, b.size() - done, static_cast<off_t>(off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw error(errc::io, std::string("relay spool write failed: ") + std::strerror(errno), {.file = {}, .tensor = {}, .field = "spool_dir"});
      done += static_cast<std::size_t>(n);
    }
    end_ += b.size();
    return off;
  }
  /// Reads back; bytes released in between read as zeros (a frame digest then fails: undelivered).
  void read(std::uint64_t off, std::span<std::byte> out) const {
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        std::memset(out.data() + done, 0, out.size() - done);
        return;
      }
      done += static_cast<std::size_t>(n);
    }
  }
  /// Gives the disk space back (the file keeps its size; the range becomes a hole).
  void release(std::uint64_t off, std::uint64_t len) {
    if (len) (void)::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off), static_cast<off_t>(len));
  }

 private:
  int fd_ = -1;
  std::uint64_t end_ = 0;
};

/// One block of a frame: in memory (`mem`), or in the spool at `offset`.
struct piece {
  block mem;
  std::uint64_t offset = 0;
  std::uint32_t length = 0;
};

struct stored_frame {
  std::uint64_t size = 0;
  std::uint64_t received = 0;
  std::vector<piece> pieces;
  bool complete() const noexcept { return received == size; }
};

/// What an engine thread needs to copy a frame out (the spool stays alive with it).
struct frame_snapshot {
  std::vector<piece> pieces;
  std::uint64_t size = 0;
  std::shared_ptr<const spool_file> spool;

  bytes assemble() const {
    bytes out(size);
    std::size_t at = 0;
    for (const auto& p : pieces) {
      if (p.mem) std::memcpy(out.data() + at, p.mem->data(), p.length);
      else if (spool) spool->read(p.offset, std::span(out.data() + at, p.length));
      at += p.length;
    }
    return out;
  }
};

class frame_store {
 public:
  frame_store(std::uint64_t memory_budget, std::filesystem::path spool_dir)
      : budget_(memory_budget), spool_dir_(std::move(spool_dir)) {}

  stored_frame* find(const frame_key& k) {
    auto it = frames_.find(k);
    return it == frames_.end() ? nullptr : &it->second;
  }
  const stored_frame* find(const frame_key& k) const {
    auto it = frames_.find(k);
    return it == frames_.end() ? nullptr : &it->second;
  }

  /// Starts a frame of `size` bytes. @pre !find(k)
  stored_frame& begin(const frame_key& k, std::uint64_t size) {
    auto& f = frames_[k];
    f = stored_frame{size, 0, {}};
    return f;
  }

  /// Appends the next block. Returns false (and stores nothing) when it would run past the size
  /// the frame was announced with.
  bool append(const frame_key& k, block b) {
    auto* f = find(k);
    if (!f || b->size() > f->size - f->received) return false;
    piece p;
    p.length = static_cast<std::uint32_t>(b->size());
    if (memory_ + b->size() <= budget_) {
      memory_ += b->size();
      p.mem = std::move(b);
    } else {
      if (!spool_) spool_ = std::make_shared<spool_file>(spool_dir_);
      p.offset = spool_->append(*b);
      spilled_ += b->size();
    }
    f->received += p.length;
    f->pieces.push_back(std::move(p));
    return true;
  }

  /// The bytes of one piece, from memory or read back from the spool.
  block load(const piece& p) const {
    if (p.mem) return p.mem;
    auto b = std::make_shared<std::vector<std::byte>>(p.length);
    if (spool_) spool_->read(p.offset, *b);
    return b;
  }

  frame_snapshot snapshot(const frame_key& k) const {
    const auto* f = find(k);
    if (!f) return {};
    return {f->pieces, f->size, spool_};
  }

  void erase(const frame_key& k) {
    auto it = frames_.find(k);
    if (it == frames_.end()) return;
    release(it->second);
    frames_.erase(it);
  }

  /// Drops every frame of stream `s` (complete or not).
  void discard(const stream_key& s) {
    auto it = frames_.lower_bound(frame_key{s, 0, 0});
    while (it != frames_.end() && it->first.stream == s) {
      release(it->second);
      it = frames_.erase(it);
    }
  }

  /// Complete frames of `s`, in (owner, seq) order.
  std::vector<frame_key> list(const stream_key& s) const {
    std::vector<frame_key> out;
    for (auto it = frames_.lower_bound(frame_key{s, 0, 0}); it != frames_.end() && it->first.stream == s; ++it)
      if (it->second.complete()) out.push_back(it->first);
    return out;
  }
  /// Every frame (complete or arriving), in key order: what a child joining here may be sent.
  std::vector<frame_key> keys() const {
    std::vector<frame_key> out;
    for (auto& [k, f] : frames_) out.push_back(k);
    return out;
  }
  /// Every complete frame, in key order (a hello's inventory).
  std::vector<frame_key> inventory() const {
    std::vector<frame_key> out;
    for (auto& [k, f] : frames_)
      if (f.complete()) out.push_back(k);
    return out;
  }

  std::uint64_t memory_bytes() const noexcept { return memory_; }
  std::uint64_t spilled_bytes() const noexcept { return spilled_; }
  std::size_t frames() const noexcept { return frames_.size(); }

 private:
  void release(stored_frame& f) {
    for (auto& p : f.pieces) {
      if (p.mem) memory_ -= p.length;
      else if (spool_) {
        spool_->release(p.offset, p.length);
        spilled_ -= p.length;
      }
    }
  }

  std::uint64_t budget_;
  std::filesystem::path spool_dir_;
  std::map<frame_key, stored_frame> frames_;
  std::shared_ptr<spool_file> spool_;
  std::uint64_t memory_ = 0, spilled_ = 0;
};

}  // namespace bitrefit::transport::relay
