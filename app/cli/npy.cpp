#include "npy.h"

#include <cstdint>
#include <cstdio>
#include <fstream>

namespace qs::cli {

Status write_npy_f32(const std::string& path, const std::vector<float>& data,
                     const std::vector<size_t>& shape) {
  std::string dims;
  size_t numel = 1;
  for (size_t d : shape) {
    dims += std::to_string(d) + ",";
    numel *= d;
    if (shape.size() > 1) dims += " ";
  }
  QS_CHECK(numel == data.size());
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64,
  // ending in '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) return make_error("cannot write '" + path + "'");
  const char magic[] = "\x93NUMPY\x01\x00";
  out.write(magic, 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  char len_le[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_le, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!out) return make_error("error writing '" + path + "'");
  return {};
}

}  // namespace qs::cli
