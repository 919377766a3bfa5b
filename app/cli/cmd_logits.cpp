// quantspec logits: the logits at every position of one prefill, as float32 NumPy [n, vocab].
#include <cstdint>
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "files.h"
#include "npy.h"
#include "options.h"
#include "report.h"

namespace qs::cli {

namespace {

struct LogitsArgs {
  ModelOptions model;
  std::string ids_csv;
  std::string tokens_file;
  std::string token_dtype = "u16";
  int last = 0;  // 0: every position
  std::string out;
};

Result<std::vector<int32_t>> parse_ids(const std::string& csv, int vocab) {
  std::vector<int32_t> ids;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size()) return make_error("--ids: '" + item + "' is not an integer");
    if (v < 0 || v >= vocab)
      return make_error("--ids: token id " + item + " is outside the vocabulary [0, " +
                        std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return make_error("--ids: no token ids given");
  return ids;
}

int run_logits(const LogitsArgs& a) {
  auto dir = resolve_model_dir(a.model);
  auto engine = Engine::load(dir, a.model.engine);
  if (!engine) return report_error(engine.error().message);
  Engine& eng = *engine.value();
  if (a.ids_csv.empty() == a.tokens_file.empty())
    return report_error("logits needs exactly one of --ids or --tokens");
  auto ids = a.tokens_file.empty()
                 ? parse_ids(a.ids_csv, eng.config().vocab_size)
                 : read_token_file(a.tokens_file, a.token_dtype, eng.config().vocab_size);
  if (!ids) return report_error(ids.error().message);
  if (ids->empty()) return report_error("no token ids given");
  if (std::string bad = fit_context(eng, a.model, static_cast<int64_t>(ids->size()), 0);
      !bad.empty())
    return report_error(bad);
  print_resolved_config("logits", dir, eng, a.model, nullptr);
  const size_t rows = a.last > 0 ? std::min<size_t>(a.last, ids->size()) : ids->size();
  if (stderr_is_tty()) {
    fmt::print(stderr, "  prefill of {} tokens...\n", ids->size());
  }
  auto logits = eng.prefill_logits(ids.value(), static_cast<int>(rows));
  if (!logits) return report_error(logits.error().message);
  Status st = write_npy_f32(a.out, logits.value(), {rows, size_t(eng.config().vocab_size)});
  if (!st) return report_error(st.error().message);
  std::fprintf(stderr, "wrote %s [%zu, %d] float32 (the last %zu of %zu positions)\n",
               a.out.c_str(), rows, eng.config().vocab_size, rows, ids->size());
  return 0;
}

}  // namespace

CommandRun add_logits_command(CLI::App& root) {
  auto args = std::make_shared<LogitsArgs>();
  CLI::App* cmd =
      root.add_subcommand("logits", "Write the logits at every position of one prefill (.npy)");
  add_model_options(*cmd, args->model);
  cmd->add_option("--ids", args->ids_csv, "Comma-separated token ids");
  cmd->add_option("--tokens", args->tokens_file, "Token ids from a raw file instead of --ids");
  cmd->add_option("--token-dtype", args->token_dtype, "--tokens element type: u16 or i32")
      ->check(CLI::IsMember({"u16", "i32"}));
  cmd->add_option("--last", args->last, "Only the last N positions' logits (0: every position)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--out", args->out, "Output .npy file (float32 [rows, vocab])")->required();
  return [args] { return run_logits(*args); };
}

}  // namespace qs::cli
