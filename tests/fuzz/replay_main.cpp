// A main() for the fuzz targets without libFuzzer: runs LLVMFuzzerTestOneInput once per file given
// and prints the process's peak resident set size after each. Used to state the memory a hostile
// input costs in an optimized build without sanitizers (README.md, "Peak memory per input"):
//   g++ -std=c++20 -O2 -Iinclude tests/fuzz/fuzz_frame.cpp tests/fuzz/replay_main.cpp -lzstd -o /tmp/replay_frame
//   /tmp/replay_frame tests/fuzz/corpus/fuzz_frame/crash-*      (each file in a fresh process: one per call)
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    std::printf("%s: %zu bytes, refused or accepted without a crash; peak RSS %ld KiB\n", argv[i], bytes.size(), u.ru_maxrss);
  }
}
