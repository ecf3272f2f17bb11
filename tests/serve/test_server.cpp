// The HTTP server in-process on an ephemeral port, driven by httplib::Client: health, models,
// chat and completions (blocking and SSE; the streamed deltas equal the blocking text for greedy
// decoding), forced tool calls, errors over HTTP, /metrics counters, a client that disconnects
// mid-stream (its request is cancelled in the engine and later requests succeed), graceful
// shutdown, a 64-client streaming load test with an RSS bound, and (when
// MYRIAD_OPENAI_CHECK_PYTHON names a python) the official openai client via
// tools/reference/openai_client_check.py.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
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

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

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
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_TRUE(call["function"]["arguments"].is_string());
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_"));

  // Streaming: one tool_calls delta with the name, then finish_reason tool_calls.
  const auto ev = stream("/v1/chat/completions", body);
  std::string name, finish;
  for (const auto& e : ev) {
    const json& c = e["choices"][0];
    if (c["delta"].contains("tool_calls")) name = c["delta"]["tool_calls"][0]["function"]["name"];
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(finish, "tool_calls");

  // "required" always yields a call to one of the tools.
  body["tool_choice"] = "required";
  const json q = post("/v1/chat/completions", body);
  EXPECT_EQ(q["choices"][0]["finish_reason"], "tool_calls");
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
  const int64_t rss0 = rss_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t tokens = round(lat);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  wait_engine_idle();
  const int64_t rss1 = rss_bytes();
  std::sort(lat.begin(), lat.end());
  std::printf(
      "[load] %d streaming clients, %lld tokens in %.2f s: %.1f tokens/s, latency p50 %.2f s "
      "p90 %.2f s max %.2f s; RSS %.1f -> %.1f MiB\n",
      kClients, static_cast<long long>(tokens), s, tokens / s, lat[kClients / 2],
      lat[kClients * 9 / 10], lat.back(), rss0 / 1048576.0, rss1 / 1048576.0);
  // After the warm-up, a second round of the same load must not grow memory by more than a
  // small allowance (allocator slack); a per-request leak of the caches would exceed it.
  EXPECT_LT(rss1 - rss0, 64ll << 20);
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
