#include "model/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

namespace qs {

namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we (a 70B model needs < 1 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests 3 levels (root, entry, shape/offsets); anything much deeper is hostile.
constexpr int kMaxJsonDepth = 16;
constexpr size_t kMaxQuotedName = 160;

struct DTypeEntry {
  const char* name;
  int bits;
  std::optional<DType> dtype;
};

// Every dtype of the safetensors spec; only F32/F16/BF16 can be bound as weights.
constexpr DTypeEntry kDTypes[] = {
    {"F32", 32, DType::F32},      {"F16", 16, DType::F16},      {"BF16", 16, DType::BF16},
    {"F64", 64, std::nullopt},    {"I64", 64, std::nullopt},    {"U64", 64, std::nullopt},
    {"C64", 64, std::nullopt},    {"I32", 32, std::nullopt},    {"U32", 32, std::nullopt},
    {"I16", 16, std::nullopt},    {"U16", 16, std::nullopt},    {"I8", 8, std::nullopt},
    {"U8", 8, std::nullopt},      {"BOOL", 8, std::nullopt},    {"F8_E4M3", 8, std::nullopt},
    {"F8_E5M2", 8, std::nullopt}, {"F8_E8M0", 8, std::nullopt}, {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt}, {"F4", 4, std::nullopt},
};

const DTypeEntry* find_dtype(std::string_view name) {
  for (const auto& d : kDTypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

// A name from an untrusted file, quoted for a one-line message.
std::string quote_name(std::string_view s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == kMaxQuotedName) {
      out += "...";
      break;
    }
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "'";
  return out;
}

// Text that may quote untrusted bytes (a parser message, a JSON value), made short and printable.
std::string one_line(std::string s) {
  constexpr size_t kMaxChars = 240;
  if (s.size() > kMaxChars) s = s.substr(0, kMaxChars) + "...";
  for (char& c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';
  }
  return s;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// A non-negative JSON integer, or nullopt.
std::optional<uint64_t> as_u64(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0)
    return static_cast<uint64_t>(j.get<int64_t>());
  return std::nullopt;
}

// Parses JSON, rejecting duplicate keys (nlohmann keeps the last silently) and deep nesting.
Result<json> parse_json_strict(std::string_view text, const std::string& what) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool too_deep = false;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        if (depth >= kMaxJsonDepth) {
          too_deep = true;
          return false;  // discard: never build the deep value
        }
        return true;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        return true;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        return true;
      default:
        return true;
    }
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    return make_error(fmt::format("{} is not valid JSON: {}", what, one_line(e.what())));
  }
  if (too_deep) {
    return make_error(fmt::format("{} nests deeper than {} levels", what, kMaxJsonDepth));
  }
  if (!duplicate.empty()) {
    return make_error(fmt::format("{} has duplicate key {}", what, quote_name(duplicate)));
  }
  return j;
}

// Validates one header entry (everything but overlaps, which need all entries).
Result<TensorInfo> parse_entry(const std::string& name, const json& entry, uint64_t data_size,
                               const std::string& src) {
  const std::string where = fmt::format("{}: tensor {}", src, quote_name(name));
  if (!entry.is_object()) {
    return make_error(where + ": expected an object {dtype, shape, data_offsets}, got " +
                      std::string(entry.type_name()));
  }
  TensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return make_error(where + ": missing string field 'dtype'");
  }
  info.dtype_name = dtype_it->get<std::string>();
  const DTypeEntry* dt = find_dtype(info.dtype_name);
  if (dt == nullptr) return make_error(where + ": unknown dtype " + quote_name(info.dtype_name));
  info.element_bits = dt->bits;
  info.dtype = dt->dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return make_error(where + ": missing array field 'shape'");
  }
  // Byte size in bits so far; every step is checked for overflow.
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& dim : *shape_it) {
    std::optional<uint64_t> d = as_u64(dim);
    if (!d)
      return make_error(where + ": shape must hold non-negative integers, got " +
                        one_line(dim.dump()));
    if (*d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
    if (!overflow && __builtin_mul_overflow(numel, *d, &numel)) overflow = true;
    info.shape.push_back(overflow ? 0 : static_cast<int64_t>(*d));
  }
  uint64_t bits = 0;
  if (overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(numel, static_cast<uint64_t>(dt->bits), &bits)) {
    std::vector<std::string> dims;
    for (const json& dim : *shape_it) dims.push_back(dim.dump());
    return make_error(fmt::format("{}: shape [{}] is too large", where, fmt::join(dims, ", ")));
  }
  if (bits % 8 != 0) {
    return make_error(fmt::format("{}: {} {} is not a whole number of bytes", where,
                                  info.dtype_name, shape_str(info.shape)));
  }
  const uint64_t need = bits / 8;

  auto off_it = entry.find("data_offsets");
  if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
      !as_u64((*off_it)[0]) || !as_u64((*off_it)[1])) {
    return make_error(where + ": 'data_offsets' must be [begin, end] with non-negative integers");
  }
  info.begin = *as_u64((*off_it)[0]);
  info.end = *as_u64((*off_it)[1]);
  if (info.begin > info.end) {
    return make_error(fmt::format("{}: data_offsets [{}, {}] end before they begin", where,
                                  info.begin, info.end));
  }
  if (info.end > data_size) {
    return make_error(fmt::format("{}: data_offsets [{}, {}] exceed the data section ({} bytes)",
                                  where, info.begin, info.end, data_size));
  }
  if (info.end - info.begin != need) {
    return make_error(fmt::format("{}: data_offsets [{}, {}] hold {} bytes, {} {} needs {}", where,
                                  info.begin, info.end, info.end - info.begin, info.dtype_name,
                                  shape_str(info.shape), need));
  }
  return info;
}

Result<std::string> read_text_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return make_error(path.string() + ": no such file");
  if (std::filesystem::is_directory(path, ec)) {
    return make_error(path.string() + ": is a directory, expected a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path.string() + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(path.string() + ": read error");
  return ss.str();
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

struct SafetensorsFile::AlignedCopies {
  std::mutex mutex;
  std::map<std::string, std::vector<uint64_t>, std::less<>> copies;  // 8-byte aligned storage
};

SafetensorsFile::SafetensorsFile() : aligned_copies_(std::make_unique<AlignedCopies>()) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string src = path.filename().string();
  QS_ASSIGN_OR_RETURN(MappedFile mapping, MappedFile::open(path));
  QS_ASSIGN_OR_RETURN(SafetensorsFile file, parse(mapping.bytes(), src));
  file.mapping_ = std::move(mapping);  // the mapping's address is unchanged by the move
  return file;
}

Result<SafetensorsFile> SafetensorsFile::parse(std::span<const uint8_t> bytes, std::string source) {
  const std::string src = source;
  if (bytes.size() < 8) {
    return make_error(
        fmt::format("{}: file is {} bytes, too short for a safetensors header", src, bytes.size()));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  const uint64_t available = bytes.size() - 8;
  if (header_len > available) {
    return make_error(fmt::format("{}: header length {} exceeds the {} bytes after it", src,
                                  header_len, available));
  }
  if (header_len > kMaxHeaderBytes) {
    return make_error(fmt::format("{}: header length {} exceeds the limit of {} bytes", src,
                                  header_len, kMaxHeaderBytes));
  }
  std::string_view header(reinterpret_cast<const char*>(bytes.data() + 8), header_len);
  if (header.empty() || header.front() != '{') {
    return make_error(src + ": header does not start with '{' (not a safetensors file?)");
  }
  QS_ASSIGN_OR_RETURN(json root, parse_json_strict(header, src + ": header"));
  if (!root.is_object()) return make_error(src + ": header is not a JSON object");

  SafetensorsFile file;
  file.source_ = std::move(source);
  file.header_bytes_ = header_len;
  file.data_ = bytes.subspan(8 + header_len);
  const uint64_t data_size = file.data_.size();

  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return make_error(src + ": '__metadata__' must be an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return make_error(fmt::format("{}: '__metadata__' value {} must be a string, got {}", src,
                                        quote_name(mk), mv.type_name()));
        }
        file.metadata_.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    QS_ASSIGN_OR_RETURN(TensorInfo info, parse_entry(key, value, data_size, src));
    file.tensors_.push_back(std::move(info));
  }
  // nlohmann objects iterate in key order, so tensors_ is sorted by name (find() relies on it).
  QS_CHECK(
      std::is_sorted(file.tensors_.begin(), file.tensors_.end(),
                     [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; }));

  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : file.tensors_) {
    if (t.begin != t.end) by_offset.push_back(&t);  // empty tensors occupy no bytes
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& a = *by_offset[i - 1];
    const TensorInfo& b = *by_offset[i];
    if (b.begin < a.end) {
      return make_error(fmt::format("{}: tensors {} [{}, {}] and {} [{}, {}] overlap", src,
                                    quote_name(a.name), a.begin, a.end, quote_name(b.name), b.begin,
                                    b.end));
    }
  }
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

std::span<const uint8_t> SafetensorsFile::raw_bytes(const TensorInfo& info) const {
  return data_.subspan(info.begin, info.end - info.begin);
}

Result<TensorView> SafetensorsFile::tensor(std::string_view name) const {
  const TensorInfo* info = find(name);
  if (info == nullptr)
    return make_error(fmt::format("{}: no tensor {}", source_, quote_name(name)));
  if (!info->dtype) {
    return make_error(fmt::format("{}: tensor {} has dtype {}; supported: F32, F16, BF16", source_,
                                  quote_name(name), info->dtype_name));
  }
  TensorView view;
  view.dtype = *info->dtype;
  view.shape = info->shape;
  view.nbytes = info->nbytes();
  std::span<const uint8_t> raw = raw_bytes(*info);
  const size_t align = dtype_size(view.dtype);
  if (reinterpret_cast<uintptr_t>(raw.data()) % align == 0) {
    view.data = raw.data();
    return view;
  }
  std::lock_guard<std::mutex> lock(aligned_copies_->mutex);
  auto it = aligned_copies_->copies.find(name);
  if (it == aligned_copies_->copies.end()) {
    std::vector<uint64_t> copy((raw.size() + 7) / 8);
    if (!raw.empty()) std::memcpy(copy.data(), raw.data(), raw.size());
    it = aligned_copies_->copies.emplace(std::string(name), std::move(copy)).first;
  }
  view.data = it->second.data();
  return view;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsSet

Result<SafetensorsSet> SafetensorsSet::open_file(const std::filesystem::path& path) {
  QS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path));
  SafetensorsSet set;
  set.source_ = file.source();
  for (const TensorInfo& t : file.tensors()) set.file_of_tensor_.emplace(t.name, 0);
  set.files_.push_back(std::make_shared<SafetensorsFile>(std::move(file)));
  return set;
}

Result<SafetensorsSet> SafetensorsSet::open_index(const std::filesystem::path& index_path) {
  const std::string src = index_path.filename().string();
  QS_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
  QS_ASSIGN_OR_RETURN(json root, parse_json_strict(text, src));
  if (!root.is_object()) return make_error(src + ": expected a JSON object");
  auto wm = root.find("weight_map");
  if (wm == root.end() || !wm->is_object()) {
    return make_error(src + ": missing object 'weight_map' {tensor name: shard file}");
  }
  if (wm->empty()) return make_error(src + ": 'weight_map' is empty");

  SafetensorsSet set;
  set.source_ = src;
  const std::filesystem::path dir = index_path.parent_path();
  std::map<std::string, size_t> shard_index;  // shard file name -> index into files_
  for (const auto& [name, shard_json] : wm->items()) {
    if (!shard_json.is_string()) {
      return make_error(fmt::format("{}: weight_map[{}] must be a shard file name, got {}", src,
                                    quote_name(name), shard_json.type_name()));
    }
    const std::string shard = shard_json.get<std::string>();
    // Shards live next to the index: a plain file name, never a path out of the directory.
    if (shard.empty() || shard == "." || shard == ".." ||
        shard.find_first_of("/\\") != std::string::npos) {
      return make_error(fmt::format("{}: weight_map[{}] = {} is not a plain file name", src,
                                    quote_name(name), quote_name(shard)));
    }
    auto it = shard_index.find(shard);
    if (it == shard_index.end()) {
      const std::filesystem::path shard_path = dir / shard;
      std::error_code ec;
      if (!std::filesystem::exists(shard_path, ec)) {
        return make_error(fmt::format("{}: shard {} (holding tensor {}) not found: {}", src,
                                      quote_name(shard), quote_name(name), shard_path.string()));
      }
      QS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(shard_path));
      set.files_.push_back(std::make_shared<SafetensorsFile>(std::move(file)));
      it = shard_index.emplace(shard, set.files_.size() - 1).first;
    }
    const SafetensorsFile& file = *set.files_[it->second];
    if (file.find(name) == nullptr) {
      return make_error(fmt::format("{}: no tensor {}, though {} maps it to this shard",
                                    file.source(), quote_name(name), src));
    }
    set.file_of_tensor_.emplace(name, it->second);
  }
  return set;
}

Result<SafetensorsSet> SafetensorsSet::open_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return make_error(dir.string() + ": not a directory");
  }
  const std::filesystem::path single = dir / "model.safetensors";
  if (std::filesystem::exists(single, ec)) return open_file(single);
  const std::filesystem::path index = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(index, ec)) return open_index(index);
  return make_error(dir.string() +
                    ": no model.safetensors or model.safetensors.index.json in this directory");
}

const SafetensorsFile* SafetensorsSet::file_for(std::string_view name) const {
  auto it = file_of_tensor_.find(std::string(name));
  return it == file_of_tensor_.end() ? nullptr : files_[it->second].get();
}

Result<TensorView> SafetensorsSet::tensor(std::string_view name) const {
  const SafetensorsFile* file = file_for(name);
  if (file == nullptr)
    return make_error(fmt::format("{}: missing tensor {}", source_, quote_name(name)));
  return file->tensor(name);
}

}  // namespace qs
