// bitrefit-check-trace — validate a recorded run against the model.
//
//   bitrefit-check-trace DIR
// DIR holds the JSON-lines traces the engine wrote (sender_options / receiver_options::trace_dir,
// or $BITREFIT_TRACE_DIR; bitrefit-demo --trace DIR). Every machine's trace is replayed through the
// pure protocol machines (the first divergence is reported with the event and both action lists),
// then the cross-role invariants are checked on the merged trace (bitrefit_proofs/trace_check.hpp).
// Prints a summary and one line per problem (file:line: what). Exit status: 0 the run is accepted,
// 1 a problem was found, 2 bad arguments or an unreadable directory.
#include <cstdio>
#include <filesystem>
#include <string>

#include "bitrefit_proofs/trace_check.hpp"

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fprintf(stderr, "usage: bitrefit-check-trace DIR   (a trace directory written by the engine)\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  if (!std::filesystem::is_directory(dir)) {
    std::fprintf(stderr, "bitrefit-check-trace: %s is not a directory\n", dir.c_str());
    return 2;
  }
  try {
    const auto report = bitrefit::proofs::traces::check_dir(dir);
    std::printf("%s: %s\n%s\n", dir.c_str(), report.ok() ? "accepted" : "REJECTED", report.text().c_str());
    return report.ok() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bitrefit-check-trace: %s\n", e.what());
    return 2;
  }
}
