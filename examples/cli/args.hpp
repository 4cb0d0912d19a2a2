// examples/cli/args.hpp — a small command-line parser for the bitrefit subcommands.
//
// Grammar: `bitrefit SUBCOMMAND [options] POSITIONAL...`. Options may come anywhere after the
// subcommand; `--name value`, `--name=value` and short `-o value` are accepted; `--` ends options.
// Every subcommand declares its options, so an unknown or misspelt option is a usage error
// (exit code 2) instead of being silently ignored.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace bitrefit::cli {

/// A usage error: bad or missing arguments. The CLI prints the message and the subcommand's usage
/// line and exits with exit_code::usage.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct option_spec {
  std::string long_name;   // "output" for --output
  char short_name = 0;     // 'o' for -o, 0 for none
  bool takes_value = false;
  std::string value_name;  // "FILE", shown in help
  std::string help;
};

struct parsed_args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> values;  // long name -> value ("" for flags)

  bool has(const std::string& name) const { return values.count(name) != 0; }
  std::optional<std::string> get(const std::string& name) const {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  }
  std::string get_or(const std::string& name, std::string fallback) const {
    auto v = get(name);
    return v ? *v : std::move(fallback);
  }
};

/// Parses `args` (everything after the subcommand) against `specs`.
/// Throws usage_error naming the offending argument.
inline parsed_args parse_args(const std::vector<std::string>& args, const std::vector<option_spec>& specs) {
  auto by_long = [&](std::string_view n) -> const option_spec* {
    for (auto& s : specs)
      if (s.long_name == n) return &s;
    return nullptr;
  };
  auto by_short = [&](char c) -> const option_spec* {
    for (auto& s : specs)
      if (s.short_name != 0 && s.short_name == c) return &s;
    return nullptr;
  };
  parsed_args out;
  bool options_done = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (options_done || a.size() < 2 || a[0] != '-') {
      out.positional.push_back(a);
      continue;
    }
    if (a == "--") {
      options_done = true;
      continue;
    }
    const option_spec* spec = nullptr;
    std::optional<std::string> inline_value;
    if (a.rfind("--", 0) == 0) {
      std::string name = a.substr(2);
      if (auto eq = name.find('='); eq != std::string::npos) {
        inline_value = name.substr(eq + 1);
        name = name.substr(0, eq);
      }
      spec = by_long(name);
      if (!spec) throw usage_error("unknown option '--" + name + "'");
    } else {
      if (a.size() != 2) throw usage_error("unknown option '" + a + "' (short options take their value separately)");
      spec = by_short(a[1]);
      if (!spec) throw usage_error("unknown option '" + a + "'");
    }
    if (out.has(spec->long_name)) throw usage_error("option '--" + spec->long_name + "' given twice");
    if (spec->takes_value) {
      if (inline_value) {
        out.values[spec->long_name] = *inline_value;
      } else {
        if (i + 1 >= args.size()) throw usage_error("option '--" + spec->long_name + "' needs a value");
        out.values[spec->long_name] = args[++i];
      }
    } else {
      if (inline_value) throw usage_error("option '--" + spec->long_name + "' takes no value");
      out.values[spec->long_name] = "";
    }
  }
  return out;
}

/// The options block of a help text, aligned.
inline std::string format_options(const std::vector<option_spec>& specs) {
  std::vector<std::pair<std::string, std::string>> rows;
  std::size_t width = 0;
  for (auto& s : specs) {
    std::string left = "  ";
    left += s.short_name ? std::string("-") + s.short_name + ", " : std::string("    ");
    left += "--" + s.long_name;
    if (s.takes_value) left += " " + s.value_name;
    width = std::max(width, left.size());
    rows.emplace_back(left, s.help);
  }
  std::string out;
  for (auto& [l, r] : rows) out += l + std::string(width + 2 - l.size(), ' ') + r + "\n";
  return out;
}

}  // namespace bitrefit::cli
