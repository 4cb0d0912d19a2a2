// examples/cli/exit_codes.hpp — what `bitrefit` returns to the shell (documented in README.md).
//
// Scripts branch on these, so the numbers are part of the CLI's stable interface: never renumber,
// only add. Library errors map by their bitrefit::errc, so a caller can tell "your delta is for
// another base" (6) from "your delta is damaged" (5) without parsing messages.
#pragma once

#include <string_view>

#include "bitrefit/core/error.hpp"

namespace bitrefit::cli {

enum exit_code : int {
  ok = 0,           // success; for `verify`: the two checkpoints are identical
  differ = 1,       // `verify` only: the checkpoints differ (names, dtypes, shapes or bits)
  usage = 2,        // bad command line (unknown subcommand or option, missing argument)
  io_failed = 3,    // a file could not be read or written (missing, permissions, disk full)
  bad_format = 4,   // input that does not parse: malformed safetensors, index or delta bundle
  integrity = 5,    // a damaged delta: digest or size check failed (corrupt, truncated)
  mismatch = 6,     // well-formed input that does not fit: delta for another base, other tensor set
  unsupported = 7,  // a format version, dtype or mode this build does not implement
  internal = 8,     // a bug: an unexpected exception (please report it)
};

constexpr int exit_code_for(errc c) noexcept {
  switch (c) {
    case errc::invalid_argument: return usage;
    case errc::io: return io_failed;
    case errc::format: return bad_format;
    case errc::integrity: return integrity;
    case errc::mismatch: return mismatch;
    case errc::unsupported: return unsupported;
    case errc::protocol:
    case errc::fenced: return internal;
  }
  return internal;
}

constexpr std::string_view exit_code_name(int c) noexcept {
  switch (c) {
    case ok: return "ok";
    case differ: return "differ";
    case usage: return "usage";
    case io_failed: return "io";
    case bad_format: return "format";
    case integrity: return "integrity";
    case mismatch: return "mismatch";
    case unsupported: return "unsupported";
    default: return "internal";
  }
}

inline constexpr std::string_view exit_codes_help =
    "Exit codes:\n"
    "  0  success (verify: identical)        5  damaged delta (digest/size check failed)\n"
    "  1  verify: the checkpoints differ     6  mismatch (delta for another base, tensor set)\n"
    "  2  usage error                        7  unsupported format version, dtype or mode\n"
    "  3  I/O error                          8  internal error (a bug)\n"
    "  4  malformed input (safetensors, index, delta)\n";

}  // namespace bitrefit::cli
