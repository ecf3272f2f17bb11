#include "serve/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "core/error.h"
#include "ops/shape.h"
#include "serve/connections.h"
#include "vision/image.h"

namespace myriad::serve {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One request in the engine: the engine thread pushes events, the HTTP thread pops them.
struct Flight {
  std::mutex m;
  std::condition_variable cv;
  std::deque<infer::TokenEvent> events;
  std::atomic<bool> gone{false};  // the client left: the next callback cancels
  uint64_t id = 0;
  int fd = -1;  // the client's socket while the request is in flight (guarded by m), else -1

  // Whether the client went away (its socket says so); m held.
  bool check_gone() {
    if (!gone && fd >= 0 && peer_closed(fd)) gone = true;
    return gone;
  }
  bool client_gone() {
    std::lock_guard lock(m);
    return check_gone();
  }

  // Waits up to `timeout` for events; moves them out.
  std::deque<infer::TokenEvent> take(std::chrono::duration<double> timeout) {
    std::unique_lock lock(m);
    cv.wait_for(lock, timeout, [&] { return !events.empty(); });
    return std::exchange(events, {});
  }
};

// What a handler prepared for the engine, and how to answer.
struct Job {
  bool chat = true;
  ChatRequest req;  // chat: messages, tools, tool choice
  Prompt prompt;    // chat: the rendered template
  std::vector<int32_t> ids;
  Tensor pixel_values;  // the request's images, processed for the model's tower
  std::vector<vision::Grid> grids;
  infer::SamplingParams sp;
  bool stream = false, include_usage = false, echo = false;
  std::string echo_text;  // completions with echo
  std::string id, model;
  int64_t created = 0;
  bool tools() const {
    return chat && !req.tools.empty() && req.tool_choice.mode != ToolChoice::None;
  }
  bool forced() const { return tools() && !prompt.forced_prefix.empty(); }
};

// Accumulated output of one request.
struct Output {
  std::string text;
  int64_t tokens = 0;
  std::vector<TokenLogprob> logprobs;
  std::string finish, error;
  bool done = false;
};

const char* kRoutes[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                         "/metrics"};

}  // namespace

struct Server::Impl {
  infer::Engine& engine;
  const data::Tokenizer& tok;
  ChatTemplate tmpl;
  ServeConfig cfg;
  FrontServer svr;
  std::thread listener;
  int port = 0;
  int listen_fd = -1;
  int64_t started = unix_now();
  std::atomic<bool> draining{false};
  std::mutex stop_m;
  bool stopped = false;

  std::mutex flights_m;
  std::map<uint64_t, std::shared_ptr<Flight>> flights;

  mutable std::mutex metrics_m;
  std::map<std::pair<std::string, int>, int64_t> requests;  // (route, status) -> count
  std::atomic<int64_t> prompt_tokens{0}, completion_tokens{0}, cancelled{0}, streams{0};
  std::atomic<int64_t> latency_us{0}, first_token_us{0}, first_token_n{0}, finished{0};

  Impl(infer::Engine& e, const data::Tokenizer& t, ChatTemplate ct, ServeConfig c)
      : engine(e), tok(t), tmpl(std::move(ct)), cfg(std::move(c)), svr(front_limits(cfg)) {}

  static ConnectionLimits front_limits(const ServeConfig& c) {
    ConnectionLimits l = c.connections;
    l.workers = c.threads;
    l.max_body_bytes = c.limits.max_body_bytes;
    return l;
  }

  // ---- engine side ----

  std::shared_ptr<Flight> launch(const Job& job) {
    if (draining) throw ApiError(503, "the server is shutting down", "", "", "server_error");
    auto f = std::make_shared<Flight>();
    f->fd = FrontServer::current_socket();
    infer::Request r{job.ids, job.sp, job.pixel_values, job.grids};
    try {
      // Every decode step looks at the client's socket: a client that went away cancels the
      // request at once, and its cache pages are freed.
      f->id = engine.submit(std::move(r), [f](const infer::TokenEvent& e) {
        bool keep;
        {
          std::lock_guard lock(f->m);
          f->events.push_back(e);
          keep = !f->check_gone();
        }
        f->cv.notify_one();
        return keep;
      });
    } catch (const std::invalid_argument& e) {
      throw ApiError(400, e.what(), "", "invalid_value");
    }
    std::lock_guard lock(flights_m);
    flights[f->id] = f;
    return f;
  }

  void land(Flight& f, const Job& job, const Output& out, Clock::time_point t0) {
    {
      std::lock_guard lock(flights_m);
      flights.erase(f.id);
    }
    {
      std::lock_guard lock(f.m);  // the socket closes (and its number is reused) after this
      f.fd = -1;
    }
    prompt_tokens += static_cast<int64_t>(job.ids.size());
    completion_tokens += out.tokens;
    if (!out.done || out.finish == "cancelled") ++cancelled;
    ++finished;
    latency_us += std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
  }

  // Folds events into out; returns the text they added.
  std::string absorb(const std::deque<infer::TokenEvent>& evs, Output& out, const Job& job) {
    std::string added;
    for (const auto& e : evs) {
      added += e.text;
      if (e.token >= 0) {
        ++out.tokens;
        if (job.sp.top_logprobs >= 0) {
          TokenLogprob lp{tok.decode({e.token}), e.logprob, {}};
          for (const auto& [id, l] : e.top) lp.top.emplace_back(tok.decode({id}), l);
          out.logprobs.push_back(std::move(lp));
        }
      }
      if (e.finished) {
        out.done = true;
        out.finish = e.finish_reason;
        out.error = e.error;
      }
    }
    out.text += added;
    return added;
  }

  // ---- request preparation ----

  void check_context(Job& job, const GenParams& p) {
    const int64_t n = static_cast<int64_t>(job.ids.size());
    const int64_t ctx = cfg.limits.context;
    const int64_t want = p.max_tokens.value_or(std::min(cfg.limits.max_tokens, ctx - n));
    if (n + want > ctx || want < 1)
      throw ApiError(400,
                     "This model's maximum context length is " + std::to_string(ctx) +
                         " tokens. However, you requested " +
                         std::to_string(n + std::max<int64_t>(want, 1)) + " tokens (" +
                         std::to_string(n) + " in the prompt, " +
                         std::to_string(std::max<int64_t>(want, 1)) +
                         " in the completion). Please reduce the length of the prompt or "
                         "completion.",
                     p.max_tokens ? "max_tokens"
                     : job.chat   ? "messages"
                                  : "prompt",
                     "context_length_exceeded");
    job.sp.max_tokens = want;
  }

  void sampling(Job& job, const GenParams& p) {
    auto& s = job.sp;
    s.temperature = p.temperature;
    s.top_k = p.top_k;
    s.top_p = p.top_p;
    s.min_p = p.min_p;
    s.repetition_penalty = p.repetition_penalty;
    s.presence_penalty = p.presence_penalty;
    s.frequency_penalty = p.frequency_penalty;
    s.seed = p.seed;
    s.stop = p.stop;
    s.ignore_eos = p.ignore_eos;
    if (!p.ignore_eos) s.stop_tokens = cfg.stop_tokens;
    s.top_logprobs = p.top_logprobs;
  }

  Job chat_job(const httplib::Request& http) {
    Job job;
    job.req = parse_chat_request(http.body, cfg.limits);
    job.prompt = render_chat(tmpl, job.req, images(job));
    job.ids = prompt_ids(tok, job.prompt);
    sampling(job, job.req.params);
    for (const auto& s : job.prompt.stop) job.sp.stop.push_back(s);
    check_context(job, job.req.params);
    job.stream = job.req.stream;
    job.include_usage = job.req.include_usage;
    job.id = new_id("chatcmpl-");
    job.model = job.req.model;
    job.created = unix_now();
    return job;
  }

  // Decodes and preprocesses the request's images for the model's tower (MODEL.md §10): their
  // pixels go on the job, their placeholder blocks (one <|media_pad|> per merged token) into the
  // prompt. A bad image is the client's error (400).
  std::vector<std::string> images(Job& job) {
    std::vector<std::string> blocks;
    std::vector<Tensor> pixels;
    const model::ModelConfig& mc = engine.model().config();
    for (size_t i = 0; i < job.req.messages.size(); ++i)
      for (const MessageImage& im : job.req.messages[i].images) {
        const std::string param = "messages[" + std::to_string(i) + "].content";
        if (!mc.vision)
          throw ApiError(400, "this model does not accept images (it has no vision tower)", param,
                         "image_input_not_supported");
        vision::Processed p;
        try {
          vision::DecodeOptions o;
          o.max_pixels = cfg.limits.max_image_pixels;
          p = vision::preprocess(vision::decode_image(im.bytes, o),
                                 vision::PreprocessOptions::from(*mc.vision));
        } catch (const Error& e) {
          throw ApiError(400, std::string("invalid image: ") + e.what(), param,
                         "invalid_image_format");
        }
        blocks.push_back(vision::image_block(p.tokens));
        pixels.push_back(p.pixel_values);
        job.grids.push_back(p.grid);
      }
    if (!pixels.empty()) job.pixel_values = ops::concat(pixels, 0);
    return blocks;
  }

  Job completion_job(const httplib::Request& http) {
    Job job;
    job.chat = false;
    CompletionRequest r = parse_completion_request(http.body, cfg.limits);
    if (r.prompt) {
      job.ids = tok.encode(*r.prompt);
      // An empty prompt starts a new document.
      if (job.ids.empty() && std::max(tok.eos(), tok.bos()) >= 0)
        job.ids = {tok.eos() >= 0 ? tok.eos() : tok.bos()};
      if (job.ids.empty()) throw ApiError(400, "the prompt is empty", "prompt");
      job.echo_text = *r.prompt;
    } else {
      for (int32_t id : r.prompt_ids)
        if (id >= tok.vocab_size())
          throw ApiError(400,
                         "token id " + std::to_string(id) + " is outside the vocabulary of " +
                             std::to_string(tok.vocab_size()),
                         "prompt");
      job.ids = r.prompt_ids;
      job.echo_text = tok.decode(r.prompt_ids);
    }
    sampling(job, r.params);
    check_context(job, r.params);
    job.stream = r.stream;
    job.include_usage = r.include_usage;
    job.echo = r.echo;
    job.id = new_id("cmpl-");
    job.model = r.model;
    job.created = unix_now();
    return job;
  }

  // ---- answers ----

  // The chat message of a finished request, and its finish reason.
  std::pair<ParsedOutput, std::string> chat_result(const Job& job, const Output& out) {
    if (job.forced())
      return {ParsedOutput{"",
                           {forced_tool_call(job.req, job.prompt.forced_prefix, out.text,
                                             tmpl.tool_format)}},
              // A call cut by max_tokens before its end marker: its arguments are partial.
              out.finish == "length" ? "length" : "tool_calls"};
    if (job.tools()) {
      ParsedOutput p = parse_tool_calls(out.text, tmpl.tool_format);
      if (!p.tool_calls.empty()) return {std::move(p), "tool_calls"};
      return {std::move(p), out.finish};
    }
    return {ParsedOutput{out.text, {}}, out.finish};
  }

  void answer_blocking(const Job& job, httplib::Response& res) {
    const auto t0 = Clock::now();
    auto f = launch(job);
    Output out;
    bool cancelling = false;
    while (!out.done) {
      absorb(f->take(std::chrono::milliseconds(100)), out, job);
      // Also while the request waits for admission, when the engine calls back with nothing.
      if (!out.done && !cancelling && f->client_gone()) {
        cancelling = true;
        engine.cancel(f->id);
      }
    }
    land(*f, job, out, t0);
    if (out.finish == "error") throw ApiError(500, "generation failed: " + out.error);
    if (f->gone)
      throw ApiError(499, "the client closed the connection", "", "client_closed_request");
    if (out.finish == "cancelled")
      throw ApiError(503, "the request was cancelled (the server is shutting down)", "", "",
                     "server_error");
    const Usage usage{static_cast<int64_t>(job.ids.size()), out.tokens};
    json body;
    if (job.chat) {
      auto [parsed, finish] = chat_result(job, out);
      body = chat_response(job.id, job.created, job.model, parsed, finish, usage,
                           job.sp.top_logprobs >= 0 ? chat_logprobs_json(out.logprobs) : json());
    } else {
      const std::string text = job.echo ? job.echo_text + out.text : out.text;
      body = completion_response(
          job.id, job.created, job.model, text, out.finish, usage,
          job.sp.top_logprobs >= 0
              ? completion_logprobs_json(out.logprobs, job.echo ? job.echo_text.size() : 0)
              : json());
    }
    res.set_content(dump(body), "application/json");
  }

  // SSE: the provider runs on the HTTP thread, waits for engine events and writes chunks.
  void answer_stream(Job job, httplib::Response& res) {
    struct State {
      Job job;
      std::shared_ptr<Flight> f;
      Output out;
      ToolStreamFilter filter;
      bool opened = false, landed = false;
      Clock::time_point t0 = Clock::now();
    };
    auto st = std::make_shared<State>();
    st->filter = ToolStreamFilter(tmpl.tool_format);
    st->job = std::move(job);
    st->f = launch(st->job);
    ++streams;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) {
          const Job& job = st->job;
          std::string buf;
          const auto chunk = [&](json delta, const std::string& finish, const json& lp) {
            buf += sse(
                job.chat ? chat_chunk(job.id, job.created, job.model, std::move(delta), finish, lp)
                         : completion_chunk(job.id, job.created, job.model,
                                            delta.get<std::string>(), finish, lp));
          };
          if (!st->opened) {
            st->opened = true;
            if (job.chat)
              chunk({{"role", "assistant"}, {"content", ""}}, "", nullptr);
            else if (job.echo)
              chunk(job.echo_text, "", nullptr);
          }
          // Events, or a ping after ping_seconds without any; the client's socket is looked at
          // every 100 ms meanwhile (a request waiting for admission gets no engine callbacks).
          std::deque<infer::TokenEvent> evs;
          const auto ping_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(cfg.ping_seconds));
          while (evs.empty()) {
            if (st->f->client_gone()) {
              engine.cancel(st->f->id);
              return false;
            }
            const auto left = ping_at - Clock::now();
            if (left <= Clock::duration::zero()) break;
            evs = st->f->take(std::min<Clock::duration>(left, std::chrono::milliseconds(100)));
          }
          if (evs.empty() && buf.empty()) buf = ": ping\n\n";
          const size_t lp0 = st->out.logprobs.size();
          const bool was_empty = st->out.tokens == 0;
          std::string text = absorb(evs, st->out, job);
          if (was_empty && st->out.tokens > 0) {
            first_token_us +=
                std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - st->t0)
                    .count();
            ++first_token_n;
          }
          json lp = nullptr;
          if (job.sp.top_logprobs >= 0 && st->out.logprobs.size() > lp0) {
            std::vector<TokenLogprob> part(st->out.logprobs.begin() + lp0, st->out.logprobs.end());
            lp = job.chat ? chat_logprobs_json(part) : completion_logprobs_json(part, 0);
          }
          if (job.forced())
            text.clear();
          else if (job.tools())
            text = st->filter.feed(text);
          if (!text.empty() || !lp.is_null()) {
            if (job.chat)
              chunk({{"content", text}}, "", lp);
            else
              chunk(text, "", lp);
          }
          if (st->out.done) {
            const auto& out = st->out;
            if (out.finish == "error" || out.finish == "cancelled") {
              const ApiError e =
                  out.finish == "error"
                      ? ApiError(500, "generation failed: " + out.error)
                      : ApiError(503, "the request was cancelled", "", "", "server_error");
              buf += sse(error_json(e));
            } else if (job.chat) {
              std::string finish = out.finish;
              std::vector<ToolCall> calls;
              if (job.forced()) {
                calls = {forced_tool_call(job.req, job.prompt.forced_prefix, out.text,
                                          tmpl.tool_format)};
              } else if (job.tools()) {
                ParsedOutput rest = st->filter.finish();
                if (!rest.content.empty()) chunk({{"content", rest.content}}, "", nullptr);
                calls = std::move(rest.tool_calls);
              }
              if (!calls.empty()) {
                chunk({{"tool_calls", tool_calls_json(calls, true)}}, "", nullptr);
                if (!(job.forced() && out.finish == "length")) finish = "tool_calls";
              }
              chunk(json::object(), finish, nullptr);
            } else {
              chunk("", out.finish, nullptr);
            }
            if (job.include_usage)
              buf += sse(usage_chunk(job.chat ? "chat.completion.chunk" : "text_completion", job.id,
                                     job.created, job.model,
                                     {static_cast<int64_t>(job.ids.size()), out.tokens}));
            buf += "data: [DONE]\n\n";
          }
          // A zero-length write would tell httplib that the stream ended.
          if (!buf.empty() && !sink.write(buf.data(), buf.size())) {
            st->f->gone = true;
            engine.cancel(st->f->id);
            return false;
          }
          if (st->out.done) {
            sink.done();
            finish_stream(*st->f, st->job, st->out, st->t0, st->landed);
          }
          return true;
        },
        [this, st](bool success) {
          if (!st->out.done) {
            st->f->gone = true;
            engine.cancel(st->f->id);
          }
          finish_stream(*st->f, st->job, st->out, st->t0, st->landed);
        });
  }

  void finish_stream(Flight& f, const Job& job, const Output& out, Clock::time_point t0,
                     bool& landed) {
    if (landed) return;
    landed = true;
    land(f, job, out, t0);
  }

  // ---- HTTP plumbing ----

  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(error_json(e)), "application/json");
  }

  template <typename Fn>
  httplib::Server::Handler guarded(Fn fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, ApiError(500, std::string("internal error: ") + e.what()));
      }
      count(req, res.status < 0 ? 200 : res.status);
    };
  }

  // Counted when the answer is decided, so a client that has its response sees it in /metrics.
  void count(const httplib::Request& req, int status) {
    std::string route = "other";
    for (const char* r : kRoutes)
      if (req.path == r) route = r;
    if (req.path.rfind("/v1/models/", 0) == 0) route = "/v1/models";
    std::lock_guard lock(metrics_m);
    ++requests[{route, status}];
  }

  json model_json() const {
    return {{"id", cfg.limits.model},
            {"object", "model"},
            {"created", started},
            {"owned_by", "myriad"}};
  }

  void routes() {
    svr.set_payload_max_length(cfg.limits.max_body_bytes);
    svr.set_socket_options([this](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_fd = sock;
    });
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (draining) {
        res.set_header("Connection", "close");
        send_error(res, ApiError(503, "the server is shutting down", "", "", "server_error"));
        count(req, 503);
        return httplib::Server::HandlerResponse::Handled;
      }
      if (!cfg.api_key.empty() && req.path.rfind("/v1/", 0) == 0 &&
          req.get_header_value("Authorization") != "Bearer " + cfg.api_key) {
        send_error(res, ApiError(401, "Incorrect API key provided.", "", "invalid_api_key"));
        count(req, 401);
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr.set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request& req, httplib::Response& res) {
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          if (res.status == 413)
            send_error(res, ApiError(413, "request body too large", "", "request_too_large"));
          else if (res.status == 404 || res.status == 405)
            send_error(res, ApiError(404, "Invalid URL (" + req.method + " " + req.path + ")", "",
                                     "unknown_url"));
          else if (res.status == 414)
            send_error(res, ApiError(414, "request URI too long"));
          else if (res.status == 400) {
            send_error(res, ApiError(400,
                                     "malformed HTTP request: the request line, a header or the "
                                     "chunked body could not be parsed"));
            FrontServer::close_after_response();  // where the next request starts is unsure
          } else
            send_error(res, ApiError(res.status, "the HTTP request could not be served"));
          count(req, res.status);
          return httplib::Server::HandlerResponse::Handled;
        }));

    svr.Get("/health", guarded([](const httplib::Request&, httplib::Response& res) {
              res.set_content(R"({"status":"ok"})", "application/json");
            }));
    svr.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
              res.set_content(metrics(), "text/plain; version=0.0.4");
            }));
    svr.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
              res.set_content(dump({{"object", "list"}, {"data", json::array({model_json()})}}),
                              "application/json");
            }));
    svr.Get(
        R"(/v1/models/(.+))", guarded([this](const httplib::Request& req, httplib::Response& res) {
          if (req.matches[1] != cfg.limits.model)
            throw ApiError(404, "The model `" + std::string(req.matches[1]) + "` does not exist.",
                           "model", "model_not_found");
          res.set_content(dump(model_json()), "application/json");
        }));
    const auto generate = [this](Job job, httplib::Response& res) {
      if (job.stream)
        answer_stream(std::move(job), res);
      else
        answer_blocking(job, res);
    };
    svr.Post("/v1/chat/completions",
             guarded([this, generate](const httplib::Request& req, httplib::Response& res) {
               generate(chat_job(req), res);
             }));
    svr.Post("/v1/completions",
             guarded([this, generate](const httplib::Request& req, httplib::Response& res) {
               generate(completion_job(req), res);
             }));
  }

  std::string metrics() const {
    const infer::EngineStats s = engine.stats();
    std::string m;
    const auto metric = [&](const char* name, const char* type, const char* help, auto value) {
      m += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + std::to_string(value) + "\n";
    };
    m += "# HELP myriad_requests_total HTTP requests by route and status.\n"
         "# TYPE myriad_requests_total counter\n";
    {
      std::lock_guard lock(metrics_m);
      for (const auto& [k, n] : requests)
        m += "myriad_requests_total{route=\"" + k.first + "\",status=\"" +
             std::to_string(k.second) + "\"} " + std::to_string(n) + "\n";
    }
    const ConnectionStats cs = svr.stats();
    metric("myriad_open_connections", "gauge", "Client connections open (idle ones included).",
           cs.open);
    m += "# HELP myriad_connection_errors_total Connections answered with an error and closed "
         "by the front (caps, timeouts, sizes).\n# TYPE myriad_connection_errors_total counter\n";
    for (const auto& [reason, n] : cs.errors)
      m += "myriad_connection_errors_total{reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
    metric("myriad_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
           prompt_tokens.load());
    metric("myriad_generated_tokens_total", "counter", "Tokens generated for finished requests.",
           completion_tokens.load());
    metric("myriad_generations_total", "counter", "Generations finished (any reason).",
           finished.load());
    metric("myriad_generations_cancelled_total", "counter",
           "Generations cancelled (client gone or shutdown).", cancelled.load());
    metric("myriad_streams_total", "counter", "Streaming (SSE) generations started.",
           streams.load());
    metric("myriad_generation_seconds_sum", "counter", "Summed generation wall time.",
           static_cast<double>(latency_us.load()) * 1e-6);
    metric("myriad_time_to_first_token_seconds_sum", "counter",
           "Summed time to the first streamed token.",
           static_cast<double>(first_token_us.load()) * 1e-6);
    metric("myriad_time_to_first_token_count", "counter", "Streams that got a first token.",
           first_token_n.load());
    metric("myriad_decode_tokens_per_second", "gauge", "Engine decode rate over the recent window.",
           s.decode_tokens_per_s);
    metric("myriad_queue_length", "gauge", "Requests waiting for admission.", s.waiting);
    metric("myriad_running_requests", "gauge", "Sequences being prefilled or decoded.", s.running);
    metric("myriad_cache_bytes_used", "gauge", "KV/state cache bytes in use.", s.cache_bytes_used);
    metric("myriad_cache_bytes_budget", "gauge", "KV/state cache budget in bytes.",
           s.cache_bytes_budget);
    metric("myriad_cache_bytes_reserved", "gauge", "Worst-case cache plans of admitted requests.",
           s.cache_bytes_reserved);
    metric("myriad_cache_bytes_peak", "gauge", "High-water mark of cache bytes used.",
           s.cache_bytes_peak);
    metric("myriad_engine_generated_tokens_total", "counter", "Tokens the engine generated.",
           s.generated_tokens);
    metric("myriad_engine_prompt_tokens_total", "counter", "Prompt tokens the engine prefilled.",
           s.prompt_tokens);
    return m;
  }

  void shutdown(double grace) {
    std::lock_guard stop_lock(stop_m);
    if (stopped) return;
    stopped = true;
    draining = true;
    const auto busy = [&] {
      std::lock_guard lock(flights_m);
      return !flights.empty();
    };
    const auto wait_idle = [&](double seconds) {
      const auto until = Clock::now() + std::chrono::duration<double>(seconds);
      while (busy() && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    };
    wait_idle(grace);
    {
      std::lock_guard lock(flights_m);
      for (const auto& [id, f] : flights) engine.cancel(id);
    }
    wait_idle(5.0);
    svr.stop();
    if (listener.joinable()) listener.join();
    svr.close_connections();
  }
};

std::vector<int32_t> prompt_ids(const data::Tokenizer& tok, const Prompt& p) {
  std::vector<data::TextPart> parts;
  for (const auto& part : p.parts) parts.push_back({part.text, part.trusted});
  std::vector<int32_t> ids = tok.encode_parts(parts);
  if (p.bos && tok.bos() >= 0) ids.insert(ids.begin(), tok.bos());
  return ids;
}

Server::Server(infer::Engine& engine, const data::Tokenizer& tokenizer, ChatTemplate chat_template,
               ServeConfig config)
    : impl_(
          std::make_unique<Impl>(engine, tokenizer, std::move(chat_template), std::move(config))) {
  impl_->routes();
}

Server::~Server() {
  shutdown(0);
}

int Server::start() {
  auto& s = *impl_;
  if (s.cfg.port == 0) {
    s.port = s.svr.bind_to_any_port(s.cfg.host);
  } else {
    s.port = s.svr.bind_to_port(s.cfg.host, s.cfg.port) ? s.cfg.port : -1;
  }
  if (s.port <= 0)
    throw std::runtime_error("cannot listen on " + s.cfg.host + ":" + std::to_string(s.cfg.port));
  // httplib 0.11 listens with a backlog of 5: a burst of clients would see dropped connections.
  ::listen(s.listen_fd, SOMAXCONN);
  s.listener = std::thread([&s] { s.svr.listen_after_bind(); });
  return s.port;
}

void Server::shutdown(double grace_seconds) {
  impl_->shutdown(grace_seconds);
}

std::string Server::metrics() const {
  return impl_->metrics();
}

}  // namespace myriad::serve
