// The HTTP face of `deepfuse serve` (cpp-httplib): the OpenAI routes, the Bearer key check, the
// OpenAI-style error bodies for every failure (httplib's own 404 and 413 included), server-sent
// events for streams, /health and /metrics. It listens before the model is loaded, so /health
// can say "loading"; generation routes answer 503 until set_ready() and again once
// begin_shutdown() is called.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "server/api/openai_request.hpp"
#include "server/batching/serving_loop.hpp"
#include "server/metrics.hpp"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace deepfuse::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port (bound_port() says which)
  std::string api_key;             // empty: no check
  int threads = 128;               // connections served at once (each stream holds one)
  size_t max_body_bytes = 8 << 20;
};

class HttpServer {
 public:
  HttpServer(HttpOptions options, Metrics& metrics);
  ~HttpServer();  // stops listening

  // Binds and starts serving on a thread of its own. Throws deepfuse::Error when the address is taken.
  void start();
  int bound_port() const { return port_; }

  // The model is loaded: generation routes serve from now on. `loop` and `model` must outlive the server.
  void set_ready(ServingLoop& loop, ServedModel model);
  // New generation requests get 503; running ones continue.
  void begin_shutdown() { shutting_down_ = true; }
  // Requests whose sequences or streams are still alive.
  int live_generations() const { return live_; }
  // Stops accepting connections and joins the listener.
  void stop();

 private:
  void routes();
  void generate(Endpoint endpoint, const httplib::Request& request, httplib::Response& response);

  HttpOptions options_;
  Metrics& metrics_;
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  int port_ = 0;
  std::atomic<bool> ready_{false};
  std::atomic<bool> shutting_down_{false};
  std::atomic<int> live_{0};
  ServingLoop* loop_ = nullptr;
  ServedModel model_;
};

}  // namespace deepfuse::server
