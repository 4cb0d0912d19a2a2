// Helpers shared by the io tests: a scratch directory, raw file building, the Python reference.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <iterator>
#include <span>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bitrefit/io/io.hpp"

namespace bitrefit::io::test {

namespace fs = std::filesystem;

/// Bitwise equality of two byte ranges. Not memcmp: an empty vector's data() may be null, and
/// memcmp(nullptr, ..., 0) is undefined behaviour (UBSan reports it).
inline bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) { return std::ranges::equal(a, b); }

/// The bytes of any contiguous range of trivially copyable values, as an owned vector.
template <class Range>
std::vector<std::byte> bytes_of(const Range& r) {
  const auto b = std::as_bytes(std::span(r));
  return {b.begin(), b.end()};
}

/// A fresh directory removed at the end of the test.
struct scratch_dir {
  fs::path path;
  scratch_dir() {
    std::string tmpl = (fs::temp_directory_path() / "bitrefit-io-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  scratch_dir(scratch_dir&& o) noexcept : path(std::exchange(o.path, {})) {}
  ~scratch_dir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& name) const { return path / name; }
  /// Every entry (hidden ones included), to prove nothing was left behind.
  std::set<std::string> entries() const {
    std::set<std::string> out;
    for (auto& e : fs::recursive_directory_iterator(path)) out.insert(fs::relative(e.path(), path).string());
    return out;
  }
};

inline std::vector<std::byte> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

inline void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A raw safetensors file: 8-byte length (or `length_override`), header text, `data_size` bytes.
inline std::string raw_safetensors(const std::string& header, std::size_t data_size,
                                   std::optional<std::uint64_t> length_override = std::nullopt) {
  std::uint64_t n = length_override.value_or(header.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += header;
  for (std::size_t i = 0; i < data_size; ++i) out.push_back(static_cast<char>(i * 37 + 11));
  return out;
}

inline std::string to_hex(std::span<const std::byte> b) {
  static constexpr char d[] = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (std::byte x : b) {
    s.push_back(d[std::to_integer<unsigned>(x) >> 4]);
    s.push_back(d[std::to_integer<unsigned>(x) & 15]);
  }
  return s;
}

/// Runs the Python reference (tests/io/safetensors_ref.py) with `args`; returns its stdout.
inline std::string run_reference(const std::string& args) {
  std::string cmd = std::string("'") + BITREFIT_PYTHON + "' '" + BITREFIT_SAFETENSORS_PY + "' " + args;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[65536];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  if (rc != 0) throw std::runtime_error("reference script failed (" + std::to_string(rc) + "): " + cmd);
  return out;
}

/// The Python reference's files (all_dtypes.safetensors, sharded/, expected.json), written once
/// per test process; tests that modify them copy them first.
inline const fs::path& reference_files() {
  static const scratch_dir dir = [] {
    scratch_dir d;
    run_reference("write '" + d.path.string() + "'");
    return d;
  }();
  return dir.path;
}

/// Expects `f()` to throw checkpoint_error with `problem`, and its message to name `file`.
template <class F>
void expect_problem(F&& f, checkpoint_errc problem, const std::string& file, const std::string& tensor = {}) {
  try {
    f();
    ADD_FAILURE() << "no error, expected " << checkpoint_errc_name(problem);
  } catch (const checkpoint_error& e) {
    EXPECT_EQ(checkpoint_errc_name(e.problem()), checkpoint_errc_name(problem)) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::string(checkpoint_errc_name(problem))), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_EQ(e.where().file, file) << e.what();
    if (!tensor.empty()) {
      EXPECT_EQ(e.where().tensor, tensor) << e.what();
    }
  }
}

}  // namespace bitrefit::io::test
