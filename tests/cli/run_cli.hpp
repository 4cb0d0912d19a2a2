// tests/cli/run_cli.hpp — runs the bitrefit executable as a subprocess and captures its output.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fixture {

struct cli_result {
  int exit_code = -1;
  std::string out, err;
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Runs `cli args...` with stdin from /dev/null and stdout/stderr captured (so not a terminal).
inline cli_result run_cli(const std::string& cli, const std::vector<std::string>& args, const std::filesystem::path& scratch) {
  std::string cmd = "exec " + shell_quote(cli);
  for (auto& a : args) cmd += " " + shell_quote(a);
  const auto out = scratch / "cli.stdout", err = scratch / "cli.stderr";
  cmd += " </dev/null >" + shell_quote(out.string()) + " 2>" + shell_quote(err.string());
  const int status = std::system(cmd.c_str());
  cli_result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

}  // namespace fixture
