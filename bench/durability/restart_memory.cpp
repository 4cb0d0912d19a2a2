// bitrefit-bench-restart-memory: peak memory of a restarted owner loading its frozen target from a
// filesystem baseline store, two ways, each in a fresh child process after B^v is loaded:
//   image    load(t) then owner_shard::load_frozen(image) (what the restart path did before)
//   change_set  refit::load_frozen_target: the stored change set itself (ChangeSetStore, law 6)
// Peak = VmHWM after the load minus VmRSS before it (VmHWM reset via /proc/self/clear_refs).
//   bitrefit-bench-restart-memory [--elements N] [--change-every K] [--dir PATH]
// prints one JSON object: elements, changes, delta_file_bytes, and per path peak_extra_kib,
// held_after_kib (what stays: the change set) and frozen_identity (equal for both: same target).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>

#include "../common/process_memory.hpp"
#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/refit/takeover.hpp"

using namespace bitrefit;

namespace {
using bitrefit_bench::status_kib;

// Runs one path in a child (fresh heap, fresh VmHWM); returns its JSON fragment.
std::string measure(const char* path, const model_manifest& m, const std::filesystem::path& dir) {
  return bitrefit_bench::in_child("bitrefit-bench-restart-memory", path, [&] {
    durability::filesystem_baseline_store s(dir);
    refit::owner_shard shard(m, 0, 1, 1 << 20);
    {
      auto b = s.load(0);
      if (!b || !shard.load_baseline(*b)) throw std::runtime_error("cannot load the baseline from the store");
    }
    const long before = status_kib("VmRSS:");
    bitrefit_bench::reset_peak_rss();
    bool ok;
    if (std::string(path) == "image") {
      auto img = s.load(1);
      ok = img && shard.load_frozen(*img);
    } else {
      ok = refit::load_frozen_target(s, shard, 0, 1);
    }
    if (!ok) throw std::runtime_error("the frozen target did not load");
    const long peak = status_kib("VmHWM:"), after = status_kib("VmRSS:");
    const auto id = refit::frozen_identity(shard);
    char buf[512];
    std::snprintf(buf, sizeof buf, "\"%s\": {\"ok\": true, \"peak_extra_kib\": %ld, \"held_after_kib\": %ld, \"frozen_identity\": \"%016llx%016llx\"}",
                  path, peak - before, after - before, (unsigned long long)id.high64, (unsigned long long)id.low64);
    return std::string(buf);
  });
}
}  // namespace

int main(int argc, char** argv) {
  std::uint64_t elements = 100'000'000, every = 40;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("bitrefit-bench-restart-" + std::to_string(getpid()));
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--elements") elements = std::stoull(argv[i + 1]);
    else if (a == "--change-every") every = std::stoull(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: bitrefit-bench-restart-memory [--elements N] [--change-every K] [--dir PATH]\n");
      return 2;
    }
  }
  const auto m = model_manifest({{"model.w", dtype::BF16, {elements}}});
  std::uint64_t changes = 0;
  std::filesystem::remove_all(dir);
  {
    durability::baseline_image base;
    auto& b = base["model.w"];
    b.resize(elements * 2);
    std::mt19937_64 rng(1);
    for (auto& x : b) x = static_cast<std::byte>(rng());
    durability::change_set cs;
    auto& c = cs["model.w"];
    c.element_size = 2, c.elements = elements;
    for (std::uint64_t i = 0; i < elements; ++i)
      if (rng() % every == 0) {  // one ULP up or down, as an AdamW step moves most changed BF16 values
        c.positions.push_back(i);
        const std::byte lo = b[2 * i] ^ std::byte{1};
        c.values.push_back(lo), c.values.push_back(b[2 * i + 1]);
      }
    changes = c.positions.size();
    durability::filesystem_baseline_store s(dir);
    s.save(0, base);
    s.save_changes(0, 1, cs);
  }
  const auto delta_bytes = std::filesystem::file_size(dir / durability::baseline_format::delta_name(1));
  const std::string image = measure("image", m, dir), cs = measure("change_set", m, dir);
  std::printf("{\"elements\": %llu, \"changes\": %llu, \"owned_bytes\": %llu, \"delta_file_bytes\": %llu, %s, %s}\n", (unsigned long long)elements,
              (unsigned long long)changes, (unsigned long long)(elements * 2), (unsigned long long)delta_bytes, image.c_str(), cs.c_str());
  std::filesystem::remove_all(dir);
}
