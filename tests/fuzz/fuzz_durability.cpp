// libFuzzer target: the durability file formats (durability/filesystem_commit_log.hpp, wire/json.hpp).
// The first input byte selects the format, the rest is the file:
//   0: the commit log record (commit.json) read by filesystem_commit_log;
//   1: a full baseline image full-v1.bin (BRBASE01), trailing XXH3-64 recomputed;
//   2: a baseline delta delta-v2.bin (BRDELT01) over a fixed full-v1.bin: the harness fixes the
//      header's target (2), base (1), the link to full-v1's digest and the trailing XXH3-64, so
//      mutations reach the record decoder (apply_delta).
// Files live in a per-process directory (under /dev/shm when there is one).
// Laws: only bitrefit::error escapes load_checked / read_unlocked; an accepted image has exactly
// the tensors and sizes of the base (a delta changes values only).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bitrefit/durability/filesystem.hpp"
#include "reseal.hpp"

using namespace bitrefit;
namespace fs = std::filesystem;

namespace {

void require(bool ok) {
  if (!ok) __builtin_trap();
}

// A RAM-backed directory when there is one: the target writes one small file per input.
const fs::path& dir() {
  static const fs::path d = (fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path()) /
                            ("bitrefit-fuzz-durability-" + std::to_string(::getpid()));
  return d;
}

const durability::baseline_image& base_image() {
  static const durability::baseline_image img = [] {
    durability::baseline_image i;
    i["a"] = std::vector<std::byte>(64, std::byte{1});
    i["b"] = std::vector<std::byte>(40, std::byte{2});
    i["c"] = std::vector<std::byte>(16, std::byte{3});
    return i;
  }();
  return img;
}

std::uint64_t file_digest(const fs::path& p) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  require(f != nullptr);
  unsigned char b[8];
  std::fseek(f, -8, SEEK_END);
  require(std::fread(b, 1, 8, f) == 8);
  std::fclose(f);
  std::uint64_t x = 0;
  for (int i = 0; i < 8; ++i) x |= std::uint64_t(b[i]) << (8 * i);
  return x;
}

void write_file(const fs::path& p, const std::vector<std::byte>& bytes) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  require(f != nullptr);
  if (!bytes.empty()) require(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  std::fclose(f);
}

void same_shape_as_base(const durability::baseline_image& img) {
  require(img.size() == base_image().size());
  for (const auto& [name, bytes] : base_image()) require(img.count(name) && img.at(name).size() == bytes.size());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fs::remove_all(dir());
  fs::create_directories(dir());
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(dir(), ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::vector<std::byte> body(reinterpret_cast<const std::byte*>(data + 1), reinterpret_cast<const std::byte*>(data + size));
  switch (data[0] % 3) {
    case 0: {
      static const fs::path d = dir() / "log";
      static durability::filesystem_commit_log log(d);
      write_file(d / "commit.json", body);
      try {
        (void)log.read_unlocked();
      } catch (const error&) {
      }
      break;
    }
    case 1: {
      static durability::filesystem_baseline_store st(dir() / "full");
      write_file(st.full_path(1), fuzz::seal_baseline_file(std::move(body)));
      try {
        (void)st.load_checked(1);
      } catch (const error&) {
      }
      break;
    }
    case 2: {
      static durability::filesystem_baseline_store st(dir() / "delta");
      static const std::uint64_t link = [] {
        st.save(1, base_image());
        return file_digest(st.full_path(1));
      }();
      write_file(st.delta_path(2), fuzz::seal_delta_v2(std::move(body), link));
      try {
        same_shape_as_base(st.load_checked(2));
      } catch (const error&) {
      }
      break;
    }
  }
  return 0;
}
