#include "dayzero/serve/http/connection_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace dz::serve::http {
namespace {

// The numeric host and port of an IPv4 or IPv6 socket address; false for other families.
bool host_and_port(const sockaddr_storage& addr, std::string& host, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
    if (!inet_ntop(AF_INET, &in.sin_addr, text, sizeof text)) return false;
    port = ntohs(in.sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
    if (!inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text)) return false;
    port = ntohs(in6.sin6_port);
  } else {
    return false;
  }
  host = text;
  return true;
}

bool matches(int fd, int local_port, const std::string& remote_addr, int remote_port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  std::string host;
  int port = 0;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
  if (!host_and_port(addr, host, port) || port != local_port) return false;
  len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return false;
  if (!host_and_port(addr, host, port) || port != remote_port) return false;
  // httplib prints IPv4-mapped peers of a dual-stack socket either way; the port pair already
  // identifies the connection on one listening port, so only a clear mismatch is refused.
  return host == remote_addr || host.ends_with(":" + remote_addr) ||
         remote_addr.ends_with(":" + host);
}

}  // namespace

ConnectionWatch ConnectionWatch::find(int local_port, const std::string& remote_addr,
                                      int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return ConnectionWatch(-1);
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return ConnectionWatch(-1);
  const int dir_fd = dirfd(dir);
  int found = -1;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dir_fd) continue;
    if (matches(static_cast<int>(fd), local_port, remote_addr, remote_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return ConnectionWatch(found);
}

bool ConnectionWatch::peer_closed() const {
  if (fd_ < 0) return false;
  pollfd p{.fd = fd_, .events = POLLIN | POLLRDHUP, .revents = 0};
  if (poll(&p, 1, 0) < 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  if (!(p.revents & POLLIN)) return false;
  char byte = 0;
  const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace dz::serve::http
