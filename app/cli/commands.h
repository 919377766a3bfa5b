// Subcommands of the `quantspec` CLI. Each adds itself to the root app and returns the function
// that runs it once the command line is parsed (exit code: 0 ok, 1 user error).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace qs::cli {

using CommandRun = std::function<int()>;

CommandRun add_generate_command(CLI::App& root);
CommandRun add_chat_command(CLI::App& root);
CommandRun add_tokenize_command(CLI::App& root);
CommandRun add_detokenize_command(CLI::App& root);
CommandRun add_logits_command(CLI::App& root);
CommandRun add_serve_command(CLI::App& root);
CommandRun add_eval_command(CLI::App& root);
CommandRun add_bench_command(CLI::App& root);

// "quantspec: error: <message>" on stderr; returns 1.
int report_error(const std::string& message);

}  // namespace qs::cli
