// The HTTP server in-process on an ephemeral port, driven by httplib::Client: health, models,
// chat and completions (blocking and SSE; the streamed deltas equal the blocking text for greedy
// decoding), forced tool calls, errors over HTTP, /metrics counters, a client that disconnects
// mid-stream (its request is cancelled in the engine and later requests succeed), graceful
// shutdown, a 64-client streaming load test with an RSS bound, and (when
// MYRIAD_OPENAI_CHECK_PYTHON names a python) the official openai client via
// tools/reference/openai_client_check.py.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "infer/engine.h"
#include "serve/server.h"
#include "serve_test_util.h"

using namespace myriad;
using namespace myriad::serve;
using json = nlohmann::json;

namespace {

struct Env {
  model::Decoder model = model::Decoder::load(test::model_dir());
  data::Tokenizer tok = data::Tokenizer::load(test::model_dir() + "/tokenizer.model");
  infer::Engine engine{model, tok, engine_config()};
  Server server{engine, tok, ChatTemplate::from_model_dir(test::model_dir()), serve_config()};
  int port = server.start();

  static infer::EngineConfig engine_config() {
    infer::EngineConfig c;
    c.max_batch = 16;
    c.cache_budget_bytes = 256ll << 20;
    c.block_tokens = 64;
    c.prefill_chunk = 256;
    c.max_context = 4096;
    return c;
  }
  static ServeConfig serve_config() {
    ServeConfig c;
    c.port = 0;
    c.threads = 80;
    c.ping_seconds = 0.5;
    c.limits.model = "tiny";
    c.limits.max_body_bytes = 64 << 10;
    c.limits.max_tokens = 4000;
    c.limits.context = 4096;
    return c;
  }
};

Env& env() {
  static Env e;
  return e;
}

httplib::Client client(int port = 0) {
  httplib::Client c("127.0.0.1", port ? port : env().port);
  c.set_read_timeout(120, 0);
  return c;
}

json post(const std::string& path, const json& body, int expect = 200) {
  auto c = client();
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(r) << "no response";
  if (!r) return {};
  EXPECT_EQ(r->status, expect) << r->body;
  return json::parse(r->body);
}

// The data lines of an SSE body; the last must be [DONE].
std::vector<json> sse_events(const std::string& body, bool& done) {
  std::vector<json> out;
  done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.empty() || ev[0] == ':') continue;  // comments (pings)
    EXPECT_TRUE(ev.starts_with("data: ")) << ev;
    EXPECT_FALSE(done) << "data after [DONE]";
    if (ev == "data: [DONE]")
      done = true;
    else
      out.push_back(json::parse(ev.substr(6)));
  }
  return out;
}

std::vector<json> stream(const std::string& path, json body, int expect = 200) {
  body["stream"] = true;
  auto c = client();
  auto r = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(r) << httplib::to_string(r.error());
  if (!r) return {};
  EXPECT_EQ(r->status, expect);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  bool done = false;
  auto ev = sse_events(r->body, done);
  EXPECT_TRUE(done) << "stream did not end with [DONE]";
  return ev;
}

json chat_body(const std::string& user, int max_tokens) {
  return {{"model", "tiny"},
          {"messages",
           {{{"role", "system"}, {"content", "You are terse."}},
            {{"role", "user"}, {"content", user}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

// Value of one Prometheus sample line ("name{labels} value"), 0 when absent.
double metric(const std::string& text, const std::string& sample) {
  const size_t at = text.find("\n" + sample + " ");
  if (at == std::string::npos) return 0;
  return std::stod(text.substr(at + sample.size() + 2));
}

std::string metrics_text() {
  auto c = client();
  auto r = c.Get("/metrics");
  EXPECT_TRUE(r && r->status == 200);
  return r ? r->body : "";
}

void wait_engine_idle() {
  for (int i = 0; i < 3000; ++i) {
    const auto s = env().engine.stats();
    if (s.running == 0 && s.waiting == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "engine still busy";
}

// A raw TCP connection to the server from a chosen loopback address (the per-client caps count
// addresses): for clients that send part of a request, hang up, or pipeline.
struct Raw {
  int fd = -1;
  explicit Raw(int port, const char* from = "127.0.0.1") {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, from, &a.sin_addr);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0)
      close();
  }
  Raw(Raw&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Raw& operator=(Raw&& o) noexcept {
    close();
    fd = std::exchange(o.fd, -1);
    return *this;
  }
  ~Raw() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  bool send(const std::string& s) {
    for (size_t off = 0; off < s.size();) {
      const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // What arrives within `seconds`, until the server closes or `done` says the text is complete.
  std::string read(double seconds, const std::function<bool(const std::string&)>& done = {}) {
    std::string out;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    char buf[65536];
    while (fd >= 0 && !(done && done(out))) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            until - std::chrono::steady_clock::now())
                            .count();
      pollfd p{fd, POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) break;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  // One whole response (a Content-Length body) within `seconds`.
  std::string response(double seconds) {
    return read(seconds, [](const std::string& r) {
      const size_t h = r.find("\r\n\r\n");
      if (h == std::string::npos) return false;
      const size_t cl = r.find("Content-Length: ");
      return cl != std::string::npos && cl < h &&
             r.size() >= h + 4 + std::stoul(r.substr(cl + 16, h - cl - 16));
    });
  }
};

std::string http_post(const std::string& path, const std::string& body,
                      const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Bytes as C-escaped text, for messages.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    char buf[8];
    if (ch >= 32 && ch < 127 && ch != '\\')
      out += static_cast<char>(ch);
    else
      std::snprintf(buf, sizeof buf, "\\x%02x", ch), out += buf;
  }
  return out;
}

int status_of(const std::string& response) {
  return response.starts_with("HTTP/1.1 ") ? std::atoi(response.c_str() + 9) : 0;
}

// The JSON body of a raw response (null when it has none).
json body_of(const std::string& response) {
  const size_t h = response.find("\r\n\r\n");
  return h == std::string::npos ? json() : json::parse(response.substr(h + 4), nullptr, false);
}

// Waits (bounded) until /metrics on `port` satisfies `ok`; returns the last text.
std::string wait_metrics(int port, const std::function<bool(const std::string&)>& ok,
                         double seconds = 10) {
  std::string m;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    auto c = client(port);
    auto r = c.Get("/metrics");
    if (r && r->status == 200) {
      m = r->body;
      if (ok(m)) return m;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < until);
  return m;
}

// Seconds /health takes on a fresh connection (a large value when it fails).
double health_seconds(int port, double timeout = 5) {
  const auto t0 = std::chrono::steady_clock::now();
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(std::chrono::duration<double>(timeout));
  c.set_read_timeout(std::chrono::duration<double>(timeout));
  auto r = c.Get("/health");
  if (!r || r->status != 200) return 1e9;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// How much a second round of the same load may grow the resident set (allocator slack); a
// per-request leak would exceed it. AddressSanitizer keeps freed blocks in a quarantine of up to
// 256 MiB, so its builds are allowed that much more (they grew 58-74 MiB; LeakSanitizer checks
// leaks there).
#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kRssAllowance = (64ll + 256) << 20;
#else
constexpr int64_t kRssAllowance = 64ll << 20;
#endif

}  // namespace

TEST(Server, HealthModelsAndUnknownRoutes) {
  auto c = client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  const json list = json::parse(m->body);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "tiny");
  EXPECT_EQ(list["data"][0]["object"], "model");
  auto one = c.Get("/v1/models/tiny");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  auto missing = c.Get("/v1/models/gpt-9");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["code"], "model_not_found");
  auto nowhere = c.Get("/v2/nothing");
  ASSERT_TRUE(nowhere);
  EXPECT_EQ(nowhere->status, 404);
  EXPECT_EQ(json::parse(nowhere->body)["error"]["code"], "unknown_url");
}

TEST(Server, ChatStreamingEqualsBlocking) {
  const json body = chat_body("Say something about the city.", 24);
  const json r = post("/v1/chat/completions", body);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_TRUE(r["id"].get<std::string>().starts_with("chatcmpl-"));
  EXPECT_EQ(r["model"], "tiny");
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  ASSERT_TRUE(choice["message"]["content"].is_string());
  const std::string finish = choice["finish_reason"];
  EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
  const json& u = r["usage"];
  EXPECT_GT(u["prompt_tokens"].get<int>(), 5);
  EXPECT_GE(u["completion_tokens"].get<int>(), 1);
  EXPECT_LE(u["completion_tokens"].get<int>(), 24);
  EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());

  json sbody = body;
  sbody["stream_options"] = {{"include_usage", true}};
  const auto ev = stream("/v1/chat/completions", sbody);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text, sfinish;
  for (const auto& e : ev) {
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (e["choices"].empty()) continue;  // the usage chunk
    const json& c = e["choices"][0];
    if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) sfinish = c["finish_reason"];
  }
  EXPECT_EQ(text, choice["message"]["content"].get<std::string>());
  EXPECT_EQ(sfinish, finish);
  EXPECT_TRUE(ev.back()["choices"].empty());
  EXPECT_EQ(ev.back()["usage"], u);

  // Logprobs: one entry per generated token, the alternatives best first.
  json lbody = body;
  lbody["logprobs"] = true;
  lbody["top_logprobs"] = 2;
  const json l = post("/v1/chat/completions", lbody);
  const json& content = l["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), l["usage"]["completion_tokens"].get<size_t>());
  for (const auto& t : content) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(),
              t["top_logprobs"][1]["logprob"].get<double>());
  }
}

TEST(Server, CompletionsBlockingStreamingAndEcho) {
  const json body = {{"model", "tiny"},
                     {"prompt", "the cat likes"},
                     {"max_tokens", 12},
                     {"temperature", 0},
                     {"logprobs", 2}};
  const json r = post("/v1/completions", body);
  EXPECT_EQ(r["object"], "text_completion");
  const std::string text = r["choices"][0]["text"];
  const int n = r["usage"]["completion_tokens"];
  EXPECT_GE(n, 1);
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(n));
  for (const auto& x : lp["token_logprobs"]) EXPECT_LE(x.get<double>(), 0.0);
  EXPECT_LE(lp["top_logprobs"][0].size(), 2u);

  std::string streamed;
  for (const auto& e : stream("/v1/completions", body)) streamed += e["choices"][0]["text"];
  EXPECT_EQ(streamed, text);

  json echo = body;
  echo["echo"] = true;
  echo.erase("logprobs");
  EXPECT_EQ(post("/v1/completions", echo)["choices"][0]["text"], "the cat likes" + text);
}

TEST(Server, ForcedToolChoiceReturnsToolCalls) {
  json body = chat_body("What is the weather in Paris?", 16);
  body["tools"] = {
      {{"type", "function"},
       {"function",
        {{"name", "get_weather"},
         {"description", "Current weather for a city"},
         {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}},
      {{"type", "function"}, {"function", {{"name", "search"}}}}};
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const json r = post("/v1/chat/completions", body);
  const json& choice = r["choices"][0];
  // "length" when max_tokens cut the call before its closing tag (partial arguments, as OpenAI
  // returns them), else "tool_calls".
  const std::string want = choice["finish_reason"];
  EXPECT_TRUE(want == "tool_calls" || (want == "length" && r["usage"]["completion_tokens"] == 16))
      << r.dump();
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_TRUE(call["function"]["arguments"].is_string());
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_"));

  // Streaming: one tool_calls delta with the name, then the same finish_reason.
  const auto ev = stream("/v1/chat/completions", body);
  std::string name, finish;
  for (const auto& e : ev) {
    const json& c = e["choices"][0];
    if (c["delta"].contains("tool_calls")) name = c["delta"]["tool_calls"][0]["function"]["name"];
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(finish, want);

  // "required" always yields a call to one of the tools.
  body["tool_choice"] = "required";
  const json q = post("/v1/chat/completions", body);
  const std::string qf = q["choices"][0]["finish_reason"];
  EXPECT_TRUE(qf == "tool_calls" || (qf == "length" && q["usage"]["completion_tokens"] == 16))
      << q.dump();
  const std::string qn = q["choices"][0]["message"]["tool_calls"][0]["function"]["name"];
  EXPECT_TRUE(qn == "get_weather" || qn == "search") << qn;

  // History with a tool call and a tool result is accepted.
  body["messages"].push_back(
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", call["id"]}, {"type", "function"}, {"function", call["function"]}}}}});
  body["messages"].push_back(
      {{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "12 degrees"}});
  body["tool_choice"] = "none";
  const json h = post("/v1/chat/completions", body);
  EXPECT_FALSE(h["choices"][0]["message"].contains("tool_calls"));
}

TEST(Server, BadRequestsAnswerJsonAndServerKeepsServing) {
  auto c = client();
  const auto check = [&](const std::string& body, int status, const std::string& code) {
    auto r = c.Post("/v1/chat/completions", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << body.substr(0, 100);
    const json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.contains("error")) << r->body;
    EXPECT_EQ(e["error"]["code"], code.empty() ? json(nullptr) : json(code));
    EXPECT_TRUE(e["error"]["type"].is_string());
  };
  check("{oops", 400, "");
  check(R"({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})", 404,
        "model_not_found");
  check(R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_p": 2})", 400,
        "invalid_value");
  check(std::string(R"({"model": "tiny", "messages": [{"role": "user", "content": ")") +
            std::string(70 << 10, 'a') + "\"}]}",
        413, "request_too_large");
  // Prompt + max_tokens over the context.
  std::string lots;
  for (int i = 0; i < 600; ++i) lots += "the quiet road sees a robot. ";
  check(json({{"model", "tiny"},
              {"messages", {{{"role", "user"}, {"content", lots}}}},
              {"max_tokens", 3000}})
            .dump(),
        400, "context_length_exceeded");
  EXPECT_EQ(post("/v1/chat/completions", chat_body("still there?", 4))["object"],
            "chat.completion");
}

TEST(Server, MetricsCountersMove) {
  const std::string a = metrics_text();
  for (const char* name :
       {"myriad_generated_tokens_total", "myriad_decode_tokens_per_second", "myriad_queue_length",
        "myriad_running_requests", "myriad_cache_bytes_used", "myriad_cache_bytes_budget"})
    EXPECT_NE(a.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  const std::string ok = R"(myriad_requests_total{route="/v1/chat/completions",status="200"})";
  const std::string bad = R"(myriad_requests_total{route="/v1/chat/completions",status="400"})";
  post("/v1/chat/completions", chat_body("count me", 6));
  post("/v1/chat/completions", json{{"model", "tiny"}}, 400);
  const std::string b = metrics_text();
  EXPECT_EQ(metric(b, ok), metric(a, ok) + 1);
  EXPECT_EQ(metric(b, bad), metric(a, bad) + 1);
  EXPECT_GT(metric(b, "myriad_generated_tokens_total"), metric(a, "myriad_generated_tokens_total"));
  EXPECT_GT(metric(b, "myriad_cache_bytes_budget"), 0);
}

TEST(Server, ClientDisconnectCancelsTheRequest) {
  wait_engine_idle();
  const std::string before = metrics_text();
  const int64_t gen0 = env().engine.stats().generated_tokens;
  json body = chat_body("Tell me a very long story.", 3000);
  body["stream"] = true;
  body["ignore_eos"] = true;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    chunks += static_cast<int>(std::count(d, d + n, '\n'));
    return chunks < 8;  // hang up after a few events
  };
  auto c = client();
  auto r = c.send(req);
  EXPECT_FALSE(r);  // the client cancelled
  // The server notices at its next write; wait (bounded) until it has counted the cancellation.
  const double cancelled0 = metric(before, "myriad_generations_cancelled_total");
  double cancelled = cancelled0;
  for (int i = 0; i < 3000 && cancelled == cancelled0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    cancelled = metric(metrics_text(), "myriad_generations_cancelled_total");
  }
  EXPECT_EQ(cancelled, cancelled0 + 1);
  wait_engine_idle();
  EXPECT_LT(env().engine.stats().generated_tokens - gen0, 3000);
  // Later requests are served.
  EXPECT_EQ(post("/v1/chat/completions", chat_body("hello again", 4))["object"], "chat.completion");
}

// Non-streaming clients that give up (their timeout fired and they closed the socket) are
// cancelled within a decode step or so, and their cache pages are freed: the engine callback
// looks at the client's socket.
TEST(Server, BlockingClientsThatGoAwayAreCancelled) {
  wait_engine_idle();
  const std::string before = metrics_text();
  const int64_t gen0 = env().engine.stats().generated_tokens;
  std::vector<Raw> conns;
  for (int i = 0; i < 4; ++i) {
    json b = chat_body("Tell me a very long story, number " + std::to_string(i), 3000);
    b["ignore_eos"] = true;
    conns.emplace_back(env().port);
    ASSERT_TRUE(conns.back().send(http_post("/v1/chat/completions", b.dump())));
  }
  for (int i = 0; i < 3000 && env().engine.stats().running < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(env().engine.stats().running, 4);
  conns.clear();  // the four clients hang up
  const double c0 = metric(before, "myriad_generations_cancelled_total");
  const std::string after = wait_metrics(
      env().port,
      [&](const std::string& m) {
        return metric(m, "myriad_running_requests") == 0 &&
               metric(m, "myriad_cache_bytes_used") == 0 &&
               metric(m, "myriad_generations_cancelled_total") == c0 + 4;
      },
      5);
  EXPECT_EQ(metric(after, "myriad_running_requests"), 0);
  EXPECT_EQ(metric(after, "myriad_cache_bytes_used"), 0);
  EXPECT_EQ(metric(after, "myriad_generations_cancelled_total"), c0 + 4);
  EXPECT_LT(env().engine.stats().generated_tokens - gen0, 4 * 3000);
}

// 300 connections that send a partial request and then nothing hold no worker: /health and a
// chat request from another client are answered at once.
TEST(Server, PartialRequestsDoNotHoldWorkers) {
  ServeConfig cfg = Env::serve_config();
  cfg.threads = 16;
  Server s(env().engine, env().tok, ChatTemplate::default_template(), cfg);
  const int port = s.start();
  std::vector<Raw> idle;
  for (int i = 0; i < 300; ++i) {
    idle.emplace_back(port, "127.0.0.2");
    idle.back().send(i % 2 ? "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"
                           : "GET /hea");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(health_seconds(port), 1.0);
  auto c = client(port);
  c.set_read_timeout(30, 0);
  auto r =
      c.Post("/v1/chat/completions", chat_body("are you there?", 4).dump(), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(health_seconds(port), 1.0);
}

// Caps and deadlines of the connection front: each answer is an OpenAI-style JSON error.
TEST(Server, ConnectionCapsTimeoutsAndSizeLimits) {
  ServeConfig cfg = Env::serve_config();
  cfg.connections.max_per_client = 4;
  cfg.connections.max_connections = 7;
  cfg.connections.header_timeout = 0.5;
  cfg.connections.body_timeout = 0.5;
  cfg.connections.max_header_bytes = 4096;
  Server s(env().engine, env().tok, ChatTemplate::default_template(), cfg);
  const int port = s.start();
  const auto expect_error = [](const std::string& resp, int status, const std::string& code) {
    EXPECT_EQ(status_of(resp), status) << resp.substr(0, 200);
    const json e = body_of(resp);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << resp.substr(0, 200);
    EXPECT_EQ(e["error"]["code"], code);
    EXPECT_FALSE(e["error"]["message"].get<std::string>().empty());
  };
  {
    // Per client address: the fifth connection from 127.0.0.3 gets 429; others are served.
    std::vector<Raw> held;
    for (int i = 0; i < 4; ++i) held.emplace_back(port, "127.0.0.3");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Raw fifth(port, "127.0.0.3");
    expect_error(fifth.response(2), 429, "rate_limit_exceeded");
    // In total: three more from other addresses fill the seven; the next gets 503.
    for (int i = 0; i < 3; ++i) held.emplace_back(port, "127.0.0.4");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Raw eighth(port, "127.0.0.5");
    expect_error(eighth.response(2), 503, "too_many_connections");
    const std::string m = s.metrics();  // not over HTTP: a /metrics connection would be refused
    EXPECT_EQ(metric(m, R"(myriad_connection_errors_total{reason="per_client_cap"})"), 1);
    EXPECT_EQ(metric(m, R"(myriad_connection_errors_total{reason="total_cap"})"), 1);
    EXPECT_EQ(metric(m, "myriad_open_connections"), 7);
  }
  // The held connections are closed by their header deadline or by the client; then all is open.
  wait_metrics(port,
               [](const std::string& m) { return metric(m, "myriad_open_connections") <= 1; });
  EXPECT_LT(health_seconds(port), 1.0);
  {
    Raw head(port);  // headers that never finish
    head.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
    expect_error(head.response(3), 408, "request_timeout");
    Raw body(port);  // a body that never finishes
    body.send(http_post("/v1/completions", std::string(100, ' ')).substr(0, 120));
    expect_error(body.response(3), 408, "request_timeout");
    Raw silent(port);  // nothing at all
    expect_error(silent.response(3), 408, "request_timeout");
  }
  {
    Raw big(port);  // a header block over the limit
    big.send("GET /health HTTP/1.1\r\nX-Junk: " + std::string(5000, 'x') + "\r\n\r\n");
    expect_error(big.response(3), 431, "request_header_too_large");
    Raw large(port);  // a body over the limit: 413 as soon as the headers say so
    large.send(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{\"a\":");
    expect_error(large.response(3), 413, "request_too_large");
    Raw bad(port);
    bad.send("POST /v1/completions HTTP/1.1\r\nContent-Length: 12x\r\n\r\n");
    const std::string r = bad.response(3);
    EXPECT_EQ(status_of(r), 400);
    EXPECT_TRUE(body_of(r).contains("error")) << r;
  }
  const std::string after = wait_metrics(port, [](const std::string& t) {
    return metric(t, R"(myriad_connection_errors_total{reason="header_timeout"})") >= 2;
  });
  EXPECT_EQ(metric(after, R"(myriad_connection_errors_total{reason="body_timeout"})"), 1);
  EXPECT_EQ(metric(after, R"(myriad_connection_errors_total{reason="too_large"})"), 2);
}

// Whatever bytes arrive, the answer (if any) is a 4xx with a JSON error body, and the server
// keeps serving.
TEST(Server, GarbageGets4xxJsonAndNeverStopsTheServer) {
  ServeConfig cfg = Env::serve_config();
  cfg.connections.header_timeout = 0.3;
  cfg.connections.body_timeout = 0.3;
  Server s(env().engine, env().tok, ChatTemplate::default_template(), cfg);
  const int port = s.start();
  const std::vector<std::string> fixed = {
      "GARBAGE\r\n\r\n",
      "GET\r\n\r\n",
      "GET /health HTTP/9.9\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
      "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
      "POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
      "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 4\r\n\r\nnull",
      std::string("GET /\0\x01\xff HTTP/1.1\r\n\r\n", 22),
  };
  std::mt19937 rng(7);
  std::vector<std::string> inputs = fixed;
  for (int i = 0; i < 100; ++i) {  // random bytes, some after a valid request line
    std::string junk(rng() % 600, '\0');
    for (char& ch : junk) ch = static_cast<char>(rng() % 256);
    if (i % 2) junk = "POST /v1/chat/completions HTTP/1.1\r\n" + junk + "\r\n\r\n";
    inputs.push_back(junk);
  }
  std::vector<Raw> conns;  // all at once (the per-client cap is 256)
  for (const std::string& in : inputs) {
    conns.emplace_back(port);
    conns.back().send(in);
  }
  int answered = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string& in = inputs[i];
    const std::string r = conns[i].response(2);
    if (r.empty()) continue;  // closed without an answer (e.g. nothing parsable yet, then 408)
    ++answered;
    const int status = status_of(r);
    EXPECT_TRUE(status >= 400 && status < 500) << status << " for " << printable(in) << "\n"
                                               << printable(r);
    const json e = body_of(r);
    EXPECT_TRUE(e.is_object() && e.contains("error") && e["error"]["message"].is_string())
        << printable(in) << "\n"
        << r;
  }
  EXPECT_GT(answered, static_cast<int>(fixed.size()) - 1);
  EXPECT_LT(health_seconds(port), 1.0);
}

// Keep-alive, pipelined requests and a chunked request body go through the front's buffering.
TEST(Server, KeepAlivePipeliningAndChunkedBodies) {
  Raw c(env().port);
  const std::string models = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(c.send(models + health));
  std::string both = c.read(
      5, [](const std::string& r) { return r.find(R"({"status":"ok"})") != std::string::npos; });
  EXPECT_EQ(status_of(both), 200);
  EXPECT_NE(both.find(R"("object":"list")"), std::string::npos) << both;
  EXPECT_NE(both.find(R"({"status":"ok"})"), std::string::npos) << both;
  // The same connection, a chunked completion request.
  const std::string body =
      json({{"model", "tiny"}, {"prompt", "the cat"}, {"max_tokens", 3}}).dump();
  char size[16];
  std::snprintf(size, sizeof size, "%zx", body.size() - 10);
  ASSERT_TRUE(
      c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
             "application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
             std::string(size) + "\r\n" + body.substr(0, body.size() - 10) + "\r\na\r\n" +
             body.substr(body.size() - 10) + "\r\n0\r\n\r\n"));
  const std::string r = c.response(30);
  EXPECT_EQ(status_of(r), 200) << r;
  EXPECT_EQ(body_of(r)["object"], "text_completion") << r;
}

// The hardening load test: 200 concurrent clients (a third hang up mid-generation, streaming or
// not) while 300 sockets sit idle after a partial request. The rest see no errors, /health
// answers within a second throughout, every hang-up is counted as a cancelled generation, no
// cache page stays in use and memory stays flat from one round to the next.
TEST(Server, LoadTest200ClientsWithHangupsAndIdleSockets) {
  constexpr int kClients = 200, kIdle = 300;
  ServeConfig cfg = Env::serve_config();
  cfg.threads = 64;
  cfg.connections.header_timeout = 600;  // the idle sockets stay for the whole test
  cfg.connections.max_per_client = 256;
  // No stop strings: the random model writes the <|end|> marker now and then, which would end a
  // hang-up request on its own before its client leaves.
  ChatTemplate tmpl = ChatTemplate::from_model_dir(test::model_dir());
  tmpl.stop.clear();
  Server s(env().engine, env().tok, tmpl, cfg);
  const int port = s.start();
  const auto t_start = std::chrono::steady_clock::now();
  std::vector<Raw> idle;
  for (int i = 0; i < kIdle; ++i) {
    idle.emplace_back(port, "127.0.0.2");
    idle.back().send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app");
  }
  std::atomic<bool> stop{false};
  std::atomic<int> health_failures{0};
  double worst_health = 0;
  std::thread watcher([&] {
    while (!stop) {
      const double t = health_seconds(port, 3);
      worst_health = std::max(worst_health, t);
      if (t > 1.0) ++health_failures;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::atomic<int> hangups{0};
  std::mutex why_m;
  std::string why;  // one error, for the message
  const auto round = [&] {
    std::atomic<int> errors{0}, completed{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kClients; ++i)
      threads.emplace_back([&, i] {
        const bool streaming = i % 2 == 1;
        if (i % 3 == 0) {  // hangs up mid-generation
          json b = chat_body("a long story " + std::to_string(i), 3000);
          b["ignore_eos"] = true;
          b["stream"] = streaming;
          Raw c(port);
          if (!c.send(http_post("/v1/chat/completions", b.dump()))) return void(++errors);
          if (streaming)  // until a few tokens have arrived (or a bounded wait)
            c.read(60, [](const std::string& r) {
              size_t n = 0;
              for (size_t at = r.find("data: "); at != std::string::npos;
                   at = r.find("data: ", at + 1))
                ++n;
              return n >= 4;  // the role chunk and three tokens
            });
          else
            std::this_thread::sleep_for(std::chrono::milliseconds(200 + 50 * (i % 13)));
          ++hangups;
          return;
        }
        json b = chat_body("client " + std::to_string(i) + " says hi", 8);
        b["stream"] = streaming;
        auto c = client(port);
        auto r = c.Post("/v1/chat/completions", b.dump(), "application/json");
        if (!r || r->status != 200) {
          std::lock_guard lock(why_m);
          why = r ? std::to_string(r->status) + " " + r->body : httplib::to_string(r.error());
          return void(++errors);
        }
        if (streaming) {
          bool done = false;
          sse_events(r->body, done);
          if (!done) return void(++errors);
        } else if (json::parse(r->body)["object"] != "chat.completion") {
          return void(++errors);
        }
        ++completed;
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(errors.load(), 0) << "e.g. " << why;
    EXPECT_EQ(completed.load(), kClients - (kClients + 2) / 3);
  };
  round();  // warm-up: thread stacks, arena and cache pages reach their working size
  wait_engine_idle();
  // Until the hung-up requests still queued for a worker have been seen to and closed: the
  // next round's 200 connections plus those would pass the per-client cap.
  wait_metrics(
      port,
      [](const std::string& m) {
        return metric(m, "myriad_open_connections") == 256 + 1 &&
               metric(m, "myriad_queue_length") == 0;
      },
      60);
  wait_engine_idle();
  const int64_t rss0 = rss_bytes();
  round();
  // Hung-up requests still queued for a worker are cancelled when a worker takes them up: on a
  // loaded machine that can take a while (bounded here by a minute).
  const auto end = wait_metrics(
      port,
      [&](const std::string& m) {
        return metric(m, "myriad_running_requests") == 0 &&
               metric(m, "myriad_cache_bytes_used") == 0 &&
               metric(m, "myriad_generations_cancelled_total") == hangups.load();
      },
      60);
  const int64_t rss1 = rss_bytes();
  stop = true;
  watcher.join();
  EXPECT_EQ(metric(end, "myriad_running_requests"), 0);
  EXPECT_EQ(metric(end, "myriad_cache_bytes_used"), 0);
  EXPECT_EQ(metric(end, "myriad_generations_cancelled_total"), hangups.load());
  // The idle sockets under the cap are still held (by the poller), the rest were refused.
  const auto held = wait_metrics(
      port, [](const std::string& m) { return metric(m, "myriad_open_connections") == 256 + 1; });
  EXPECT_EQ(metric(held, "myriad_open_connections"), 256 + 1);  // + this /metrics request
  EXPECT_EQ(metric(held, R"(myriad_connection_errors_total{reason="per_client_cap"})"),
            kIdle - 256);
  EXPECT_EQ(health_failures.load(), 0);
  EXPECT_LT(worst_health, 1.0);
  idle.clear();
  const auto closed = wait_metrics(
      port, [](const std::string& m) { return metric(m, "myriad_open_connections") <= 1; });
  EXPECT_EQ(metric(closed, "myriad_open_connections"), 1);  // this /metrics request
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::printf(
      "[hardening load] 2 rounds x %d clients (%d hung up in all), %d idle sockets: worst /health "
      "%.3f s, RSS %.1f -> %.1f MiB, cache bytes used %.0f, running %.0f, cancelled %.0f, "
      "%.1f s\n",
      kClients, hangups.load(), kIdle, worst_health, rss0 / 1048576.0, rss1 / 1048576.0,
      metric(end, "myriad_cache_bytes_used"), metric(end, "myriad_running_requests"),
      metric(end, "myriad_generations_cancelled_total"), wall);
  EXPECT_LT(rss1 - rss0, kRssAllowance);
}

TEST(Server, LoadTest64StreamingClients) {
  constexpr int kClients = 64, kTokens = 12;
  const auto round = [&](std::vector<double>& latency) {
    std::atomic<int> errors{0}, completed{0};
    std::atomic<int64_t> tokens{0};
    std::vector<std::thread> threads;
    latency.assign(kClients, 0);
    for (int i = 0; i < kClients; ++i)
      threads.emplace_back([&, i] {
        const auto t0 = std::chrono::steady_clock::now();
        json body = chat_body("client " + std::to_string(i) + " says hi", kTokens);
        body["temperature"] = 0.8;
        body["seed"] = i;
        body["stream"] = true;
        body["stream_options"] = {{"include_usage", true}};
        auto c = client();
        auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
        if (!r || r->status != 200) return void(++errors);
        bool done = false;
        const auto ev = sse_events(r->body, done);
        if (!done || ev.empty() || !ev.back().contains("usage")) return void(++errors);
        tokens += ev.back()["usage"]["completion_tokens"].get<int64_t>();
        latency[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++completed;
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(completed.load(), kClients);
    return tokens.load();
  };
  std::vector<double> lat;
  round(lat);  // warm-up: thread stacks, arena and cache pages reach their working size
  wait_engine_idle();
  const int64_t rss0 = rss_bytes(), pool0 = env().engine.stats().pool_bytes;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t tokens = round(lat);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  wait_engine_idle();
  const int64_t rss1 = rss_bytes();
  const infer::EngineStats st = env().engine.stats();
  std::sort(lat.begin(), lat.end());
  std::printf(
      "[load] %d streaming clients, %lld tokens in %.2f s: %.1f tokens/s, latency p50 %.2f s "
      "p90 %.2f s max %.2f s; RSS %.1f -> %.1f MiB, cache page pool %.1f -> %.1f MiB\n",
      kClients, static_cast<long long>(tokens), s, tokens / s, lat[kClients / 2],
      lat[kClients * 9 / 10], lat.back(), rss0 / 1048576.0, rss1 / 1048576.0, pool0 / 1048576.0,
      st.pool_bytes / 1048576.0);
  // Finished requests hold no cache pages (cached prefixes are counted apart), and the page pool
  // (kept for reuse) stays within the budget.
  EXPECT_EQ(st.cache_bytes_used, 0);
  EXPECT_LE(st.pool_bytes, st.cache_bytes_budget);
  // After the warm-up, a second round of the same load grows memory by no more than the pages
  // the pool added and the allowance.
  EXPECT_LT((rss1 - rss0) - (st.pool_bytes - pool0), kRssAllowance);
}

TEST(Server, GracefulShutdownFinishesThenRefuses) {
  ServeConfig cfg = Env::serve_config();
  Server s(env().engine, env().tok, ChatTemplate::default_template(), cfg);
  const int port = s.start();
  // A blocking request in flight finishes within the grace period.
  json result;
  std::thread t([&] {
    auto c = client(port);
    auto r = c.Post("/v1/chat/completions", chat_body("finish me", 40).dump(), "application/json");
    if (r && r->status == 200) result = json::parse(r->body);
  });
  for (int i = 0; i < 3000 && env().engine.stats().running + env().engine.stats().waiting == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  s.shutdown(60);
  t.join();
  EXPECT_EQ(result["object"], "chat.completion");
  auto c = client(port);
  EXPECT_FALSE(c.Get("/health"));  // no longer listening
}

TEST(Server, ShutdownCancelsStreamsAfterGrace) {
  ServeConfig cfg = Env::serve_config();
  Server s(env().engine, env().tok, ChatTemplate::default_template(), cfg);
  const int port = s.start();
  std::string body;
  std::thread t([&] {
    json b = chat_body("a long one", 3000);
    b["stream"] = true;
    b["ignore_eos"] = true;
    auto c = client(port);
    auto r = c.Post("/v1/chat/completions", b.dump(), "application/json");
    if (r) body = r->body;
  });
  for (int i = 0; i < 3000 && env().engine.stats().running == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  s.shutdown(0);
  t.join();
  wait_engine_idle();
  // The stream ended early, with an error event and [DONE] or a cut connection.
  EXPECT_EQ(body.find("\"finish_reason\":\"length\""), std::string::npos);
}

TEST(Server, ApiKeyGuardsV1Routes) {
  ServeConfig cfg = Env::serve_config();
  cfg.api_key = "sesame";
  Server s(env().engine, env().tok, ChatTemplate::default_template(), cfg);
  auto c = client(s.start());
  auto denied = c.Get("/v1/models");
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->status, 401);
  EXPECT_EQ(json::parse(denied->body)["error"]["code"], "invalid_api_key");
  auto ok = c.Get("/v1/models", {{"Authorization", "Bearer sesame"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(Server, OfficialOpenAIClient) {
  const char* py = std::getenv("MYRIAD_OPENAI_CHECK_PYTHON");
  if (!py || !*py)
    GTEST_SKIP() << "set MYRIAD_OPENAI_CHECK_PYTHON to a python (the script installs openai)";
  const std::string cmd = std::string(py) +
                          " " MYRIAD_SOURCE_DIR
                          "/tools/reference/openai_client_check.py http://127.0.0.1:" +
                          std::to_string(env().port) + "/v1 tiny";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}
