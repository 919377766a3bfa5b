#include "model/config.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

namespace qs {

namespace {

using json = nlohmann::json;

constexpr const char* kSupportedArchitectures =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

// A string from the file, made short and printable for a one-line message.
std::string printable(std::string s) {
  constexpr size_t kMaxChars = 240;
  if (s.size() > kMaxChars) s = s.substr(0, kMaxChars) + "...";
  for (char& c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';
  }
  return s;
}

// Reads typed fields of one JSON object, producing "<source>: field 'x' ..." messages.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string source) : obj_(obj), source_(std::move(source)) {}

  const std::string& source() const { return source_; }

  // The field, or nullptr when absent or null.
  const json* get(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const char* key) const { return get(key) != nullptr; }

  Error error(const char* key, const std::string& what) const {
    return make_error(fmt::format("{}: field '{}' {}", source_, key, what));
  }

  // An integer in [min_value, INT_MAX]; `fallback` when absent (nullopt: required).
  Result<int> get_int(const char* key, std::optional<int> fallback, int min_value = 1) const {
    const json* v = get(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return make_error(fmt::format("{}: missing field '{}'", source_, key));
    }
    if (!v->is_number_integer()) {
      return error(key, fmt::format("must be an integer, got {}", dump(*v)));
    }
    bool in_range;
    int64_t x = 0;
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      in_range = u <= static_cast<uint64_t>(std::numeric_limits<int>::max());
      x = in_range ? static_cast<int64_t>(u) : 0;
    } else {
      x = v->get<int64_t>();
      in_range = x <= std::numeric_limits<int>::max();
    }
    if (!in_range || x < min_value) {
      return error(key, fmt::format("must be an integer in [{}, {}], got {}", min_value,
                                    std::numeric_limits<int>::max(), dump(*v)));
    }
    return static_cast<int>(x);
  }

  // A finite number > 0 (or >= 0 when allow_zero) that fits a float; `fallback` when absent.
  Result<float> get_positive(const char* key, std::optional<float> fallback,
                             bool allow_zero = false) const {
    QS_ASSIGN_OR_RETURN(double x, get_number(key, fallback, allow_zero));
    if (x != 0 && x < std::numeric_limits<float>::min()) {  // would round to 0 or lose bits
      return error(key, fmt::format("must be a positive number a float holds (>= {:g}), got {:g}",
                                    std::numeric_limits<float>::min(), x));
    }
    return static_cast<float>(x);
  }

  // The same, kept in double.
  Result<double> get_number(const char* key, std::optional<double> fallback,
                            bool allow_zero = false) const {
    const json* v = get(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return make_error(fmt::format("{}: missing field '{}'", source_, key));
    }
    if (!v->is_number()) return error(key, fmt::format("must be a number, got {}", dump(*v)));
    double x = v->get<double>();
    if (!std::isfinite(x) || x < 0 || (x == 0 && !allow_zero) ||
        x > std::numeric_limits<float>::max()) {
      return error(key, fmt::format("must be a positive number, got {}", dump(*v)));
    }
    return x;
  }

  Result<bool> get_bool(const char* key, bool fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return error(key, fmt::format("must be true or false, got {}", dump(*v)));
    return v->get<bool>();
  }

  Result<std::string> get_string(const char* key, const std::string& fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) return error(key, fmt::format("must be a string, got {}", dump(*v)));
    return v->get<std::string>();
  }

  static std::string dump(const json& v) {
    std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true);
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
  }

 private:
  const json& obj_;
  std::string source_;
};

Result<json> parse_json_object(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return make_error(fmt::format("{}: invalid JSON: {}", source, printable(e.what())));
  }
  if (!j.is_object()) return make_error(source + ": expected a JSON object");
  return j;
}

Result<std::string> read_file(const std::filesystem::path& path) {
  std::error_code ec;
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

Result<Architecture> parse_architecture(const FieldReader& r) {
  if (const json* archs = r.get("architectures")) {
    if (!archs->is_array() || archs->empty()) {
      return r.error("architectures", "must be a non-empty list of class names");
    }
    std::string first;
    for (const json& a : *archs) {
      if (!a.is_string()) return r.error("architectures", "must be a list of strings");
      const std::string name = a.get<std::string>();
      if (name == "LlamaForCausalLM") return Architecture::Llama;
      if (name == "MistralForCausalLM") return Architecture::Mistral;
      if (name == "Qwen2ForCausalLM") return Architecture::Qwen2;
      if (first.empty()) first = name;
    }
    return make_error(fmt::format("{}: unsupported architecture '{}' (supported: {})", r.source(),
                                  printable(first), kSupportedArchitectures));
  }
  QS_ASSIGN_OR_RETURN(std::string model_type, r.get_string("model_type", ""));
  if (model_type == "llama") return Architecture::Llama;
  if (model_type == "mistral") return Architecture::Mistral;
  if (model_type == "qwen2") return Architecture::Qwen2;
  if (model_type.empty()) {
    return make_error(fmt::format("{}: no 'architectures' or 'model_type' field (supported: {})",
                                  r.source(), kSupportedArchitectures));
  }
  return make_error(
      fmt::format("{}: unsupported model_type '{}' (supported: llama, mistral, qwen2)", r.source(),
                  printable(model_type)));
}

// YaRN's keys as transformers reads them (_compute_yarn_parameters and its config
// standardization): original_max_position_embeddings defaults to max_position_embeddings, a
// missing factor to max_position_embeddings / original_max_position_embeddings, beta_fast /
// beta_slow (0 or absent: 32 / 1), attention_factor from mscale / mscale_all_dim or the factor.
Status parse_yarn(const FieldReader& r, ModelConfig& cfg) {
  RopeScaling& s = cfg.rope_scaling;
  s = RopeScaling{};
  s.type = RopeScalingType::Yarn;
  QS_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                      r.get_int("original_max_position_embeddings", cfg.max_position_embeddings));
  QS_ASSIGN_OR_RETURN(double factor,
                      r.get_number("factor", static_cast<double>(cfg.max_position_embeddings) /
                                                 s.original_max_position_embeddings));
  s.factor = static_cast<float>(factor);
  QS_ASSIGN_OR_RETURN(double beta_fast, r.get_number("beta_fast", 0.0, /*allow_zero=*/true));
  QS_ASSIGN_OR_RETURN(double beta_slow, r.get_number("beta_slow", 0.0, /*allow_zero=*/true));
  s.beta_fast = beta_fast > 0 ? beta_fast : 32.0;  // transformers: `or 32`, `or 1`
  s.beta_slow = beta_slow > 0 ? beta_slow : 1.0;
  if (!(s.beta_fast > s.beta_slow)) {
    return make_error(fmt::format("{}: beta_fast ({}) must exceed beta_slow ({})", r.source(),
                                  s.beta_fast, s.beta_slow));
  }
  QS_ASSIGN_OR_RETURN(s.truncate, r.get_bool("truncate", true));
  auto mscale_of = [&](double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  if (r.has("attention_factor")) {
    QS_ASSIGN_OR_RETURN(s.attention_factor, r.get_number("attention_factor", std::nullopt));
  } else {
    QS_ASSIGN_OR_RETURN(double m, r.get_number("mscale", 0.0, /*allow_zero=*/true));
    QS_ASSIGN_OR_RETURN(double m_all, r.get_number("mscale_all_dim", 0.0, /*allow_zero=*/true));
    s.attention_factor = m > 0 && m_all > 0 ? mscale_of(m) / mscale_of(m_all) : mscale_of(1.0);
  }
  return {};
}

// rope_scaling (transformers v4) or rope_parameters (v5): the same keys, one object.
Status parse_rope(const FieldReader& top, ModelConfig& cfg) {
  const char* key = top.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const json* rope = top.get(key);
  if (rope == nullptr) return {};
  if (!rope->is_object()) return top.error(key, "must be an object or null");
  FieldReader r(*rope, fmt::format("{}: {}", top.source(), key));

  if (r.has("rope_theta")) {
    QS_ASSIGN_OR_RETURN(cfg.rope_theta, r.get_positive("rope_theta", std::nullopt));
  }
  const char* type_key = r.has("rope_type") ? "rope_type" : "type";
  QS_ASSIGN_OR_RETURN(std::string type, r.get_string(type_key, "default"));
  RopeScaling& s = cfg.rope_scaling;
  if (type == "default") {
    s = RopeScaling{};
    // transformers warns about these too ("Unrecognized keys in `rope_scaling`"): a factor
    // without a type is not applied.
    std::string ignored;
    for (const auto& [k, v] : rope->items()) {
      if (k != "rope_type" && k != "type" && k != "rope_theta" && !v.is_null())
        ignored += (ignored.empty() ? "" : ", ") + k;
    }
    if (!ignored.empty()) {
      cfg.warnings.push_back(
          r.has("rope_type") || r.has("type")
              ? fmt::format("{}: rope type 'default' ignores {}", r.source(), ignored)
              : fmt::format("{}: no 'rope_type' (or 'type'), so the default RoPE is used and {} "
                            "ignored",
                            r.source(), ignored));
    }
  } else if (type == "linear") {
    s.type = RopeScalingType::Linear;
    QS_ASSIGN_OR_RETURN(s.factor, r.get_positive("factor", std::nullopt));
  } else if (type == "llama3") {
    s.type = RopeScalingType::Llama3;
    QS_ASSIGN_OR_RETURN(s.factor, r.get_positive("factor", std::nullopt));
    QS_ASSIGN_OR_RETURN(s.low_freq_factor, r.get_positive("low_freq_factor", std::nullopt));
    QS_ASSIGN_OR_RETURN(s.high_freq_factor, r.get_positive("high_freq_factor", std::nullopt));
    QS_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                        r.get_int("original_max_position_embeddings", std::nullopt));
    // The llama3 ramp divides by (high - low).
    if (!(s.high_freq_factor > s.low_freq_factor)) {
      return make_error(fmt::format("{}: high_freq_factor ({}) must exceed low_freq_factor ({})",
                                    r.source(), s.high_freq_factor, s.low_freq_factor));
    }
  } else if (type == "yarn") {
    QS_TRY(parse_yarn(r, cfg));
  } else {
    return make_error(
        fmt::format("{}: unsupported rope type '{}' (supported: default, linear, "
                    "llama3, yarn)",
                    r.source(), printable(type)));
  }
  return {};
}

// eos_token_id: an int, a list of ints, or null.
Result<std::vector<int>> parse_token_ids(const FieldReader& r, const char* key) {
  std::vector<int> ids;
  const json* v = r.get(key);
  if (v == nullptr) return ids;
  auto one = [&](const json& x) -> Status {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
        x.get<int64_t>() > std::numeric_limits<int>::max()) {
      return r.error(
          key, fmt::format("must be a token id or a list of them, got {}", FieldReader::dump(*v)));
    }
    ids.push_back(static_cast<int>(x.get<int64_t>()));
    return {};
  };
  if (v->is_array()) {
    for (const json& x : *v) QS_TRY(one(x));
  } else {
    QS_TRY(one(*v));
  }
  return ids;
}

Status parse_special_tokens(const FieldReader& r, ModelConfig& cfg) {
  if (r.has("bos_token_id")) {
    QS_ASSIGN_OR_RETURN(std::vector<int> bos, parse_token_ids(r, "bos_token_id"));
    if (bos.size() != 1) return r.error("bos_token_id", "must be a single token id");
    cfg.bos_token_id = bos[0];
  }
  if (r.has("eos_token_id")) {
    QS_ASSIGN_OR_RETURN(cfg.eos_token_ids, parse_token_ids(r, "eos_token_id"));
  }
  return {};
}

}  // namespace

const char* architecture_name(Architecture a) {
  switch (a) {
    case Architecture::Llama:
      return "LlamaForCausalLM";
    case Architecture::Mistral:
      return "MistralForCausalLM";
    case Architecture::Qwen2:
      return "Qwen2ForCausalLM";
  }
  return "?";
}

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source) {
  QS_ASSIGN_OR_RETURN(json root, parse_json_object(json_text, source));
  FieldReader r(root, source);
  ModelConfig cfg;
  QS_ASSIGN_OR_RETURN(cfg.arch, parse_architecture(r));

  if (r.has("quantization_config")) {
    return make_error(source +
                      ": quantized checkpoints (quantization_config) are not supported; "
                      "use the fp16/bf16 model");
  }
  QS_ASSIGN_OR_RETURN(std::string act, r.get_string("hidden_act", "silu"));
  if (act != "silu") {
    return r.error("hidden_act", fmt::format("is '{}'; only 'silu' is supported", printable(act)));
  }
  QS_ASSIGN_OR_RETURN(bool mlp_bias, r.get_bool("mlp_bias", false));
  if (mlp_bias) return r.error("mlp_bias", "is true; MLP biases are not supported");

  QS_ASSIGN_OR_RETURN(cfg.vocab_size, r.get_int("vocab_size", std::nullopt));
  QS_ASSIGN_OR_RETURN(cfg.hidden_size, r.get_int("hidden_size", std::nullopt));
  QS_ASSIGN_OR_RETURN(cfg.intermediate_size, r.get_int("intermediate_size", std::nullopt));
  QS_ASSIGN_OR_RETURN(cfg.num_layers, r.get_int("num_hidden_layers", std::nullopt));
  QS_ASSIGN_OR_RETURN(cfg.num_heads, r.get_int("num_attention_heads", std::nullopt));
  QS_ASSIGN_OR_RETURN(cfg.num_kv_heads, r.get_int("num_key_value_heads", cfg.num_heads));
  if (cfg.num_heads % cfg.num_kv_heads != 0) {
    return make_error(
        fmt::format("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                    source, cfg.num_heads, cfg.num_kv_heads));
  }
  if (r.has("head_dim")) {
    QS_ASSIGN_OR_RETURN(cfg.head_dim, r.get_int("head_dim", std::nullopt));
  } else {
    if (cfg.hidden_size % cfg.num_heads != 0) {
      return make_error(fmt::format(
          "{}: hidden_size ({}) must be a multiple of num_attention_heads ({}) when head_dim is "
          "not given",
          source, cfg.hidden_size, cfg.num_heads));
    }
    cfg.head_dim = cfg.hidden_size / cfg.num_heads;
  }
  if (cfg.head_dim % 2 != 0) {
    return make_error(
        fmt::format("{}: head_dim ({}) must be even for rotary embeddings", source, cfg.head_dim));
  }
  if (static_cast<int64_t>(cfg.num_heads) * cfg.head_dim > std::numeric_limits<int>::max()) {
    return make_error(fmt::format("{}: num_attention_heads * head_dim is too large", source));
  }

  const int default_max_pos = cfg.arch == Architecture::Llama     ? 2048
                              : cfg.arch == Architecture::Mistral ? 131072
                                                                  : 32768;
  QS_ASSIGN_OR_RETURN(cfg.max_position_embeddings,
                      r.get_int("max_position_embeddings", default_max_pos));
  QS_ASSIGN_OR_RETURN(cfg.rope_theta, r.get_positive("rope_theta", 10000.0f));
  QS_ASSIGN_OR_RETURN(cfg.rms_norm_eps, r.get_positive("rms_norm_eps", 1e-6f));
  QS_TRY(parse_rope(r, cfg));
  QS_ASSIGN_OR_RETURN(cfg.tie_word_embeddings, r.get_bool("tie_word_embeddings", false));

  switch (cfg.arch) {
    case Architecture::Llama: {
      QS_ASSIGN_OR_RETURN(cfg.attention_bias, r.get_bool("attention_bias", false));
      break;
    }
    case Architecture::Mistral: {  // transformers builds Mistral's projections without bias
      cfg.attention_bias = false;
      QS_ASSIGN_OR_RETURN(cfg.sliding_window, r.get_int("sliding_window", 0, 0));
      break;
    }
    case Architecture::Qwen2: {
      cfg.attention_bias = true;
      QS_ASSIGN_OR_RETURN(bool use_sw, r.get_bool("use_sliding_window", false));
      if (use_sw) {
        QS_ASSIGN_OR_RETURN(cfg.sliding_window, r.get_int("sliding_window", 0, 0));
        // transformers applies the window to layers >= max_window_layers only.
        QS_ASSIGN_OR_RETURN(int max_window_layers, r.get_int("max_window_layers", 0, 0));
        if (max_window_layers >= cfg.num_layers) {
          cfg.sliding_window = 0;
        } else if (max_window_layers > 0 && cfg.sliding_window > 0) {
          return make_error(fmt::format(
              "{}: a sliding window on layers >= max_window_layers ({}) only is not supported",
              source, max_window_layers));
        }
      }
      break;
    }
  }

  // transformers v5 renamed torch_dtype to dtype.
  QS_ASSIGN_OR_RETURN(cfg.torch_dtype,
                      r.get_string(r.has("torch_dtype") ? "torch_dtype" : "dtype", ""));
  QS_TRY(parse_special_tokens(r, cfg));
  return cfg;
}

Result<ModelConfig> load_model_config(const std::filesystem::path& dir) {
  std::error_code ec;
  const std::filesystem::path config_path = dir / "config.json";
  if (!std::filesystem::exists(config_path, ec)) {
    if (!std::filesystem::is_directory(dir, ec)) {
      return make_error(dir.string() + ": model directory does not exist");
    }
    return make_error(config_path.string() + ": no such file");
  }
  QS_ASSIGN_OR_RETURN(std::string text, read_file(config_path));
  QS_ASSIGN_OR_RETURN(ModelConfig cfg, parse_model_config(text, "config.json"));

  // generation_config.json, when present, decides the special tokens (as transformers does).
  const std::filesystem::path gen_path = dir / "generation_config.json";
  if (std::filesystem::exists(gen_path, ec)) {
    QS_ASSIGN_OR_RETURN(std::string gen_text, read_file(gen_path));
    QS_ASSIGN_OR_RETURN(json gen, parse_json_object(gen_text, "generation_config.json"));
    QS_TRY(parse_special_tokens(FieldReader(gen, "generation_config.json"), cfg));
  }
  return cfg;
}

float ModelConfig::attention_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (rope_scaling.type == RopeScalingType::Yarn) {
    scale *= rope_scaling.attention_factor * rope_scaling.attention_factor;
  }
  return static_cast<float>(scale);
}

}  // namespace qs
