#include "server.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <thread>

#include "openapi.h"

namespace qs::server {

namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(50);

const Tokenizer& require_tokenizer(const Engine& engine) {
  QS_CHECK_MSG(engine.tokenizer() != nullptr, "the server needs an engine with a tokenizer");
  return *engine.tokenizer();
}

int64_t unix_now() {
  return static_cast<int64_t>(std::time(nullptr));
}

ApiError make_api_error(int status, std::string message, std::string code, std::string param = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.code = std::move(code);
  e.param = std::move(param);
  switch (status) {
    case 408:
      e.type = "timeout_error";
      break;
    case 429:
      e.type = "rate_limit_error";
      break;
    case 499:
      e.type = "client_closed_request";
      break;
    case 503:
      e.type = "service_unavailable";
      break;
    case 501:  // a request feature the server does not implement (a transfer coding)
      e.type = "invalid_request_error";
      break;
    default:
      e.type = status >= 500 ? "server_error" : "invalid_request_error";
  }
  return e;
}

// Errors the HTTP layer answers by itself.
std::string http_error_body(int status, const std::string& message) {
  std::string code;
  switch (status) {
    case 400:
      code = "bad_request";
      break;
    case 404:
      code = "not_found";
      break;
    case 405:
      code = "method_not_allowed";
      break;
    case 413:
      code = "request_too_large";
      break;
    case 414:
      code = "uri_too_long";
      break;
    case 415:
      code = "unsupported_media_type";
      break;
    case 501:
      code = "not_implemented";
      break;
    default:
      code = status >= 500 ? "internal_error" : "bad_request";
  }
  return dump_json(error_json(make_api_error(status, message, code)));
}

ApiError stop_error(StopReason why, int timeout_s) {
  switch (why) {
    case StopReason::kTimeout:
      return make_api_error(
          408,
          "the request did not finish within the server's per-request timeout of " +
              std::to_string(timeout_s) + " s",
          "request_timeout");
    case StopReason::kShutdown:
      return make_api_error(503, "the server is shutting down; the request was cancelled",
                            "shutting_down");
    default:
      return make_api_error(499, "the client closed the connection", "client_closed_request");
  }
}

// The error a finished job answers with, or nothing when it has a result to send. A stopped job
// (timeout, shutdown, client gone) answers with its stop reason, whether the scheduler reached it
// while it was queued (no result) or while it generated (a "cancelled" result): which of the two
// happens is a matter of timing only.
std::optional<ApiError> finished_job_error(const Job& job, int timeout_s) {
  const Job::Outcome& o = job.outcome();
  if (!o.results.empty()) {
    if (o.results.back().finish_reason == "cancelled")
      return stop_error(job.stop_reason(), timeout_s);
    return std::nullopt;
  }
  if (o.error_status != 500 && job.stop_reason() != StopReason::kNone)
    return stop_error(job.stop_reason(), timeout_s);
  return make_api_error(o.error_status, o.error,
                        o.error_status == 503 ? "shutting_down" : "generation_failed");
}

}  // namespace

Server::Server(Engine& engine, ServerOptions options, ChatSetup chat)
    : engine_(engine),
      tokenizer_(require_tokenizer(engine)),
      options_(std::move(options)),
      chat_(std::move(chat)),
      metrics_({"/health", "/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize",
                "/detokenize", "/metrics", "/openapi.json"}),
      http_(options_.http),
      started_at_(unix_now()) {
  if (chat_.chat_template) tool_format_ = tool_format_of(chat_.chat_template->source());
  options_.defaults.max_context = engine_.max_context();
  options_.defaults.vocab_size = engine_.config().vocab_size;
  scheduler_ = std::make_unique<Scheduler>(engine_, options_.max_queue, metrics_);
  OpenApiLimits limits;
  limits.model_name = options_.model_name;
  limits.max_context = engine_.max_context();
  limits.vocab_size = engine_.config().vocab_size;
  limits.max_body_bytes = options_.http.max_body_bytes;
  openapi_json_ = openapi_document(limits).dump(2);

  http_.set_error_body(http_error_body);
  http_.set_access_log([this](const std::string& method, const std::string& path, int status) {
    metrics_.on_http_response(path, status);
    // The server's own failures reach the operator too, not only the client (the message is in
    // the answer's error body). Not 501 (a client's transfer coding) or 503 (shutting down).
    if (status >= 500 && status != 501 && status != 503) {
      std::fprintf(stderr, "quantspec serve: %s %s answered %d\n", method.c_str(), path.c_str(),
                   status);
    }
  });
  http_.handle("GET", "/health", [this](const HttpRequest&, HttpResponse& res) {
    const bool down = shutting_down_.load();
    res.status = down ? 503 : 200;
    res.body = dump_json(Json{{"status", down ? "shutting_down" : "ok"}});
  });
  http_.handle("GET", "/v1/models", [this](const HttpRequest&, HttpResponse& res) {
    Json model = {{"id", options_.model_name},
                  {"object", "model"},
                  {"created", started_at_},
                  {"owned_by", "quantspec"},
                  {"max_model_len", engine_.max_context()}};
    res.body = dump_json(Json{{"object", "list"}, {"data", Json::array({model})}});
  });
  http_.handle("GET", "/metrics", [this](const HttpRequest&, HttpResponse& res) {
    res.content_type = "text/plain; version=0.0.4; charset=utf-8";
    res.body = metrics_.render(scheduler_->gauges());
  });
  http_.handle("GET", "/openapi.json",
               [this](const HttpRequest&, HttpResponse& res) { res.body = openapi_json_; });
  http_.handle("POST", "/v1/completions", [this](const HttpRequest& req, HttpResponse& res) {
    handle_generate(Endpoint::kCompletions, req, res);
  });
  http_.handle("POST", "/v1/chat/completions", [this](const HttpRequest& req, HttpResponse& res) {
    handle_generate(Endpoint::kChatCompletions, req, res);
  });
  http_.handle("POST", "/tokenize",
               [this](const HttpRequest& req, HttpResponse& res) { handle_tokenize(req, res); });
  http_.handle("POST", "/detokenize",
               [this](const HttpRequest& req, HttpResponse& res) { handle_detokenize(req, res); });
}

Server::~Server() = default;

Result<int> Server::bind() {
  return http_.bind();
}

void Server::run() {
  http_.run();
}

void Server::shutdown() {
  if (shutting_down_.exchange(true)) return;
  std::fprintf(stderr,
               "quantspec serve: shutting down: no new requests; queued ones get 503; the "
               "running one may finish within %d s\n",
               options_.shutdown_grace_s);
  scheduler_->begin_shutdown();
  http_.stop();
  if (!scheduler_->wait_idle(std::chrono::seconds(options_.shutdown_grace_s))) {
    std::fprintf(stderr, "quantspec serve: grace period over: cancelling the running request\n");
    scheduler_->cancel_running();
    scheduler_->wait_idle(std::chrono::seconds(60));
  }
}

void Server::respond_error(HttpResponse& res, const ApiError& e) {
  res.status = e.status;
  res.content_type = "application/json";
  res.body = dump_json(error_json(e));
  if (e.status == 429) res.headers.emplace_back("Retry-After", "1");
}

std::variant<std::string, ApiError> Server::render_chat(const Json& messages,
                                                        const Json& tools) const {
  if (!chat_.chat_template)
    return make_api_error(400, chat_.problem, "chat_template_missing", "messages");
  const Json extra = tools.empty() ? Json::object() : Json{{"tools", tools}};
  auto text = chat_.chat_template->render(messages, chat_.tokens, extra);
  if (!text.ok()) {
    return make_api_error(400, "the chat template rejected the messages: " + text.error().message,
                          "chat_template_error", "messages");
  }
  return std::move(text).value();
}

std::optional<ApiError> Server::prompt_ids(const ApiRequest& r,
                                           std::vector<std::vector<int32_t>>* prompts) {
  const bool chat = r.endpoint == Endpoint::kChatCompletions;
  prompts->clear();
  if (chat) {
    auto text = render_chat(r.messages, r.tools.tools);
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    // The template writes the special tokens (BOS, ...) itself, as HF's apply_chat_template.
    prompts->push_back(tokenizer_.encode(std::get<std::string>(text), /*add_special=*/false));
    if (prompts->front().empty()) {
      return make_api_error(400, "the prompt is empty (it has no tokens)", "invalid_value",
                            "messages");
    }
  }
  const int64_t vocab = engine_.config().vocab_size;
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    const PromptInput& in = r.prompts[p];
    // The parameter a prompt's error names: "prompt", or "prompt[p]" in a batch.
    const std::string param =
        r.prompts.size() > 1 ? "prompt[" + std::to_string(p) + "]" : std::string("prompt");
    std::vector<int32_t> ids;
    if (in.text) {
      ids = tokenizer_.encode(*in.text, /*add_special=*/true);
    } else {
      for (size_t i = 0; i < in.ids.size(); ++i) {
        const int64_t id = in.ids[i];
        if (id < 0 || id >= vocab) {
          return make_api_error(400,
                                "token id " + std::to_string(id) + " at " + param + " position " +
                                    std::to_string(i) + " is outside the vocabulary [0, " +
                                    std::to_string(vocab) + ")",
                                "invalid_value", param);
        }
        ids.push_back(static_cast<int32_t>(id));
      }
    }
    if (ids.empty())
      return make_api_error(400, "the prompt is empty (it has no tokens)", "invalid_value", param);
    prompts->push_back(std::move(ids));
  }
  return std::nullopt;
}

void Server::handle_tokenize(const HttpRequest& req, HttpResponse& res) {
  auto parsed = parse_tokenize(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_error(res, *e);
  const TokenizeRequest& t = std::get<TokenizeRequest>(parsed);
  std::string text;
  if (t.prompt) {
    text = *t.prompt;
  } else {
    auto rendered = render_chat(t.messages, t.tools);
    if (auto* e = std::get_if<ApiError>(&rendered)) return respond_error(res, *e);
    text = std::move(std::get<std::string>(rendered));
  }
  const std::vector<int32_t> ids = tokenizer_.encode(text, t.add_special);
  res.body = dump_json(
      Json{{"count", ids.size()}, {"max_model_len", engine_.max_context()}, {"tokens", ids}});
}

void Server::handle_detokenize(const HttpRequest& req, HttpResponse& res) {
  auto parsed = parse_detokenize(req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_error(res, *e);
  const int64_t vocab = engine_.config().vocab_size;
  std::vector<int32_t> ids;
  for (const int64_t id : std::get<std::vector<int64_t>>(parsed)) {
    if (id >= vocab) {
      return respond_error(
          res, make_api_error(400,
                              "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                  std::to_string(vocab) + ")",
                              "invalid_value", "tokens"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  res.body = dump_json(Json{{"prompt", tokenizer_.decode(ids, /*skip_special=*/false)}});
}

void Server::handle_generate(Endpoint endpoint, const HttpRequest& req, HttpResponse& res) {
  auto parsed = parse_request(req.body, endpoint, options_.defaults);
  if (auto* e = std::get_if<ApiError>(&parsed)) return respond_error(res, *e);
  ApiRequest r = std::move(std::get<ApiRequest>(parsed));
  if (shutting_down_) return respond_error(res, stop_error(StopReason::kShutdown, 0));

  std::vector<std::vector<int32_t>> prompts;
  if (auto e = prompt_ids(r, &prompts)) return respond_error(res, *e);
  // tool_choice required / a named function: the reply follows the calls' schema.
  if (std::string schema = tool_output_schema(r.tools, tool_format_); !schema.empty())
    r.params.json_schema = std::move(schema);

  // Context: prompt + completion must fit (as OpenAI), for every prompt of a batch; without
  // max_tokens the completion gets the server default, clipped to the room the longest leaves.
  const int64_t ctx = engine_.max_context();
  const auto longest_it =
      std::max_element(prompts.begin(), prompts.end(),
                       [](const auto& a, const auto& b) { return a.size() < b.size(); });
  const int64_t n_prompt = static_cast<int64_t>(longest_it->size());
  const auto longest = static_cast<size_t>(longest_it - prompts.begin());
  const std::string prompt_param = endpoint == Endpoint::kChatCompletions ? "messages"
                                   : prompts.size() > 1 ? "prompt[" + std::to_string(longest) + "]"
                                                        : "prompt";
  int64_t max_new = 0;
  if (r.max_tokens) {
    max_new = *r.max_tokens;
    if (n_prompt + max_new > ctx) {
      return respond_error(
          res,
          make_api_error(
              400,
              fmt::format(
                  "this model's maximum context length is {} tokens, but {} were requested ({} in "
                  "the prompt + {} max_tokens); shorten the prompt or lower max_tokens",
                  ctx, n_prompt + max_new, n_prompt, max_new),
              "context_length_exceeded", n_prompt >= ctx ? prompt_param : "max_tokens"));
    }
  } else {
    const int64_t room = ctx - n_prompt;
    if (room < 1) {
      return respond_error(
          res,
          make_api_error(
              400,
              fmt::format(
                  "this model's maximum context length is {} tokens, and the prompt has {}: no "
                  "room to generate; shorten the prompt",
                  ctx, n_prompt),
              "context_length_exceeded", prompt_param));
    }
    max_new = std::clamp<int64_t>(options_.defaults.gen.max_new_tokens, 1, room);
  }
  r.params.max_new_tokens = static_cast<int>(max_new);

  const auto deadline = Clock::now() + std::chrono::seconds(options_.request_timeout_s);
  const int n = r.n;
  auto job = std::make_shared<Job>(std::move(prompts), r.params, deadline, n);
  if (r.echo) {
    std::vector<std::string> texts;
    for (int p = 0; p < job->num_prompts(); ++p) {
      const PromptInput& in = r.prompts[static_cast<size_t>(p)];
      texts.push_back(in.text ? *in.text : tokenizer_.decode(job->prompt(p), true));
    }
    job->set_echo(std::move(texts));
  }
  switch (scheduler_->submit(job)) {
    case Scheduler::Admission::kAccepted:
      break;
    case Scheduler::Admission::kQueueFull:
      return respond_error(
          res,
          make_api_error(
              429,
              fmt::format(
                  "the server is busy: {} requests are already waiting (--max-queue); retry later",
                  options_.max_queue),
              "queue_full"));
    case Scheduler::Admission::kShuttingDown:
      return respond_error(res, stop_error(StopReason::kShutdown, 0));
  }

  ResponseMeta meta;
  meta.id = new_response_id(endpoint);
  meta.created = unix_now();
  meta.model = options_.model_name;
  const int timeout_s = options_.request_timeout_s;

  if (!r.stream) {
    for (;;) {
      if (job->wait(kPollInterval).finished) break;
      if (req.client_gone && req.client_gone()) {
        job->cancel(StopReason::kClientGone);
        return respond_error(res, stop_error(StopReason::kClientGone, timeout_s));
      }
      if (Clock::now() > job->deadline()) {
        job->cancel(StopReason::kTimeout);
        return respond_error(res, stop_error(StopReason::kTimeout, timeout_s));
      }
    }
    if (auto error = finished_job_error(*job, timeout_s)) return respond_error(res, *error);
    const Job::Outcome& o = job->outcome();
    const ResponseStats extra{options_.decode_mode, o.spec, o.queue_s, n};
    // An echo: each choice's text and logprobs start with its prompt's (choice c: prompt c / n).
    std::vector<GenerationResult> results = o.results;
    std::vector<Json> logprobs;
    for (size_t c = 0; c < results.size(); ++c) {
      GenerationResult& result = results[c];
      const int p = static_cast<int>(c) / n;
      if (job->echo()) result.text.insert(0, job->echo_text(p));
      if (r.params.logprobs < 0) continue;
      std::vector<TokenLogprob> entries = o.prompt_logprobs[static_cast<size_t>(p)];
      entries.insert(entries.end(), result.logprobs.begin(), result.logprobs.end());
      int64_t text_offset = 0;
      logprobs.push_back(logprobs_json(endpoint, entries, tokenizer_, &text_offset,
                                       job->echo() ? job->echo_text(p) : std::string_view()));
    }
    Json body = endpoint == Endpoint::kChatCompletions
                    ? chat_response(meta, results, extra, logprobs)
                    : completion_response(meta, results, extra, logprobs);
    if (endpoint == Endpoint::kChatCompletions) {
      for (Json& choice : body["choices"]) take_tool_calls(r.tools, tool_format_, &choice);
    }
    res.body = dump_json(body);
    return;
  }

  res.content_type = "text/event-stream";
  res.headers.emplace_back("Cache-Control", "no-cache");
  res.headers.emplace_back("X-Accel-Buffering", "no");
  const bool include_usage = r.include_usage;
  const std::string mode = options_.decode_mode;
  const Tokenizer* logprob_tokenizer = r.params.logprobs >= 0 ? &tokenizer_ : nullptr;
  res.stream = [job, meta, endpoint, include_usage, timeout_s, mode, n, logprob_tokenizer,
                tools = r.tools, tool_format = tool_format_](StreamSink& sink) {
    const bool chat = endpoint == Endpoint::kChatCompletions;
    auto send_error = [&](const ApiError& e) {
      sink.write(sse_event(error_json(e)));
      sink.write(kSseDone);
    };
    // Each choice's chunks in turn (they run one after another): a chat choice opens with its
    // role, and every choice but the last closes with its finish reason as it ends (the last
    // one's comes with the statistics, below).
    int64_t text_offset = 0;  // logprobs: the next token's offset in the current choice
    int opened = 0;           // chat: the choices whose role chunk was sent
    auto write = [&](const Json& chunk) {
      if (sink.write(sse_event(chunk))) return true;
      job->cancel(StopReason::kClientGone);
      return false;
    };
    // Chat: the current choice's reply, whose tool calls are held back and sent as it ends.
    std::optional<ToolReplyReader> reader;
    auto open_choice = [&](int choice) {
      if (!chat) return true;
      for (; opened <= choice; ++opened) {
        reader.emplace(tools, tool_format);
        if (!write(chat_chunk(meta, Json{{"role", "assistant"}, {"content", ""}}, "", nullptr,
                              opened)))
          return false;
      }
      return true;
    };
    // A chat choice's end: the content held back and its tool calls, then its finish reason
    // (nullopt: the client is gone).
    auto end_reply = [&](int choice, const std::string& finish_reason) {
      std::optional<std::string> reason = finish_reason;
      if (!chat) return reason;
      const ToolReply reply = reader->finish();
      if (!reply.content.empty() &&
          !write(chat_chunk(meta, Json{{"content", reply.content}}, "", nullptr, choice)))
        return std::optional<std::string>();
      if (!reply.calls.empty() && !reply.streamed &&
          !write(chat_chunk(meta, Json{{"tool_calls", tool_calls_json(reply.calls, true)}}, "",
                            nullptr, choice)))
        return std::optional<std::string>();
      reason = tool_finish_reason(tools, reply, finish_reason);
      return reason;
    };
    if (!open_choice(0)) return;
    for (;;) {
      Job::Progress p = job->wait(kPollInterval);
      for (const Job::Delta& d : p.deltas) {
        if (!open_choice(d.choice)) return;
        // Chat: text that may start a tool call is held back; a named function's arguments go
        // out as tool call deltas.
        const ToolReplyPart part = chat ? reader->feed(d.text) : ToolReplyPart{d.text};
        const bool call = !part.tool_calls.empty();
        if (!part.content.empty() || call || !d.logprobs.empty()) {
          // A chunk carries the tokens generated since the last one (its text may lag them: held
          // back UTF-8, stop-string prefixes or tool calls).
          Json logprobs =
              logprob_tokenizer != nullptr
                  ? logprobs_json(endpoint, d.logprobs, *logprob_tokenizer, &text_offset,
                                  d.echo ? std::string_view(d.text) : std::string_view())
                  : Json(nullptr);
          const Json delta =
              call ? Json{{"tool_calls", part.tool_calls}} : Json{{"content", part.content}};
          const Json chunk =
              chat ? chat_chunk(meta, delta, "", std::move(logprobs), d.choice)
                   : completion_chunk(meta, part.content, "", std::move(logprobs), d.choice);
          if (!write(chunk)) return;
        }
        if (!d.finish_reason.empty()) {
          text_offset = 0;
          const auto reason = end_reply(d.choice, d.finish_reason);
          if (!reason) return;
          const Json end = chat ? chat_chunk(meta, Json::object(), *reason, nullptr, d.choice)
                                : completion_chunk(meta, "", *reason, nullptr, d.choice);
          if (!write(end)) return;
        }
      }
      if (p.finished) break;
      // Checked after every chunk too: a client that closed is noticed within a token or two,
      // before the kernel would make a write fail.
      if (sink.client_gone()) {
        job->cancel(StopReason::kClientGone);
        return;
      }
      if (Clock::now() > job->deadline()) {
        job->cancel(StopReason::kTimeout);
        return send_error(stop_error(StopReason::kTimeout, timeout_s));
      }
    }
    if (auto error = finished_job_error(*job, timeout_s)) return send_error(*error);
    const Job::Outcome& o = job->outcome();
    const GenerationResult& result = o.results.back();
    const int index = static_cast<int>(o.results.size()) - 1;
    if (!open_choice(index)) return;
    const auto reason = end_reply(index, result.finish_reason);
    if (!reason) return;
    Json last = chat ? chat_chunk(meta, Json::object(), *reason, nullptr, index)
                     : completion_chunk(meta, "", *reason, nullptr, index);
    last["quantspec"] = stats_json(o.results, ResponseStats{mode, o.spec, o.queue_s, n});
    sink.write(sse_event(last));
    if (include_usage) {
      sink.write(sse_event(usage_chunk(meta, endpoint, o.results, n)));
    }
    sink.write(kSseDone);
  };
}

namespace {

// SIGINT/SIGTERM may land on any thread (libraries start threads before main), so the handler
// only writes the signal number to a pipe that serve_until_signal's watcher thread reads.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_shutdown_signal(int sig) {
  const char c = static_cast<char>(sig);
  const ssize_t n = write(g_signal_pipe[1], &c, 1);
  (void)n;
}

}  // namespace

void install_shutdown_signal_handlers() {
  std::signal(SIGPIPE, SIG_IGN);
  if (g_signal_pipe[0] >= 0) return;
  QS_CHECK(pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0);
  struct sigaction sa {};
  sa.sa_handler = on_shutdown_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int serve_until_signal(Server& server) {
  QS_CHECK_MSG(g_signal_pipe[0] >= 0, "call install_shutdown_signal_handlers() first");
  std::atomic<bool> done{false};
  std::thread watcher([&server, &done] {
    std::thread shutdown_thread;
    int received = 0;
    while (!done) {
      pollfd pfd{g_signal_pipe[0], POLLIN, 0};
      if (poll(&pfd, 1, 200) <= 0) continue;
      char sig = 0;
      while (read(g_signal_pipe[0], &sig, 1) == 1) {
        if (++received == 1) {
          std::fprintf(stderr,
                       "quantspec serve: received %s; shutting down gracefully (send it again "
                       "to exit at once)\n",
                       sig == SIGINT ? "SIGINT" : "SIGTERM");
          shutdown_thread = std::thread([&server] { server.shutdown(); });
        } else {
          std::fprintf(stderr, "quantspec serve: second signal: exiting now\n");
          std::fflush(stderr);
          std::_Exit(130);
        }
      }
    }
    if (shutdown_thread.joinable()) shutdown_thread.join();
  });
  server.run();
  done = true;
  watcher.join();
  std::fprintf(stderr, "quantspec serve: stopped\n");
  return 0;
}

}  // namespace qs::server
