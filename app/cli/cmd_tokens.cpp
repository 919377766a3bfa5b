// quantspec tokenize / detokenize: JSONL in on stdin, JSONL out on stdout. Work on a directory
// holding only tokenizer files, as Hugging Face's AutoTokenizer does.
#include <cstdint>
#include <nlohmann/json.hpp>

#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "model/tokenizer/tokenizer.h"
#include "options.h"

namespace qs::cli {

namespace {

struct TokenArgs {
  ModelOptions model;
  bool add_special = false;
  bool skip_special = false;
};

// Applies `fn` to each JSON line of stdin; stops at the first bad line with an error naming it.
template <class Fn>
int for_each_json_line(const char* expect, Fn fn) {
  std::string line;
  for (long line_no = 1; std::getline(std::cin, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // the parser's reason (bad UTF-8, ...)
      std::string why = e.what();
      if (const size_t end = why.find("] "); end != std::string::npos) why = why.substr(end + 2);
      return report_error("stdin line " + std::to_string(line_no) + ": not valid JSON: " + why);
    }
    if (!j.is_object())
      return report_error("stdin line " + std::to_string(line_no) + ": not a JSON object");
    std::string err = fn(j);
    if (!err.empty())
      return report_error("stdin line " + std::to_string(line_no) + ": " + err + " (expected " +
                          expect + ")");
    std::cout.flush();
  }
  return 0;
}

int run_tokenize(const TokenArgs& a) {
  auto tok = Tokenizer::load(resolve_model_dir(a.model));
  if (!tok) return report_error(tok.error().message);
  return for_each_json_line("{\"text\": \"...\"}", [&](const nlohmann::json& j) -> std::string {
    auto it = j.find("text");
    if (it == j.end() || !it->is_string()) return "missing string field \"text\"";
    auto ids = tok->encode(it->get_ref<const std::string&>(), a.add_special);
    std::cout << nlohmann::json{{"ids", ids}}.dump() << "\n";
    return "";
  });
}

int run_detokenize(const TokenArgs& a) {
  auto tok = Tokenizer::load(resolve_model_dir(a.model));
  if (!tok) return report_error(tok.error().message);
  const int32_t vocab = tok->vocab_size();
  return for_each_json_line("{\"ids\": [...]}", [&](const nlohmann::json& j) -> std::string {
    auto it = j.find("ids");
    if (it == j.end() || !it->is_array()) return "missing array field \"ids\"";
    std::vector<int32_t> ids;
    for (const auto& v : *it) {
      if (!v.is_number_integer()) return "\"ids\" must hold integers";
      int64_t id = v.get<int64_t>();
      if (id < 0 || id >= vocab)
        return "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
               std::to_string(vocab) + ")";
      ids.push_back(static_cast<int32_t>(id));
    }
    // Invalid UTF-8 (a lone byte-fallback piece) is replaced, so the output is valid JSON.
    std::string text = tok->decode(ids, a.skip_special);
    std::cout << nlohmann::json{{"text", text}}.dump(-1, ' ', false,
                                                     nlohmann::json::error_handler_t::replace)
              << "\n";
    return "";
  });
}

}  // namespace

CommandRun add_tokenize_command(CLI::App& root) {
  auto args = std::make_shared<TokenArgs>();
  CLI::App* cmd = root.add_subcommand(
      "tokenize", "Read JSONL {\"text\": ...} on stdin, write JSONL {\"ids\": [...]}");
  cmd->add_option("-m,--model", args->model.model_dir, "Model or tokenizer directory")
      ->envname("QS_MODEL");
  cmd->add_flag("--add-special", args->add_special, "Add special tokens (e.g. BOS)");
  return [args] { return run_tokenize(*args); };
}

CommandRun add_detokenize_command(CLI::App& root) {
  auto args = std::make_shared<TokenArgs>();
  CLI::App* cmd = root.add_subcommand(
      "detokenize", "Read JSONL {\"ids\": [...]} on stdin, write JSONL {\"text\": ...}");
  cmd->add_option("-m,--model", args->model.model_dir, "Model or tokenizer directory")
      ->envname("QS_MODEL");
  cmd->add_flag("--skip-special", args->skip_special, "Leave special tokens out of the text");
  return [args] { return run_detokenize(*args); };
}

}  // namespace qs::cli
