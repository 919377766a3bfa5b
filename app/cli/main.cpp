// quantspec: long-context LLM generation with QuantSpec self-speculative decoding.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"quantspec " QS_VERSION
               ": fast long-context generation for Llama-family models (QuantSpec)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", QS_VERSION);

  std::map<CLI::App*, qs::cli::CommandRun> runs;
  auto add = [&](qs::cli::CommandRun run) { runs[app.get_subcommands({}).back()] = std::move(run); };
  add(qs::cli::add_generate_command(app));
  add(qs::cli::add_chat_command(app));
  add(qs::cli::add_tokenize_command(app));
  add(qs::cli::add_detokenize_command(app));
  add(qs::cli::add_logits_command(app));
#ifdef QS_HAVE_SERVER
  add(qs::cli::add_serve_command(app));
#else
  app.add_subcommand("serve", "(not in this build: configured with QS_SERVER=OFF)")
      ->allow_extras();
  add([] { return qs::cli::report_error("this quantspec was built without the server (QS_SERVER=OFF)"); });
#endif
  add(qs::cli::add_eval_command(app));
  add(qs::cli::add_bench_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);  // prints help/version, or the usage error
    return code == 0 ? 0 : 2;
  }
  for (auto& [sub, run] : runs)
    if (sub->parsed()) return run();
  return 2;
}
