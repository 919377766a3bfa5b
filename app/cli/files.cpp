#include "files.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace qs::cli {

Result<std::string> read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return make_error("'" + path + "' is a directory, not a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error("error reading '" + path + "'");
  return ss.str();
}

Result<std::vector<int32_t>> read_token_file(const std::string& path, const std::string& dtype,
                                             int vocab) {
  QS_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  const size_t width = dtype == "u16" ? 2 : 4;
  if (bytes.size() % width != 0) {
    return make_error("--tokens '" + path + "': " + std::to_string(bytes.size()) +
                      " bytes is not a whole number of " + dtype + " token ids");
  }
  std::vector<int32_t> ids(bytes.size() / width);
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto* b = reinterpret_cast<const unsigned char*>(bytes.data() + i * width);
    int64_t v = width == 2 ? int64_t(b[0] | (b[1] << 8))
                           : int64_t(int32_t(uint32_t(b[0]) | (uint32_t(b[1]) << 8) |
                                             (uint32_t(b[2]) << 16) | (uint32_t(b[3]) << 24)));
    if (v < 0 || v >= vocab) {
      return make_error("--tokens '" + path + "': token " + std::to_string(i) + " = " +
                        std::to_string(v) + " is outside the vocabulary [0, " +
                        std::to_string(vocab) + ")");
    }
    ids[i] = static_cast<int32_t>(v);
  }
  return ids;
}

}  // namespace qs::cli
