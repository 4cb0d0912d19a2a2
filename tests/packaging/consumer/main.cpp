// Uses every dependency that bitrefit::bitrefit promises to bring along, and checks bits:
// core + io (write a checkpoint, read it back), xxhash (XXH3-128), zstd, nlohmann_json, Boost.Asio.
#include <utility>  // before Asio (Boost 1.74 coroutine headers need it)

#ifdef BITREFIT_CONSUMER_ASIO
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#endif
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>
#include <unistd.h>
#include <zstd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <bitrefit/bitrefit.hpp>

int main() {
  namespace fs = std::filesystem;
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "consumer: FAILED %s\n", what);
      ++failures;
    }
  };

  std::vector<std::byte> w(2 * 3 * 2);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::byte>(0x80 ^ (i * 29));
  std::vector<bitrefit::tensor_view> tensors{bitrefit::tensor_view("w", bitrefit::dtype::BF16, {2, 3}, w)};
  const fs::path dir = fs::temp_directory_path() / ("bitrefit-consumer-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  bitrefit::io::write_safetensors(dir / "m.safetensors", tensors, {{"format", "pt"}});
  {
    bitrefit::io::checkpoint ck(dir / "m.safetensors");
    auto t = ck.tensor("w");
    check(t.bytes().size() == w.size() && std::memcmp(t.bytes().data(), w.data(), w.size()) == 0, "checkpoint round trip");
    check(ck.metadata().at("format") == "pt", "metadata round trip");
  }
  fs::remove_all(dir);

  XXH128_hash_t h = XXH3_128bits(w.data(), w.size());
  bitrefit::digest128 d{h.low64, h.high64};
  check(bitrefit::digest128::from_hex(d.to_hex()) == d, "digest hex round trip");

  std::vector<char> z(ZSTD_compressBound(w.size()));
  std::size_t zn = ZSTD_compress(z.data(), z.size(), w.data(), w.size(), 3);
  std::vector<std::byte> back(w.size());
  check(!ZSTD_isError(zn) && ZSTD_decompress(back.data(), back.size(), z.data(), zn) == w.size() && back == w, "zstd round trip");

  check(nlohmann::json::parse(R"({"a":[1,2]})")["a"][1] == 2, "nlohmann_json");

#ifdef BITREFIT_CONSUMER_ASIO
  boost::asio::io_context io;
  int ran = 0;
  boost::asio::post(io, [&] { ++ran; });
  io.run();
  check(ran == 1, "boost asio");
#endif
#if defined(BITREFIT_CONSUMER_INSTALLED) && __has_include(<bitrefit/testing/crash_points.hpp>)
#error "testing/ headers are test machinery and must not be installed"
#endif

  if (failures == 0) std::puts("consumer: ok");
  return failures == 0 ? 0 : 1;
}
