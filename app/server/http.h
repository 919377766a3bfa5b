// Our small HTTP interface, implemented over cpp-httplib (http.cpp is the only file that sees it).
// It adds what the library lacks for a server that must survive bad clients: a body-size limit
// that also holds for chunked bodies, a deadline for receiving a whole request (slowloris), and
// a way to learn that a client has gone away while its request is being served.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace qs::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port (bind() says which)
  int threads = 96;              // connection threads (one per open connection)
  int read_timeout_s = 10;       // longest wait for the next bytes of a request
  int write_timeout_s = 10;      // longest wait to write to a client
  int keep_alive_timeout_s = 5;  // idle time before a keep-alive connection is closed
  int request_deadline_s = 30;   // a whole request must arrive within this (slowloris)
  size_t max_body_bytes = size_t{8} << 20;
};

// Where a streaming response writes its chunks.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual bool write(std::string_view data) = 0;  // false: the client is gone
  virtual bool client_gone() = 0;                 // the client closed its connection
};

struct HttpRequest {
  std::string method;
  std::string path;
  std::string body;
  std::string remote;                 // "address:port", for messages
  std::function<bool()> client_gone;  // true once the client has closed the connection
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // When set, the response body is streamed (chunked): called once, on the request's thread,
  // after the status and headers have been sent.
  std::function<void(StreamSink&)> stream;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;
// The body of responses the HTTP layer makes itself (404, 405, 413, malformed requests).
using ErrorBodyFn = std::function<std::string(int status, const std::string& message)>;
// Called once per answered request (after the response is sent); path is "" when the request
// line could not be parsed.
using AccessLogFn =
    std::function<void(const std::string& method, const std::string& path, int status)>;

class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Exact-path routes. A known path with another method gets 405; an unknown path 404.
  void handle(const std::string& method, const std::string& path, HttpHandler handler);
  void set_error_body(ErrorBodyFn fn);
  void set_access_log(AccessLogFn fn);

  // Bind the listening socket; returns the port (useful with port 0).
  Result<int> bind();
  // Serve until stop(); returns once in-flight requests have finished.
  void run();
  // Stop accepting connections and close idle keep-alive connections. Thread-safe; may be
  // called before run() starts or while it runs.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qs::server
