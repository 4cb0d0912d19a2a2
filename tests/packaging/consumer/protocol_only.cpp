// The pure protocol with bitrefit::protocol alone (no zstd, xxhash, json, Boost): the model world
// runs a transition to its commit through protocol::drive.
#include <cstdio>

#include <bitrefit/protocol/model/cluster.hpp>

int main() {
  bitrefit::protocol::model::world_config cfg;
  bitrefit::protocol::model::cluster w(cfg);
  for (int i = 0; i < 10000 && !w.settled(); ++i) {
    auto m = bitrefit::protocol::model::fair_move(w);
    if (!m) break;
    w.apply(*m);
  }
  const bool ok = w.settled() && !w.check_invariants();
  std::puts(ok ? "consumer_protocol: ok" : "consumer_protocol: FAILED");
  return ok ? 0 : 1;
}
