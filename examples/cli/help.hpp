// examples/cli/help.hpp — usage texts and option tables of every subcommand.
#pragma once

#include <iterator>
#include <string>
#include <vector>

#include "args.hpp"

namespace bitrefit::cli {

struct command_info {
  std::string name;
  std::string synopsis;     // after "bitrefit NAME "
  std::string description;  // what it does, wrapped by hand
  std::vector<option_spec> options;
  std::size_t min_positional, max_positional;
};

inline option_spec opt_json() { return {"json", 0, false, "", "print one JSON object on stdout (keys: see README.md)"}; }
inline option_spec opt_progress() {
  return {"progress", 0, true, "WHEN", "progress bar on stderr: auto (only on a terminal; default), always, never"};
}
inline option_spec opt_quiet() { return {"quiet", 'q', false, "", "no progress bar and no informational text"}; }
inline option_spec opt_help() { return {"help", 'h', false, "", "show this help"}; }
inline option_spec opt_zstd() { return {"zstd-level", 0, true, "N", "zstd level of the payload sections (default 3)"}; }
inline option_spec opt_threads() {
  return {"threads", 'j', true, "N", "encoder threads (default: all cores); the output does not depend on it"};
}
inline option_spec opt_frame() {
  return {"frame-mib", 0, true, "N", "canonical input MiB per frame, bounds receiver scratch (default and format limit 64)"};
}

inline const std::vector<command_info>& commands() {
  static const std::vector<command_info> c = {
      {"stat", "OLD NEW [options]",
       "Measure what a delta from OLD to NEW would cost, per tensor and in total: elements, changed\n"
       "elements (stored bits differ; -0.0 vs +0.0 and NaN payloads count), change rate, and payload\n"
       "bytes for dense, overwrite-only, XOR and the coding the encoder chooses, next to the order-0\n"
       "entropy bound n*H(c/n) + c*H(XOR words). Says whether OLD and NEW are bitwise equal.\n"
       "Nothing is written. The chosen total equals the frame bytes `bitrefit diff` writes.",
       {opt_json(), {"tensors", 0, true, "N", "text output: list at most N tensors, most changed first (default 20; 0: all)"},
        opt_zstd(), opt_frame(), opt_threads(), opt_progress(), opt_quiet(), opt_help()},
       2, 2},
      {"diff", "OLD NEW -o DELTA [options]",
       "Write the delta bundle that turns OLD into NEW: a manifest (base and target attestation\n"
       "digests, tensor set, frame list with sizes and digests) and its frames. DELTA is one file,\n"
       "or a directory (manifest.json + frame files) with --dir or when DELTA ends in '/'. The\n"
       "bundle is written atomically: on failure nothing appears under DELTA.",
       {{"output", 'o', true, "DELTA", "where to write the delta bundle (required)"},
        {"mode", 0, true, "MODE", "xor (default: XOR where smaller, else overwrite, per item) or overwrite"},
        {"dir", 0, false, "", "write the bundle as a directory"},
        opt_zstd(), opt_frame(), opt_threads(), opt_json(), opt_progress(), opt_quiet(), opt_help()},
       2, 2},
      {"apply", "BASE DELTA (-o OUT | --in-place) [options]",
       "Rebuild NEW from BASE and a delta bundle, bit-exactly. Everything is checked before\n"
       "anything is written: the bundle's structure and every frame digest, that BASE has the\n"
       "bundle's tensor set (names, dtypes, shapes) and BASE's attestation digest equals the\n"
       "bundle's base digest; the result's digest must equal the bundle's target digest. OUT keeps\n"
       "BASE's layout (one file, or the same shards). --in-place replaces BASE atomically. On any\n"
       "error nothing is written and BASE is untouched.",
       {{"output", 'o', true, "OUT", "where to write the result"},
        {"in-place", 0, false, "", "replace BASE with the result (atomic rename)"},
        opt_json(), opt_progress(), opt_quiet(), opt_help()},
       2, 2},
      {"verify", "A B [options]",
       "Exit 0 iff A and B have the same tensor names, dtypes, shapes and every bit. Prints both\n"
       "attestation digests and, when they differ, the first differing tensors and element indices.",
       {{"limit", 0, true, "N", "report at most N differing tensors and N indices each (default 5)"},
        opt_json(), opt_progress(), opt_quiet(), opt_help()},
       2, 2},
      {"digest", "CKPT [options]",
       "Print the attestation digest of a checkpoint: XXH3-128 over, in byte-wise tensor-name order,\n"
       "each tensor's name, dtype, shape and the XXH3-128 of its consecutive 64 KiB slices. It does\n"
       "not depend on how the checkpoint is laid out in files (one file or shards, tensor order).",
       {opt_json(), opt_progress(), opt_quiet(), opt_help()},
       1, 1},
  };
  return c;
}

inline const command_info* find_command(const std::string& name) {
  for (auto& c : commands())
    if (c.name == name) return &c;
  return nullptr;
}

inline std::string usage_line(const command_info& c) { return "Usage: bitrefit " + c.name + " " + c.synopsis + "\n"; }

inline std::string command_help(const command_info& c) {
  return usage_line(c) + "\n" + c.description + "\n\nPaths may be a .safetensors file or a sharded checkpoint directory\n"
         "(model.safetensors.index.json + shards).\n\nOptions:\n" + format_options(c.options);
}

inline std::string main_help() {
  std::string s =
      "bitrefit — measure, build, apply and verify bit-exact deltas between model checkpoints.\n\n"
      "Usage: bitrefit <command> [options] ARGS...\n"
      "       bitrefit <command> --help\n\nCommands:\n";
  static const char* summaries[] = {"what would change between two checkpoints, and what a delta would cost",
                                    "write the delta bundle that turns OLD into NEW",
                                    "rebuild NEW from BASE and a delta, bit-exactly (checked before writing)",
                                    "exit 0 iff two checkpoints are bitwise identical; else where they differ",
                                    "print a checkpoint's attestation digest"};
  std::size_t i = 0;
  for (auto& c : commands()) {
    s += "  " + c.name + std::string(8 - c.name.size(), ' ') + c.synopsis + "\n";
    if (i < std::size(summaries)) s += "          " + std::string(summaries[i++]) + "\n";
  }
  s += "\nEvery path may be a .safetensors file or a sharded checkpoint directory.\n";
  return s;
}

}  // namespace bitrefit::cli
