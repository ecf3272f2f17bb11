#include "serve/connections.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "serve/protocol.h"

namespace myriad::serve {

namespace {

using Clock = std::chrono::steady_clock;

thread_local int tl_socket = -1;
thread_local bool tl_close = false;

// A connection the front holds: in the poller while its next request arrives, on a worker
// while that request is served.
struct Conn {
  int fd = -1;
  std::string peer;      // client address
  bool counted = false;  // counted against the caps (refused ones are not)
  std::string buf;       // bytes read and not served yet
  enum { Idle, Head, Body, Linger } phase = Head;
  Clock::time_point deadline;
  size_t head_end = 0;   // length of the header block (with its blank line)
  size_t need = 0;       // length of the request (header block + body) once known
  bool chunked = false;  // Transfer-Encoding: chunked: complete at the terminating chunk
  bool light = false;    // a light route: the light pool serves it
  bool eof = false;      // the client closed its side
  size_t served = 0;     // requests served on this connection
};

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t n = sizeof a;
  ip.clear();
  port = 0;
  auto* sa = reinterpret_cast<sockaddr*>(&a);
  if ((peer ? getpeername(fd, sa, &n) : getsockname(fd, sa, &n)) != 0) return;
  char buf[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &in->sin6_addr, buf, sizeof buf);
    port = ntohs(in->sin6_port);
  }
  ip = buf;
}

bool wait_for(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  int r;
  do r = ::poll(&p, 1, timeout_ms);
  while (r < 0 && errno == EINTR);
  return r > 0 && (p.revents & (events | POLLHUP | POLLERR));
}

int to_ms(time_t sec, time_t usec) {
  return static_cast<int>(sec * 1000 + usec / 1000);
}

// What process_request reads from and writes to: the request's bytes as the poller read them,
// then end of input (never the socket: a worker must not wait for a client; a POST without
// Content-Length thus has an empty body), and the socket for the answer.
class RequestStream final : public httplib::Stream {
 public:
  RequestStream(int fd, std::string bytes, int write_ms)
      : fd_(fd), bytes_(std::move(bytes)), write_ms_(write_ms) {}
  bool is_readable() const override { return pos_ < bytes_.size(); }
  bool is_writable() const override { return wait_for(fd_, POLLOUT, write_ms_); }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < bytes_.size()) {
      size = std::min(size, bytes_.size() - pos_);
      std::memcpy(ptr, bytes_.data() + pos_, size);
      pos_ += size;
      return static_cast<ssize_t>(size);
    }
    return 0;
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    return ::send(fd_, ptr, size, MSG_NOSIGNAL);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(fd_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(fd_, false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  int fd_;
  std::string bytes_;
  size_t pos_ = 0;
  int write_ms_;
};

const char* reason_phrase(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    default:
      return "Service Unavailable";
  }
}

// A whole HTTP response with an OpenAI-style error body; the connection closes after it.
std::string error_response(const ApiError& e) {
  const std::string body = error_json(e).dump();
  return "HTTP/1.1 " + std::to_string(e.status) + " " + reason_phrase(e.status) +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// Where the header block ends (after its blank line), or npos. CRLF only, as httplib reads it.
size_t header_end(const std::string& b) {
  const size_t at = b.find("\r\n\r\n");
  return at == std::string::npos ? at : at + 4;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// The values of one header in a header block (the request line skipped).
std::vector<std::string_view> header_values(std::string_view head, std::string_view name) {
  std::vector<std::string_view> out;
  size_t pos = head.find('\n');
  while (pos != std::string_view::npos && pos + 1 < head.size()) {
    const size_t end = head.find('\n', pos + 1);
    const std::string_view line = head.substr(
        pos + 1, end == std::string_view::npos ? std::string_view::npos : end - pos - 1);
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos && iequals(trim(line.substr(0, colon)), name))
      out.push_back(trim(line.substr(colon + 1)));
    pos = end;
  }
  return out;
}

// /health, /metrics and /v1/models[/id]: cheap answers the light pool gives.
bool light_route(std::string_view head) {
  const size_t sp = head.find(' ');
  if (sp == std::string_view::npos) return false;
  std::string_view target = head.substr(sp + 1);
  target = target.substr(0, target.find_first_of(" ?\r\n"));
  return target == "/health" || target == "/metrics" || target == "/v1/models" ||
         target.starts_with("/v1/models/");
}

}  // namespace

struct FrontServer::Poller {
  FrontServer& svr;
  const ConnectionLimits lim;
  int ep = -1, wake = -1;
  std::unique_ptr<httplib::ThreadPool> heavy, light;
  std::thread thread;

  mutable std::mutex m;  // guards what follows, up to `conns`
  bool stopping = false;
  std::deque<std::unique_ptr<Conn>> incoming;  // for the poller: new or kept-alive connections
  std::map<std::string, int> per_client;       // open connections per client address
  int64_t open = 0;
  std::map<std::string, int64_t> errors;

  std::unordered_map<int, std::unique_ptr<Conn>> conns;  // the poller thread's own

  Poller(FrontServer& s, ConnectionLimits l) : svr(s), lim(std::move(l)) {
    ep = epoll_create1(EPOLL_CLOEXEC);
    wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ep < 0 || wake < 0) throw std::runtime_error("epoll/eventfd failed");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wake;
    epoll_ctl(ep, EPOLL_CTL_ADD, wake, &ev);
    heavy = std::make_unique<httplib::ThreadPool>(static_cast<size_t>(std::max(1, lim.workers)));
    light =
        std::make_unique<httplib::ThreadPool>(static_cast<size_t>(std::max(1, lim.light_workers)));
    thread = std::thread([this] { run(); });
  }

  ~Poller() {
    ::close(ep);
    ::close(wake);
  }

  static Clock::time_point after(double seconds) {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

  // ---- any thread ----

  // A freshly accepted socket: counted, or answered 429/503 when over a cap.
  void admit(int fd) {
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    std::string peer;
    int port = 0;
    address_of(fd, true, peer, port);
    const char* over = nullptr;
    {
      std::lock_guard lock(m);
      if (open >= lim.max_connections)
        over = "total_cap";
      else if (per_client[peer] >= lim.max_per_client)
        over = "per_client_cap";
      if (over) {
        ++errors[over];
        if (per_client[peer] == 0) per_client.erase(peer);
      } else {
        ++open;
        ++per_client[peer];
        c->peer = peer;
        c->counted = true;
      }
    }
    if (over)
      refuse(*c, std::string(over) == "total_cap"
                     ? ApiError(503,
                                "the server has too many open connections (" +
                                    std::to_string(lim.max_connections) + "); retry later",
                                "", "too_many_connections", "server_error")
                     : ApiError(429,
                                "too many open connections from " + peer + " (at most " +
                                    std::to_string(lim.max_per_client) + ")",
                                "", "rate_limit_exceeded", "requests"));
    else
      c->deadline = after(lim.header_timeout);
    hand_over(std::move(c));
  }

  // Back to the poller (new, kept alive, or lingering); closed instead once stopping.
  void hand_over(std::unique_ptr<Conn> c) {
    {
      std::lock_guard lock(m);
      if (!stopping) {
        incoming.push_back(std::move(c));
        const uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(wake, &one, sizeof one);
        return;
      }
    }
    close_conn(std::move(c));
  }

  void close_conn(std::unique_ptr<Conn> c) {
    if (c->counted) {
      std::lock_guard lock(m);
      --open;
      if (--per_client[c->peer] <= 0) per_client.erase(c->peer);
    }
    ::close(c->fd);
  }

  // Answers an error and lets the client read it: no more reading requests, what it still
  // sends is drained for a second (closing with unread input would reset the connection and
  // could lose the answer), then the socket closes.
  void refuse(Conn& c, const ApiError& e) {
    const std::string r = error_response(e);
    [[maybe_unused]] auto n = ::send(c.fd, r.data(), r.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::shutdown(c.fd, SHUT_WR);
    c.phase = Conn::Linger;
    c.buf.clear();
    c.deadline = after(1.0);
  }

  // ---- the poller thread ----

  void run() {
    std::vector<epoll_event> evs(256);
    auto next_scan = Clock::now();
    for (;;) {
      const int n = epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), 50);
      std::deque<std::unique_ptr<Conn>> in;
      {
        std::lock_guard lock(m);
        if (stopping) break;
        in.swap(incoming);
      }
      for (auto& c : in) add(std::move(c));
      for (int i = 0; i < n; ++i) {
        const int fd = evs[i].data.fd;
        if (fd == wake) {
          uint64_t v;
          [[maybe_unused]] auto r = ::read(wake, &v, sizeof v);
        } else {
          readable(fd);
        }
      }
      if (Clock::now() >= next_scan) {
        expire();
        next_scan = Clock::now() + std::chrono::milliseconds(50);
      }
    }
    for (auto& [fd, c] : conns) close_conn(std::move(c));
    conns.clear();
  }

  void add(std::unique_ptr<Conn> c) {
    const int fd = c->fd;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) return close_conn(std::move(c));
    conns[fd] = std::move(c);
    advance(fd);  // a kept-alive connection may hold the next (pipelined) request already
  }

  void remove(int fd) {
    auto it = conns.find(fd);
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    close_conn(std::move(it->second));
    conns.erase(it);
  }

  void readable(int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    Conn& c = *it->second;
    char tmp[16384];
    // At most 256 KiB per wake-up, so one fast sender cannot starve the others.
    for (int i = 0; i < 16; ++i) {
      const ssize_t r = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
      if (r > 0) {
        if (c.phase != Conn::Linger) c.buf.append(tmp, static_cast<size_t>(r));
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c.eof = true;
      break;
    }
    if (c.phase == Conn::Linger) {
      if (c.eof) remove(fd);
      return;
    }
    if (advance(fd)) return;  // dispatched
    if (c.eof) remove(fd);
  }

  // Moves a connection on with what it has read; true when a request went to a worker.
  bool advance(int fd) {
    Conn& c = *conns.at(fd);
    if (c.phase == Conn::Linger) return false;
    if (c.phase == Conn::Idle) {
      c.buf.erase(0, std::min(c.buf.size(), c.buf.find_first_not_of("\r\n")));
      if (c.buf.empty()) return false;
      c.phase = Conn::Head;
      c.deadline = after(lim.header_timeout);
    }
    if (c.phase == Conn::Head) {
      const size_t end = header_end(c.buf);
      if (end == std::string::npos ? c.buf.size() > lim.max_header_bytes
                                   : end > lim.max_header_bytes) {
        fail(c, "too_large",
             ApiError(431,
                      "the request's header block is larger than " +
                          std::to_string(lim.max_header_bytes) + " bytes",
                      "", "request_header_too_large"));
        return false;
      }
      if (end == std::string::npos) return false;
      const std::string_view head(c.buf.data(), end);
      const auto te = header_values(head, "Transfer-Encoding");
      const auto cl = header_values(head, "Content-Length");
      c.head_end = end;
      c.chunked = !te.empty();
      c.light = light_route(head);
      size_t length = 0;
      if (c.chunked && (te.size() > 1 || !iequals(te[0], "chunked") || !cl.empty())) {
        fail(c, "bad_request",
             ApiError(400, "unsupported Transfer-Encoding (only chunked, without Content-Length)"));
        return false;
      }
      if (cl.size() > 1 ||
          (cl.size() == 1 && (cl[0].empty() || cl[0].size() > 18 ||
                              cl[0].find_first_not_of("0123456789") != std::string_view::npos))) {
        fail(c, "bad_request", ApiError(400, "invalid Content-Length header"));
        return false;
      }
      if (cl.size() == 1) length = std::stoull(std::string(cl[0]));
      if (length > lim.max_body_bytes) {
        fail(c, "too_large", ApiError(413, "request body too large", "", "request_too_large"));
        return false;
      }
      c.need = end + length;
      c.phase = Conn::Body;
      c.deadline = after(lim.body_timeout);
    }
    // Body.
    if (c.chunked) {
      const size_t body = c.buf.size() - c.head_end;
      const size_t last = c.buf.compare(c.head_end, 5, "0\r\n\r\n") == 0
                              ? c.head_end
                              : c.buf.find("\r\n0\r\n\r\n", c.head_end);
      if (last == std::string::npos) {
        if (body > lim.max_body_bytes + (64 << 10))
          fail(c, "too_large", ApiError(413, "request body too large", "", "request_too_large"));
        return false;
      }
      c.need = last + (last == c.head_end ? 5 : 7);
    }
    if (c.buf.size() < c.need) return false;
    dispatch(fd);
    return true;
  }

  void fail(Conn& c, const char* what, const ApiError& e) {
    {
      std::lock_guard lock(m);
      ++errors[what];
    }
    refuse(c, e);
  }

  void expire() {
    const auto now = Clock::now();
    std::vector<int> due;
    for (const auto& [fd, c] : conns)
      if (now >= c->deadline) due.push_back(fd);
    for (int fd : due) {
      Conn& c = *conns.at(fd);
      if (c.phase == Conn::Head || c.phase == Conn::Body) {
        const bool head = c.phase == Conn::Head;
        fail(c, head ? "header_timeout" : "body_timeout",
             ApiError(408,
                      head ? "the request's headers did not arrive in time"
                           : "the request's body did not arrive in time",
                      "", "request_timeout"));
      } else {
        remove(fd);  // idle keep-alive or lingering: closed quietly
      }
    }
  }

  // A complete request goes to a worker, the connection with it.
  void dispatch(int fd) {
    auto it = conns.find(fd);
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    Conn* c = it->second.release();
    conns.erase(it);
    std::string bytes = c->buf.substr(0, c->need);
    c->buf.erase(0, c->need);
    c->phase = Conn::Idle;
    (c->light ? light : heavy)->enqueue([this, c, bytes = std::move(bytes)]() mutable {
      serve(std::unique_ptr<Conn>(c), std::move(bytes));
    });
  }

  // ---- a worker ----

  void serve(std::unique_ptr<Conn> c, std::string bytes) {
    RequestStream s(c->fd, std::move(bytes),
                    to_ms(svr.write_timeout_sec_, svr.write_timeout_usec_));
    const bool last = ++c->served >= svr.keep_alive_max_count_ || !svr.is_running();
    bool closed = false;
    tl_socket = c->fd;
    tl_close = false;
    const bool ok = svr.serve_one(s, last, closed);
    tl_socket = -1;
    if (!ok || closed || last || tl_close) return close_conn(std::move(c));
    c->deadline = after(lim.idle_timeout);
    hand_over(std::move(c));
  }

  void stop() {
    {
      std::lock_guard lock(m);
      if (stopping) return;
      stopping = true;
      const uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(wake, &one, sizeof one);
    }
    thread.join();
    std::deque<std::unique_ptr<Conn>> rest;
    {
      std::lock_guard lock(m);
      rest.swap(incoming);
    }
    for (auto& c : rest) close_conn(std::move(c));
    heavy->shutdown();  // workers finish their requests; their connections then close
    light->shutdown();
  }
};

FrontServer::FrontServer(ConnectionLimits limits) {
  new_task_queue = [] { return new httplib::ThreadPool(2); };  // admission only: never blocks
  keep_alive_timeout_sec_ = std::max<time_t>(1, static_cast<time_t>(limits.idle_timeout));
  keep_alive_max_count_ = 100;
  p_ = std::make_unique<Poller>(*this, std::move(limits));
}

FrontServer::~FrontServer() {
  close_connections();
}

void FrontServer::close_connections() {
  p_->stop();
}

bool FrontServer::serve_one(httplib::Stream& strm, bool close_connection, bool& connection_closed) {
  return process_request(strm, close_connection, connection_closed, nullptr);
}

ConnectionStats FrontServer::stats() const {
  std::lock_guard lock(p_->m);
  return {p_->open, p_->errors};
}

int FrontServer::current_socket() {
  return tl_socket;
}

void FrontServer::close_after_response() {
  tl_close = true;
}

bool FrontServer::process_and_close_socket(socket_t sock) {
  p_->admit(sock);
  return true;
}

bool peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (!(p.revents & POLLIN)) return false;
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace myriad::serve
