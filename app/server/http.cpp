#include "http.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "conn_watch.h"

namespace qs::server {

namespace {

std::string default_error_message(int status, const httplib::Request& req, size_t max_body) {
  switch (status) {
    case 400:
      (void)req;
      return "malformed or incomplete HTTP request (the request line, headers and body must be "
             "well-formed and arrive within the read timeout)";
    case 404:
      return "no such endpoint: " + req.method + " " + req.path;
    case 413:
      return "request body is larger than the limit of " + std::to_string(max_body) + " bytes";
    case 414:
      return "request URI is too long";
    case 416:
      return "range not satisfiable";
    default:
      return "HTTP error " + std::to_string(status);
  }
}

// A request whose body's framing cannot be trusted: the status and why, or nothing. Several
// Content-Length headers, or a value that is not a plain decimal number (the library would read
// a body of another length): 400. A transfer coding other than chunked (the library ignores it
// and waits for a body that never ends, or reads a compressed one as JSON): 501, as RFC 9112 asks.
std::optional<std::pair<int, std::string>> bad_body_framing(const httplib::Request& req) {
  const size_t count = req.get_header_value_count("Content-Length");
  if (count > 1)
    return std::pair{400, std::string("the request has more than one Content-Length header")};
  if (count == 1) {
    const std::string value = req.get_header_value("Content-Length");
    const bool digits =
        !value.empty() && value.size() <= 19 &&
        std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits)
      return std::pair{400,
                       "the request's Content-Length is not a number of bytes: '" + value + "'"};
  }
  for (size_t i = 0; i < req.get_header_value_count("Transfer-Encoding"); ++i) {
    std::string te = req.get_header_value("Transfer-Encoding", i);
    std::transform(te.begin(), te.end(), te.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (te != "chunked") {
      return std::pair{501, "Transfer-Encoding '" + req.get_header_value("Transfer-Encoding", i) +
                                "' is not supported (only chunked)"};
    }
  }
  return std::nullopt;
}

// The socket of one request's connection, looked up when first needed (most requests never ask).
// Used only on the request's own thread, while the connection is open.
class ConnectionRef {
 public:
  ConnectionRef(int local_port, std::string peer, int peer_port)
      : local_port_(local_port), peer_(std::move(peer)), peer_port_(peer_port) {}
  int fd() {
    if (!looked_up_) {
      fd_ = find_connection_fd(local_port_, peer_, peer_port_);
      looked_up_ = true;
    }
    return fd_;
  }
  bool peer_gone() { return peer_closed(fd()); }

 private:
  int local_port_;
  std::string peer_;
  int peer_port_;
  bool looked_up_ = false;
  int fd_ = -1;
};

class SinkAdapter : public StreamSink {
 public:
  SinkAdapter(httplib::DataSink& sink, std::shared_ptr<ConnectionRef> conn)
      : sink_(sink), conn_(std::move(conn)) {}
  bool write(std::string_view data) override {
    if (failed_) return false;
    if (!sink_.write(data.data(), data.size())) failed_ = true;
    return !failed_;
  }
  bool client_gone() override { return failed_ || conn_->peer_gone(); }

 private:
  httplib::DataSink& sink_;
  std::shared_ptr<ConnectionRef> conn_;
  bool failed_ = false;
};

}  // namespace

struct HttpServer::Impl {
  explicit Impl(HttpServerOptions o) : opt(std::move(o)) {}

  HttpServerOptions opt;
  httplib::Server svr;
  std::map<std::string, std::map<std::string, HttpHandler>> routes;  // path -> method -> handler
  ErrorBodyFn error_body = [](int, const std::string& m) { return m; };
  AccessLogFn access_log;
  int port = -1;
  std::unique_ptr<ConnectionWatchdog> watchdog;
  std::atomic<bool> stop_requested{false};

  void set_error(httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(error_body(status, message), "application/json");
  }

  // An error answer after which the connection closes, for a request whose body was left unread
  // or whose end is unknown: nothing after it on the connection can be trusted. The library has
  // no call for this; the releaser of the body's provider runs once the answer is written (when
  // the library drops the response) and stops the reading side, which ends the keep-alive loop.
  // (Stopping it before the answer would make the library think the client gone and not answer.)
  void set_error_and_close(httplib::Response& res, int status, const std::string& message, int fd) {
    auto body = std::make_shared<std::string>(error_body(status, message));
    res.status = status;
    res.set_content_provider(
        body->size(), "application/json",
        [body](size_t offset, size_t length, httplib::DataSink& sink) {
          return sink.write(body->data() + offset, length);
        },
        [fd](bool) { stop_reading(fd); });
  }

  void dispatch(const std::string& path, const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader* reader) {
    const std::string peer = req.remote_addr;
    const int peer_port = req.remote_port;
    if (watchdog) watchdog->begin_request(peer, peer_port);
    // Ends the request for the watchdog exactly once: when the handler returns, or for a
    // streaming response when the stream is done.
    auto ended = std::make_shared<std::atomic<bool>>(false);
    auto end_request = [this, ended, peer, peer_port] {
      if (!ended->exchange(true) && watchdog) watchdog->end_request(peer, peer_port);
    };
    auto conn = std::make_shared<ConnectionRef>(port, peer, peer_port);

    HttpRequest r;
    r.method = req.method;
    r.path = path;
    r.remote = peer + ":" + std::to_string(peer_port);
    r.client_gone = [conn] { return conn->peer_gone(); };

    if (reader && req.is_multipart_form_data()) {
      // The library reads such a body only through a multipart reader; ours are JSON.
      set_error_and_close(res, 415,
                          "multipart/form-data bodies are not accepted: send the request as JSON "
                          "(Content-Type: application/json)",
                          conn->fd());
      end_request();
      return;
    }
    if (reader) {
      bool too_big = false;
      const bool ok = (*reader)([&](const char* data, size_t n) {
        if (r.body.size() + n > opt.max_body_bytes) {
          too_big = true;
          return false;
        }
        r.body.append(data, n);
        return true;
      });
      if (too_big || (!ok && res.status == 413)) {
        // A chunked body is not drained: the connection closes after the answer.
        if (req.has_header("Content-Length")) {
          set_error(res, 413, default_error_message(413, req, opt.max_body_bytes));
        } else {
          set_error_and_close(res, 413, default_error_message(413, req, opt.max_body_bytes),
                              conn->fd());
        }
        end_request();
        return;
      }
      if (!ok) {
        set_error(res, 400,
                  "could not read the request body (it must have a Content-Length or be "
                  "chunked, and arrive within the read timeout)");
        end_request();
        return;
      }
    }

    const auto& by_method = routes.at(path);  // only registered paths are dispatched here
    auto it = by_method.find(req.method == "HEAD" ? "GET" : req.method);
    if (it == by_method.end()) {
      std::string allow;
      for (const auto& [m, h] : by_method) allow += (allow.empty() ? "" : ", ") + m;
      res.set_header("Allow", allow);
      set_error(
          res, 405,
          "method " + req.method + " is not allowed on " + path + " (allowed: " + allow + ")");
      end_request();
      return;
    }

    HttpResponse out;
    it->second(r, out);
    res.status = out.status;
    for (const auto& [k, v] : out.headers) res.set_header(k, v);
    if (!out.stream) {
      res.set_content(out.body, out.content_type);
      end_request();
      return;
    }
    auto stream = std::make_shared<std::function<void(StreamSink&)>>(std::move(out.stream));
    res.set_chunked_content_provider(
        out.content_type,
        [stream, conn](size_t /*offset*/, httplib::DataSink& sink) {
          SinkAdapter adapter(sink, conn);
          (*stream)(adapter);
          sink.done();
          return true;
        },
        [end_request](bool /*success*/) { end_request(); });
  }
};

HttpServer::HttpServer(HttpServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

HttpServer::~HttpServer() = default;

void HttpServer::handle(const std::string& method, const std::string& path, HttpHandler handler) {
  impl_->routes[path][method] = std::move(handler);
}

void HttpServer::set_error_body(ErrorBodyFn fn) {
  impl_->error_body = std::move(fn);
}

void HttpServer::set_access_log(AccessLogFn fn) {
  impl_->access_log = std::move(fn);
}

Result<int> HttpServer::bind() {
  Impl& d = *impl_;
  httplib::Server& svr = d.svr;
  const int threads = std::max(4, d.opt.threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_read_timeout(d.opt.read_timeout_s, 0);
  svr.set_write_timeout(d.opt.write_timeout_s, 0);
  svr.set_keep_alive_timeout(d.opt.keep_alive_timeout_s);
  svr.set_payload_max_length(d.opt.max_body_bytes);
  svr.set_tcp_nodelay(true);
  // The library's default also sets SO_REUSEPORT, with which a second server on a port in use
  // starts and the two share the connections; SO_REUSEADDR alone still allows a restart while
  // the last run's connections are in TIME_WAIT.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  svr.set_pre_routing_handler([impl = &d](const httplib::Request& req, httplib::Response& res) {
    if (auto error = bad_body_framing(req)) {
      impl->set_error_and_close(res, error->first, error->second,
                                find_connection_fd(impl->port, req.remote_addr, req.remote_port));
      return httplib::Server::HandlerResponse::Handled;
    }
    // Byte ranges are for files; applied to an API answer they would cut its JSON. The
    // request object is the library's own, writable one: clearing its parsed ranges makes
    // every answer whole (RFC 9110 lets a server ignore Range).
    const_cast<httplib::Request&>(req).ranges.clear();
    res.set_header("Accept-Ranges", "none");
    return httplib::Server::HandlerResponse::Unhandled;
  });

  for (const auto& [path, by_method] : d.routes) {
    const std::string p = path;
    // Exact match: escape the regex metacharacters our paths could contain.
    std::string pattern;
    for (char c : p) {
      if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) pattern += '\\';
      pattern += c;
    }
    Impl* impl = &d;
    auto plain = [impl, p](const httplib::Request& req, httplib::Response& res) {
      impl->dispatch(p, req, res, nullptr);
    };
    auto with_body = [impl, p](const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& reader) {
      impl->dispatch(p, req, res, &reader);
    };
    svr.Get(pattern, plain);
    svr.Post(pattern, with_body);
    svr.Put(pattern, with_body);
    svr.Patch(pattern, with_body);
    svr.Delete(pattern, plain);
    svr.Options(pattern, plain);
  }

  svr.set_error_handler(httplib::Server::HandlerWithResponse(
      [impl = &d](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.content_length_ > 0)  // answered already
          return httplib::Server::HandlerResponse::Unhandled;
        // A well-formed request line with a method we route nowhere (TRACE, ...): the library
        // says 400; answer as for any other method: 405 on a known path, else 404.
        // (For a method it does not know at all, only the method and target are parsed.)
        const std::string path =
            !req.path.empty() ? req.path : req.target.substr(0, req.target.find('?'));
        static const std::set<std::string> kRouted = {"GET",   "HEAD",   "POST",   "PUT",
                                                      "PATCH", "DELETE", "OPTIONS"};
        if (res.status == 400 && !path.empty() && path[0] == '/' && !req.method.empty() &&
            !kRouted.count(req.method) && req.version.rfind("HTTP/", 0) == 0 &&
            std::all_of(req.method.begin(), req.method.end(),
                        [](char c) { return c >= 'A' && c <= 'Z'; })) {
          auto route = impl->routes.find(path);
          if (route == impl->routes.end()) {
            impl->set_error(res, 404, "no such endpoint: " + req.method + " " + path);
            return httplib::Server::HandlerResponse::Handled;
          } else {
            std::string allow;
            for (const auto& [m, h] : route->second) allow += (allow.empty() ? "" : ", ") + m;
            res.set_header("Allow", allow);
            impl->set_error(res, 405,
                            "method " + req.method + " is not allowed on " + path +
                                " (allowed: " + allow + ")");
            return httplib::Server::HandlerResponse::Handled;
          }
        }
        impl->set_error(res, res.status,
                        default_error_message(res.status, req, impl->opt.max_body_bytes));
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr.set_exception_handler(
      [impl = &d](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        std::fprintf(stderr, "quantspec serve: internal error: %s\n", what.c_str());
        impl->set_error(res, 500, "internal error: " + what);
      });
  svr.set_logger([impl = &d](const httplib::Request& req, const httplib::Response& res) {
    if (impl->access_log) impl->access_log(req.method, req.path, res.status);
  });

  int port = d.opt.port;
  if (port == 0) {
    port = svr.bind_to_any_port(d.opt.host);
    if (port < 0) return make_error("cannot listen on " + d.opt.host + " (any port)");
  } else if (!svr.bind_to_port(d.opt.host, port)) {
    return make_error("cannot listen on " + d.opt.host + ":" + std::to_string(port) +
                      " (address in use, not local, or not permitted)");
  }
  d.port = port;
  d.watchdog =
      std::make_unique<ConnectionWatchdog>(port, std::chrono::seconds(d.opt.request_deadline_s));
  if (d.stop_requested) stop();
  return port;
}

void HttpServer::run() {
  if (!impl_->stop_requested) impl_->svr.listen_after_bind();
}

void HttpServer::stop() {
  impl_->stop_requested = true;
  impl_->svr.stop();
  if (impl_->watchdog) impl_->watchdog->close_idle_from_now_on();
}

}  // namespace qs::server
