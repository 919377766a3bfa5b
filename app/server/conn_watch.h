// Linux socket bookkeeping the HTTP library does not expose: find the socket of a request by its
// peer address, ask whether the peer has closed it, and cut off connections that take too long to
// deliver a request (slowloris) or sit idle at shutdown.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace qs::server {

struct TcpConnection {
  int fd = -1;
  std::string peer;  // numeric address, as getnameinfo(NI_NUMERICHOST) writes it
  int peer_port = 0;
};

// Connected TCP sockets of this process whose local port is `local_port` (from /proc/self/fd).
std::vector<TcpConnection> list_tcp_connections(int local_port);

// The socket of the connection from peer:peer_port to local_port; -1 when there is none.
int find_connection_fd(int local_port, const std::string& peer, int peer_port);

// Whether the peer has closed (or reset) the connection. Never blocks or consumes data.
bool peer_closed(int fd);

// Stop reading from a connection: a read in progress or the next one sees end-of-stream, so the
// HTTP library answers what it has (400 for a partial request) and closes the connection.
void stop_reading(int fd);

// stop_reading(fd) if fd still is the connection from peer:peer_port to local_port, checked and
// cut through a duplicate of fd, so that a connection that opens on a reused descriptor number
// is never cut in its place. Returns whether it was.
bool stop_reading_if(int fd, int local_port, const std::string& peer, int peer_port);

// A thread that, twice a second, looks at the open connections on a port and stops reading from
// those that have spent longer than `deadline` outside a request handler (a request that has not
// fully arrived yet, or an idle keep-alive connection). After close_idle_from_now_on() it does the
// same to every connection that has spent a second outside a handler.
class ConnectionWatchdog {
 public:
  ConnectionWatchdog(int local_port, std::chrono::milliseconds deadline);
  ~ConnectionWatchdog();
  ConnectionWatchdog(const ConnectionWatchdog&) = delete;
  ConnectionWatchdog& operator=(const ConnectionWatchdog&) = delete;

  // A request from peer:port has fully arrived and is being handled / has been answered.
  void begin_request(const std::string& peer, int port);
  void end_request(const std::string& peer, int port);
  void close_idle_from_now_on();

 private:
  struct State {
    int fd = -1;
    int busy = 0;  // requests of this connection inside a handler
    bool cut = false;
    std::chrono::steady_clock::time_point since;  // last time it left a handler (or appeared)
  };
  using Key = std::pair<std::string, int>;

  void loop();
  void update_locked(const std::vector<TcpConnection>& open,
                     std::chrono::steady_clock::time_point now);

  const int port_;
  const std::chrono::milliseconds deadline_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, State> conns_;
  bool close_idle_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace qs::server
