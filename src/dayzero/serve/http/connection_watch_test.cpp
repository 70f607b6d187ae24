#include "dayzero/serve/http/connection_watch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace dz::serve::http {
namespace connection_watch_test {

int port_of(int fd, bool peer) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  EXPECT_EQ(rc, 0);
  return ntohs(addr.sin_port);
}

// A loopback connection: the listening socket, the client end and the accepted end.
struct Loopback {
  int listener = -1, client = -1, accepted = -1;
  Loopback() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(listen(listener, 4), 0);
    addr.sin_port = htons(static_cast<uint16_t>(port_of(listener, false)));
    client = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    accepted = accept(listener, nullptr, nullptr);
    EXPECT_GE(accepted, 0);
  }
  ~Loopback() {
    for (int fd : {listener, client, accepted})
      if (fd >= 0) close(fd);
  }
};

bool eventually_closed(const ConnectionWatch& watch) {
  for (int i = 0; i < 100; ++i) {
    if (watch.peer_closed()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(ConnectionWatch, FindsTheAcceptedSocketAndSeesTheClientLeave) {
  Loopback link;
  const ConnectionWatch watch = ConnectionWatch::find(port_of(link.accepted, false), "127.0.0.1",
                                                      port_of(link.client, false));
  ASSERT_TRUE(watch.found());
  EXPECT_FALSE(watch.peer_closed());
  // Pending request bytes (pipelining) are not a departure.
  ASSERT_EQ(write(link.client, "GET", 3), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(watch.peer_closed());
  close(link.client);
  link.client = -1;
  EXPECT_TRUE(eventually_closed(watch));
}

TEST(ConnectionWatch, UnknownPairsAreNotFoundAndNeverClosed) {
  Loopback link;
  const ConnectionWatch watch = ConnectionWatch::find(port_of(link.accepted, false), "127.0.0.1",
                                                      port_of(link.client, false) + 1);
  EXPECT_FALSE(watch.found());
  EXPECT_FALSE(watch.peer_closed());
  EXPECT_FALSE(ConnectionWatch::find(0, "", 0).found());
}

}  // namespace connection_watch_test
}  // namespace dz::serve::http
