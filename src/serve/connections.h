// The connection front of the HTTP server: an httplib::Server whose accepted sockets never sit on
// a worker thread while the client is slow. One poller thread (epoll) reads each request's header
// block and body into memory, with deadlines and size limits, and caps the open connections per
// client address and in total; only a complete request is handed to a worker, which runs
// httplib's process_request on it once and hands a keep-alive connection back to the poller.
// Light routes (/health, /metrics, /v1/models) have their own small pool, so they are answered
// while every generation worker is busy. Linux only (epoll, POLLRDHUP).
#pragma once
#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace myriad::serve {

struct ConnectionLimits {
  int max_connections = 2048;          // open connections in total; over it: 503 and close
  int max_per_client = 256;            // open connections per client address; over it: 429
  double header_timeout = 10;          // seconds for a request's header block (from its 1st byte)
  double body_timeout = 30;            // seconds for its body (after the header block)
  double idle_timeout = 5;             // keep-alive: seconds to wait for the next request
  size_t max_header_bytes = 16 << 10;  // larger header blocks: 431
  size_t max_body_bytes = 1 << 20;     // larger bodies: 413, before they are read
  int workers = 64;                    // generation workers (requests served at once)
  int light_workers = 2;               // workers for /health, /metrics and /v1/models
};

// Connection-level events for /metrics: "per_client_cap", "total_cap", "header_timeout",
// "body_timeout", "too_large", "bad_request" -> count.
struct ConnectionStats {
  int64_t open = 0;
  std::map<std::string, int64_t> errors;
};

class FrontServer : public httplib::Server {
 public:
  explicit FrontServer(ConnectionLimits limits);
  ~FrontServer() override;
  // After stop(): closes the connections the poller holds and joins the worker pools.
  // Idempotent.
  void close_connections();
  ConnectionStats stats() const;

  // The socket of the request the calling thread is serving (-1 outside a request): handlers
  // keep it to notice a client that went away (peer_closed).
  static int current_socket();
  // Called while serving a request: the connection closes after this answer.
  static void close_after_response();

 private:
  bool process_and_close_socket(socket_t sock) override;  // on accept: to the poller
  bool serve_one(httplib::Stream& strm, bool close_connection, bool& connection_closed);
  struct Poller;
  friend struct Poller;
  std::unique_ptr<Poller> p_;
};

// Whether the peer of a connected socket has closed its side (cheap, non-blocking: one poll).
// A client that sent its whole request and then shut down or closed counts as gone, like nginx.
bool peer_closed(int fd);

}  // namespace myriad::serve
