// bitrefit-bench-freeze-memory: what an owner's freeze costs in memory and time with the identity
// projection (the trainer hands over canonical bits), two ways, each in a fresh child process after
// B^v is loaded, on one tensor the trainer holds in memory:
//   whole   the tensor read whole into a scratch of its size, then diffed (what changes_of did
//           before tensor_source took element ranges; rebuilt here as the reference)
//   blocks  owner_shard::freeze(refit::copy_from(...)): reads and diffs of change_block_bytes
// Peak = VmHWM after the first freeze minus VmRSS before it (VmHWM reset via /proc/self/clear_refs);
// held_after_kib is what stays after it (the frozen change set, and the whole path's kept scratch).
// Seconds: the best of three later freezes in the same child (scratch warm, as in a long run); the
// two children run one after the other, `--repeat` times alternating, and the best of each is kept.
//   bitrefit-bench-freeze-memory [--elements N] [--change-every K] [--repeat R]
// prints one JSON object: elements, changes, block_bytes, and per path ok, peak_extra_kib,
// held_after_kib, seconds, frozen_identity (equal for both: the same change set).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../common/process_memory.hpp"
#include "bitrefit/refit/owner_shard.hpp"
#include "bitrefit/refit/projection.hpp"
#include "bitrefit/refit/takeover.hpp"

using namespace bitrefit;

namespace {
using bitrefit_bench::status_kib;

struct result {
  long peak = 0, held = 0;
  double seconds = 0;
  std::string identity;
};

// Runs one path in a child (fresh heap, fresh VmHWM); returns what it measured.
result measure(const std::string& path, const model_manifest& m, const std::vector<std::byte>& base, const std::vector<std::byte>& next) {
  const std::string out = bitrefit_bench::in_child("bitrefit-bench-freeze-memory", path, [&] {
    refit::owner_shard shard(m, 0, 1, 1 << 20);
    shard.load_baseline(refit::copy_from([&](const tensor_info&) { return std::span<const std::byte>(base); }));
    const refit::tensor_source trainer = refit::copy_from([&](const tensor_info&) { return std::span<const std::byte>(next); });
    const auto freeze = [&] {
      if (path == "whole") {
        shard.freeze([&](const tensor_info& t, std::span<const std::byte> b, durability::tensor_changes& out) {
          thread_local std::vector<std::byte> scratch;  // as before: one per thread, kept across transitions
          scratch.resize(t.bytes());
          trainer(t, layout::index_range{0, t.elements()}, scratch);
          out.positions.clear(), out.values.clear();
          durability::diff_tensor(b, scratch, element_size(t.type), out);
        });
      } else {
        shard.freeze(trainer);
      }
    };
    const long before = status_kib("VmRSS:");
    bitrefit_bench::reset_peak_rss();
    freeze();  // the first transition: memory
    const long peak = status_kib("VmHWM:"), after = status_kib("VmRSS:");
    double s = 1e300;  // later transitions (scratch warm, as in a long run): time, best of 3
    for (int k = 0; k < 3; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      freeze();
      s = std::min(s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const auto id = refit::frozen_identity(shard);
    char buf[256];
    std::snprintf(buf, sizeof buf, "%ld %ld %.6f %016llx%016llx", peak - before, after - before, s, (unsigned long long)id.high64,
                  (unsigned long long)id.low64);
    return std::string(buf);
  });
  result r;
  char id[64] = {};
  if (std::sscanf(out.c_str(), "%ld %ld %lf %63s", &r.peak, &r.held, &r.seconds, id) != 4) {
    std::fprintf(stderr, "bitrefit-bench-freeze-memory: the %s child reported \"%s\"\n", path.c_str(), out.c_str());
    std::exit(1);
  }
  r.identity = id;
  return r;
}
}  // namespace

int main(int argc, char** argv) {
  std::uint64_t elements = 100'000'000, every = 40, repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--elements") elements = std::stoull(argv[i + 1]);
    else if (a == "--change-every") every = std::stoull(argv[i + 1]);
    else if (a == "--repeat") repeat = std::max<std::uint64_t>(1, std::stoull(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: bitrefit-bench-freeze-memory [--elements N] [--change-every K] [--repeat R]\n");
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "bitrefit-bench-freeze-memory: option %s needs a value\n", argv[argc - 1]);
    return 2;
  }
  const auto m = model_manifest({{"model.w", dtype::BF16, {elements}}});
  std::vector<std::byte> base(elements * 2), next;
  std::mt19937_64 rng(1);
  for (std::size_t k = 0; k < base.size(); k += 8) {
    const std::uint64_t w = rng();
    std::memcpy(base.data() + k, &w, std::min<std::size_t>(8, base.size() - k));
  }
  next = base;
  std::uint64_t changes = 0;
  for (std::uint64_t i = 0; i < elements; ++i)
    if (rng() % every == 0) next[2 * i] ^= std::byte{1}, ++changes;  // one ULP, as most AdamW BF16 changes

  result best[2];
  const char* names[2] = {"whole", "blocks"};
  for (std::uint64_t r = 0; r < repeat; ++r)
    for (int p = 0; p < 2; ++p) {
      const result x = measure(names[p], m, base, next);
      if (r == 0 || x.seconds < best[p].seconds) best[p].seconds = x.seconds;
      best[p].peak = r == 0 ? x.peak : std::max(best[p].peak, x.peak);
      best[p].held = x.held, best[p].identity = x.identity;
    }
  std::printf("{\"elements\": %llu, \"changes\": %llu, \"owned_bytes\": %llu, \"block_bytes\": %zu, \"repeat\": %llu", (unsigned long long)elements,
              (unsigned long long)changes, (unsigned long long)(elements * 2), refit::change_block_bytes, (unsigned long long)repeat);
  for (int p = 0; p < 2; ++p)
    std::printf(", \"%s\": {\"peak_extra_kib\": %ld, \"held_after_kib\": %ld, \"seconds\": %.4f, \"frozen_identity\": \"%s\"}", names[p], best[p].peak,
                best[p].held, best[p].seconds, best[p].identity.c_str());
  std::printf(", \"same_target\": %s}\n", best[0].identity == best[1].identity ? "true" : "false");
  return best[0].identity == best[1].identity ? 0 : 1;
}
