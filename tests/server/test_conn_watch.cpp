// conn_watch's socket bookkeeping on real loopback connections.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "conn_watch.h"

namespace qs::server {
namespace {

// A listening socket on a free loopback port, and connections to it: each one's client socket,
// its accepted server-side socket and the client's port as the server sees it.
class Loopback {
 public:
  Loopback() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len), 0);
    EXPECT_EQ(listen(listen_fd_, 8), 0);
    EXPECT_EQ(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
  }
  ~Loopback() { close(listen_fd_); }
  int port() const { return port_; }

  struct Conn {
    int client = -1, server = -1, client_port = 0;
  };
  Conn connect_one() {
    Conn c;
    c.client = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port_));
    EXPECT_EQ(connect(c.client, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    sockaddr_in peer{};
    socklen_t len = sizeof(peer);
    c.server = accept(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len);
    c.client_port = ntohs(peer.sin_port);
    return c;
  }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
};

// Whether reading from fd now sees end-of-stream (its read side stopped, no data pending).
bool read_side_stopped(int fd) {
  char c;
  return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

TEST(ConnWatch, ListsAndFindsTheConnectionsOfItsPort) {
  Loopback lo;
  const Loopback::Conn a = lo.connect_one(), b = lo.connect_one();
  EXPECT_EQ(find_connection_fd(lo.port(), "127.0.0.1", a.client_port), a.server);
  EXPECT_EQ(find_connection_fd(lo.port(), "127.0.0.1", b.client_port), b.server);
  EXPECT_EQ(find_connection_fd(lo.port() == 1 ? 2 : 1, "127.0.0.1", a.client_port), -1);
  EXPECT_EQ(list_tcp_connections(lo.port()).size(), 2u);  // not the listening socket
  for (int fd : {a.client, a.server, b.client, b.server}) close(fd);
}

TEST(ConnWatch, StopReadingIfCutsOnlyTheNamedConnection) {
  Loopback lo;
  const Loopback::Conn a = lo.connect_one();
  EXPECT_FALSE(stop_reading_if(a.server, lo.port(), "127.0.0.1", a.client_port + 1));
  EXPECT_FALSE(stop_reading_if(a.server, lo.port() + 1, "127.0.0.1", a.client_port));
  EXPECT_FALSE(read_side_stopped(a.server));
  EXPECT_TRUE(stop_reading_if(a.server, lo.port(), "127.0.0.1", a.client_port));
  EXPECT_TRUE(read_side_stopped(a.server));
  EXPECT_FALSE(stop_reading_if(-1, lo.port(), "127.0.0.1", a.client_port));
  for (int fd : {a.client, a.server}) close(fd);
}

// The watchdog's race: a connection closes and a new one is accepted on the same descriptor
// number before the cut. The new connection must not be cut in the old one's place.
TEST(ConnWatch, ANewConnectionOnAReusedDescriptorIsNotCut) {
  Loopback lo;
  const Loopback::Conn old_conn = lo.connect_one();
  close(old_conn.server);
  close(old_conn.client);
  const Loopback::Conn new_conn = lo.connect_one();
  ASSERT_EQ(new_conn.server, old_conn.server) << "the kernel did not reuse the lowest free number";
  ASSERT_NE(new_conn.client_port, old_conn.client_port);
  EXPECT_FALSE(stop_reading_if(old_conn.server, lo.port(), "127.0.0.1", old_conn.client_port));
  EXPECT_FALSE(read_side_stopped(new_conn.server));
  EXPECT_TRUE(stop_reading_if(new_conn.server, lo.port(), "127.0.0.1", new_conn.client_port));
  for (int fd : {new_conn.client, new_conn.server}) close(fd);
}

}  // namespace
}  // namespace qs::server
