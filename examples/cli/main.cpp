// examples/cli/main.cpp — `bitrefit`: measure, build, apply and verify deltas between checkpoints.
//
// This file is the shell around the library: argument parsing, help, text and JSON output, exit
// codes. The work itself (reading checkpoints, change detection, encoding, bundles, digests) is
// the library's; ops.hpp composes it for each subcommand.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.hpp"
#include "exit_codes.hpp"
#include "help.hpp"
#include "bitrefit/ops/checkpoint_ops.hpp"
#include "progress.hpp"

namespace bitrefit::cli {
namespace {

using json = nlohmann::ordered_json;
using namespace bitrefit::ops;

const char* version_string() { return "0.1.0"; }

struct common {
  bool json_out = false;
  bool quiet = false;
  progress_mode progress = progress_mode::automatic;
};

common parse_common(const parsed_args& a) {
  common c;
  c.json_out = a.has("json");
  c.quiet = a.has("quiet");
  const std::string p = a.get_or("progress", "auto");
  if (p == "auto") c.progress = progress_mode::automatic;
  else if (p == "always") c.progress = progress_mode::always;
  else if (p == "never") c.progress = progress_mode::never;
  else throw usage_error("--progress takes auto, always or never, not '" + p + "'");
  if (c.quiet) c.progress = progress_mode::never;
  return c;
}

std::uint64_t parse_uint(const parsed_args& a, const std::string& name, std::uint64_t fallback, std::uint64_t lo,
                         std::uint64_t hi) {
  auto v = a.get(name);
  if (!v) return fallback;
  std::uint64_t x = 0;
  if (v->empty() || v->size() > 18) throw usage_error("--" + name + " needs a number, not '" + *v + "'");
  for (char ch : *v) {
    if (ch < '0' || ch > '9') throw usage_error("--" + name + " needs a number, not '" + *v + "'");
    x = x * 10 + static_cast<std::uint64_t>(ch - '0');
  }
  if (x < lo || x > hi)
    throw usage_error("--" + name + " must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return x;
}

codec_settings parse_codec(const parsed_args& a) {
  codec_settings s;
  s.zstd_level = static_cast<int>(parse_uint(a, "zstd-level", static_cast<std::uint64_t>(s.zstd_level), 1, 22));
  s.frame_bytes = parse_uint(a, "frame-mib", s.frame_bytes >> 20, 1, codec::frame_input_bytes_limit >> 20) << 20;
  s.threads = static_cast<unsigned>(parse_uint(a, "threads", 0, 1, 1024));
  return s;
}

void print_timings(const std::vector<phase_time>& phases) {
  std::fprintf(stderr, "time:");
  for (auto& p : phases) std::fprintf(stderr, " %s %.3f s", p.name.c_str(), p.seconds);
  std::fprintf(stderr, "\n");
}

std::string ratio(double a, double b) {
  char buf[32];
  if (b <= 0) return "-";
  std::snprintf(buf, sizeof buf, "%.3f", a / b);
  return buf;
}

// ---- subcommands --------------------------------------------------------------------------------

int run_stat(const parsed_args& a) {
  const common c = parse_common(a);
  const auto tensors_shown = parse_uint(a, "tensors", 20, 0, UINT64_MAX / 2);
  terminal_progress progress(c.progress);
  const stat_result r = compute_stat(a.positional[0], a.positional[1], parse_codec(a), progress);
  if (c.json_out) {
    json j;
    j["command"] = "stat";
    j["old"] = a.positional[0];
    j["new"] = a.positional[1];
    j.update(to_json(r));
    std::cout << j.dump(2) << "\n";
    return ok;
  }
  std::vector<const stat_row*> rows;
  for (auto& t : r.tensors) rows.push_back(&t);
  std::stable_sort(rows.begin(), rows.end(), [](auto* x, auto* y) { return x->changed > y->changed; });
  if (tensors_shown != 0 && rows.size() > tensors_shown) rows.resize(tensors_shown);
  std::printf("%-48s %12s %12s %8s %12s %12s %12s %12s %12s %12s\n", "tensor", "elements", "changed", "rate%", "dense",
              "overwrite", "xor", "xor|ow", "chosen", "entropy");
  auto line = [](const std::string& name, const stat_row& t) {
    std::printf("%-48s %12llu %12llu %8.3f %12llu %12llu %12llu %12llu %12llu %12.0f\n", name.c_str(),
                static_cast<unsigned long long>(t.elements), static_cast<unsigned long long>(t.changed),
                100.0 * t.change_rate(), static_cast<unsigned long long>(t.dense_bytes),
                static_cast<unsigned long long>(t.overwrite_only_bytes), static_cast<unsigned long long>(t.xor_bytes),
                static_cast<unsigned long long>(t.unconditioned_bytes), static_cast<unsigned long long>(t.chosen_bytes),
                t.entropy_bytes);
  };
  for (auto* t : rows) line(t->name.size() > 48 ? "..." + t->name.substr(t->name.size() - 45) : t->name, *t);
  if (rows.size() < r.tensors.size())
    std::printf("(%zu more tensors; --tensors 0 lists all)\n", r.tensors.size() - rows.size());
  line("TOTAL", r.total);
  std::printf("\n%s\n", r.equal ? "OLD and NEW are bitwise equal." : "OLD and NEW differ.");
  std::printf("chosen/overwrite-only %s, chosen/entropy %s, chosen/dense %s; bundle %s in %llu frames (zstd %d)\n",
              ratio(static_cast<double>(r.total.chosen_bytes), static_cast<double>(r.total.overwrite_only_bytes)).c_str(),
              ratio(static_cast<double>(r.total.chosen_bytes), r.total.entropy_bytes).c_str(),
              ratio(static_cast<double>(r.total.chosen_bytes), static_cast<double>(r.total.dense_bytes)).c_str(),
              human_bytes(static_cast<double>(r.bundle_bytes)).c_str(), static_cast<unsigned long long>(r.frames),
              r.settings.zstd_level);
  if (r.total.changed)
    std::printf("bytes per changed element: chosen %.3f, XOR-or-overwrite only (no base-conditioned items) %.3f\n",
                static_cast<double>(r.total.chosen_bytes) / static_cast<double>(r.total.changed),
                static_cast<double>(r.total.unconditioned_bytes) / static_cast<double>(r.total.changed));
  if (!c.quiet) print_timings(r.phases);
  return ok;
}

int run_diff(const parsed_args& a) {
  const common c = parse_common(a);
  auto out = a.get("output");
  if (!out || out->empty()) throw usage_error("diff needs -o DELTA");
  const std::string mode = a.get_or("mode", "xor");
  if (mode != "xor" && mode != "overwrite") throw usage_error("--mode takes xor or overwrite, not '" + mode + "'");
  const bool as_dir = a.has("dir") || (!out->empty() && out->back() == '/');
  terminal_progress progress(c.progress);
  const diff_result r = write_diff(a.positional[0], a.positional[1], *out, as_dir, mode == "overwrite",
                                   parse_codec(a), progress);
  if (c.json_out) {
    json j;
    j["command"] = "diff";
    j["old"] = a.positional[0];
    j["new"] = a.positional[1];
    j["layout"] = as_dir ? "directory" : "file";
    j["mode"] = mode;
    j.update(to_json(r));
    std::cout << j.dump(2) << "\n";
    return ok;
  }
  if (!c.quiet) {
    std::printf("wrote %s: %llu frames, %s (%s of dense), %llu of %llu elements changed (%.3f%%)\n",
                r.delta_path.c_str(), static_cast<unsigned long long>(r.frames),
                human_bytes(static_cast<double>(r.bundle_bytes)).c_str(),
                ratio(static_cast<double>(r.bundle_bytes), static_cast<double>(r.dense_bytes)).c_str(),
                static_cast<unsigned long long>(r.changed), static_cast<unsigned long long>(r.elements),
                r.elements ? 100.0 * static_cast<double>(r.changed) / static_cast<double>(r.elements) : 0.0);
    std::printf("base   %s\ntarget %s\n", r.base_digest.to_hex().c_str(), r.target_digest.to_hex().c_str());
    print_timings(r.phases);
  }
  return ok;
}

int run_apply(const parsed_args& a) {
  const common c = parse_common(a);
  const bool in_place = a.has("in-place");
  auto out = a.get("output");
  if (in_place && out) throw usage_error("apply takes either -o OUT or --in-place, not both");
  if (!in_place && (!out || out->empty())) throw usage_error("apply needs -o OUT or --in-place");
  const std::string target = in_place ? a.positional[0] : *out;
  terminal_progress progress(c.progress);
  const apply_result r = apply_delta(a.positional[0], a.positional[1], target, progress);
  if (c.json_out) {
    json j;
    j["command"] = "apply";
    j["base"] = a.positional[0];
    j["delta"] = a.positional[1];
    j["output"] = target;
    j["in_place"] = in_place;
    j.update(to_json(r));
    std::cout << j.dump(2) << "\n";
    return ok;
  }
  if (!c.quiet) {
    std::printf("wrote %s: %llu frames applied, %llu elements changed; digest %s verified\n", target.c_str(),
                static_cast<unsigned long long>(r.frames), static_cast<unsigned long long>(r.changed),
                r.target_digest.to_hex().c_str());
    print_timings(r.phases);
  }
  return ok;
}

int run_verify(const parsed_args& a) {
  const common c = parse_common(a);
  const auto limit = parse_uint(a, "limit", 5, 1, 1u << 20);
  terminal_progress progress(c.progress);
  const verify_result r = verify_checkpoints(a.positional[0], a.positional[1], limit, progress);
  if (c.json_out) {
    json j;
    j["command"] = "verify";
    j["a"] = a.positional[0];
    j["b"] = a.positional[1];
    j.update(to_json(r));
    std::cout << j.dump(2) << "\n";
    return r.equal ? ok : differ;
  }
  std::printf("A %s  %s\nB %s  %s\n", r.a_digest.to_hex().c_str(), a.positional[0].c_str(), r.b_digest.to_hex().c_str(),
              a.positional[1].c_str());
  if (r.equal) {
    std::printf("identical: names, dtypes, shapes and every bit\n");
    return ok;
  }
  std::printf("DIFFER: %llu tensors\n", static_cast<unsigned long long>(r.differing_tensors));
  for (auto& d : r.differences) {
    std::printf("  %s: %s", d.tensor.c_str(), d.reason.c_str());
    if (d.reason == "bits") {
      std::printf(" (%llu elements) at", static_cast<unsigned long long>(d.differing_elements));
      for (auto i : d.first_indices) std::printf(" %llu", static_cast<unsigned long long>(i));
      if (d.differing_elements > d.first_indices.size()) std::printf(" ...");
    }
    std::printf("\n");
  }
  if (r.differing_tensors > r.differences.size())
    std::printf("  ... and %llu more tensors\n", static_cast<unsigned long long>(r.differing_tensors - r.differences.size()));
  return differ;
}

int run_digest(const parsed_args& a) {
  const common c = parse_common(a);
  terminal_progress progress(c.progress);
  const digest_result r = digest_checkpoint(a.positional[0], progress);
  if (c.json_out) {
    json j;
    j["command"] = "digest";
    j["path"] = a.positional[0];
    j.update(to_json(r));
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("%s  %s\n", r.digest.to_hex().c_str(), a.positional[0].c_str());
  }
  return ok;
}

int dispatch(const command_info& cmd, const parsed_args& a) {
  if (cmd.name == "stat") return run_stat(a);
  if (cmd.name == "diff") return run_diff(a);
  if (cmd.name == "apply") return run_apply(a);
  if (cmd.name == "verify") return run_verify(a);
  if (cmd.name == "digest") return run_digest(a);
  return internal;
}

int report_error(bool json_out, int code, const std::string& message, const error_context* where) {
  std::fprintf(stderr, "bitrefit: %s\n", message.c_str());
  if (json_out) {
    json j;
    j["error"] = {{"exit_code", code}, {"kind", std::string(exit_code_name(code))}, {"message", message}};
    if (where) j["error"]["where"] = {{"file", where->file}, {"tensor", where->tensor}, {"field", where->field}};
    std::cout << j.dump(2) << "\n";
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(main_help().c_str(), stderr);
    return usage;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    if (args.size() > 1) {
      if (auto* c = find_command(args[1])) {
        std::fputs(command_help(*c).c_str(), stdout);
        std::fputs(("\n" + std::string(exit_codes_help)).c_str(), stdout);
        return ok;
      }
      std::fprintf(stderr, "bitrefit: unknown command '%s'\n\n%s", args[1].c_str(), main_help().c_str());
      return usage;
    }
    std::fputs(main_help().c_str(), stdout);
    std::fputs(("\n" + std::string(exit_codes_help)).c_str(), stdout);
    return ok;
  }
  if (args[0] == "--version") {
    std::printf("bitrefit %s\n", version_string());
    return ok;
  }
  const command_info* cmd = find_command(args[0]);
  if (!cmd) {
    std::fprintf(stderr, "bitrefit: unknown command '%s'\n\n%s", args[0].c_str(), main_help().c_str());
    return usage;
  }
  bool json_out = false;
  for (auto& s : args) json_out = json_out || s == "--json";
  try {
    parsed_args a = parse_args({args.begin() + 1, args.end()}, cmd->options);
    if (a.has("help")) {
      std::fputs(command_help(*cmd).c_str(), stdout);
      std::fputs(("\n" + std::string(exit_codes_help)).c_str(), stdout);
      return ok;
    }
    if (a.positional.size() < cmd->min_positional || a.positional.size() > cmd->max_positional)
      throw usage_error(cmd->name + " takes " + std::to_string(cmd->min_positional) + " path argument" +
                        (cmd->min_positional == 1 ? "" : "s") + ", got " + std::to_string(a.positional.size()));
    return dispatch(*cmd, a);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "bitrefit %s: %s\n%sTry 'bitrefit %s --help'.\n", cmd->name.c_str(), e.what(),
                 usage_line(*cmd).c_str(), cmd->name.c_str());
    if (json_out) {
      json j;
      j["error"] = {{"exit_code", static_cast<int>(usage)}, {"kind", "usage"}, {"message", e.what()}};
      std::cout << j.dump(2) << "\n";
    }
    return usage;
  } catch (const bitrefit::error& e) {
    return report_error(json_out, exit_code_for(e.code()), e.what(), &e.where());
  } catch (const std::bad_alloc&) {
    return report_error(json_out, io_failed, "out of memory", nullptr);
  } catch (const std::exception& e) {
    return report_error(json_out, internal, std::string("internal error: ") + e.what(), nullptr);
  }
}

}  // namespace bitrefit::cli

int main(int argc, char** argv) { return bitrefit::cli::main(argc, argv); }
