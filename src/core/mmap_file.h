// Read-only memory mapping of a whole file (RAII, move-only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

#include "core/error.h"

namespace qs {

class MappedFile {
 public:
  // Map `path` read-only. Errors: missing, not a regular file, unreadable, empty.
  static Result<MappedFile> open(const std::filesystem::path& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }  // page-aligned; stable across moves
  size_t size() const { return size_; }          // bytes
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void reset();

  const uint8_t* data_ = nullptr;  // (size_) bytes, PROT_READ
  size_t size_ = 0;
  std::filesystem::path path_;
};

}  // namespace qs
