// bench/refit/rollout.hpp — the rollout side of a session: the `dir` object server and the
// receiver processes.
//
//   store    the `dir` transport's rollout-side service: a directory_store served on TCP
//            (object_server.hpp); writes the port it listens on to --port-file.
//   rollout  one receiver process. bitrefit/overwrite: a refit::receiver over the transport, its
//            model in a layout::canonical_store (restores version 0 densely at start, then applies
//            every refit in place; reports its attestation digest after each commit). dense: a
//            plain buffer that takes every raw chunk of each version, then reports "done" and (after
//            the timed part) its digest.
#pragma once

#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/refit/receiver.hpp"
#include "session.hpp"
#include "workload.hpp"

namespace bench {

inline int run_store(const options& o) {
  transport::directory_store store(fs::path(o.session) / "store");
  asio::io_context io;
  tcp::acceptor acceptor(io);
  const tcp::endpoint ep(asio::ip::address_v4::any(), static_cast<std::uint16_t>(o.port));
  acceptor.open(ep.protocol());
  acceptor.set_option(tcp::acceptor::reuse_address(true));
  acceptor.bind(ep);
  acceptor.listen();
  const std::string port = std::to_string(acceptor.local_endpoint().port());
  io::write_file_atomically(o.port_file, as_span(port), false);
  serve_objects(store, acceptor);
  return 0;
}



template <class Net>
int engine_rollout(const options& o, const model_manifest& m, Net net) {
  layout::canonical_store loader(m);  // the identity Loader: bit-preserving, holds everything
  using receiver_t = refit::receiver<layout::canonical_store, Net, durability::filesystem_commit_log>;
  receiver_t* self = nullptr;
  refit::receiver_options ro;
  ro.index = static_cast<std::uint32_t>(o.index);
  ro.incarnation = 1;
  ro.gate = o.mode == "async" ? protocol::gate_policy::asynchronous : protocol::gate_policy::synchronous;
  ro.attest = o.attest;
  ro.poll = std::chrono::milliseconds(o.poll_ms);
  ro.deadline = std::chrono::milliseconds(o.deadline_ms);
  ro.on_commit = [&](const protocol::commit_record& k) {
    json rep{{"receiver", o.index}, {"version", k.version}};
    if (self->last_attestation()) rep["attestation"] = digest_json(*self->last_attestation());
    const std::string s = rep.dump();
    self->transport().post("bench/report", as_span(s));
  };
  receiver_t r(loader, std::move(net), durability::filesystem_commit_log(fs::path(o.session) / "log"), ro);
  self = &r;
  r.start();
  while (!stop_requested) r.step(ro.poll);
  return 0;
}

template <class Net>
int dense_rollout(const options& o, const model_manifest& m, Net net) {
  layout::canonical_store buf(m);
  const auto plan = dense_plan(m, o.frame_kib << 10);
  const std::string ready = json{{"receiver", o.index}}.dump();
  const std::string mailbox = "bench/dense/" + std::to_string(o.index);
  bool got_job = false;
  auto last_ready = steady::now() - 1h;
  while (!stop_requested) {
    // "ready" until the first job: a message can be lost on a transport that routes only along
    // links that exist (the trainer's duplicates are harmless)
    if (!got_job && steady::now() - last_ready > 500ms) {
      net.post("bench/ready", as_span(ready));
      last_ready = steady::now();
    }
    for (const auto& msg : net.receive(mailbox, std::chrono::milliseconds(o.poll_ms))) {
      got_job = true;
      const json job = parse_json(msg);
      const std::uint64_t version = job.at("version");
      const transport::stream_key stream{job.at("stream").get<std::string>()};
      std::vector<bool> got(plan.size(), false);
      std::size_t have = 0;
      double apply_s = 0;
      while (have < plan.size() && !stop_requested) {
        bool progressed = false;
        for (const auto& key : net.list(stream)) {
          if (key.seq >= plan.size() || got[key.seq]) continue;
          auto b = net.fetch(key);
          const dense_chunk& c = plan[key.seq];
          if (!b || b->size() != c.size) continue;
          const auto t = steady::now();
          std::memcpy(buf.bytes(m.tensors()[c.tensor].name).data() + c.offset, b->data(), c.size);
          apply_s += since(t);
          got[key.seq] = true;
          ++have;
          progressed = true;
        }
        if (!progressed) std::this_thread::sleep_for(1ms);
      }
      const std::string done = json{{"receiver", o.index}, {"version", version}, {"apply_s", apply_s}}.dump();
      net.post("bench/dense-done", as_span(done));
      // after the timed part: what it holds, for the trainer's bit-exactness check
      const std::string rep =
          json{{"receiver", o.index}, {"version", version}, {"attestation", digest_json(attestation_of(m, buf))}}.dump();
      net.post("bench/report", as_span(rep));
    }
  }
  return 0;
}

inline int run_rollout(const options& o) {
  install_stop_handler();
  const model_manifest m = manifest_of(sim::llama_like(dims_for_bytes(o.model_mib << 20)));
  transport_endpoint ep{o.transport, o.host, o.port, nullptr, std::chrono::milliseconds(o.poll_ms), o.session, o.index, o.receivers};
  return with_transport(ep, [&](auto net) {
    return o.method == "dense" ? dense_rollout(o, m, std::move(net)) : engine_rollout(o, m, std::move(net));
  });
}

}  // namespace bench
