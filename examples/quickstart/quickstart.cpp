// bitrefit quickstart: one trainer, two rollout engines, three refits, in one process.
// The trainer changes a few weights per step; each refit sends only the changed bits, and every
// engine ends bit-identical to the trainer. Copy this file to start.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "bitrefit/durability/memory.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/transport/inprocess.hpp"

using namespace bitrefit;

int main() {
  // The model, in canonical coordinates (Hugging Face names), and the trainer's current bits.
  const model_manifest model({{"model.layers.0.mlp.weight", dtype::BF16, {512, 512}}, {"model.norm.weight", dtype::BF16, {512}}});
  std::map<std::string, std::vector<std::byte>> trainer;
  std::mt19937 rng(1);
  for (auto& t : model.tensors())
    for (std::uint64_t i = 0; i < t.bytes(); ++i) trainer[t.name].push_back(std::byte(rng()));
  const refit::tensor_source bits = refit::copy_from([&](const tensor_info& t) { return std::span<const std::byte>(trainer[t.name]); });

  // Policies: an in-process network, an in-memory commit log and baseline store (swap in the
  // directory object store and the filesystem ones to run across processes), and the identity
  // projection: this trainer already has canonical bits (a Megatron trainer would hand over its
  // shards through refit::sharded_projection<layout::megatron_projection>).
  transport::inprocess_transport net;
  durability::memory_commit_log log;
  refit::sender_options so;
  so.receivers = 2;  // so.placements: what each engine's Loader holds (refit::declare); default all
  refit::sender<transport::inprocess_transport, durability::memory_commit_log, durability::memory_baseline_store,
                refit::identity_projection>
      trainer_side(model, net, log, {durability::memory_baseline_store{}}, so);
  trainer_side.start(bits);  // version 0 = the trainer's current bits

  // Two rollout engines, each placing canonical values into its own storage (a Loader).
  layout::canonical_store engines[2] = {layout::canonical_store(model), layout::canonical_store(model)};
  std::atomic<bool> stop{false};
  std::vector<std::thread> rollout;
  for (std::uint32_t i = 0; i < 2; ++i)
    rollout.emplace_back([&, i] {
      refit::receiver_options ro;
      ro.index = i;
      refit::receiver<layout::canonical_store, transport::inprocess_transport, durability::memory_commit_log> r(engines[i], net, log, ro);
      r.start();  // restores version 0 densely, then joins
      while (!stop) r.step(std::chrono::milliseconds(1));
    });
  trainer_side.wait_for_members(std::chrono::seconds(30));

  for (int step = 1; step <= 3; ++step) {
    for (auto& [name, b] : trainer)  // "training": ~1% of the bytes change
      for (std::size_t i = 0; i < b.size() / 100; ++i) b[rng() % b.size()] = std::byte(rng());
    const auto stats = trainer_side.refit(bits);
    std::printf("refit %d: %s\n", step, stats.line().c_str());
  }
  stop = true;
  for (auto& t : rollout) t.join();

  bool exact = true;
  for (auto& e : engines)
    for (auto& t : model.tensors()) exact &= std::memcmp(e.bytes(t.name).data(), trainer[t.name].data(), t.bytes()) == 0;
  std::printf("every engine bit-identical to the trainer: %s\n", exact ? "yes" : "NO");
  return exact ? 0 : 1;
}
