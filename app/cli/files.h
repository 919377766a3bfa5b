// Reading the files commands take: whole text files and raw token-id files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace qs::cli {

// The whole file. Error: "cannot read '<path>'".
Result<std::string> read_file(const std::string& path);

// Raw little-endian token ids of `dtype` "u16" or "i32" (e.g. models/qs-tiny-16k/heldout.u16),
// each checked against [0, vocab).
Result<std::vector<int32_t>> read_token_file(const std::string& path, const std::string& dtype,
                                             int vocab);

}  // namespace qs::cli
