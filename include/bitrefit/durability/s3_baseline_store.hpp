// bitrefit/durability/s3_baseline_store.hpp — the owners' baseline store in an S3 bucket, so a
// trainer restarted on a fresh host (empty local disk) recovers K.v's baseline from the bucket and
// the commit log alone.
//
// Same format and folding as the filesystem store (baseline_format.hpp): under `<key prefix>`,
// full-v<v>.bin holds a whole image and delta-v<t>.bin a change set linked to the digest of its
// base's object; a chain is folded into a full image at retain_only once it reaches max_chain
// deltas or weighs as much as the full image. What S3 gives in place of temp + fsync + rename: an
// object appears only when its PUT (or CompleteMultipartUpload) succeeded, whole, and a 200 means
// it is durable; DELETE is durable when it returns. The write order is the filesystem store's, so
// the same crash analysis holds: save and save_changes delete any earlier image of the target
// BEFORE writing theirs (no crash leaves an older image of t loadable), the fold writes the full
// image before deleting the chain it replaces. Every object ends with its XXH3-64, so a damaged
// one reads as loss (errc::integrity naming its s3:// URL), never as wrong bits.
//
// Large images stream up as multipart uploads (s3_store::open: parts of part_size, in parallel, no
// second copy of the image). An upload interrupted by a crash is invisible to loads, and
// retain_only aborts every incomplete upload under the prefix (one owner writes a store, and it is
// not writing while it retains).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>

#include "bitrefit/core/error.hpp"
#include "bitrefit/durability/baseline_format.hpp"
#include "bitrefit/durability/concepts.hpp"
#include "bitrefit/transport/s3_store.hpp"

namespace bitrefit::durability {

struct s3_baseline_store_options {
  /// Where this owner's images live in the bucket ("baseline/owner-0/"), under the store's own prefix.
  std::string key_prefix = "baseline/";
  /// As baseline_store_options::max_chain (filesystem.hpp).
  std::uint32_t max_chain = 16;
};

class s3_baseline_store {
 public:
  using options = s3_baseline_store_options;

  s3_baseline_store(transport::s3_store store, options o) : store_(std::move(store)), opt_(std::move(o)) {
    if (!opt_.key_prefix.empty() && opt_.key_prefix.back() != '/') opt_.key_prefix += '/';
  }

  /// Law 1: streams the image into full-v<v>.bin (hashing as it goes); durable when it returns.
  void save(version_t v, const baseline_image& img) {
    remove_images_of(v);  // law 4: no crash leaves an earlier image of v loadable
    write(baseline_format::full_name(v), [&](auto& out) { baseline_format::write_full(out, v, img); });
  }

  /// Law 4: writes delta-v<t>.bin linked to the object that holds b's image now.
  void save_changes(version_t b, version_t t, const change_set& cs) {
    if (t == b) throw error(errc::invalid_argument, "save_changes: target equals base", {.file = {}, .tensor = {}, .field = "target"});
    files f{*this, std::nullopt};
    const auto link = baseline_format::image_link(f, b);
    if (!link)
      throw error(errc::mismatch, "save_changes: no durable image of base version " + std::to_string(b), {.file = f.where(""), .tensor = {}, .field = "base"});
    remove_images_of(t);
    write(baseline_format::delta_name(t), [&](auto& out) { baseline_format::write_delta(out, t, b, link->second, cs); });
  }

  /// The image of v; nullopt when it is absent or anything on its chain does not verify
  /// (last_error() says why). Network failures that retries cannot fix are thrown (s3_error):
  /// "the bucket is unreachable" is not "the image is lost".
  std::optional<baseline_image> load(version_t v) {
    last_error_.reset();
    try {
      return load_checked(v);
    } catch (const transport::s3_error&) {
      throw;
    } catch (const error& e) {
      last_error_ = e;
      return std::nullopt;
    }
  }

  baseline_image load_checked(version_t v) {
    files f{*this, listing()};
    return baseline_format::load_chain(f, v);
  }

  /// Law 6: t's change set against b, read from delta-v<t>.bin alone, when that delta is linked
  /// to the object holding b's image now; else nullopt (last_error() says why when an object on
  /// the way does not verify). Network failures are thrown, as by load.
  std::optional<change_set> load_changes(version_t b, version_t t) {
    last_error_.reset();
    try {
      files f{*this, listing()};
      return baseline_format::delta_changes(f, b, t);
    } catch (const transport::s3_error&) {
      throw;
    } catch (const error& e) {
      last_error_ = e;
      return std::nullopt;
    }
  }

  /// Law 3: keeps v's chain (folded into a full image when due), deletes every other image and
  /// aborts incomplete uploads under the prefix.
  void retain_only(version_t v) {
    const auto sizes = listing();
    files f{*this, sizes};
    std::set<std::string> keep = baseline_format::chain_names(f, v);
    std::uint32_t deltas = 0;
    std::uint64_t delta_bytes = 0, full_bytes = 0;
    for (const auto& n : keep) {
      const std::uint64_t size = sizes.count(n) ? sizes.at(n) : 0;
      if (baseline_format::is_delta_name(n)) ++deltas, delta_bytes += size;
      else full_bytes = size;
    }
    if (baseline_format::fold_due(deltas, delta_bytes, full_bytes, opt_.max_chain)) {
      if (auto img = load(v)) {
        write(baseline_format::full_name(v), [&](auto& out) { baseline_format::write_full(out, v, *img); });
        keep = {baseline_format::full_name(v)};
      }
    }
    for (const auto& u : store_.incomplete_uploads(opt_.key_prefix))
      store_.client().call(transport::s3_call::make("AbortMultipartUpload", "DELETE", u.key).param("uploadId", u.upload_id).answer(404));
    std::vector<std::string> drop;
    for (const auto& [n, size] : sizes)
      if (baseline_format::is_image_name(n) && !keep.count(n)) drop.push_back(opt_.key_prefix + n);
    store_.remove_keys(drop);
  }

  /// Why the last load() returned nullopt (nullopt after a successful load).
  const std::optional<error>& last_error() const noexcept { return last_error_; }
  /// The object key of an image file, e.g. key_of(full_name(3)).
  std::string key_of(const std::string& name) const { return opt_.key_prefix + name; }
  transport::s3_store& store() noexcept { return store_; }

 private:
  /// The bucket prefix as baseline_format's chain walk reads it (BaselineFiles).
  /// Object name (under the prefix) -> size: one LIST spares a request per absent name.
  using names = std::map<std::string, std::uint64_t>;
  names listing() {
    names out;
    for (const auto& o : store_.list_objects(opt_.key_prefix)) out[o.key.substr(opt_.key_prefix.size())] = o.size;
    return out;
  }

  struct files {
    s3_baseline_store& s;
    std::optional<names> listed;  // when set: names absent from it are not asked for
    std::optional<std::uint64_t> digest_of(const std::string& name) {
      if (listed && !listed->count(name)) return std::nullopt;
      auto tail = s.store_.get_tail(s.key_of(name), baseline_format::trailer_size);
      if (!tail) return std::nullopt;
      return tail->size() == baseline_format::trailer_size ? baseline_format::load_u64(*tail) : 0;
    }
    std::optional<std::vector<std::byte>> read(const std::string& name) { return s.store_.get(s.key_of(name)); }
    std::vector<std::byte> read_head(const std::string& name, std::size_t n) {
      auto b = s.store_.get_range(s.key_of(name), 0, n);
      return b ? std::move(*b) : std::vector<std::byte>{};
    }
    std::string where(const std::string& name) const { return s.store_.client().where(s.key_of(name)); }
  };
  static_assert(BaselineFiles<files>);

  void remove_images_of(version_t v) {
    store_.remove(key_of(baseline_format::delta_name(v)));
    store_.remove(key_of(baseline_format::full_name(v)));
  }

  /// One object streamed by `body`; nothing appears under the key unless it all went up.
  template <class Body>
  void write(const std::string& name, Body&& body) {
    auto w = store_.open(key_of(name));
    body(w);
    w.commit();
  }

  transport::s3_store store_;
  options opt_;
  std::optional<error> last_error_;
};

static_assert(ChangeSetStore<s3_baseline_store>);

}  // namespace bitrefit::durability
