// bitrefit/wire/trace.hpp — recorded runs: every event a machine was stepped with and every action it
// emitted, as JSON lines, one file per machine lifetime, for bitrefit-check-trace (proofs/).
//
// Layout of a trace directory (one per run; any number of processes write into it):
//   c-e<epoch>.jsonl          the coordinator of that epoch
//   o<i>-e<epoch>.jsonl       owner i of the sender that ran the coordinator of that epoch
//   r<i>-i<incarnation>.jsonl receiver i, from the process started under that incarnation
// Lines (objects):
//   {"seq":n,"init":{...}}                       a machine was constructed (its arguments)
//   {"seq":n,"event":E,"actions":[A...]}         one step: what drive() stepped and what came out
//   {"seq":n,"recovered":true}                   an owner restarted from its durable state
//   {"seq":n,"restore_served":K,"owners":[B...]} (coordinator file) a dense restore of K was served
//                                                while the owners' baselines were B
// Events and actions use the positional JSON of wire/json.hpp (from the types' field lists);
// messages inside them the named form. `seq` is strictly increasing across every file one process
// writes, so the lines of one process have a total order. Each line is written with one write(2) on
// an O_APPEND descriptor BEFORE the step's effects are performed, so a process killed at any point
// leaves whole lines that cover everything it did (a torn last line, if the kernel ever left one,
// is reported and ignored by the reader).
//
// Off by default and free when off: a recorder that was not opened is a null pointer check.
// Turned on by an option (sender_options / receiver_options::trace_dir) or the environment variable
// BITREFIT_TRACE_DIR.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bitrefit/core/error.hpp"
#include "bitrefit/wire/json.hpp"

namespace bitrefit::wire {

/// The trace directory to use: `option` when set, else $BITREFIT_TRACE_DIR, else none (off).
inline std::string trace_dir_from(const std::string& option) {
  if (!option.empty()) return option;
  const char* env = std::getenv("BITREFIT_TRACE_DIR");
  return env ? std::string(env) : std::string();
}

/// One process's clock for trace lines (shared by every file it writes).
inline std::atomic<std::uint64_t>& trace_sequence() {
  static std::atomic<std::uint64_t> seq{0};
  return seq;
}

/// One machine lifetime's trace file. Thread-compatible: one machine is stepped by one thread.
class trace_file_writer {
 public:
  /// Opens (creates or appends to) `dir/name.jsonl`. @throws errc::io naming the file.
  trace_file_writer(const std::filesystem::path& dir, const std::string& name) : path_(dir / (name + ".jsonl")) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw error(errc::io, std::string("cannot open trace file: ") + std::strerror(errno), {.file = path_.string(), .tensor = {}, .field = {}});
  }
  trace_file_writer(const trace_file_writer&) = delete;
  trace_file_writer& operator=(const trace_file_writer&) = delete;
  ~trace_file_writer() {
    if (fd_ >= 0) ::close(fd_);
  }

  /// Appends one line {"seq":n, <fields of `body`>} with a single write(2).
  void line(json body) {
    body["seq"] = trace_sequence().fetch_add(1) + 1;
    std::string s = body.dump();
    s += '\n';
    const char* p = s.data();
    std::size_t left = s.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw error(errc::io, std::string("cannot write trace: ") + std::strerror(errno), {.file = path_.string(), .tensor = {}, .field = {}});
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }

  template <class Event, class Actions>
  void step(const Event& ev, const Actions& actions) {
    line(json{{"event", value_to_json(ev)}, {"actions", value_to_json(actions)}});
  }

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

/// One parsed line of a trace file.
struct trace_line {
  std::uint64_t seq = 0;
  std::size_t number = 0;  // 1-based line number in its file
  json body;               // the whole object
};

struct trace_file {
  std::filesystem::path path;
  std::string name;  // file name without .jsonl
  std::vector<trace_line> lines;
  bool torn_tail = false;  // the last line had no newline and did not parse (a killed writer)
};

/// Reads one trace file. A last line without a newline that does not parse is a torn write of a
/// killed process: dropped and flagged. Any other line that does not parse is errc::format naming
/// the file and line.
inline trace_file read_trace_file(const std::filesystem::path& p) {
  trace_file f{p, p.stem().string(), {}, false};
  std::ifstream in(p, std::ios::binary);
  if (!in) throw error(errc::io, "cannot read trace file", {.file = p.string(), .tensor = {}, .field = {}});
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t pos = 0, number = 0;
  while (pos < text.size()) {
    const std::size_t nl = text.find('\n', pos);
    const bool complete = nl != std::string::npos;
    const std::string s = text.substr(pos, complete ? nl - pos : std::string::npos);
    pos = complete ? nl + 1 : text.size();
    ++number;
    if (s.empty()) continue;
    json x;
    try {
      x = json::parse(s);
    } catch (const json::exception& e) {
      if (!complete) {
        f.torn_tail = true;
        break;
      }
      throw error(errc::format, "trace line " + std::to_string(number) + " does not parse: " + e.what(),
                  {.file = p.string(), .tensor = {}, .field = "line"});
    }
    if (!x.is_object() || !x.contains("seq"))
      throw error(errc::format, "trace line " + std::to_string(number) + " has no seq", {.file = p.string(), .tensor = {}, .field = "seq"});
    f.lines.push_back(trace_line{x.at("seq").get<std::uint64_t>(), number, std::move(x)});
  }
  return f;
}

/// Every *.jsonl file of a trace directory, sorted by name.
inline std::vector<trace_file> read_trace_dir(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> paths;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".jsonl") paths.push_back(e.path());
  if (ec) throw error(errc::io, "cannot list trace directory: " + ec.message(), {.file = dir.string(), .tensor = {}, .field = {}});
  std::sort(paths.begin(), paths.end());
  std::vector<trace_file> out;
  for (const auto& p : paths) out.push_back(read_trace_file(p));
  return out;
}

}  // namespace bitrefit::wire
