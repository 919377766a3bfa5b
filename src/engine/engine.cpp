#include "engine/engine.h"

#include <system_error>

#include "engine/llm_engine.h"
#include "model/weights.h"

namespace qs {

const char* decode_mode_name(DecodeMode mode) {
  switch (mode) {
    case DecodeMode::kQuantSpec:
      return "quantspec";
    case DecodeMode::kStreamingLlm:
      return "streamingllm";
    case DecodeMode::kSnapKv:
      return "snapkv";
    case DecodeMode::kAr:
      break;
  }
  return "ar";
}

const char* kv_type_name(KvType kv) {
  switch (kv) {
    case KvType::kFp16:
      return "fp16";
    case KvType::kInt8:
      return "int8";
    case KvType::kInt4:
      return "int4";
  }
  return "?";
}

const char* kv_dtype_name(KvDType t) {
  switch (t) {
    case KvDType::kF32:
      return "f32";
    case KvDType::kF16:
      return "f16";
    case KvDType::kAuto:
      break;
  }
  return "auto";
}

const char* prefill_matmul_name(PrefillMatmul p) {
  return p == PrefillMatmul::kBf16 ? "bf16" : "exact";
}

const char* attention_operands_name(AttentionOperands d) {
  return d == AttentionOperands::kExact ? "exact" : "f16";
}

const char* prefill_kv_name(PrefillKv p) {
  return p == PrefillKv::kQuantized ? "quantized" : "exact";
}

KvDType resolve_kv_dtype(const EngineOptions& options) {
  if (options.kv_dtype != KvDType::kAuto) return options.kv_dtype;
  return options.device == Device::kCuda ? KvDType::kF16 : KvDType::kF32;
}

const char* draft_weights_name(DraftWeights w) {
  switch (w) {
    case DraftWeights::kInt4:
      return "int4";
    case DraftWeights::kInt4Mlp:
      return "int4-mlp";
    case DraftWeights::kNative:
      return "native";
  }
  return "?";
}

Result<std::unique_ptr<Engine>> Engine::load(const std::filesystem::path& dir,
                                             const EngineOptions& options) {
  QS_ASSIGN_OR_RETURN(ModelConfig cfg, load_model_config(dir));
  QS_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(dir, cfg));
  std::vector<std::string> warnings = cfg.warnings;
  if (!weights.unused.empty()) {
    std::string names;
    for (size_t i = 0; i < weights.unused.size() && i < 4; ++i)
      names += (i ? ", " : "") + weights.unused[i];
    if (weights.unused.size() > 4) names += ", ...";
    warnings.push_back(std::to_string(weights.unused.size()) +
                       " tensor(s) of the checkpoint are not used by the model as config.json "
                       "describes it (" +
                       names + ")");
  }
  std::optional<Tokenizer> tokenizer;
  std::error_code ec;
  if (std::filesystem::exists(dir / "tokenizer.json", ec)) {
    QS_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(dir));
    tokenizer.emplace(std::move(tok));
  }
  QS_ASSIGN_OR_RETURN(std::unique_ptr<LlmEngine> engine,
                      LlmEngine::create(cfg, std::move(weights), std::move(tokenizer), options));
  engine->load_warnings_ = std::move(warnings);
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace qs
