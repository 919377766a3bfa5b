#include "conn_watch.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <set>

namespace qs::server {

namespace {

// At shutdown, a connection outside a handler gets this long to finish sending its request (it
// then gets an answer, 503) before it is closed.
constexpr std::chrono::milliseconds kShutdownGrace{1000};

bool numeric_address(const sockaddr_storage& addr, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof(h), s, sizeof(s),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  *host = h;
  *port = std::atoi(s);
  return true;
}

// The connection of socket `fd` to local_port; false for any other kind of descriptor, a socket on
// another port, or the listening socket.
bool tcp_connection(int fd, int local_port, TcpConnection* c) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  if (local.ss_family != AF_INET && local.ss_family != AF_INET6) return false;
  std::string local_host;
  int port = 0;
  if (!numeric_address(local, local_len, &local_host, &port) || port != local_port) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  c->fd = fd;
  return numeric_address(peer, peer_len, &c->peer, &c->peer_port);
}

}  // namespace

std::vector<TcpConnection> list_tcp_connections(int local_port) {
  std::vector<TcpConnection> out;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return out;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    TcpConnection c;
    if (tcp_connection(static_cast<int>(fd), local_port, &c)) out.push_back(std::move(c));
  }
  closedir(dir);
  return out;
}

int find_connection_fd(int local_port, const std::string& peer, int peer_port) {
  for (const TcpConnection& c : list_tcp_connections(local_port)) {
    if (c.peer == peer && c.peer_port == peer_port) return c.fd;
  }
  return -1;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  char c;
  const ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r == 0) return true;  // orderly shutdown (FIN)
  if (r < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  return false;  // bytes waiting (a pipelined request): still there
}

void stop_reading(int fd) {
  if (fd >= 0) shutdown(fd, SHUT_RD);
}

bool stop_reading_if(int fd, int local_port, const std::string& peer, int peer_port) {
  // The check and the shutdown act on a duplicate: if the connection closed and a new one got its
  // descriptor number meanwhile, the duplicate refers to the new socket and fails the check, and
  // once checked, it keeps referring to the same socket whatever happens to the number `fd`.
  const int dup_fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (dup_fd < 0) return false;
  TcpConnection c;
  const bool same =
      tcp_connection(dup_fd, local_port, &c) && c.peer == peer && c.peer_port == peer_port;
  if (same) shutdown(dup_fd, SHUT_RD);
  close(dup_fd);
  return same;
}

ConnectionWatchdog::ConnectionWatchdog(int local_port, std::chrono::milliseconds deadline)
    : port_(local_port), deadline_(deadline) {
  thread_ = std::thread([this] { loop(); });
}

ConnectionWatchdog::~ConnectionWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ConnectionWatchdog::begin_request(const std::string& peer, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  State& s = conns_[{peer, port}];
  if (s.busy == 0 && s.fd < 0) s.since = std::chrono::steady_clock::now();
  ++s.busy;
}

void ConnectionWatchdog::end_request(const std::string& peer, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find({peer, port});
  if (it == conns_.end()) return;
  if (it->second.busy > 0) --it->second.busy;
  it->second.since = std::chrono::steady_clock::now();
}

void ConnectionWatchdog::close_idle_from_now_on() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    close_idle_ = true;
  }
  cv_.notify_all();
}

void ConnectionWatchdog::update_locked(const std::vector<TcpConnection>& open,
                                       std::chrono::steady_clock::time_point now) {
  std::set<Key> seen;
  for (const TcpConnection& c : open) {
    Key key{c.peer, c.peer_port};
    seen.insert(key);
    State& s = conns_[key];
    if (s.fd != c.fd) {  // first sighting (or a new connection reusing the peer address)
      if (s.busy == 0) s.since = now;
      s.fd = c.fd;
      s.cut = false;
    }
  }
  for (auto it = conns_.begin(); it != conns_.end();) {
    State& s = it->second;
    if (!seen.count(it->first)) {
      if (s.busy == 0) {  // closed; entries held by a running handler stay
        it = conns_.erase(it);
        continue;
      }
    } else if (s.busy == 0 && !s.cut &&
               now - s.since > (close_idle_ ? std::min(deadline_, kShutdownGrace) : deadline_)) {
      // The fd was listed a moment ago; it is cut only if it still is this peer's connection.
      stop_reading_if(s.fd, port_, it->first.first, it->first.second);
      s.cut = true;
    }
    ++it;
  }
}

void ConnectionWatchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    const std::vector<TcpConnection> open = list_tcp_connections(port_);
    lock.lock();
    update_locked(open, std::chrono::steady_clock::now());
    cv_.wait_for(lock, std::chrono::milliseconds(close_idle_ ? 100 : 500));
  }
}

}  // namespace qs::server
