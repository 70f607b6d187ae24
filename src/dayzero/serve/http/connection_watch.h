#pragma once
// Whether an HTTP client is still there (docs/serving.md §5.5). cpp-httplib 0.11.4 gives a handler
// no access to its socket (no Request::is_connection_closed; that came in later releases), so the
// socket is found by its address pair among the process's descriptors, once per request; the
// connection owns it until the handler and any content provider return, so the descriptor stays
// valid for as long as the watch is used. peer_closed() is a non-blocking poll plus a one-byte
// MSG_PEEK: an orderly close reads 0 bytes, a reset reads an error.

#include <string>

namespace dz::serve::http {

class ConnectionWatch {
 public:
  // The socket whose local end is local_port and whose peer is remote_addr:remote_port (as
  // httplib::Request spells them); an unknown one (watch disabled) when none matches.
  static ConnectionWatch find(int local_port, const std::string& remote_addr, int remote_port);

  bool found() const { return fd_ >= 0; }
  // True once the peer closed or reset the connection. Data the client still sends (pipelining)
  // counts as alive. Always false when the socket was not found.
  bool peer_closed() const;

 private:
  explicit ConnectionWatch(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace dz::serve::http
