// tests/cli/test_cli.cpp — the `bitrefit` executable, end to end (label cli).
//
// A chain of 5 versions from the AdamW simulation (BF16 with FP32 master, lr 1e-6), plus F32,
// I64 and BOOL tensors, written by an independent safetensors writer as single files and as
// sharded directories. Every check compares bytes read by an independent reader.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "run_cli.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using fixture::cli_result;

namespace {

constexpr int versions = 5;

struct chain_env {
  fs::path root;
  std::vector<fixture::model> models;
  std::vector<fs::path> file, dir;  // v_k as one file, and as a 3-shard directory
};

chain_env& env() {
  static chain_env e = [] {
    chain_env c;
    c.root = fs::temp_directory_path() / ("bitrefit-test-cli-" + std::to_string(::getpid()));
    fs::remove_all(c.root);
    fs::create_directories(c.root / "chain");
    fs::create_directories(c.root / "io");
    c.models = fixture::make_chain(versions, 2024);
    for (int v = 0; v < versions; ++v) {
      c.file.push_back(c.root / "chain" / ("v" + std::to_string(v) + ".safetensors"));
      c.dir.push_back(c.root / "chain" / ("v" + std::to_string(v) + "-sharded"));
      fixture::write_file(c.file.back(), c.models[static_cast<std::size_t>(v)]);
      fixture::write_sharded(c.dir.back(), c.models[static_cast<std::size_t>(v)], 3);
    }
    return c;
  }();
  return e;
}

cli_result cli(const std::vector<std::string>& args) { return fixture::run_cli(BITREFIT_CLI_PATH, args, env().root / "io"); }

/// A fresh empty work directory for one test.
fs::path workdir(const std::string& name) {
  fs::path p = env().root / "work" / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

/// Every file under `p` with its bytes (to prove "nothing written" / "untouched").
std::map<std::string, std::vector<std::byte>> snapshot(const fs::path& p) {
  std::map<std::string, std::vector<std::byte>> s;
  for (auto& e : fs::recursive_directory_iterator(p))
    if (e.is_regular_file()) s[fs::relative(e.path(), p).string()] = fixture::read_bytes(e.path());
    else s[fs::relative(e.path(), p).string() + "/"] = {};
  return s;
}

json parse_json(const cli_result& r) {
  try {
    return json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "stdout is not JSON: " << e.what() << "\n" << r.out << "\nstderr: " << r.err;
    return json::object();
  }
}

std::uint64_t file_or_dir_bytes(const fs::path& p) {
  if (!fs::is_directory(p)) return fs::file_size(p);
  std::uint64_t n = 0;
  for (auto& e : fs::recursive_directory_iterator(p))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

// The independent byte comparison: every tensor's dtype, shape and data bytes.
void expect_same_model(const fs::path& got, const fixture::model& want) {
  const fixture::model m = fixture::read(got);
  ASSERT_EQ(m.size(), want.size()) << got;
  for (auto& [name, t] : want) {
    auto it = m.find(name);
    ASSERT_NE(it, m.end()) << name << " missing in " << got;
    EXPECT_EQ(it->second.dtype, t.dtype) << name;
    EXPECT_EQ(it->second.shape, t.shape) << name;
    EXPECT_TRUE(it->second.bytes == t.bytes) << name << " bytes differ in " << got;
  }
}

}  // namespace

TEST(Cli, HelpForEveryCommandAndUsageErrors) {
  for (std::string c : {"stat", "diff", "apply", "verify", "digest"}) {
    auto r = cli({c, "--help"});
    EXPECT_EQ(r.exit_code, 0) << c;
    EXPECT_NE(r.out.find("Usage: bitrefit " + c), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Exit codes:"), std::string::npos) << c;
  }
  auto top = cli({"--help"});
  EXPECT_EQ(top.exit_code, 0);
  for (std::string c : {"stat", "diff", "apply", "verify", "digest"}) EXPECT_NE(top.out.find("  " + c), std::string::npos);
  EXPECT_EQ(cli({}).exit_code, 2);
  EXPECT_EQ(cli({"frobnicate"}).exit_code, 2);
  auto bad_opt = cli({"digest", "--bogus", env().file[0].string()});
  EXPECT_EQ(bad_opt.exit_code, 2);
  EXPECT_NE(bad_opt.err.find("unknown option '--bogus'"), std::string::npos) << bad_opt.err;
  EXPECT_EQ(cli({"stat", env().file[0].string()}).exit_code, 2);  // missing NEW
  EXPECT_EQ(cli({"diff", env().file[0].string(), env().file[1].string()}).exit_code, 2);  // missing -o
  EXPECT_EQ(cli({"apply", env().file[0].string(), "x", "-o", "y", "--in-place"}).exit_code, 2);
  EXPECT_EQ(cli({"diff", env().file[0].string(), env().file[1].string(), "-o", "d", "--mode", "rle"}).exit_code, 2);
  auto json_usage = cli({"verify", env().file[0].string(), "--json"});
  EXPECT_EQ(json_usage.exit_code, 2);
  EXPECT_EQ(parse_json(json_usage)["error"]["kind"], "usage");
  auto missing = cli({"digest", (env().root / "nope.safetensors").string()});
  EXPECT_EQ(missing.exit_code, 3);
  EXPECT_NE(missing.err.find("nope.safetensors"), std::string::npos) << missing.err;
}

TEST(Cli, ChainRoundTripsThroughDiffAndApply) {
  const fs::path w = workdir("chain");
  for (int v = 0; v + 1 < versions; ++v) {
    SCOPED_TRACE("step " + std::to_string(v) + " -> " + std::to_string(v + 1));
    const auto& e = env();
    const std::string s = std::to_string(v);
    // single files
    const fs::path delta = w / ("d" + s + ".brd"), out = w / ("out" + s + ".safetensors");
    auto d = cli({"diff", e.file[v].string(), e.file[v + 1].string(), "-o", delta.string(), "--json", "-j2"});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    const json dj = parse_json(d);
    auto a = cli({"apply", e.file[v].string(), delta.string(), "-o", out.string()});
    ASSERT_EQ(a.exit_code, 0) << a.err;
    auto vr = cli({"verify", out.string(), e.file[v + 1].string()});
    EXPECT_EQ(vr.exit_code, 0) << vr.out << vr.err;
    expect_same_model(out, e.models[static_cast<std::size_t>(v + 1)]);
    // The digests diff recorded are those `digest` prints for OLD and NEW.
    auto g0 = parse_json(cli({"digest", e.file[v].string(), "--json"}));
    auto g1 = parse_json(cli({"digest", e.file[v + 1].string(), "--json"}));
    EXPECT_EQ(dj["base_digest"], g0["digest"]);
    EXPECT_EQ(dj["target_digest"], g1["digest"]);
    EXPECT_EQ(dj["bundle_bytes"].get<std::uint64_t>(), file_or_dir_bytes(delta));

    // sharded directories, a directory-form bundle, and overwrite mode
    const fs::path ddir = w / ("d" + s + "-dir"), outdir = w / ("out" + s + "-sharded");
    auto d2 = cli({"diff", e.dir[v].string(), e.dir[v + 1].string(), "-o", ddir.string(), "--dir", "--mode", "overwrite"});
    ASSERT_EQ(d2.exit_code, 0) << d2.err;
    ASSERT_TRUE(fs::is_directory(ddir));
    auto a2 = cli({"apply", e.dir[v].string(), ddir.string(), "-o", outdir.string()});
    ASSERT_EQ(a2.exit_code, 0) << a2.err;
    ASSERT_TRUE(fs::is_directory(outdir));
    EXPECT_EQ(cli({"verify", outdir.string(), e.dir[v + 1].string()}).exit_code, 0);
    EXPECT_EQ(cli({"verify", outdir.string(), e.file[v + 1].string()}).exit_code, 0);
    expect_same_model(outdir, e.models[static_cast<std::size_t>(v + 1)]);
    // OUT keeps BASE's layout: the same shard files holding the same tensors.
    auto weight_map = [](const fs::path& d) {
      return json::parse(std::ifstream(d / "model.safetensors.index.json"))["weight_map"];
    };
    EXPECT_EQ(weight_map(outdir), weight_map(e.dir[v]));
    for (auto& f : fs::directory_iterator(e.dir[v]))
      EXPECT_TRUE(fs::exists(outdir / f.path().filename())) << f.path().filename();

    // A delta is about canonical tensors, not files: one made from files applies to shards.
    const fs::path mixed = w / ("mixed" + s + ".safetensors");
    auto a3 = cli({"apply", e.dir[v].string(), delta.string(), "-o", mixed.string()});
    ASSERT_EQ(a3.exit_code, 0) << a3.err;
    expect_same_model(mixed, e.models[static_cast<std::size_t>(v + 1)]);
  }
}

TEST(Cli, ApplyInPlaceReplacesBase) {
  const fs::path w = workdir("inplace");
  const auto& e = env();
  const fs::path base = w / "model.safetensors", delta = w / "d.brd";
  fs::copy_file(e.file[1], base);
  ASSERT_EQ(cli({"diff", e.file[1].string(), e.file[2].string(), "-o", delta.string()}).exit_code, 0);
  auto r = cli({"apply", base.string(), delta.string(), "--in-place", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(parse_json(r)["in_place"], true);
  expect_same_model(base, e.models[2]);
  // Applying the same delta again: BASE is now v2, not the delta's base -> refused, untouched.
  const auto before = snapshot(w);
  auto again = cli({"apply", base.string(), delta.string(), "--in-place"});
  EXPECT_EQ(again.exit_code, 6) << again.err;
  EXPECT_EQ(snapshot(w), before);
  // Sharded in place.
  const fs::path sdir = w / "sharded";
  fs::copy(e.dir[1], sdir, fs::copy_options::recursive);
  auto rs = cli({"apply", sdir.string(), delta.string(), "--in-place"});
  ASSERT_EQ(rs.exit_code, 0) << rs.err;
  expect_same_model(sdir, e.models[2]);
}

TEST(Cli, StatCountsMatchAnIndependentCountAndDiffPayload) {
  const fs::path w = workdir("stat");
  const auto& e = env();
  for (int v : {0, 3}) {
    auto r = cli({"stat", e.file[v].string(), e.file[v + 1].string(), "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = parse_json(r);
    EXPECT_EQ(j["equal"], false);
    const auto& a = e.models[static_cast<std::size_t>(v)];
    const auto& b = e.models[static_cast<std::size_t>(v + 1)];
    ASSERT_EQ(j["tensors"].size(), a.size());
    std::uint64_t changed = 0, elements = 0;
    std::set<std::string> seen;
    for (auto& t : j["tensors"]) {
      const std::string name = t["name"];
      seen.insert(name);
      const std::uint64_t want = fixture::count_changed(a.at(name), b.at(name));
      EXPECT_EQ(t["changed"].get<std::uint64_t>(), want) << name;
      EXPECT_EQ(t["dense_bytes"].get<std::uint64_t>(), a.at(name).bytes.size()) << name;
      changed += want;
      elements += t["elements"].get<std::uint64_t>();
      for (const char* k : {"overwrite_only_bytes", "xor_bytes", "unconditioned_bytes", "chosen_bytes", "entropy_bytes", "change_rate"})
        EXPECT_TRUE(t.contains(k)) << k;
      EXPECT_LE(t["chosen_bytes"].get<std::uint64_t>(),
                std::min(t["xor_bytes"].get<std::uint64_t>(), t["overwrite_only_bytes"].get<std::uint64_t>()))
          << name;
    }
    EXPECT_EQ(seen.size(), a.size());
    const json& tot = j["total"];
    EXPECT_EQ(tot["changed"].get<std::uint64_t>(), changed);
    EXPECT_EQ(tot["elements"].get<std::uint64_t>(), elements);
    EXPECT_GT(changed, 0u);
    EXPECT_DOUBLE_EQ(tot["change_rate"].get<double>(), static_cast<double>(changed) / static_cast<double>(elements));
    // The chosen payload is exactly what diff writes (same coding, same zstd level).
    const fs::path delta = w / ("d" + std::to_string(v) + ".brd");
    auto d = cli({"diff", e.file[v].string(), e.file[v + 1].string(), "-o", delta.string(), "--json", "-j2"});
    ASSERT_EQ(d.exit_code, 0) << d.err;
    const json dj = parse_json(d);
    EXPECT_EQ(tot["chosen_bytes"], dj["frame_bytes"]);
    // per changed element: the chosen coding next to the codec without base-conditioned items
    // (this fixture's tensors are too small for per-class tables to pay off; tests/codec checks the gain)
    EXPECT_DOUBLE_EQ(tot["chosen_bytes_per_changed"].get<double>(), static_cast<double>(tot["chosen_bytes"].get<std::uint64_t>()) / static_cast<double>(changed));
    EXPECT_GT(tot["unconditioned_bytes_per_changed"].get<double>(), 0.0);
    EXPECT_EQ(j["payload"]["frame_bytes"], dj["frame_bytes"]);
    EXPECT_EQ(j["payload"]["frames"], dj["frames"]);
    EXPECT_EQ(j["payload"]["bundle_bytes"].get<std::uint64_t>(), fs::file_size(delta));
    EXPECT_EQ(dj["changed"].get<std::uint64_t>(), changed);
    // And overwrite-only is what diff --mode overwrite writes.
    const fs::path ow = w / ("o" + std::to_string(v) + ".brd");
    auto o = cli({"diff", e.file[v].string(), e.file[v + 1].string(), "-o", ow.string(), "--mode", "overwrite", "--json"});
    ASSERT_EQ(o.exit_code, 0) << o.err;
    EXPECT_EQ(tot["overwrite_only_bytes"], parse_json(o)["frame_bytes"]);
  }
  // Equal inputs: nothing changed.
  auto same = cli({"stat", e.file[2].string(), e.dir[2].string(), "--json"});
  ASSERT_EQ(same.exit_code, 0) << same.err;
  const json sj = parse_json(same);
  EXPECT_EQ(sj["equal"], true);
  EXPECT_EQ(sj["total"]["changed"], 0);
  // Text mode prints a table with a TOTAL line.
  auto text = cli({"stat", e.file[0].string(), e.file[1].string()});
  ASSERT_EQ(text.exit_code, 0);
  EXPECT_NE(text.out.find("TOTAL"), std::string::npos);
}

TEST(Cli, VerifyNamesFirstDifferences) {
  const auto& e = env();
  auto r = cli({"verify", e.file[0].string(), e.file[1].string(), "--json", "--limit", "3"});
  EXPECT_EQ(r.exit_code, 1);
  const json j = parse_json(r);
  EXPECT_EQ(j["equal"], false);
  EXPECT_NE(j["a_digest"], j["b_digest"]);
  ASSERT_FALSE(j["differences"].empty());
  EXPECT_LE(j["differences"].size(), 3u);
  // Independent: the differing tensors in name order, their counts and first indices.
  const auto& a = e.models[0];
  const auto& b = e.models[1];
  std::vector<std::string> want;
  for (auto& [n, t] : a)
    if (t.bytes != b.at(n).bytes) want.push_back(n);
  EXPECT_EQ(j["differing_tensors"].get<std::size_t>(), want.size());
  for (std::size_t i = 0; i < j["differences"].size(); ++i) {
    const json& d = j["differences"][i];
    EXPECT_EQ(d["tensor"], want[i]);
    EXPECT_EQ(d["reason"], "bits");
    const auto& ta = a.at(want[i]);
    const auto& tb = b.at(want[i]);
    std::vector<std::uint64_t> first;
    EXPECT_EQ(d["differing_elements"].get<std::uint64_t>(), fixture::count_changed(ta, tb, &first, 3));
    EXPECT_EQ(d["first_indices"].get<std::vector<std::uint64_t>>(), first) << want[i];
  }
  auto t = cli({"verify", e.file[0].string(), e.file[1].string()});
  EXPECT_EQ(t.exit_code, 1);
  EXPECT_NE(t.out.find(want[0]), std::string::npos) << t.out;
  // Structural differences are named too.
  const fs::path w = workdir("verify");
  auto m = e.models[0];
  m.erase("model.norm.weight");
  m["extra"] = {"U8", {2}, {std::byte{1}, std::byte{2}}};
  fixture::write_file(w / "other.safetensors", m);
  auto s = parse_json(cli({"verify", e.file[0].string(), (w / "other.safetensors").string(), "--json"}));
  std::set<std::string> reasons;
  for (auto& d : s["differences"]) reasons.insert(d["tensor"].get<std::string>() + ":" + d["reason"].get<std::string>());
  EXPECT_TRUE(reasons.count("extra:only in B")) << s.dump();
  EXPECT_TRUE(reasons.count("model.norm.weight:only in A")) << s.dump();
}

TEST(Cli, DigestDependsOnContentNotLayout) {
  const auto& e = env();
  std::set<std::string> seen;
  for (int v = 0; v < versions; ++v) {
    auto f = cli({"digest", e.file[v].string()});
    auto d = cli({"digest", e.dir[v].string()});
    ASSERT_EQ(f.exit_code, 0) << f.err;
    ASSERT_EQ(d.exit_code, 0) << d.err;
    const std::string hf = f.out.substr(0, 32), hd = d.out.substr(0, 32);
    EXPECT_EQ(hf, hd);
    EXPECT_TRUE(seen.insert(hf).second) << "two versions share a digest";
    EXPECT_EQ(hf.find_first_not_of("0123456789abcdef"), std::string::npos);
  }
}

TEST(Cli, BadInputsAreRefusedWithNothingWritten) {
  const fs::path w = workdir("bad");
  const auto& e = env();
  const fs::path delta = w / "d01.brd";
  ASSERT_EQ(cli({"diff", e.file[0].string(), e.file[1].string(), "-o", delta.string()}).exit_code, 0);
  const auto good = fixture::read_bytes(delta);

  struct kase {
    std::string name;
    fs::path base;
    std::vector<std::byte> delta;
    int exit_code;
    std::string message;  // a piece of the message that names the problem
  };
  std::vector<kase> cases;
  cases.push_back({"base digest mismatch", e.file[2], good, 6, "base"});
  auto corrupt = good;
  corrupt[corrupt.size() / 2] ^= std::byte{0x40};
  cases.push_back({"corrupt delta", e.file[0], corrupt, 5, "digest"});
  auto truncated = good;
  truncated.resize(good.size() - good.size() / 3);
  cases.push_back({"truncated delta", e.file[0], truncated, 5, "truncated"});
  cases.push_back({"empty delta", e.file[0], {}, 5, "truncated"});
  auto bad_manifest = good;
  bad_manifest[60] ^= std::byte{0x01};  // inside the manifest JSON
  cases.push_back({"corrupt manifest", e.file[0], bad_manifest, 5, "manifest"});
  cases.push_back({"not a delta", e.file[0], fixture::read_bytes(e.file[1]), 4, "not a bitrefit delta bundle"});
  // Tensor set mismatch: BASE lacks a tensor, or has an extra one, or a changed dtype/shape.
  auto m = e.models[0];
  m.erase("model.norm.weight");
  fixture::write_file(w / "missing.safetensors", m);
  cases.push_back({"tensor missing from base", w / "missing.safetensors", good, 6, "model.norm.weight"});
  m = e.models[0];
  m["extra.buffer"] = {"U8", {3}, {std::byte{1}, std::byte{2}, std::byte{3}}};
  fixture::write_file(w / "extra.safetensors", m);
  cases.push_back({"extra tensor in base", w / "extra.safetensors", good, 6, "extra.buffer"});
  m = e.models[0];
  m["model.causal_mask"].shape = {4, 16};
  fixture::write_file(w / "reshaped.safetensors", m);
  cases.push_back({"shape differs", w / "reshaped.safetensors", good, 6, "model.causal_mask"});

  for (auto& k : cases) {
    SCOPED_TRACE(k.name);
    const fs::path cw = workdir("bad-case");
    const fs::path base = cw / "base.safetensors", d = cw / "delta.brd", out = cw / "out.safetensors";
    fs::copy_file(k.base, base);
    fixture::write_bytes(d, k.delta);
    const auto before = snapshot(cw);
    auto r = cli({"apply", base.string(), d.string(), "-o", out.string()});
    EXPECT_EQ(r.exit_code, k.exit_code) << r.err;
    EXPECT_NE(r.err.find(k.message), std::string::npos) << r.err;
    std::printf("  %-26s exit %d: %s", k.name.c_str(), r.exit_code, r.err.c_str());
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_EQ(snapshot(cw), before) << "something was written";
    auto ip = cli({"apply", base.string(), d.string(), "--in-place", "--json"});
    EXPECT_EQ(ip.exit_code, k.exit_code) << ip.err;
    EXPECT_EQ(snapshot(cw), before) << "BASE or its directory changed";
    const json ej = parse_json(ip);
    EXPECT_EQ(ej["error"]["exit_code"], k.exit_code);
    // Sharded BASE, in place: every shard and the index untouched.
    const fs::path sdir = cw / "sharded";
    fixture::write_sharded(sdir, fixture::read(k.base), 3);
    const auto sbefore = snapshot(cw);
    auto sp = cli({"apply", sdir.string(), d.string(), "--in-place"});
    EXPECT_EQ(sp.exit_code, k.exit_code) << sp.err;
    EXPECT_EQ(snapshot(cw), sbefore);
  }
}

TEST(Cli, DamagedDirectoryBundlesAreRefused) {
  const fs::path w = workdir("bad-dir");
  const auto& e = env();
  const fs::path good = w / "good";
  ASSERT_EQ(cli({"diff", e.file[0].string(), e.file[1].string(), "-o", good.string() + "/"}).exit_code, 0);
  ASSERT_TRUE(fs::exists(good / "manifest.json"));
  struct kase {
    std::string name;
    std::function<void(const fs::path&)> damage;
    int exit_code;
    std::string message;
  };
  const std::vector<kase> cases = {
      {"missing frame", [](const fs::path& d) { fs::remove(d / "frames" / "00000000.frame"); }, 5, "missing"},
      {"truncated frame",
       [](const fs::path& d) {
         auto b = fixture::read_bytes(d / "frames" / "00000000.frame");
         b.resize(b.size() - 1);
         fixture::write_bytes(d / "frames" / "00000000.frame", b);
       },
       5, "truncated"},
      {"manifest not JSON",
       [](const fs::path& d) { fixture::write_bytes(d / "manifest.json", {std::byte{'{'}, std::byte{'x'}}); }, 4,
       "manifest.json"},
  };
  for (auto& k : cases) {
    SCOPED_TRACE(k.name);
    const fs::path cw = workdir("bad-dir-case");
    fs::copy(good, cw / "delta", fs::copy_options::recursive);
    fs::copy_file(e.file[0], cw / "base.safetensors");
    k.damage(cw / "delta");
    const auto before = snapshot(cw);
    auto r = cli({"apply", (cw / "base.safetensors").string(), (cw / "delta").string(), "-o", (cw / "out.safetensors").string()});
    EXPECT_EQ(r.exit_code, k.exit_code) << r.err;
    EXPECT_NE(r.err.find(k.message), std::string::npos) << r.err;
    auto ip = cli({"apply", (cw / "base.safetensors").string(), (cw / "delta").string(), "--in-place"});
    EXPECT_EQ(ip.exit_code, k.exit_code) << ip.err;
    EXPECT_EQ(snapshot(cw), before);
  }
}

TEST(Cli, DiffAndStatRefuseDifferentTensorSets) {
  const fs::path w = workdir("sets");
  const auto& e = env();
  auto m = e.models[1];
  m.erase("model.layers.0.mlp.up_proj.weight");
  fixture::write_file(w / "fewer.safetensors", m);
  m = e.models[1];
  m["model.position_ids"].dtype = "U64";
  fixture::write_file(w / "retyped.safetensors", m);
  for (std::string other : {"fewer.safetensors", "retyped.safetensors"}) {
    SCOPED_TRACE(other);
    const auto before = snapshot(w);
    auto d = cli({"diff", e.file[0].string(), (w / other).string(), "-o", (w / "d.brd").string()});
    EXPECT_EQ(d.exit_code, 6) << d.err;
    EXPECT_NE(d.err.find(other == "fewer.safetensors" ? "model.layers.0.mlp.up_proj.weight" : "model.position_ids"),
              std::string::npos)
        << d.err;
    auto dd = cli({"diff", e.file[0].string(), (w / other).string(), "-o", (w / "d-dir").string(), "--dir"});
    EXPECT_EQ(dd.exit_code, 6) << dd.err;
    EXPECT_EQ(snapshot(w), before) << "diff wrote something";
    auto s = cli({"stat", e.file[0].string(), (w / other).string(), "--json"});
    EXPECT_EQ(s.exit_code, 6) << s.err;
    EXPECT_EQ(parse_json(s)["error"]["kind"], "mismatch");
  }
  // A directory that is not a bundle is never replaced.
  fs::create_directories(w / "precious");
  fixture::write_bytes(w / "precious" / "notes.txt", {std::byte{'x'}});
  auto r = cli({"diff", e.file[0].string(), e.file[1].string(), "-o", (w / "precious").string(), "--dir"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(fixture::read_bytes(w / "precious" / "notes.txt").size(), 1u);
  EXPECT_EQ(std::distance(fs::directory_iterator(w / "precious"), fs::directory_iterator()), 1);
}

TEST(Cli, ProgressOnlyWhenAskedOrOnATerminal) {
  const auto& e = env();
  auto quiet = cli({"digest", e.file[0].string()});
  EXPECT_EQ(quiet.err, "");  // not a TTY: no bar
  auto bar = cli({"digest", e.file[0].string(), "--progress", "always"});
  EXPECT_EQ(bar.exit_code, 0);
  EXPECT_NE(bar.err.find('\r'), std::string::npos);
  EXPECT_NE(bar.err.find("/s"), std::string::npos) << bar.err;
  EXPECT_NE(bar.err.find("100%"), std::string::npos) << bar.err;
  EXPECT_EQ(bar.out.substr(32), "  " + e.file[0].string() + "\n");  // stdout carries only the result
  auto diff_bar = cli({"diff", e.file[0].string(), e.file[1].string(), "-o", (workdir("progress") / "d.brd").string(),
                       "--progress=always"});
  EXPECT_EQ(diff_bar.exit_code, 0);
  EXPECT_NE(diff_bar.err.find("encode   done in"), std::string::npos) << diff_bar.err;
  EXPECT_EQ(diff_bar.err.find("100%"), diff_bar.err.rfind("100%")) << "the read bar restarted";
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (rc == 0) fs::remove_all(env().root);
  return rc;
}
