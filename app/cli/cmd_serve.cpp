// quantspec serve: the OpenAI-compatible HTTP server (app/server).
#include <fmt/core.h>

#include <filesystem>
#include <memory>

#include "chat_setup.h"
#include "commands.h"
#include "options.h"
#include "report.h"
#include "server.h"

namespace qs::cli {

namespace {

struct ServeArgs {
  ModelOptions model;
  GenerationParams gen;
  server::ServerOptions server;
  std::string served_model_name;
  std::string chat_template;  // built-in name or file; empty: the model's own
  bool prompt_cache = true;   // EngineOptions::prompt_cache
  CLI::Option* seed_option = nullptr;
};

// The chat template (--chat-template or the model's own) as the server takes it.
Result<server::ChatSetup> resolve_chat(const ServeArgs& a, const std::filesystem::path& dir,
                                       const Engine& engine, std::string* origin) {
  const std::string fix =
      "start the server with --chat-template NAME (built-ins: " + chat_builtin_list() +
      ") or a template file, or use /v1/completions";
  QS_ASSIGN_OR_RETURN(ChatSetupChoice c,
                      resolve_chat_template(a.chat_template, dir, *engine.tokenizer(), fix));
  *origin = std::move(c.origin);
  return server::ChatSetup{std::move(c.chat_template), std::move(c.tokens), std::move(c.problem)};
}

std::string default_model_name(const std::filesystem::path& dir) {
  std::filesystem::path p = dir;
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  return name.empty() ? "quantspec" : name;
}

int run_serve(ServeArgs& a) {
  server::install_shutdown_signal_handlers();
  if (std::string bad = validate_generation_params(a.gen); !bad.empty()) return report_error(bad);
  if (std::string bad = validate_decode_options(a.model); !bad.empty()) return report_error(bad);
  const auto dir = resolve_model_dir(a.model);
  a.model.engine.prompt_cache = a.prompt_cache;
  auto engine = Engine::load(dir, a.model.engine);
  if (!engine) return report_error(engine.error().message);
  Engine& eng = *engine.value();
  if (!eng.tokenizer())
    return report_error(dir.string() + ": no tokenizer.json, cannot serve text");

  std::string chat_origin;
  auto chat = resolve_chat(a, dir, eng, &chat_origin);
  if (!chat) return report_error(chat.error().message);

  a.server.defaults.gen = a.gen;
  a.server.defaults.seed_given = a.seed_option && a.seed_option->count() > 0;
  a.server.model_name = a.served_model_name.empty() ? default_model_name(dir) : a.served_model_name;
  a.server.decode_mode = decode_mode_name(a.model.engine.mode);
  if (a.server.http.threads == 0) a.server.http.threads = static_cast<int>(a.server.max_queue) + 32;

  print_resolved_config("serve", dir, eng, a.model, &a.gen);
  const auto& o = a.server;
  fmt::print(stderr,
             "  server: model id '{}', queue {}, request timeout {} s, read timeout {} s, request "
             "deadline {} s, keep-alive {} s, max body {} bytes, {} connection threads, shutdown "
             "grace {} s\n",
             o.model_name, o.max_queue, o.request_timeout_s, o.http.read_timeout_s,
             o.http.request_deadline_s, o.http.keep_alive_timeout_s, o.http.max_body_bytes,
             o.http.threads, o.shutdown_grace_s);
  fmt::print(stderr, "  chat template: {}\n", chat_origin);
  if (chat->chat_template) {
    fmt::print(stderr, "  tool calls (tool_choice auto): read in the {} format\n",
               server::tool_format_name(server::tool_format_of(chat->chat_template->source())));
  }
  if (const int64_t model_max = model_context_limit(eng.config());
      a.model.engine.max_context == 0 && model_max > eng.max_context() && model_max < INT32_MAX) {
    fmt::print(stderr,
               "  context: {} tokens, fixed while serving; the model allows {} (--ctx sets it)\n",
               eng.max_context(), model_max);
  }
  fmt::print(stderr, "  prompt cache: {}\n",
             !a.prompt_cache ? "off"
             : a.model.engine.mode == DecodeMode::kStreamingLlm ||
                     a.model.engine.mode == DecodeMode::kSnapKv
                 ? "off (not with the sparse-KV drafts)"
                 : "on (a prompt that starts with the previous request's tokens prefills only the "
                   "rest)");
  fmt::print(stderr, "  requests without a seed: {}\n",
             o.defaults.seed_given ? "use --seed" : "get a random seed");

  server::Server srv(eng, a.server, std::move(chat.value()));
  auto port = srv.bind();
  if (!port) return report_error(port.error().message);
  const std::string& host = a.server.http.host;
  const bool v6 = host.find(':') != std::string::npos;
  fmt::print(stderr, "quantspec serve: listening on http://{}{}{}:{}\n", v6 ? "[" : "", host,
             v6 ? "]" : "", *port);
  std::fflush(stderr);
  return server::serve_until_signal(srv);
}

}  // namespace

CommandRun add_serve_command(CLI::App& root) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = root.add_subcommand(
      "serve",
      "Serve the model over an OpenAI-compatible HTTP API (/v1/completions, "
      "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /metrics, "
      "/openapi.json)");
  add_model_options(*cmd, args->model);
  add_decode_options(*cmd, args->model);
  add_generation_options(*cmd, args->gen);  // defaults for what requests leave out
  args->seed_option = cmd->get_option("--seed");
  server::ServerOptions& s = args->server;
  cmd->add_option("--host", s.http.host, "Address to listen on")
      ->envname("QS_HOST")
      ->capture_default_str();
  cmd->add_option("--port", s.http.port, "Port to listen on (0: any free port)")
      ->envname("QS_PORT")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--served-model-name", args->served_model_name,
                  "Model id reported by /v1/models (default: the model directory's name)")
      ->envname("QS_SERVED_MODEL_NAME");
  cmd->add_option("--chat-template", args->chat_template,
                  "Chat template: a built-in (" + chat_builtin_list() +
                      ") or a Jinja file; default: the model's tokenizer_config.json chat_template")
      ->envname("QS_CHAT_TEMPLATE");
  const std::map<std::string, bool> on_off{{"on", true}, {"off", false}};
  add_choice_option(*cmd, "--prompt-cache", args->prompt_cache, on_off,
                    "Keep the KV of the previous request: a prompt that starts with its tokens "
                    "(a conversation's next turn) prefills only the rest; with a quantized KV "
                    "cache the rest then reads the kept history through its INT8 (INT4) view, "
                    "as decoding does; on|off [default: on]",
                    "QS_PROMPT_CACHE");
  cmd->add_option("--max-queue", s.max_queue, "Requests that may wait for the engine; beyond: 429")
      ->envname("QS_MAX_QUEUE")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--timeout", s.request_timeout_s,
                  "Per-request time limit in seconds (queue + generation)")
      ->envname("QS_REQUEST_TIMEOUT")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--read-timeout", s.http.read_timeout_s,
                  "Seconds a client may pause while sending a request")
      ->envname("QS_READ_TIMEOUT")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--request-deadline", s.http.request_deadline_s,
                  "Seconds a client may take to send a whole request (slow clients are cut off)")
      ->envname("QS_REQUEST_DEADLINE")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--keep-alive", s.http.keep_alive_timeout_s,
                  "Idle seconds before a keep-alive connection closes")
      ->envname("QS_KEEP_ALIVE")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--max-body", s.http.max_body_bytes, "Largest request body in bytes; beyond: 413")
      ->envname("QS_MAX_BODY")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 34))
      ->capture_default_str();
  s.http.threads = 0;
  cmd->add_option("--http-threads", s.http.threads,
                  "Connection threads, one per open connection (0: --max-queue + 32, so that a "
                  "full queue answers 429 rather than leaving connections waiting)")
      ->envname("QS_HTTP_THREADS")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", s.shutdown_grace_s,
                  "On SIGINT/SIGTERM: seconds the running request may take to finish")
      ->envname("QS_SHUTDOWN_GRACE")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  return [args] { return run_serve(*args); };
}

}  // namespace qs::cli
