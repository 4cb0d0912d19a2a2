// A user-defined transport policy: a metered link that wraps any bitrefit Transport, limits the
// payload data plane to a given rate (as a WAN link between a trainer and a rollout cluster
// would) and counts what crossed it. bitrefit's engine is instantiated with it unchanged — the
// Transport concept (transport/concepts.hpp) is all it asks for.
//
//   bitrefit-custom-transport [MiB/s]     (default 20)
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "bitrefit/durability/memory.hpp"
#include "bitrefit/layout/canonical_store.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "bitrefit/refit/sender.hpp"
#include "bitrefit/transport/inprocess.hpp"

using namespace bitrefit;

/// Every publish sleeps for size / rate (a serialised link); counters are shared by all copies.
template <transport::Transport Inner>
class metered_link {
 public:
  metered_link(Inner inner, double bytes_per_second)
      : inner_(std::move(inner)), rate_(bytes_per_second), sent_(std::make_shared<std::atomic<std::uint64_t>>(0)),
        link_(std::make_shared<std::mutex>()) {}

  void publish(const transport::frame_key& k, std::span<const std::byte> b) {
    {
      std::lock_guard lock(*link_);  // one frame on the wire at a time
      std::this_thread::sleep_for(std::chrono::duration<double>(double(b.size()) / rate_));
    }
    *sent_ += b.size();
    inner_.publish(k, b);
  }
  std::vector<transport::frame_key> list(const transport::stream_key& s) { return inner_.list(s); }
  std::optional<transport::bytes> fetch(const transport::frame_key& k) { return inner_.fetch(k); }
  void discard(const transport::stream_key& s) { inner_.discard(s); }
  void post(const std::string& m, std::span<const std::byte> b) { inner_.post(m, b); }
  std::vector<transport::bytes> receive(const std::string& m, std::chrono::milliseconds w) { return inner_.receive(m, w); }

  std::uint64_t bytes_sent() const { return sent_->load(); }

 private:
  Inner inner_;
  double rate_;
  std::shared_ptr<std::atomic<std::uint64_t>> sent_;
  std::shared_ptr<std::mutex> link_;
};

static_assert(transport::Transport<metered_link<transport::inprocess_transport>>);

int main(int argc, char** argv) {
  const double mib_per_s = argc > 1 ? std::stod(argv[1]) : 20.0;
  using link_t = metered_link<transport::inprocess_transport>;
  const model_manifest model({{"model.embed_tokens.weight", dtype::BF16, {8192, 2048}}});  // 32 MiB
  std::vector<std::byte> bits(model.total_bytes());
  std::mt19937 rng(7);
  for (auto& b : bits) b = std::byte(rng());
  const refit::tensor_source source = refit::copy_from([&](const tensor_info&) { return std::span<const std::byte>(bits); });

  link_t link(transport::inprocess_transport{}, mib_per_s * 1048576.0);
  durability::memory_commit_log log;
  refit::sender_options so;
  so.max_frame_input_bytes = 1 << 20;
  so.deadline = std::chrono::seconds(30);
  refit::sender<link_t, durability::memory_commit_log, durability::memory_baseline_store> tx(
      model, link, log, {durability::memory_baseline_store{}}, so);
  tx.start(source);

  layout::canonical_store engine(model);
  std::atomic<bool> stop{false};
  std::thread rollout([&] {
    refit::receiver<layout::canonical_store, link_t, durability::memory_commit_log> r(engine, link, log, {});
    r.start();
    while (!stop) r.step(std::chrono::milliseconds(1));
  });
  tx.wait_for_members(std::chrono::seconds(60));
  const std::uint64_t restore_bytes = link.bytes_sent();  // the initial dense restore crossed the link too

  for (std::size_t i = 0; i < bits.size() / 50; ++i) bits[rng() % bits.size()] ^= std::byte{1};  // ~1% of bytes
  const auto st = tx.refit(source);
  stop = true;
  rollout.join();

  const double dense_s = double(st.dense_bytes) / (mib_per_s * 1048576.0);
  std::printf("link %.0f MiB/s: dense restore sent %.2f MiB; refit sent %.3f MiB in %.3f s "
              "(a dense refit would need %.3f s on this link: %.1fx)\n",
              mib_per_s, double(restore_bytes) / 1048576.0, double(link.bytes_sent() - restore_bytes) / 1048576.0,
              st.total_s, dense_s, dense_s / st.total_s);
  const bool exact = std::memcmp(engine.bytes(model.tensors()[0].name).data(), bits.data(), bits.size()) == 0;
  std::printf("engine bit-identical to the trainer: %s\n", exact ? "yes" : "NO");
  return exact ? 0 : 1;
}
