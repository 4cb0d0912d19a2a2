// bitrefit/transport/any_transport.hpp — a type-erased Transport.
//
// The engine's sender and receiver are templates over their Transport; a program that chooses its
// transport at run time (directory store, S3, relay tree) would instantiate the whole engine once per
// choice. Wrapping the choice in any_transport instantiates it once. any_transport models Transport
// by forwarding every call to the model it holds, so it inherits that model's laws unchanged.
#pragma once

#include <chrono>
#include <concepts>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bitrefit/transport/concepts.hpp"

namespace bitrefit::transport {

/// Any Transport, chosen at run time (copies share the one model): one instantiation of the engine
/// serves every transport a program can pick from its command line (the demo, bitrefit-bench-refit).
/// Each call is one virtual call; the transports behind it do I/O.
class any_transport {
 public:
  template <Transport T>
    requires(!std::same_as<T, any_transport>)
  explicit any_transport(T t) : p_(std::make_shared<model<T>>(std::move(t))) {}
  void publish(const frame_key& k, std::span<const std::byte> b) { p_->publish(k, b); }
  std::vector<frame_key> list(const stream_key& s) { return p_->list(s); }
  std::optional<bytes> fetch(const frame_key& k) { return p_->fetch(k); }
  void discard(const stream_key& s) { p_->discard(s); }
  void post(const std::string& m, std::span<const std::byte> b) { p_->post(m, b); }
  std::vector<bytes> receive(const std::string& m, std::chrono::milliseconds w) { return p_->receive(m, w); }

 private:
  struct iface {
    virtual ~iface() = default;
    virtual void publish(const frame_key&, std::span<const std::byte>) = 0;
    virtual std::vector<frame_key> list(const stream_key&) = 0;
    virtual std::optional<bytes> fetch(const frame_key&) = 0;
    virtual void discard(const stream_key&) = 0;
    virtual void post(const std::string&, std::span<const std::byte>) = 0;
    virtual std::vector<bytes> receive(const std::string&, std::chrono::milliseconds) = 0;
  };
  template <class T>
  struct model final : iface {
    explicit model(T x) : t(std::move(x)) {}
    void publish(const frame_key& k, std::span<const std::byte> b) override { t.publish(k, b); }
    std::vector<frame_key> list(const stream_key& s) override { return t.list(s); }
    std::optional<bytes> fetch(const frame_key& k) override { return t.fetch(k); }
    void discard(const stream_key& s) override { t.discard(s); }
    void post(const std::string& m, std::span<const std::byte> b) override { t.post(m, b); }
    std::vector<bytes> receive(const std::string& m, std::chrono::milliseconds w) override { return t.receive(m, w); }
    T t;
  };
  std::shared_ptr<iface> p_;
};
static_assert(Transport<any_transport>);

}  // namespace bitrefit::transport
