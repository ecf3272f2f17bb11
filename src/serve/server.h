// The OpenAI-compatible HTTP server (docs/SERVING.md) on cpp-httplib: /v1/chat/completions and
// /v1/completions (JSON or SSE streams), /v1/models, /health and Prometheus /metrics, in front of
// one infer::Engine. Each HTTP worker thread submits its request to the engine and waits for the
// events the engine thread pushes; a stream whose client went away is cancelled in the engine.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "infer/engine.h"
#include "serve/connections.h"
#include "serve/protocol.h"

namespace myriad::serve {

struct ServeConfig {
  std::string host = "127.0.0.1";
  int port = 8000;               // 0: any free port (see Server::port)
  Limits limits;                 // limits.model is the id clients must send
  int threads = 64;              // HTTP worker threads (requests served at once)
  ConnectionLimits connections;  // caps and timeouts of the connection front (connections.h);
                                 // its workers and max_body_bytes come from the fields here
  std::string api_key;           // non-empty: /v1/* need "Authorization: Bearer <api_key>"
  double ping_seconds = 5;       // SSE comment after this long without tokens (finds gone clients)
  // Token ids that end a reply besides the tokenizer's eos (generation_config.json's
  // eos_token_id, e.g. K3's <|end_of_msg|>); ignore_eos turns them off too.
  std::vector<int32_t> stop_tokens{};
};

// The token ids of a rendered chat prompt: bos when the template asks for it, then the parts
// (special tokens only from the template's own text).
std::vector<int32_t> prompt_ids(const data::Tokenizer& tok, const Prompt& p);

class Server {
 public:
  Server(infer::Engine& engine, const data::Tokenizer& tokenizer, ChatTemplate chat_template,
         ServeConfig config);
  ~Server();  // shutdown(0)
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and serves on a background thread; returns the bound port. Throws when it cannot bind.
  int start();
  // Graceful stop: new requests get 503, running ones get up to grace_seconds to finish, the rest
  // are cancelled; then the listener closes. Idempotent; blocks until the server has stopped.
  void shutdown(double grace_seconds);
  std::string metrics() const;  // the /metrics text

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace myriad::serve
