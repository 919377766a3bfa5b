// The OpenAI-compatible server: routes, request handling, streaming, graceful shutdown.
//
//   GET  /health                /v1/models        /metrics        /openapi.json
//   POST /v1/completions        /v1/chat/completions   (stream=true: Server-Sent Events)
//
// One Engine, owned by the scheduler thread (batch 1, FIFO, bounded queue -> 429).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "api.h"
#include "engine/engine.h"
#include "http.h"
#include "metrics.h"
#include "model/chat_template.h"
#include "scheduler.h"

namespace qs::server {

struct ServerOptions {
  HttpServerOptions http;
  std::string model_name = "quantspec";  // the id /v1/models reports and responses carry
  std::string decode_mode = "ar";        // the engine's decoding mode ("ar", "quantspec")
  size_t max_queue = 64;                 // waiting requests beyond the running one; more: 429
  int request_timeout_s = 600;           // arrival -> last token; beyond: 408 / error event
  int shutdown_grace_s = 30;             // SIGINT/SIGTERM: time the running request may finish
  RequestDefaults defaults;              // generation flags of the command line
};

// How chat requests are formatted; `chat_template` empty: chat requests get 400 `problem`.
struct ChatSetup {
  std::optional<ChatTemplate> chat_template;
  ChatRenderOptions tokens;  // bos_token / eos_token the template sees
  std::string problem;       // why there is no template (for the 400 message)
};

class Server {
 public:
  // `engine` must have a tokenizer and outlive the server.
  Server(Engine& engine, ServerOptions options, ChatSetup chat);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  Result<int> bind();  // the bound port
  void run();          // serve until shutdown() has completed
  // Graceful shutdown: stop accepting, answer queued requests 503, let the running one finish for
  // up to shutdown_grace_s, then cancel it. Blocks until that is done; idempotent, thread-safe.
  void shutdown();

 private:
  void handle_generate(Endpoint endpoint, const HttpRequest& req, HttpResponse& res);
  void handle_tokenize(const HttpRequest& req, HttpResponse& res);
  void handle_detokenize(const HttpRequest& req, HttpResponse& res);
  // The conversation as the chat template renders it (special tokens written by the template).
  // `tools`: the request's tools (an array; empty: none), which the template sees as `tools`.
  std::variant<std::string, ApiError> render_chat(const Json& messages, const Json& tools) const;
  void respond_error(HttpResponse& res, const ApiError& e);
  // Prompt ids for the request, or the 4xx to answer.
  // The request's prompts as token ids (chat: one, the rendered conversation).
  std::optional<ApiError> prompt_ids(const ApiRequest& r,
                                     std::vector<std::vector<int32_t>>* prompts);

  Engine& engine_;
  const Tokenizer& tokenizer_;
  ServerOptions options_;
  ChatSetup chat_;
  ToolFormat tool_format_ = ToolFormat::kHermes;  // how the chat template's model writes calls
  Metrics metrics_;
  std::unique_ptr<Scheduler> scheduler_;
  HttpServer http_;
  std::string openapi_json_;
  const int64_t started_at_;  // unix seconds
  std::atomic<bool> shutting_down_{false};
};

// Route SIGINT and SIGTERM to serve_until_signal (whatever thread receives them) and ignore
// SIGPIPE (writes to a closed connection fail instead). Call once, early.
void install_shutdown_signal_handlers();

// Serve until SIGINT or SIGTERM arrives, then shut down gracefully; a second signal exits at once.
// Returns the process exit code (0).
int serve_until_signal(Server& server);

}  // namespace qs::server
