// Helpers for the model tests: a temp directory, a safetensors writer and tiny model directories,
// all generated in the test (nothing downloaded, nothing committed).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace qs::test {

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("qs_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string to_string(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

// Writes safetensors bytes the way the reference implementation does: tensors packed in the
// order added, header padded with spaces to a multiple of 8.
class SafetensorsBuilder {
 public:
  // Raw bytes with an arbitrary dtype string (for unsupported dtypes).
  SafetensorsBuilder& add_raw(const std::string& name, const std::string& dtype,
                              std::vector<int64_t> shape, const std::string& bytes) {
    entries_.push_back({name, dtype, std::move(shape), bytes});
    return *this;
  }
  // Values converted to F32/F16/BF16.
  SafetensorsBuilder& add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          const std::vector<float>& values) {
    std::string bytes;
    for (float v : values) {
      if (dtype == DType::F32) {
        bytes.append(reinterpret_cast<const char*>(&v), 4);
      } else {
        uint16_t h = dtype == DType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
        bytes.append(reinterpret_cast<const char*>(&h), 2);
      }
    }
    return add_raw(name, dtype_name(dtype), std::move(shape), bytes);
  }
  SafetensorsBuilder& metadata(const std::string& key, const std::string& value) {
    metadata_[key] = value;
    return *this;
  }

  nlohmann::json header() const {
    nlohmann::json h = nlohmann::json::object();
    if (!metadata_.empty()) h["__metadata__"] = metadata_;
    uint64_t offset = 0;
    for (const Entry& e : entries_) {
      h[e.name] = {{"dtype", e.dtype},
                   {"shape", e.shape},
                   {"data_offsets", {offset, offset + e.bytes.size()}}};
      offset += e.bytes.size();
    }
    return h;
  }
  std::string data() const {
    std::string d;
    for (const Entry& e : entries_) d += e.bytes;
    return d;
  }
  std::string build() const { return assemble(header().dump(), data()); }

  // Any header text + data, with the 8-byte length prefix and padding.
  static std::string assemble(std::string header_text, const std::string& data, bool pad = true) {
    if (pad) {
      while (header_text.size() % 8 != 0) header_text += ' ';
    }
    std::string out(8, '\0');
    uint64_t n = header_text.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + header_text + data;
  }

 private:
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Deterministic pseudo-random values in [-1, 1), exactly representable in bf16 and f16.
inline std::vector<float> test_values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = static_cast<float>(static_cast<int>(s >> 24) - 128) / 128.0f;
  }
  return v;
}

struct TinyModelOptions {
  DType dtype = DType::F32;
  int shards = 1;  // > 1: model-0000i-of-0000n.safetensors + index
  bool write_lm_head = true;
};

// Every tensor name and shape the architecture needs, in file order.
inline std::vector<std::pair<std::string, std::vector<int64_t>>> tiny_model_tensors(
    const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), f = c.intermediate_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> t;
  t.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", {h}});
    t.push_back({p + "self_attn.q_proj.weight", {q, h}});
    t.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    t.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    t.push_back({p + "self_attn.o_proj.weight", {h, q}});
    if (c.arch == Architecture::Qwen2 || c.attention_bias) {
      t.push_back({p + "self_attn.q_proj.bias", {q}});
      t.push_back({p + "self_attn.k_proj.bias", {kv}});
      t.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    if (c.arch == Architecture::Llama && c.attention_bias) {
      t.push_back({p + "self_attn.o_proj.bias", {h}});
    }
    t.push_back({p + "post_attention_layernorm.weight", {h}});
    t.push_back({p + "mlp.gate_proj.weight", {f, h}});
    t.push_back({p + "mlp.up_proj.weight", {f, h}});
    t.push_back({p + "mlp.down_proj.weight", {h, f}});
  }
  t.push_back({"model.norm.weight", {h}});
  t.push_back({"lm_head.weight", {c.vocab_size, h}});
  return t;
}

inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Writes the safetensors file(s) of a model with config `c` into `dir`. Tensor k holds
// test_values(numel, k). Returns the per-tensor seeds by name.
inline std::map<std::string, uint32_t> write_tiny_model(const std::filesystem::path& dir,
                                                        const ModelConfig& c,
                                                        const TinyModelOptions& opt = {}) {
  auto tensors = tiny_model_tensors(c);
  if (!opt.write_lm_head) tensors.pop_back();
  std::map<std::string, uint32_t> seeds;
  std::vector<SafetensorsBuilder> shards(opt.shards);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < tensors.size(); ++k) {
    const auto& [name, shape] = tensors[k];
    seeds[name] = static_cast<uint32_t>(k);
    size_t s = k * opt.shards / tensors.size();
    shards[s].add(name, opt.dtype, shape, test_values(numel_of(shape), static_cast<uint32_t>(k)));
    char shard_name[64];
    std::snprintf(shard_name, sizeof shard_name, "model-%05zu-of-%05d.safetensors", s + 1,
                  opt.shards);
    weight_map[name] = shard_name;
  }
  if (opt.shards == 1) {
    write_file(dir / "model.safetensors", shards[0].build());
  } else {
    for (int s = 0; s < opt.shards; ++s) {
      char shard_name[64];
      std::snprintf(shard_name, sizeof shard_name, "model-%05d-of-%05d.safetensors", s + 1,
                    opt.shards);
      write_file(dir / shard_name, shards[s].build());
    }
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
    write_file(dir / "model.safetensors.index.json", index.dump(2));
  }
  return seeds;
}

// A small but non-degenerate config: GQA 2:1, head_dim 4, 2 layers.
inline ModelConfig tiny_config(Architecture arch = Architecture::Llama) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 19;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.attention_bias = arch == Architecture::Qwen2;
  return c;
}

}  // namespace qs::test
