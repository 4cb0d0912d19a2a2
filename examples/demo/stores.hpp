// stores.hpp — the demo's transport, commit log and baseline store, chosen by flags at run time:
//   --transport dir|s3|relay    payload frames + control messages: the directory object store
//                               (<dir>/store), S3 (--s3-endpoint URL --s3-bucket NAME, credentials
//                               from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), or the relay tree
//                               (net.hpp; baselines then in <dir>/baseline);
//   --commit-log file|etcd      the filesystem log (<dir>/log) or etcd (--etcd-endpoints URL[,URL]
//                               --etcd-prefix P);
// the owners' baselines live next to the frames: <dir>/baseline with dir, the bucket with s3.
// Each run works under its own sub-prefix (<etcd-prefix>/<run>, s3://bucket/bitrefit-demo/<run>/),
// so runs never see each other's state; the trainer removes it at the end unless --keep.
//
// The engine's policies are templates; the demo picks them at run time, so it wraps each in a small
// type-erased adapter (one sender and one receiver instantiation instead of one per combination).
// Each adapter models its concept and forwards every call to the chosen model.
#pragma once

#include <concepts>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bitrefit/durability/etcd_commit_log.hpp"
#include "bitrefit/durability/filesystem.hpp"
#include "bitrefit/durability/s3_baseline_store.hpp"
#include "bitrefit/transport/any_transport.hpp"
#include "bitrefit/transport/object_store.hpp"
#include "bitrefit/transport/s3_store.hpp"

namespace demo {

using namespace bitrefit;

struct store_flags {
  std::string transport = "dir";  // dir | s3 | relay
  std::string s3_endpoint;        // empty: AWS
  std::string s3_bucket;
  std::string s3_prefix;          // this run's key prefix in the bucket (set by the trainer)
  std::string commit_log = "file";  // file | etcd
  std::string etcd_endpoints = "http://127.0.0.1:2379";
  std::string etcd_prefix = "/bitrefit-demo";  // the trainer appends /<run>

  /// Why these flags cannot work, or "" (checked before anything starts).
  std::string problem() const {
    if (transport != "dir" && transport != "s3" && transport != "relay") return "--transport must be dir, s3 or relay";
    if (transport == "s3" && s3_bucket.empty()) return "--transport s3 needs --s3-bucket NAME (and --s3-endpoint URL for a server other than AWS)";
    if (commit_log != "file" && commit_log != "etcd") return "--commit-log must be file or etcd";
    if (commit_log == "etcd" && etcd_endpoints.empty()) return "--commit-log etcd needs --etcd-endpoints URL[,URL...]";
    return {};
  }

  transport::s3_options s3() const {
    transport::s3_options o;
    o.endpoint = s3_endpoint;
    o.bucket = s3_bucket;
    o.prefix = s3_prefix;
    return o;
  }
  durability::etcd_commit_log::options etcd() const {
    durability::etcd_commit_log::options o;
    o.etcd.endpoints.clear();
    std::stringstream in(etcd_endpoints);
    for (std::string e; std::getline(in, e, ',');)
      if (!e.empty()) o.etcd.endpoints.push_back(e);
    o.prefix = etcd_prefix;
    return o;
  }
  /// The arguments that hand these choices to a rollout process.
  std::vector<std::string> args() const {
    return {"--transport", transport, "--s3-endpoint", s3_endpoint, "--s3-bucket", s3_bucket, "--s3-prefix", s3_prefix,
            "--commit-log", commit_log, "--etcd-endpoints", etcd_endpoints, "--etcd-prefix", etcd_prefix};
  }
};

/// Any Transport, chosen at run time (its home is the library: transport/any_transport.hpp).
using transport::any_transport;

/// Any CommitLog, chosen at run time.
class any_commit_log {
 public:
  template <durability::CommitLog L>
    requires(!std::same_as<L, any_commit_log>)
  explicit any_commit_log(L l) : apply_([p = std::make_shared<L>(std::move(l))](const protocol::log_request& q) { return p->apply(q); }) {}
  protocol::log_reply apply(const protocol::log_request& q) { return apply_(q); }

 private:
  std::function<protocol::log_reply(const protocol::log_request&)> apply_;
};
static_assert(durability::CommitLog<any_commit_log>);

/// Any DeltaBaselineStore, chosen at run time.
class any_baseline_store {
 public:
  template <durability::DeltaBaselineStore S>
    requires(!std::same_as<S, any_baseline_store>)
  explicit any_baseline_store(S s) : p_(std::make_shared<model<S>>(std::move(s))) {}
  void save(version_t v, const durability::baseline_image& img) { p_->save(v, img); }
  void save_changes(version_t b, version_t t, const durability::change_set& cs) { p_->save_changes(b, t, cs); }
  std::optional<durability::baseline_image> load(version_t v) { return p_->load(v); }
  void retain_only(version_t v) { p_->retain_only(v); }

 private:
  struct iface {
    virtual ~iface() = default;
    virtual void save(version_t, const durability::baseline_image&) = 0;
    virtual void save_changes(version_t, version_t, const durability::change_set&) = 0;
    virtual std::optional<durability::baseline_image> load(version_t) = 0;
    virtual void retain_only(version_t) = 0;
  };
  template <class S>
  struct model final : iface {
    explicit model(S x) : s(std::move(x)) {}
    void save(version_t v, const durability::baseline_image& img) override { s.save(v, img); }
    void save_changes(version_t b, version_t t, const durability::change_set& cs) override { s.save_changes(b, t, cs); }
    std::optional<durability::baseline_image> load(version_t v) override { return s.load(v); }
    void retain_only(version_t v) override { s.retain_only(v); }
    S s;
  };
  std::shared_ptr<iface> p_;
};
static_assert(durability::DeltaBaselineStore<any_baseline_store>);

/// The transport the flags name, dir or s3 (relay: net.hpp); `dir` is the demo's working directory.
inline any_transport make_transport(const store_flags& f, const std::filesystem::path& dir, std::chrono::milliseconds poll) {
  if (f.transport == "s3") return any_transport(transport::s3_transport(transport::s3_store(f.s3()), {poll}));
  return any_transport(transport::directory_transport(transport::directory_store(dir / "store"), {poll}));
}

inline any_commit_log make_commit_log(const store_flags& f, const std::filesystem::path& dir) {
  if (f.commit_log == "etcd") return any_commit_log(durability::etcd_commit_log(f.etcd()));
  return any_commit_log(durability::filesystem_commit_log(dir / "log"));
}

/// Owner i's baselines: in the bucket with --transport s3 (a trainer on any host recovers them),
/// in <dir>/baseline otherwise.
inline any_baseline_store make_baseline_store(const store_flags& f, const std::filesystem::path& dir, std::uint32_t owner) {
  const std::string name = "owner-" + std::to_string(owner);
  if (f.transport == "s3") return any_baseline_store(durability::s3_baseline_store(transport::s3_store(f.s3()), {.key_prefix = "baseline/" + name, .max_chain = 16}));
  return any_baseline_store(durability::filesystem_baseline_store(dir / "baseline" / name));
}

/// Removes what a run left in the bucket and in etcd (the trainer, at the end, unless --keep).
inline void remove_run_state(const store_flags& f) {
  if (f.transport == "s3") transport::s3_store(f.s3()).remove_prefix("");
  if (f.commit_log == "etcd") durability::etcd_kv(f.etcd().etcd).remove(f.etcd().prefix + "/commit");
}

}  // namespace demo
