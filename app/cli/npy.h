// Minimal NumPy .npy (format 1.0) writer for float32 arrays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace qs::cli {

Status write_npy_f32(const std::string& path, const std::vector<float>& data,
                     const std::vector<size_t>& shape);

}  // namespace qs::cli
