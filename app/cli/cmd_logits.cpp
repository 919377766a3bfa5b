// quantspec logits: the logits at every position of one prefill, as float32 NumPy [n, vocab].
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "npy.h"
#include "options.h"
#include "report.h"

namespace qs::cli {

namespace {

struct LogitsArgs {
  ModelOptions model;
  std::string ids_csv;
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
  print_resolved_config("logits", dir, eng, a.model, nullptr);
  auto ids = parse_ids(a.ids_csv, eng.config().vocab_size);
  if (!ids) return report_error(ids.error().message);
  auto logits = eng.prefill_logits(ids.value());
  if (!logits) return report_error(logits.error().message);
  Status st = write_npy_f32(a.out, logits.value(), {ids->size(), size_t(eng.config().vocab_size)});
  if (!st) return report_error(st.error().message);
  std::fprintf(stderr, "wrote %s [%zu, %d] float32\n", a.out.c_str(), ids->size(),
               eng.config().vocab_size);
  return 0;
}

}  // namespace

CommandRun add_logits_command(CLI::App& root) {
  auto args = std::make_shared<LogitsArgs>();
  CLI::App* cmd =
      root.add_subcommand("logits", "Write the logits at every position of one prefill (.npy)");
  add_model_options(*cmd, args->model);
  cmd->add_option("--ids", args->ids_csv, "Comma-separated token ids")->required();
  cmd->add_option("--out", args->out, "Output .npy file (float32 [n_ids, vocab])")->required();
  return [args] { return run_logits(*args); };
}

}  // namespace qs::cli
