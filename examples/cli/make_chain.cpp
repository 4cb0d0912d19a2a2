// examples/cli/make_chain.cpp — `bitrefit-make-chain`: writes a chain of training-like checkpoints.
//
// Versions v0..v{N-1} of a Llama-shaped model trained by the deterministic AdamW simulation
// (testing/adamw.hpp: FP32 master weights, synthetic gradients, lr 1e-6 by default, BF16 export by
// round-to-nearest-even), as DIR/v<k>.safetensors, or as sharded directories DIR/v<k>/ with
// --sharded. Meant for trying `bitrefit stat/diff/apply` without real checkpoints at hand and for
// reproducing the numbers in README.md. Same arguments, same bytes, on every platform.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bitrefit/io/checkpoint.hpp"
#include "bitrefit/testing/adamw.hpp"

namespace {

const char* usage =
    "Usage: bitrefit-make-chain DIR [--versions N] [--layers L] [--hidden H] [--intermediate I]\n"
    "                           [--vocab V] [--heads A] [--kv-heads K] [--seed S] [--lr LR]\n"
    "                           [--weight-decay WD] [--threads T] [--sharded] [--shard-mib M]\n"
    "Writes DIR/v0.safetensors ... (or DIR/v0/ ... with --sharded) of a Llama-shaped BF16 model\n"
    "trained by a deterministic AdamW simulation. Defaults: 5 versions, 2 layers, hidden 256,\n"
    "intermediate 688, vocab 4096, 8 heads, 4 kv heads, seed 42, lr 1e-6, weight decay 0.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace bitrefit;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(usage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  std::filesystem::path dir;
  testing::llama_dims dims{.layers = 2, .hidden = 256, .intermediate = 688, .vocab = 4096, .heads = 8, .kv_heads = 4};
  testing::adamw_config cfg;
  std::uint64_t versions = 5, seed = 42, shard_mib = 0;
  bool sharded = false;
  try {
    for (std::size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      auto value = [&]() -> const std::string& {
        if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
        return args[++i];
      };
      auto num = [&]() { return std::stoull(value()); };
      if (a == "--versions") versions = num();
      else if (a == "--layers") dims.layers = num();
      else if (a == "--hidden") dims.hidden = num();
      else if (a == "--intermediate") dims.intermediate = num();
      else if (a == "--vocab") dims.vocab = num();
      else if (a == "--heads") dims.heads = num();
      else if (a == "--kv-heads") dims.kv_heads = num();
      else if (a == "--seed") seed = num();
      else if (a == "--lr") cfg.lr = std::stof(value());
      else if (a == "--weight-decay") cfg.weight_decay = std::stof(value());
      else if (a == "--threads") cfg.threads = static_cast<unsigned>(num());
      else if (a == "--sharded") sharded = true;
      else if (a == "--shard-mib") shard_mib = num();
      else if (!a.empty() && a[0] == '-') throw std::invalid_argument("unknown option " + a);
      else if (dir.empty()) dir = a;
      else throw std::invalid_argument("more than one DIR");
    }
    if (dir.empty()) throw std::invalid_argument("DIR is missing");
    if (versions == 0) throw std::invalid_argument("--versions must be at least 1");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bitrefit-make-chain: %s\n%s", e.what(), usage);
    return 2;
  }
  try {
    std::filesystem::create_directories(dir);
    testing::adamw_sim s(testing::llama_like(dims), seed, cfg);
    const io::metadata_map meta{{"format", "pt"}, {"generator", "bitrefit-make-chain"}, {"seed", std::to_string(seed)}};
    for (std::uint64_t v = 0; v < versions; ++v) {
      if (v > 0) s.step();
      std::vector<std::vector<std::byte>> data;
      std::vector<tensor_view> views;
      data.reserve(s.tensor_count());
      for (std::size_t i = 0; i < s.tensor_count(); ++i) {
        data.push_back(s.bf16_bytes(i));
        views.emplace_back(s.spec(i).name, dtype::BF16, s.spec(i).shape, std::span<const std::byte>(data.back()));
      }
      const auto path = dir / ("v" + std::to_string(v) + (sharded ? "" : ".safetensors"));
      io::write_options wo;
      if (shard_mib) wo.max_shard_bytes = shard_mib << 20;
      if (sharded) io::write_sharded_checkpoint(path, views, meta, wo);
      else io::write_safetensors(path, views, meta);
      std::printf("%s  (%llu elements, step %llu)\n", path.c_str(), static_cast<unsigned long long>(s.total_elements()),
                  static_cast<unsigned long long>(v));
    }
  } catch (const bitrefit::error& e) {
    std::fprintf(stderr, "bitrefit-make-chain: %s\n", e.what());
    return 3;
  }
  return 0;
}
