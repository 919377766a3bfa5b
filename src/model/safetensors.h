// Reader for the safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the
// data section. Every header entry is validated when the file is opened, before any tensor is
// used; tensors are zero-copy views into the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/mmap_file.h"

namespace qs {

// One validated header entry.
struct TensorInfo {
  std::string name;
  std::string dtype_name;      // as written: "BF16", "I8", "F8_E4M3", ...
  int element_bits = 0;        // 4, 6, 8, 16, 32 or 64
  std::optional<DType> dtype;  // set for the dtypes we compute with: F32, F16, BF16
  std::vector<int64_t> shape;  // [] is a scalar
  uint64_t begin = 0;          // byte offsets into the data section, end - begin == nbytes()
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

// A tensor ready to read. `data` is aligned to the element size.
struct TensorView {
  const void* data = nullptr;  // nbytes bytes
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t nbytes = 0;

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Map and validate a file. Messages start with the file's basename.
  static Result<SafetensorsFile> open(const std::filesystem::path& path);
  // Validate bytes already in memory (tests, fuzzing). The file does not own `bytes`: they must
  // outlive it. `source` names the file in messages.
  static Result<SafetensorsFile> parse(std::span<const uint8_t> bytes, std::string source);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& source() const { return source_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t header_bytes() const { return header_bytes_; }  // N, without the 8-byte length
  size_t data_bytes() const { return data_.size(); }

  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  // Errors: absent, or a dtype other than F32/F16/BF16.
  Result<TensorView> tensor(std::string_view name) const;
  // The raw bytes of any entry, whatever its dtype (not realigned).
  std::span<const uint8_t> raw_bytes(const TensorInfo& info) const;

 private:
  struct AlignedCopies;
  SafetensorsFile();

  std::string source_;
  MappedFile mapping_;             // empty for parse()
  std::span<const uint8_t> data_;  // the data section
  size_t header_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  // Tensors whose offset is not a multiple of their element size are copied once, on first use.
  std::unique_ptr<AlignedCopies> aligned_copies_;
};

// The tensors of one model: a single model.safetensors, or the shards listed by
// model.safetensors.index.json ({"weight_map": {tensor name: shard file name}}).
class SafetensorsSet {
 public:
  // `dir/model.safetensors` when it exists, else `dir/model.safetensors.index.json`.
  static Result<SafetensorsSet> open_dir(const std::filesystem::path& dir);
  // Opens each shard once; every tensor the index lists must be in its shard.
  static Result<SafetensorsSet> open_index(const std::filesystem::path& index_path);
  static Result<SafetensorsSet> open_file(const std::filesystem::path& path);

  // "model.safetensors" or "model.safetensors.index.json": names the set in messages.
  const std::string& source() const { return source_; }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

  // The file that holds `name`, nullptr when no file does.
  const SafetensorsFile* file_for(std::string_view name) const;
  Result<TensorView> tensor(std::string_view name) const;

 private:
  std::string source_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, size_t> file_of_tensor_;  // name -> index into files_
};

}  // namespace qs
