// bitrefit/transport/relay/node.hpp — one node of the relay tree: root relay, member or owner.
//
// Roles (options.hpp):
//  * owner  — the trainer side. publish() sends each payload frame to the root, once, over the
//             cross-cluster link; publish blocks while more than owner_queue_bytes wait (the
//             encoder is paced by the link). Control messages to rollout mailboxes go to the root.
//  * root   — in the rollout cluster. Keeps every frame an owner sends (retained for rejoins and
//             wants; beyond retain_memory_bytes in a spool file) and forwards it to its children.
//  * member — a rollout process. Holds the frames its engine lists and fetches, and relays them to
//             up to `fanout` children of its own.
// Data plane. Attempt streams are pushed down the whole tree: a relay forwards each block of a
// frame to every child that lacks the frame as soon as the block arrived (cut-through); each
// child link pulls blocks from the store as its queue drains (link_window_bytes), so a slow child
// delays only its own subtree — until it is max_child_lag_bytes behind, when it is disconnected
// (it rejoins and the protocol's retry covers what it missed). Restore streams
// (transport::restore_stream, "r<v>.<g>") are not pushed: only a restarted receiver needs them,
// and its fetch() pulls each frame from its ancestors (want / missing), which keep a copy on the
// way. A node joining or rejoining sends the inventory of frames it holds, and its new parent
// sends it every retained frame it lacks: that is how a child fetches the payload ids it missed
// from its parent's retained frames of the active attempt. discard() (the coordinator's cleanup)
// flows down and leaves a tombstone, so a late copy of a discarded stream is not resurrected.
// Control plane. post() routes by mailbox: down to the child whose subtree serves it (children
// report their subtree's mailboxes upward, framing::routes), else up; at the root, mailboxes not
// in the tree belong to the trainer side (the owners). Messages to one link are batched into one
// control message per write; upward messages wait (bounded) while a member is between parents.
// Failures. A member whose parent link closes (the relay died, the link stayed down past
// peer_timeout) rejoins at the nearest live ancestor, then the root (tree.hpp), within about
// connect_timeout per dead ancestor; its own subtree moves with it.
// The node holds no protocol state: it moves bytes, and which bytes are a valid, complete payload
// is for the engine to verify (digest) before it applies anything.
//
// Threads: the node runs its own io_context on one thread; all state lives on one strand, so there
// are no locks. The synchronous Transport members (publish, list, fetch, ...) may be called from
// any other thread; the async_* members take Asio completion tokens (a callback, use_future,
// use_awaitable, ...). Calling a synchronous member from a completion handler that runs on the
// node's own thread would deadlock and throws instead.
#pragma once

#include <utility>  // Boost 1.74's Asio wants <utility> before it (coroutine support)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include "bitrefit/core/error.hpp"
#include "bitrefit/transport/concepts.hpp"
#include "bitrefit/transport/relay/frame_store.hpp"
#include "bitrefit/transport/relay/framing.hpp"
#include "bitrefit/transport/relay/handshake.hpp"
#include "bitrefit/transport/relay/link.hpp"
#include "bitrefit/transport/relay/options.hpp"
#include "bitrefit/transport/relay/tls.hpp"
#include "bitrefit/transport/relay/tree.hpp"

namespace bitrefit::transport::relay {

/// Restore streams are pulled by the receiver that needs them; every other stream is pushed.
inline bool pushed_stream(const stream_key& s) { return s.name.empty() || s.name[0] != 'r'; }

/// A snapshot of one node (stats()).
struct peer_stats {
  std::string name, kind, remote;
  std::uint32_t subtree = 0;
  std::uint64_t lag_bytes = 0;  // frames this peer still has to be sent
  link_counters counters;
};
struct node_stats {
  std::string name;
  node_role role = node_role::member;
  bool attached = false;          // members/owners: has a parent; root: always
  std::size_t depth = 0;          // ancestors above this node (root: 0; a root's child: 1)
  std::string parent;
  std::vector<peer_stats> peers;  // parent, children, owners
  std::vector<peer_stats> closed; // the last 64 links that closed, with what they carried
  std::size_t frames = 0;
  std::uint64_t memory_bytes = 0, spilled_bytes = 0;
  std::uint64_t frames_completed = 0, frames_aborted = 0, control_dropped = 0, rejoins = 0;
  std::uint64_t disconnects = 0, refused = 0;
  std::uint64_t closed_frame_bytes_in = 0, closed_frame_bytes_out = 0;  // carried by links now closed
};

namespace detail {
/// A move-only type-erased callable (std::move_only_function is C++23).
template <class>
class unique_fn;
template <class R, class... A>
class unique_fn<R(A...)> {
  struct base {
    virtual ~base() = default;
    virtual R call(A... a) = 0;
  };
  template <class F>
  struct impl final : base {
    F f;
    explicit impl(F&& x) : f(std::move(x)) {}
    R call(A... a) override { return f(std::forward<A>(a)...); }
  };
  std::unique_ptr<base> p_;

 public:
  unique_fn() = default;
  template <class F>
  unique_fn(F f) : p_(std::make_unique<impl<F>>(std::move(f))) {}
  R operator()(A... a) { return p_->call(std::forward<A>(a)...); }
  explicit operator bool() const noexcept { return p_ != nullptr; }
};
}  // namespace detail

class node : public std::enable_shared_from_this<node> {
  struct private_tag {};

 public:
  using clock = std::chrono::steady_clock;
  using error_code = boost::system::error_code;

  /// Starts a node: loads the TLS files, binds the listener (root, member), starts joining the tree
  /// (member, owner) in the background. @throws bitrefit::error for bad options or TLS files.
  static std::shared_ptr<node> create(node_options o) {
    auto n = std::make_shared<node>(private_tag{}, std::move(o));
    n->start();
    return n;
  }

  node(private_tag, node_options o)
      : opt_(std::move(o)), ssl_(make_tls_context(opt_.tls)), strand_(asio::make_strand(io_)), lim_(framing::limits::from(opt_)),
        store_(opt_.retain_memory_bytes, opt_.spool_dir), acceptor_(strand_), maintenance_(strand_), backoff_timer_(strand_) {
    if (!framing::valid_cluster(opt_.cluster))
      throw error(errc::invalid_argument, "cluster name must be 1-64 letters, digits, '.', '_' or '-'", {.file = {}, .tensor = {}, .field = "cluster"});
    if (!framing::valid_node_name(opt_.name))
      throw error(errc::invalid_argument, "node name must be 1-128 letters, digits, '.', '_', '-' or '/'", {.file = {}, .tensor = {}, .field = "name"});
    if (opt_.role != node_role::root && opt_.root.port == 0)
      throw error(errc::invalid_argument, "members and owners need the root relay's address", {.file = {}, .tensor = {}, .field = "root"});
    if (opt_.fanout == 0) throw error(errc::invalid_argument, "fanout must be at least 1", {.file = {}, .tensor = {}, .field = "fanout"});
    if (opt_.block_bytes == 0 || opt_.block_bytes > framing::max_block_bytes)
      throw error(errc::invalid_argument, "block_bytes must be 1 B .. 4 MiB", {.file = {}, .tensor = {}, .field = "block_bytes"});
    for (auto& m : opt_.mailboxes)
      if (!framing::valid_mailbox(m)) throw error(errc::invalid_argument, "invalid mailbox name '" + m + "'", {.file = {}, .tensor = {}, .field = "mailboxes"});
    hosted_.insert(opt_.mailboxes.begin(), opt_.mailboxes.end());
  }
  node(const node&) = delete;
  node& operator=(const node&) = delete;
  ~node() { stop(); }

  /// Closes every link and stops the thread; pending async operations complete with
  /// operation_aborted. Idempotent.
  void stop() {
    if (!thread_.joinable()) return;
    stopped_ = true;
    asio::post(strand_, [this] { shutdown(); });
    work_.reset();
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();
      return;
    }
    thread_.join();
  }

  // ---- the Transport concept (blocking; any thread but the node's own) ----------------------

  /// Owner: queues the frame for the root (blocks while owner_queue_bytes are waiting; after
  /// publish_timeout without a root the frame is dropped and logged). Root: retains and forwards.
  /// Member: unsupported (frames flow from the trainer side down).
  void publish(const frame_key& k, std::span<const std::byte> b) {
    (void)call<error_code>([&](auto done) { async_publish(k, bytes(b.begin(), b.end()), std::move(done)); });
  }
  std::vector<frame_key> list(const stream_key& s) {
    return run_on_strand([&] { return store_.list(s); });
  }
  /// A held frame, or one pulled from the ancestors (fetch_timeout); nullopt if none has it.
  std::optional<bytes> fetch(const frame_key& k) {
    auto snap = call<std::optional<frame_snapshot>>([&](auto done) { snapshot_async(k, std::move(done)); });
    if (!snap) return std::nullopt;
    return snap->assemble();  // copied out on the caller's thread, not the node's
  }
  void discard(const stream_key& s) {
    run_on_strand([&] { do_discard(s, 0, /*local=*/true); });
  }
  void post(const std::string& mailbox, std::span<const std::byte> b) {
    if (!framing::valid_mailbox(mailbox)) throw error(errc::invalid_argument, "invalid mailbox name '" + mailbox + "'", {.file = {}, .tensor = {}, .field = "mailbox"});
    run_on_strand([&, m = bytes(b.begin(), b.end())]() mutable { route({mailbox, std::move(m)}, 0); });
  }
  /// What arrived for `mailbox`; returns early (possibly empty) when a payload frame completed here,
  /// so an engine that lists frames after receive() reacts at once (Transport law 6).
  std::vector<bytes> receive(const std::string& mailbox, std::chrono::milliseconds wait) {
    return call<std::vector<bytes>>([&](auto done) { async_receive(mailbox, wait, std::move(done)); });
  }

  // ---- asynchronous operations (Asio completion tokens) --------------------------------------

  /// Completion: void(error_code, std::vector<bytes>).
  template <class Token>
  auto async_receive(std::string mailbox, std::chrono::milliseconds wait, Token&& token) {
    return asio::async_initiate<Token, void(error_code, std::vector<bytes>)>(
        [self = shared_from_this()](auto handler, std::string m, std::chrono::milliseconds w) {
          auto done = self->completion<error_code, std::vector<bytes>>(std::move(handler));
          asio::dispatch(self->strand_, [self, m = std::move(m), w, done = std::move(done)]() mutable { self->do_receive(std::move(m), w, std::move(done)); });
        },
        token, std::move(mailbox), wait);
  }

  /// Completion: void(error_code, std::optional<bytes>) — nullopt: no ancestor had the frame.
  template <class Token>
  auto async_fetch(frame_key k, Token&& token) {
    return asio::async_initiate<Token, void(error_code, std::optional<bytes>)>(
        [self = shared_from_this()](auto handler, frame_key key) {
          auto done = self->completion<error_code, std::optional<bytes>>(std::move(handler));
          asio::dispatch(self->strand_, [self, key = std::move(key), done = std::move(done)]() mutable {
            self->want_snapshot(key, [done = std::move(done)](error_code ec, std::optional<frame_snapshot> s) mutable {
              done(ec, s ? std::optional<bytes>(s->assemble()) : std::nullopt);
            });
          });
        },
        token, std::move(k));
  }

  /// Completion: void(error_code) once the frame is accepted (owner: the queue to the root is
  /// under owner_queue_bytes; timed_out: dropped after publish_timeout without a root).
  template <class Token>
  auto async_publish(frame_key k, bytes b, Token&& token) {
    return asio::async_initiate<Token, void(error_code)>(
        [self = shared_from_this()](auto handler, frame_key key, bytes data) {
          auto done = self->completion<error_code>(std::move(handler));
          // split into blocks on the caller's thread: the node's thread only links them
          std::vector<block> blocks;
          const std::size_t bs = self->opt_.block_bytes;
          for (std::size_t at = 0; at < data.size(); at += bs) {
            const std::size_t n = std::min(bs, data.size() - at);
            blocks.push_back(std::make_shared<const std::vector<std::byte>>(data.begin() + static_cast<std::ptrdiff_t>(at),
                                                                             data.begin() + static_cast<std::ptrdiff_t>(at + n)));
          }
          asio::dispatch(self->strand_, [self, key = std::move(key), size = data.size(), blocks = std::move(blocks), done = std::move(done)]() mutable {
            self->do_publish(key, size, std::move(blocks), std::move(done));
          });
        },
        token, std::move(k), std::move(b));
  }

  /// Completion: void(error_code, bool attached) when this node has a parent (members, owners;
  /// the root at once), or after `timeout`.
  template <class Token>
  auto async_wait_attached(std::chrono::milliseconds timeout, Token&& token) {
    return asio::async_initiate<Token, void(error_code, bool)>(
        [self = shared_from_this()](auto handler, std::chrono::milliseconds t) {
          auto done = self->completion<error_code, bool>(std::move(handler));
          asio::dispatch(self->strand_, [self, t, done = std::move(done)]() mutable {
            if (self->attached()) return done(error_code{}, true);
            self->attach_waiters_.push_back({clock::now() + t, std::move(done)});
          });
        },
        token, timeout);
  }

  bool wait_attached(std::chrono::milliseconds timeout) {
    return call<bool>([&](auto done) { async_wait_attached(timeout, std::move(done)); });
  }

  /// Root and members: the address children connect to (the port is known once create() returned).
  endpoint_spec listening() const { return listening_; }
  const node_options& options() const noexcept { return opt_; }
  asio::io_context::executor_type get_executor() noexcept { return io_.get_executor(); }

  node_stats stats() {
    return run_on_strand([&] { return snapshot_stats(); });
  }

 private:
  // ---- plumbing -------------------------------------------------------------------------------

  /// The completion of an async operation: posts to the handler's executor (never inline),
  /// keeping that executor's work alive until then.
  template <class... Args, class Handler>
  detail::unique_fn<void(Args...)> completion(Handler handler) {
    auto ex = asio::get_associated_executor(handler, strand_);
    auto work = asio::prefer(ex, asio::execution::outstanding_work.tracked);
    return [h = std::move(handler), work = std::move(work)](Args... args) mutable {
      asio::post(work, [h = std::move(h), tup = std::make_tuple(std::move(args)...)]() mutable { std::apply(std::move(h), std::move(tup)); });
    };
  }

  void check_thread() const {
    if (stopped_) throw error(errc::invalid_argument, "relay node " + opt_.name + " was stopped", {.file = {}, .tensor = {}, .field = "node"});
    if (std::this_thread::get_id() == thread_id_)
      throw error(errc::invalid_argument, "a blocking relay call from the node's own thread would deadlock; use the async_* form",
                  {.file = {}, .tensor = {}, .field = "thread"});
  }

  template <class F>
  auto run_on_strand(F&& f) -> decltype(f()) {
    check_thread();
    using R = decltype(f());
    std::promise<R> p;
    auto fut = p.get_future();
    asio::dispatch(strand_, [&] {
      try {
        if constexpr (std::is_void_v<R>) {
          f();
          p.set_value();
        } else {
          p.set_value(f());
        }
      } catch (...) {
        p.set_exception(std::current_exception());
      }
    });
    return fut.get();
  }

  /// Runs an async operation and waits for its result (the error code, if any, is dropped: the
  /// Transport laws let a network lose things, and the node logged why).
  template <class R, class Start>
  R call(Start&& start) {
    check_thread();
    std::promise<R> p;
    auto fut = p.get_future();
    if constexpr (std::is_same_v<R, error_code>) {
      start([&p](error_code ec) { p.set_value(ec); });
    } else {
      start([&p](error_code, R r) { p.set_value(std::move(r)); });
    }
    return fut.get();
  }

  void log(const std::string& line) const {
    const std::string s = "relay " + opt_.name + " (" + std::string(to_string(opt_.role)) + "): " + line;
    if (opt_.log) opt_.log(s);
    else std::fprintf(stderr, "%s\n", s.c_str());
  }

  bool attached() const { return opt_.role == node_role::root || parent_.has_value(); }

  // ---- peers ----------------------------------------------------------------------------------

  enum class kind { pending_in, pending_out, parent, child, owner };
  static const char* kind_name(kind k) {
    switch (k) {
      case kind::pending_in: return "connecting-in";
      case kind::pending_out: return "connecting-out";
      case kind::parent: return "parent";
      case kind::child: return "child";
      case kind::owner: return "owner";
    }
    return "?";
  }

  struct transfer {
    frame_key key;
    std::uint32_t channel = 0;
    std::size_t next_piece = 0;
  };

  struct peer {
    std::shared_ptr<link> ln;
    kind k = kind::pending_in;
    std::string name;
    endpoint_spec listen;  // children: where they take children
    endpoint_spec dialed;  // pending_out / parent: the address dialed
    std::uint32_t subtree = 1;
    std::set<std::string> mailboxes;  // served in its subtree
    std::set<frame_key> has;          // frames it holds (inventory) or was sent whole
    std::deque<frame_key> fifo;       // frames to send it, in order
    std::set<frame_key> queued;       // the keys in fifo
    std::optional<transfer> out;      // the frame being sent
    std::map<std::uint32_t, std::optional<frame_key>> in;  // its transfers to us (nullopt: ignored copy)
    std::uint32_t next_channel = 1;
    std::vector<framing::control_item> batch;  // control items for the next write
    bool flush_posted = false;
  };

  void start() {
    thread_ = std::thread([this] { io_.run(); });
    thread_id_ = thread_.get_id();
    if (opt_.role != node_role::owner) {
      run_on_strand([&] {
        const auto addr = asio::ip::make_address(opt_.listen_host);
        tcp::endpoint ep(addr, opt_.listen_port);
        acceptor_.open(ep.protocol());
        acceptor_.set_option(tcp::acceptor::reuse_address(true));
        acceptor_.bind(ep);
        acceptor_.listen();
        listening_ = {opt_.advertise_host.empty() ? opt_.listen_host : opt_.advertise_host, acceptor_.local_endpoint().port()};
        do_accept();
      });
    }
    asio::dispatch(strand_, [self = shared_from_this()] {
      self->maintain();
      if (self->opt_.role != node_role::root) self->join();
    });
  }

  void shutdown() {
    stopping_ = true;
    error_code ig;
    acceptor_.close(ig);
    maintenance_.cancel();
    backoff_timer_.cancel();
    for (auto& [id, p] : peers_) p.ln->close("node stopping");
    for (auto& [id, w] : waiters_) {
      w.timer->cancel();
      w.done(asio::error::operation_aborted, {});
    }
    waiters_.clear();
    for (auto& [k, fs] : fetchers_)
      for (auto& f : fs) f.done(asio::error::operation_aborted, std::nullopt);
    fetchers_.clear();
    for (auto& p : publishers_) p.done(asio::error::operation_aborted);
    publishers_.clear();
    for (auto& w : attach_waiters_) w.done(asio::error::operation_aborted, false);
    attach_waiters_.clear();
  }

  void do_accept() {
    auto ln = std::make_shared<link>(strand_, ssl_, ++next_id_, opt_, lim_);
    acceptor_.async_accept(ln->socket(), asio::bind_executor(strand_, [self = shared_from_this(), ln](const error_code& ec) {
      if (self->stopping_ || ec == asio::error::operation_aborted) return;
      if (!ec) self->on_accepted(ln);
      self->do_accept();
    }));
  }

  void on_accepted(const std::shared_ptr<link>& ln) {
    std::size_t pending = 0;
    for (auto& [id, p] : peers_) pending += p.k == kind::pending_in;
    if (pending >= opt_.max_pending_handshakes) {
      ++refused_;
      error_code ig;
      log("refusing a connection: " + std::to_string(pending) + " connections still in their handshake");
      ln->socket().close(ig);
      return;
    }
    auto& p = peers_[ln->id()];
    p.ln = ln;
    p.k = kind::pending_in;
    ln->accept(callbacks_for(ln->id()));
  }

  link::callbacks callbacks_for(std::uint64_t id) {
    std::weak_ptr<node> w = shared_from_this();
    link::callbacks cb;
    cb.message = [w, id](framing::decoded&& d) {
      if (auto s = w.lock()) s->on_message(id, std::move(d));
    };
    cb.closed = [w, id](const std::string& why) {
      if (auto s = w.lock()) s->on_closed(id, why);
    };
    cb.writable = [w, id] {
      if (auto s = w.lock()) s->pump(id);
    };
    cb.secured = [w, id] {
      if (auto s = w.lock()) s->on_secured(id);
    };
    return cb;
  }

  peer* find_peer(std::uint64_t id) {
    auto it = peers_.find(id);
    return it == peers_.end() ? nullptr : &it->second;
  }

  void drop_peer(peer& p, const std::string& why) {
    ++disconnects_;
    log("disconnecting " + describe(p) + ": " + why);
    p.ln->close(why);
  }

  static std::string describe(const peer& p) {
    return std::string(kind_name(p.k)) + (p.name.empty() ? "" : " " + p.name) + " at " + p.ln->remote();
  }

  // ---- joining the tree (members, owners) -----------------------------------------------------

  void join() {
    if (stopping_) return;
    candidates_ = rejoin_order(chain_, opt_.root);
    candidate_ = 0;
    redirects_ = 0;
    dial(candidates_[0]);
  }

  void dial(const endpoint_spec& to) {
    auto ln = std::make_shared<link>(strand_, ssl_, ++next_id_, opt_, lim_);
    auto& p = peers_[ln->id()];
    p.ln = ln;
    p.k = kind::pending_out;
    p.dialed = to;
    ln->connect(to, callbacks_for(ln->id()));
  }

  void next_candidate() {
    if (stopping_ || parent_) return;
    if (++candidate_ < candidates_.size()) return dial(candidates_[candidate_]);
    backoff_timer_.expires_after(backoff_);
    backoff_ = std::min(backoff_ * 2, opt_.max_reconnect_backoff);
    backoff_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](const error_code& ec) {
      if (!ec && !self->parent_) self->join();
    }));
  }

  void on_secured(std::uint64_t id) {
    peer* p = find_peer(id);
    if (!p || p->k != kind::pending_out) return;
    framing::hello h;
    h.cluster = opt_.cluster;
    h.role = opt_.role;
    h.name = opt_.name;
    if (opt_.role == node_role::member) h.listen = listening_;
    h.subtree = opt_.role == node_role::owner ? 1 : subtree_size();
    h.mailboxes = subtree_mailboxes();
    if (opt_.role == node_role::member) h.inventory = store_.inventory();
    p->ln->send(h);
  }

  void on_welcome(peer& p, framing::welcome& w) {
    p.k = kind::parent;
    p.name = p.ln->remote();
    parent_ = p.ln->id();
    chain_ = std::move(w.ancestors);
    chain_.push_back(p.dialed);
    for (auto& s : w.tombstones) do_discard(stream_key{s}, p.ln->id(), false);
    p.ln->established();
    backoff_ = opt_.reconnect_backoff;
    ++rejoins_;
    log("attached below " + p.dialed.to_string() + " at depth " + std::to_string(chain_.size()) + " (" + std::to_string(candidate_) + " dead ancestor(s) skipped, " +
        std::to_string(redirects_) + " redirect(s))");
    last_routes_.reset();
    // what waited for a parent goes now: control items, discards, frames (owner)
    for (auto& it : up_pending_) enqueue_control(p, std::move(it));
    up_pending_.clear();
    for (auto& s : pending_discards_) p.ln->send(framing::discard{s.name});
    pending_discards_.clear();
    if (opt_.role == node_role::owner) {
      p.fifo.clear();
      p.queued.clear();
      for (auto& k : store_.keys()) queue_frame(p, k);
      pump(p.ln->id());
    }
    // wants that were on their way up when the old parent went away
    std::set<frame_key> wanted;
    for (auto& [k, f] : fetchers_) wanted.insert(k);
    for (auto& [k, w] : wanters_) wanted.insert(k);
    for (auto& k : wanted)
      if (!store_.find(k)) ask_up(k);
    send_routes();
    tell_children_ancestors();
    for (auto& a : attach_waiters_) a.done(error_code{}, true);
    attach_waiters_.clear();
  }

  /// The ancestors changed (this node rejoined elsewhere): children learn the new chain, so their
  /// next rejoin tries live ancestors (a welcome on an established link is that update).
  void tell_children_ancestors() {
    for (auto& [id, c] : peers_)
      if (c.k == kind::child) c.ln->send(framing::welcome{chain_, {}});
  }

  void on_ancestors(peer& parent, framing::welcome& w) {
    chain_ = std::move(w.ancestors);
    chain_.push_back(parent.dialed);
    for (auto& s : w.tombstones) do_discard(stream_key{s}, parent.ln->id(), false);
    tell_children_ancestors();
  }

  // ---- messages -------------------------------------------------------------------------------

  void on_message(std::uint64_t id, framing::decoded&& d) {
    peer* pp = find_peer(id);
    if (!pp || !pp->ln->is_open()) return;
    peer& p = *pp;
    const auto t = framing::type_of(d.msg);
    if (p.k == kind::pending_in) {
      if (t != framing::type::hello) return drop_peer(p, std::string("expected a hello first, got ") + std::string(framing::to_string(t)));
      return on_hello(p, std::get<framing::hello>(d.msg));
    }
    if (p.k == kind::pending_out) {
      switch (t) {
        case framing::type::welcome: return on_welcome(p, std::get<framing::welcome>(d.msg));
        case framing::type::redirect: {
          const auto to = std::get<framing::redirect>(d.msg).to;
          p.ln->close("redirected to " + to.to_string());
          if (++redirects_ > max_redirects) {
            log("too many redirects; starting over");
            candidate_ = candidates_.size();
            return next_candidate();
          }
          return dial(to);
        }
        case framing::type::refuse:
          ++refused_;
          log("refused by " + p.dialed.to_string() + ": " + std::get<framing::refuse>(d.msg).why);
          return p.ln->close("refused");
        default: return drop_peer(p, std::string("expected welcome, redirect or refuse, got ") + std::string(framing::to_string(t)));
      }
    }
    switch (t) {
      case framing::type::frame_begin: return on_frame_begin(p, d.channel, std::get<framing::frame_begin>(d.msg));
      case framing::type::frame_block: return on_frame_block(p, d.channel, std::move(std::get<framing::frame_block>(d.msg).data));
      case framing::type::frame_abort: return on_frame_abort(p, d.channel);
      case framing::type::control:
        for (auto& it : std::get<framing::control>(d.msg).items) route(std::move(it), id);
        return;
      case framing::type::discard:
        if (p.k == kind::child) return drop_peer(p, "a child may not discard streams");
        return do_discard(stream_key{std::get<framing::discard>(d.msg).stream}, id, false);
      case framing::type::want: return on_want(p, std::get<framing::want>(d.msg).key);
      case framing::type::welcome:
        if (p.k != kind::parent) return drop_peer(p, "unexpected welcome");
        return on_ancestors(p, std::get<framing::welcome>(d.msg));
      case framing::type::missing:
        if (p.k != kind::parent) return drop_peer(p, "unexpected missing");
        return on_missing(std::get<framing::missing>(d.msg).key);
      case framing::type::routes: {
        if (p.k != kind::child && p.k != kind::owner) return drop_peer(p, "unexpected routes");
        auto& r = std::get<framing::routes>(d.msg);
        if (p.k == kind::owner && r.subtree != 1) return drop_peer(p, "an owner has no subtree");
        p.subtree = r.subtree;
        p.mailboxes = std::set<std::string>(r.mailboxes.begin(), r.mailboxes.end());
        return send_routes();
      }
      default: return drop_peer(p, std::string("unexpected ") + std::string(framing::to_string(t)) + " after the handshake");
    }
  }

  void on_hello(peer& p, framing::hello& h) {
    if (auto why = admit(h, opt_.cluster, opt_.role)) {
      ++refused_;
      log("refusing " + h.name + " at " + p.ln->remote() + ": " + *why);
      p.ln->send(framing::refuse{*why});
      return p.ln->close_after_flush("refused: " + *why);
    }
    if (h.role == node_role::owner) {
      p.k = kind::owner;
      p.name = h.name;
      p.mailboxes = std::set<std::string>(h.mailboxes.begin(), h.mailboxes.end());
      p.ln->send(framing::welcome{});
      p.ln->established();
      log("owner " + h.name + " attached from " + p.ln->remote());
      return;
    }
    std::vector<child_view> children;
    for (auto& [id, c] : peers_)
      if (c.k == kind::child && c.ln->is_open()) children.push_back({id, c.subtree, c.listen});
    // a newer connection of a node replaces its older one (a restarted process, a rejoin)
    for (auto& [peer_id, c] : peers_)
      if (c.k == kind::child && c.name == h.name && c.ln->is_open()) {
        log("child " + h.name + " reconnected; closing its older link");
        c.ln->close("replaced by a newer connection of the same node");
        const auto id = peer_id;  // (clang 14 cannot capture a structured binding)
        std::erase_if(children, [&](const child_view& v) { return v.id == id; });
      }
    const placement where = place(children, opt_.fanout);
    if (where.what == placement::kind::redirect) {
      p.ln->send(framing::redirect{where.to, "fanout " + std::to_string(opt_.fanout) + " reached"});
      return p.ln->close_after_flush("redirected");
    }
    if (where.what == placement::kind::refuse) {
      ++refused_;
      p.ln->send(framing::refuse{"no capacity below this relay"});
      return p.ln->close_after_flush("no capacity");
    }
    p.k = kind::child;
    p.name = h.name;
    p.listen = h.listen;
    if (p.listen.port != 0 && (p.listen.host.empty() || p.listen.host == "0.0.0.0" || p.listen.host == "::")) {
      const auto& r = p.ln->remote();
      p.listen.host = r.substr(0, r.rfind(':'));
      if (!p.listen.host.empty() && p.listen.host.front() == '[') p.listen.host = p.listen.host.substr(1, p.listen.host.size() - 2);
    }
    p.subtree = h.subtree;
    p.mailboxes = std::set<std::string>(h.mailboxes.begin(), h.mailboxes.end());
    p.has = std::set<frame_key>(h.inventory.begin(), h.inventory.end());
    framing::welcome w;
    w.ancestors = opt_.role == node_role::root ? std::vector<endpoint_spec>{} : chain_;
    w.tombstones.assign(tombstone_order_.begin(), tombstone_order_.end());
    p.ln->send(w);
    p.ln->established();
    log("child " + h.name + " attached from " + p.ln->remote() + " (subtree " + std::to_string(h.subtree) + ", holds " +
        std::to_string(h.inventory.size()) + " frame(s))");
    // the rejoin sync: every retained pushed frame it lacks
    for (auto& k : store_.keys())
      if (pushed_stream(k.stream)) queue_frame(p, k);
    pump(p.ln->id());
    send_routes();
  }

  void on_closed(std::uint64_t id, const std::string& why) {
    auto it = peers_.find(id);
    if (it == peers_.end()) return;
    peer p = std::move(it->second);
    peers_.erase(it);
    const auto c = p.ln->counters();
    closed_frame_in_ += c.frame_bytes_in;
    closed_frame_out_ += c.frame_bytes_out;
    if (p.k != kind::pending_in && p.k != kind::pending_out) {
      closed_.push_back({p.name, kind_name(p.k), p.ln->remote(), p.subtree, 0, c});
      if (closed_.size() > 64) closed_.pop_front();
    }
    // frames it was sending us are incomplete: they go (the new parent resends them whole)
    for (auto& [ch, key] : p.in)
      if (key) abort_frame(*key);
    for (auto& [k, ws] : wanters_) ws.erase(id);
    if (stopping_) return;
    switch (p.k) {
      case kind::pending_out:
        if (!parent_ && why.rfind("redirected", 0) != 0 && why != "refused") log("cannot attach via " + p.dialed.to_string() + ": " + why);
        if (why.rfind("redirected", 0) != 0) next_candidate();
        return;
      case kind::parent:
        parent_.reset();
        log("lost parent " + p.dialed.to_string() + ": " + why + "; rejoining");
        asked_up_.clear();
        return join();
      case kind::child:
        log("child " + p.name + " left: " + why);
        return send_routes();
      case kind::owner: log("owner " + p.name + " left: " + why); return;
      case kind::pending_in:
        if (why != "node stopping") log("connection from " + p.ln->remote() + " closed before it joined: " + why);
        return;
    }
  }

  // ---- frames ---------------------------------------------------------------------------------

  void on_frame_begin(peer& p, std::uint32_t ch, const framing::frame_begin& b) {
    const bool from_upstream = p.k == kind::parent || (p.k == kind::owner && opt_.role == node_role::root);
    if (!from_upstream) return drop_peer(p, "payload frames flow from the trainer side down; this peer may not send them");
    if (p.in.count(ch)) return drop_peer(p, "frame transfer channel reused before it ended");
    if (tombstones_.count(b.key.stream.name) || store_.find(b.key)) {
      p.in[ch] = std::nullopt;  // a copy of something discarded or already here: read and ignored
      if (b.size == 0) p.in.erase(ch);
      return;
    }
    store_.begin(b.key, b.size);
    p.in[ch] = b.key;
    frame_started(b.key);
    if (b.size == 0) {
      p.in.erase(ch);
      frame_completed(b.key);
    }
  }

  void on_frame_block(peer& p, std::uint32_t ch, std::vector<std::byte>&& data) {
    auto it = p.in.find(ch);
    if (it == p.in.end()) return drop_peer(p, "frame block for a transfer that was never begun");
    if (!it->second) return;  // ignored copy
    const frame_key key = *it->second;
    if (!store_.append(key, std::make_shared<const std::vector<std::byte>>(std::move(data))))
      return drop_peer(p, "frame " + key.stream.name + "/" + frame_object_name(key.owner, key.seq) + " longer than announced");
    const bool done = store_.find(key)->complete();
    if (done) p.in.erase(it);
    for (auto& [id, c] : peers_)
      if (c.out && c.out->key == key) pump(id);
    if (done) frame_completed(key);
  }

  void on_frame_abort(peer& p, std::uint32_t ch) {
    auto it = p.in.find(ch);
    if (it == p.in.end()) return;
    const auto key = it->second;
    p.in.erase(it);
    if (key) abort_frame(*key);
  }

  /// A frame began arriving here: children that should have it get it, block by block.
  void frame_started(const frame_key& k) {
    auto w = wanters_.find(k);
    std::set<std::uint64_t> wanted = w == wanters_.end() ? std::set<std::uint64_t>{} : std::move(w->second);
    if (w != wanters_.end()) wanters_.erase(w);
    asked_up_.erase(k);
    parked_.erase(k);
    const bool push = pushed_stream(k.stream);
    for (auto& [id, c] : peers_) {
      if ((push && c.k == kind::child) || wanted.count(id)) {
        if (wanted.count(id)) c.has.erase(k);
        queue_frame(c, k);
      }
    }
    for (auto& [id, c] : peers_)
      if (!c.fifo.empty() || c.out) {
        check_lag(c);
        pump(id);
      }
  }

  void frame_completed(const frame_key& k) {
    ++frames_completed_;
    auto f = fetchers_.find(k);
    if (f != fetchers_.end()) {
      auto snap = store_.snapshot(k);
      for (auto& x : f->second) x.done(error_code{}, snap);
      fetchers_.erase(f);
    }
    // wake receive() waiters: the engine lists frames after each receive
    std::vector<std::uint64_t> ids;
    for (auto& [id, w] : waiters_) ids.push_back(id);
    for (auto id : ids) complete_waiter(id);
  }

  /// An incomplete frame whose sender went away or aborted: dropped here and down the tree.
  void abort_frame(const frame_key& k) {
    const auto* f = store_.find(k);
    if (!f || f->complete()) return;
    ++frames_aborted_;
    store_.erase(k);
    for (auto& [id, c] : peers_) {
      if (c.out && c.out->key == k) {
        c.ln->send(framing::frame_abort{}, c.out->channel, /*urgent=*/false);
        c.out.reset();
      }
      if (c.queued.erase(k)) std::erase(c.fifo, k);
      if (c.ln->is_open()) pump(id);
    }
  }

  void queue_frame(peer& c, const frame_key& k) {
    if (c.has.count(k) || c.queued.count(k) || (c.out && c.out->key == k)) return;
    c.fifo.push_back(k);
    c.queued.insert(k);
  }

  std::uint64_t lag_of(const peer& c) const {
    std::uint64_t lag = 0;
    if (c.out)
      if (const auto* f = store_.find(c.out->key)) {
        std::uint64_t sent = 0;
        for (std::size_t i = 0; i < c.out->next_piece && i < f->pieces.size(); ++i) sent += f->pieces[i].length;
        lag += f->size - sent;
      }
    for (auto& k : c.fifo)
      if (const auto* f = store_.find(k)) lag += f->size;
    return lag;
  }

  void check_lag(peer& c) {
    if (c.k != kind::child) return;
    const auto lag = lag_of(c);
    if (lag > opt_.max_child_lag_bytes)
      drop_peer(c, "slow consumer: " + std::to_string(lag) + " bytes behind (max_child_lag_bytes " + std::to_string(opt_.max_child_lag_bytes) + ")");
  }

  /// Moves frame blocks from the store into the link's queue while it has room.
  void pump(std::uint64_t id) {
    peer* pp = find_peer(id);
    if (!pp || !pp->ln->is_open() || !pp->ln->is_established()) return;
    peer& c = *pp;
    while (c.ln->queued() < opt_.link_window_bytes) {
      if (!c.out) {
        if (c.fifo.empty()) break;
        const frame_key k = c.fifo.front();
        c.fifo.pop_front();
        c.queued.erase(k);
        const auto* f = store_.find(k);
        if (!f || c.has.count(k)) continue;
        c.out = transfer{k, c.next_channel++, 0};
        if (c.next_channel == 0) c.next_channel = 1;
        c.ln->send(framing::frame_begin{k, f->size}, c.out->channel, /*urgent=*/false);
      }
      const auto* f = store_.find(c.out->key);
      if (!f) {  // discarded or aborted meanwhile
        c.ln->send(framing::frame_abort{}, c.out->channel, false);
        c.out.reset();
        continue;
      }
      if (c.out->next_piece < f->pieces.size()) {
        c.ln->send_block(c.out->channel, store_.load(f->pieces[c.out->next_piece]));
        ++c.out->next_piece;
        continue;
      }
      if (!f->complete()) break;  // waiting for the next block from upstream
      const frame_key done = c.out->key;
      c.out.reset();
      c.has.insert(done);
      if (opt_.role == node_role::owner && c.k == kind::parent) store_.erase(done);  // owners keep nothing once sent
    }
    if (opt_.role == node_role::owner) release_publishers();
  }

  // ---- publish / fetch ------------------------------------------------------------------------

  struct publish_waiter {
    clock::time_point deadline;
    frame_key key;
    detail::unique_fn<void(error_code)> done;
  };
  struct fetch_waiter {
    clock::time_point deadline;
    detail::unique_fn<void(error_code, std::optional<frame_snapshot>)> done;
  };
  struct attach_waiter {
    clock::time_point deadline;
    detail::unique_fn<void(error_code, bool)> done;
  };

  std::uint64_t owner_unsent() const {
    std::uint64_t n = 0;
    if (parent_)
      if (auto it = peers_.find(*parent_); it != peers_.end()) n = lag_of(it->second) + it->second.ln->queued();
    if (!parent_)
      for (auto& k : store_.keys()) n += store_.find(k)->size;
    return n;
  }

  void release_publishers() {
    if (publishers_.empty()) return;
    if (!parent_ || owner_unsent() > opt_.owner_queue_bytes) return;
    for (auto& p : publishers_) p.done(error_code{});
    publishers_.clear();
  }

  void do_publish(const frame_key& k, std::size_t size, std::vector<block> blocks, detail::unique_fn<void(error_code)> done) {
    if (stopping_) return done(asio::error::operation_aborted);
    if (opt_.role == node_role::member) {
      log("publish of " + k.stream.name + " ignored: members do not publish frames");
      return done(asio::error::operation_not_supported);
    }
    if (!framing::valid_stream(k.stream.name)) return done(asio::error::invalid_argument);
    if (store_.find(k)) return done(error_code{});  // law 2: the same key again is the same frame
    if (opt_.role == node_role::root && tombstones_.erase(k.stream.name)) std::erase(tombstone_order_, k.stream.name);  // published again
    store_.begin(k, size);
    for (auto& b : blocks) store_.append(k, std::move(b));
    if (opt_.role == node_role::root) {
      frame_started(k);
      frame_completed(k);
      return done(error_code{});
    }
    // owner: to the root
    if (parent_) {
      peer& p = peers_.at(*parent_);
      queue_frame(p, k);
      pump(p.ln->id());
    }
    if (parent_ && owner_unsent() <= opt_.owner_queue_bytes) return done(error_code{});
    publishers_.push_back({clock::now() + opt_.publish_timeout, k, std::move(done)});
  }

  void snapshot_async(const frame_key& k, detail::unique_fn<void(error_code, std::optional<frame_snapshot>)> done) {
    asio::dispatch(strand_, [self = shared_from_this(), k, done = std::move(done)]() mutable { self->want_snapshot(k, std::move(done)); });
  }

  void want_snapshot(const frame_key& k, detail::unique_fn<void(error_code, std::optional<frame_snapshot>)> done) {
    if (stopping_) return done(asio::error::operation_aborted, std::nullopt);
    if (const auto* f = store_.find(k); f && f->complete()) return done(error_code{}, store_.snapshot(k));
    if (tombstones_.count(k.stream.name)) return done(error_code{}, std::nullopt);
    fetchers_[k].push_back({clock::now() + opt_.fetch_timeout, std::move(done)});
    if (store_.find(k)) return;  // arriving
    ask_up(k);
  }

  void ask_up(const frame_key& k) {
    if (parent_ && !asked_up_.count(k)) {
      asked_up_.insert(k);
      peers_.at(*parent_).ln->send(framing::want{k});
    }
  }

  void on_want(peer& p, const frame_key& k) {
    if (p.k != kind::child && p.k != kind::owner) return drop_peer(p, "unexpected want");
    if (tombstones_.count(k.stream.name)) return p.ln->send(framing::missing{k});
    if (store_.find(k)) {
      p.has.erase(k);
      queue_frame(p, k);
      return pump(p.ln->id());
    }
    wanters_[k].insert(p.ln->id());
    if (opt_.role == node_role::root || !parent_) {
      if (!parked_.count(k)) parked_[k] = clock::now() + (opt_.role == node_role::root ? opt_.root_want_wait : opt_.fetch_timeout);
      return;
    }
    ask_up(k);
  }

  void on_missing(const frame_key& k) {
    asked_up_.erase(k);
    if (auto w = wanters_.find(k); w != wanters_.end()) {
      for (auto id : w->second)
        if (peer* c = find_peer(id)) c->ln->send(framing::missing{k});
      wanters_.erase(w);
    }
    if (auto f = fetchers_.find(k); f != fetchers_.end() && !store_.find(k)) {
      for (auto& x : f->second) x.done(error_code{}, std::nullopt);
      fetchers_.erase(f);
    }
  }

  // ---- discard --------------------------------------------------------------------------------

  void do_discard(const stream_key& s, std::uint64_t from, bool local) {
    if (!framing::valid_stream(s.name)) return;
    if (opt_.role != node_role::owner && !tombstones_.count(s.name)) {
      tombstones_.insert(s.name);
      tombstone_order_.push_back(s.name);
      if (tombstone_order_.size() > 256) {
        tombstones_.erase(tombstone_order_.front());
        tombstone_order_.pop_front();
      }
    }
    for (auto& [id, c] : peers_) {
      if (c.out && c.out->key.stream == s) {
        c.ln->send(framing::frame_abort{}, c.out->channel, false);
        c.out.reset();
      }
      std::erase_if(c.fifo, [&](const frame_key& k) { return k.stream == s; });
      std::erase_if(c.queued, [&](const frame_key& k) { return k.stream == s; });
      std::erase_if(c.has, [&](const frame_key& k) { return k.stream == s; });
      for (auto& [ch, key] : c.in)
        if (key && key->stream == s) key.reset();  // the rest of that transfer is read and ignored
    }
    store_.discard(s);
    for (auto it = fetchers_.begin(); it != fetchers_.end();) {
      if (it->first.stream == s) {
        for (auto& x : it->second) x.done(error_code{}, std::nullopt);
        it = fetchers_.erase(it);
      } else {
        ++it;
      }
    }
    std::erase_if(wanters_, [&](const auto& kv) { return kv.first.stream == s; });
    std::erase_if(parked_, [&](const auto& kv) { return kv.first.stream == s; });
    // onward: down the tree (a member's own discard is local: its children keep their copies);
    // an owner's own cleanup goes up to the root
    if (!local || opt_.role == node_role::root)
      for (auto& [id, c] : peers_)
        if (c.k == kind::child && id != from) c.ln->send(framing::discard{s.name});
    if (opt_.role == node_role::owner && local) {
      if (parent_) peers_.at(*parent_).ln->send(framing::discard{s.name});
      else pending_discards_.push_back(s);
    }
    for (auto& [id, c] : peers_) pump(id);
  }

  // ---- control plane --------------------------------------------------------------------------

  /// Routes one control item that arrived from link `from` (0: posted here).
  void route(framing::control_item it, std::uint64_t from) {
    if (hosted_.count(it.mailbox) || (opt_.role == node_role::owner && from != 0)) return deliver(std::move(it));
    for (auto& [id, c] : peers_)
      if (c.k == kind::child && id != from && c.mailboxes.count(it.mailbox)) return enqueue_control(c, std::move(it));
    if (opt_.role != node_role::root) {
      if (parent_ && from == *parent_) {  // for nobody below us: a stale route, lost
        ++control_dropped_;
        return;
      }
      if (parent_) return enqueue_control(peers_.at(*parent_), std::move(it));
      if (up_pending_.size() >= 4096) {
        ++control_dropped_;
        up_pending_.pop_front();
      }
      up_pending_.push_back(std::move(it));
      return;
    }
    // root: the trainer side
    std::vector<peer*> owners, serving;
    for (auto& [id, c] : peers_)
      if (c.k == kind::owner && id != from) {
        owners.push_back(&c);
        if (c.mailboxes.count(it.mailbox)) serving.push_back(&c);
      }
    auto& to = serving.empty() ? owners : serving;
    if (to.empty()) {
      ++control_dropped_;
      return;
    }
    for (std::size_t i = 0; i + 1 < to.size(); ++i) enqueue_control(*to[i], it);
    enqueue_control(*to.back(), std::move(it));
  }

  void enqueue_control(peer& p, framing::control_item it) {
    p.batch.push_back(std::move(it));
    if (p.flush_posted) return;
    p.flush_posted = true;
    asio::post(strand_, [self = shared_from_this(), id = p.ln->id()] {
      peer* q = self->find_peer(id);
      if (!q) return;
      q->flush_posted = false;
      if (q->batch.empty()) return;
      framing::control c{std::move(q->batch)};
      q->batch.clear();
      q->ln->send(c);
    });
  }

  void deliver(framing::control_item it) {
    auto& q = mailboxes_[it.mailbox];
    if (q.size() >= 4096) {
      ++control_dropped_;
      q.pop_front();
    }
    q.push_back(std::move(it.message));
    for (auto& [id, w] : waiters_)
      if (w.mailbox == it.mailbox) return complete_waiter(id);
  }

  std::uint32_t subtree_size() const {
    std::uint32_t n = 1;
    for (auto& [id, c] : peers_)
      if (c.k == kind::child) n += c.subtree;
    return n;
  }
  std::vector<std::string> subtree_mailboxes() const {
    std::set<std::string> all(hosted_.begin(), hosted_.end());
    for (auto& [id, c] : peers_)
      if (c.k == kind::child) all.insert(c.mailboxes.begin(), c.mailboxes.end());
    return {all.begin(), all.end()};
  }

  /// Tells the parent what this subtree serves, when that changed.
  void send_routes() {
    if (!parent_ || opt_.role == node_role::root) return;
    framing::routes r{opt_.role == node_role::owner ? 1u : subtree_size(), subtree_mailboxes()};
    if (last_routes_ && *last_routes_ == r) return;
    last_routes_ = r;
    peers_.at(*parent_).ln->send(r);
  }

  // ---- receive --------------------------------------------------------------------------------

  struct waiter {
    std::string mailbox;
    detail::unique_fn<void(error_code, std::vector<bytes>)> done;
    std::unique_ptr<asio::steady_timer> timer;
  };

  void do_receive(std::string m, std::chrono::milliseconds wait, detail::unique_fn<void(error_code, std::vector<bytes>)> done) {
    if (stopping_) return done(asio::error::operation_aborted, {});
    if (framing::valid_mailbox(m) && hosted_.insert(m).second) send_routes();
    auto q = mailboxes_.find(m);
    if ((q != mailboxes_.end() && !q->second.empty()) || wait.count() <= 0) {
      std::vector<bytes> out;
      if (q != mailboxes_.end()) {
        out.assign(std::make_move_iterator(q->second.begin()), std::make_move_iterator(q->second.end()));
        q->second.clear();
      }
      return done(error_code{}, std::move(out));
    }
    const std::uint64_t id = ++next_waiter_;
    auto& w = waiters_[id];
    w.mailbox = std::move(m);
    w.done = std::move(done);
    w.timer = std::make_unique<asio::steady_timer>(strand_);
    w.timer->expires_after(wait);
    w.timer->async_wait(asio::bind_executor(strand_, [self = shared_from_this(), id](const error_code& ec) {
      if (!ec) self->complete_waiter(id);
    }));
  }

  void complete_waiter(std::uint64_t id) {
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;
    waiter w = std::move(it->second);
    waiters_.erase(it);
    w.timer->cancel();
    std::vector<bytes> out;
    if (auto q = mailboxes_.find(w.mailbox); q != mailboxes_.end()) {
      out.assign(std::make_move_iterator(q->second.begin()), std::make_move_iterator(q->second.end()));
      q->second.clear();
    }
    w.done(error_code{}, std::move(out));
  }

  // ---- housekeeping ---------------------------------------------------------------------------

  void maintain() {
    if (stopping_) return;
    const auto now = clock::now();
    for (auto it = fetchers_.begin(); it != fetchers_.end();) {
      auto& v = it->second;
      for (auto x = v.begin(); x != v.end();) {
        if (x->deadline <= now) {
          x->done(asio::error::timed_out, std::nullopt);
          x = v.erase(x);
        } else {
          ++x;
        }
      }
      it = v.empty() ? fetchers_.erase(it) : std::next(it);
    }
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (it->second <= now) {
        const frame_key k = it->first;
        it = parked_.erase(it);
        on_missing(k);
      } else {
        ++it;
      }
    }
    for (auto it = attach_waiters_.begin(); it != attach_waiters_.end();) {
      if (it->deadline <= now) {
        it->done(error_code{}, false);
        it = attach_waiters_.erase(it);
      } else {
        ++it;
      }
    }
    if (opt_.role == node_role::owner && !parent_) {
      for (auto it = publishers_.begin(); it != publishers_.end();) {
        if (it->deadline <= now) {
          log("dropping frame " + it->key.stream.name + "/" + frame_object_name(it->key.owner, it->key.seq) + ": no root relay for " +
              std::to_string(opt_.publish_timeout.count()) + " ms");
          store_.erase(it->key);
          it->done(asio::error::timed_out);
          it = publishers_.erase(it);
        } else {
          ++it;
        }
      }
    }
    maintenance_.expires_after(std::chrono::milliseconds(50));
    maintenance_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](const error_code& ec) {
      if (!ec) self->maintain();
    }));
  }

  node_stats snapshot_stats() const {
    node_stats s;
    s.name = opt_.name;
    s.role = opt_.role;
    s.attached = attached();
    s.depth = opt_.role == node_role::root ? 0 : chain_.size();
    if (parent_)
      if (auto it = peers_.find(*parent_); it != peers_.end()) s.parent = it->second.dialed.to_string();
    for (auto& [id, p] : peers_) {
      if (p.k == kind::pending_in || p.k == kind::pending_out) continue;
      s.peers.push_back({p.name, kind_name(p.k), p.ln->remote(), p.subtree, lag_of(p), p.ln->counters()});
    }
    s.closed.assign(closed_.begin(), closed_.end());
    s.frames = store_.frames();
    s.memory_bytes = store_.memory_bytes();
    s.spilled_bytes = store_.spilled_bytes();
    s.frames_completed = frames_completed_;
    s.frames_aborted = frames_aborted_;
    s.control_dropped = control_dropped_;
    s.rejoins = rejoins_;
    s.disconnects = disconnects_;
    s.refused = refused_;
    s.closed_frame_bytes_in = closed_frame_in_;
    s.closed_frame_bytes_out = closed_frame_out_;
    return s;
  }

  // configuration and machinery (declared first: destroyed last)
  node_options opt_;
  asio::ssl::context ssl_;
  asio::io_context io_;
  strand_t strand_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{io_.get_executor()};
  std::thread thread_;
  std::thread::id thread_id_;
  framing::limits lim_;

  // state (strand only)
  frame_store store_;
  tcp::acceptor acceptor_;
  asio::steady_timer maintenance_, backoff_timer_;
  endpoint_spec listening_;
  std::map<std::uint64_t, peer> peers_;
  std::uint64_t next_id_ = 0;
  std::optional<std::uint64_t> parent_;
  std::vector<endpoint_spec> chain_;  // ancestors, root first, the parent last
  std::vector<endpoint_spec> candidates_;
  std::size_t candidate_ = 0;
  int redirects_ = 0;
  std::chrono::milliseconds backoff_ = opt_.reconnect_backoff;
  std::set<std::string> hosted_;
  std::map<std::string, std::deque<bytes>> mailboxes_;
  std::deque<framing::control_item> up_pending_;
  std::vector<stream_key> pending_discards_;
  std::optional<framing::routes> last_routes_;
  std::set<std::string> tombstones_;
  std::deque<std::string> tombstone_order_;
  std::map<frame_key, std::set<std::uint64_t>> wanters_;
  std::set<frame_key> asked_up_;
  std::map<frame_key, clock::time_point> parked_;
  std::map<frame_key, std::vector<fetch_waiter>> fetchers_;
  std::vector<publish_waiter> publishers_;
  std::vector<attach_waiter> attach_waiters_;
  std::map<std::uint64_t, waiter> waiters_;
  std::uint64_t next_waiter_ = 0;
  bool stopping_ = false;
  std::atomic<bool> stopped_{false};
  std::uint64_t frames_completed_ = 0, frames_aborted_ = 0, control_dropped_ = 0, rejoins_ = 0, disconnects_ = 0, refused_ = 0;
  std::uint64_t closed_frame_in_ = 0, closed_frame_out_ = 0;
  std::deque<peer_stats> closed_;
};

}  // namespace bitrefit::transport::relay
