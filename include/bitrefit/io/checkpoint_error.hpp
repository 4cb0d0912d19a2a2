// bitrefit/io/checkpoint_error.hpp — the named problems a checkpoint reader can find.
//
// Every strict-validation failure of a safetensors file or a sharded checkpoint directory is a
// `checkpoint_error`: a `bitrefit::error` (so callers that catch `error` and branch on `code()` keep
// working) that also carries *which* rule was broken, so tests and tools can tell an overlap from
// a gap without parsing messages. The message starts with the problem's name in brackets.
#pragma once

#include <string>
#include <string_view>

#include "bitrefit/core/error.hpp"

namespace bitrefit::io {

enum class checkpoint_errc {
  file_too_short,          // fewer than the 8 bytes of the header length
  header_length_past_end,  // the header length points beyond the end of the file
  header_length_absurd,    // the header length exceeds the 100 MB limit safetensors itself enforces
  malformed_json,          // the header is not a JSON object
  header_too_deep,         // the header nests arrays/objects deeper than max_header_depth
  malformed_entry,         // a tensor entry or __metadata__ has a missing or mistyped field
  unknown_dtype,           // a dtype spelling this library does not know
  shape_size_mismatch,     // data_offsets span != product(shape) * element size
  offsets_reversed,        // data_offsets out of order: end < begin
  offsets_overlap,         // two tensors share bytes
  offsets_gap,             // bytes of the data section that no tensor owns (before, between, after)
  offsets_past_end,        // a tensor ends beyond the end of the file
  duplicate_tensor,        // one name twice in a header, or in two shards
  malformed_index,         // model.safetensors.index.json unparsable, too large or deep, no weight_map, bad shard name
  index_missing_shard,     // the index names a shard file that does not exist
  index_missing_tensor,    // the index names a tensor that its shard does not hold
  index_unlisted_tensor,   // a shard holds a tensor that the index does not list
  not_a_checkpoint,        // neither a .safetensors file nor a checkpoint directory
};

constexpr std::string_view checkpoint_errc_name(checkpoint_errc p) noexcept {
  switch (p) {
    case checkpoint_errc::file_too_short: return "file_too_short";
    case checkpoint_errc::header_length_past_end: return "header_length_past_end";
    case checkpoint_errc::header_length_absurd: return "header_length_absurd";
    case checkpoint_errc::malformed_json: return "malformed_json";
    case checkpoint_errc::header_too_deep: return "header_too_deep";
    case checkpoint_errc::malformed_entry: return "malformed_entry";
    case checkpoint_errc::unknown_dtype: return "unknown_dtype";
    case checkpoint_errc::shape_size_mismatch: return "shape_size_mismatch";
    case checkpoint_errc::offsets_reversed: return "offsets_reversed";
    case checkpoint_errc::offsets_overlap: return "offsets_overlap";
    case checkpoint_errc::offsets_gap: return "offsets_gap";
    case checkpoint_errc::offsets_past_end: return "offsets_past_end";
    case checkpoint_errc::duplicate_tensor: return "duplicate_tensor";
    case checkpoint_errc::malformed_index: return "malformed_index";
    case checkpoint_errc::index_missing_shard: return "index_missing_shard";
    case checkpoint_errc::index_missing_tensor: return "index_missing_tensor";
    case checkpoint_errc::index_unlisted_tensor: return "index_unlisted_tensor";
    case checkpoint_errc::not_a_checkpoint: return "not_a_checkpoint";
  }
  return "unknown";
}

/// The general error category each problem belongs to.
constexpr errc checkpoint_errc_category(checkpoint_errc p) noexcept {
  switch (p) {
    case checkpoint_errc::file_too_short:
    case checkpoint_errc::header_length_past_end:
    case checkpoint_errc::offsets_past_end: return errc::integrity;  // typically a truncated file
    case checkpoint_errc::unknown_dtype: return errc::unsupported;
    case checkpoint_errc::index_missing_shard:
    case checkpoint_errc::index_missing_tensor:
    case checkpoint_errc::index_unlisted_tensor: return errc::mismatch;
    default: return errc::format;
  }
}

class checkpoint_error : public error {
 public:
  checkpoint_error(checkpoint_errc problem, const std::string& message, error_context where = {})
      : error(checkpoint_errc_category(problem), "[" + std::string(checkpoint_errc_name(problem)) + "] " + message,
              std::move(where)),
        problem_(problem) {}

  checkpoint_errc problem() const noexcept { return problem_; }

 private:
  checkpoint_errc problem_;
};

}  // namespace bitrefit::io
