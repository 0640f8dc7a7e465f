#include "server/http/http_server.hpp"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <string>

#include "deepfuse/error.hpp"
#include "server/api_error.hpp"
#include "server/http/generation.hpp"

namespace deepfuse::server {

namespace {

void send_error(httplib::Response& response, const ApiError& error) {
  response.status = error.status;
  response.set_content(to_wire(error.body()), "application/json");
}

// SSE framing: one `data:` event per chunk.
void append_event(std::string& events, const std::string& data) {
  events += "data: ";
  events += data;
  events += "\n\n";
}

}  // namespace

HttpServer::HttpServer(HttpOptions options, Metrics& metrics)
    : options_(std::move(options)), metrics_(metrics), server_(std::make_unique<httplib::Server>()) {
  const int threads = options_.threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(options_.max_body_bytes);
  // httplib's default sets SO_REUSEPORT, with which a second server on the same port binds too and
  // the kernel splits connections between the two. SO_REUSEADDR alone: a restart can rebind at
  // once, a second server fails with "address in use".
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  server_->set_keep_alive_max_count(1000);
  // Responses go out as several small writes (the headers, then the body or each stream chunk).
  // With Nagle's algorithm a write waits for the ACK of the one before, and a client on a
  // kept-alive connection delays that ACK by up to 40 ms: the first token of a stream, or a
  // whole small response, arrived that much later (docs/server.md, "First-token latency").
  server_->set_tcp_nodelay(true);
  routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::routes() {
  httplib::Server& s = *server_;
  s.set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (options_.api_key.empty() || request.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (request.get_header_value("Authorization") == "Bearer " + options_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(response, ApiError(401, "Incorrect API key provided (send it as 'Authorization: Bearer KEY')",
                                  std::nullopt, "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own refusals (no route, body too large, ...) get OpenAI's error body too.
  s.set_error_handler([this](const httplib::Request& request, httplib::Response& response) {
    metrics_.request_rejected(response.status);
    if (!response.body.empty()) return;
    if (response.status == 404)
      return send_error(response, ApiError(404, "Unknown endpoint: " + request.method + " " + request.path,
                                           std::nullopt, "not_found"));
    if (response.status == 413)
      return send_error(response, ApiError(413, "The request body is larger than " +
                                                    std::to_string(options_.max_body_bytes) + " bytes",
                                           std::nullopt, "request_too_large"));
    send_error(response, ApiError(response.status, "HTTP error " + std::to_string(response.status)));
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& response, std::exception_ptr error) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(response, ApiError(500, what, std::nullopt, std::nullopt, "server_error"));
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    const char* state = shutting_down_ ? "shutting_down" : ready_ ? "ok" : "loading";
    response.status = ready_ && !shutting_down_ ? 200 : 503;
    response.set_content(std::string("{\"status\": \"") + state + "\"}", "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics_.render(), "text/plain; version=0.0.4");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    if (!ready_) return send_error(response, ApiError(503, "the model is loading", std::nullopt, std::nullopt, "server_error"));
    const ResponseHeader header = make_response_header(Endpoint::completions, model_.name);
    const json list = {{"object", "list"},
                       {"data", json::array({{{"id", model_.name},
                                              {"object", "model"},
                                              {"created", header.created},
                                              {"owned_by", "deepfuse"},
                                              {"max_model_len", model_.max_context}}})}};
    response.set_content(to_wire(list), "application/json");
  });
  s.Post("/v1/completions", [this](const httplib::Request& request, httplib::Response& response) {
    generate(Endpoint::completions, request, response);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& request, httplib::Response& response) {
    generate(Endpoint::chat_completions, request, response);
  });
}

void HttpServer::generate(Endpoint endpoint, const httplib::Request& request, httplib::Response& response) {
  std::shared_ptr<Generation> generation;
  bool stream = false;
  try {
    if (shutting_down_) throw ApiError(503, "the server is shutting down", std::nullopt, std::nullopt, "server_error");
    if (!ready_) throw ApiError(503, "the model is loading", std::nullopt, std::nullopt, "server_error");
    OpenAiRequest parsed = parse_openai_request(endpoint, request.body, model_);
    loop_->backend().check(parsed.spec);
    stream = parsed.stream;
    generation = std::make_shared<Generation>(*loop_, std::move(parsed), model_, live_);
    if (!stream) {
      response.set_content(to_wire(generation->complete()), "application/json");
      return;
    }
  } catch (const ApiError& error) {
    return send_error(response, error);
  } catch (const deepfuse::Error& error) {
    return send_error(response, ApiError(400, error.what()));
  }
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream",
      [generation](size_t, httplib::DataSink& sink) {
        std::vector<json> chunks;
        const bool over = generation->next_chunks(std::chrono::milliseconds(1000), chunks);
        // Everything ready goes out in one write (one HTTP chunk, one segment). An SSE comment
        // when nothing came for a second: a client that went away shows up as a failed write,
        // and its sequences are cancelled.
        std::string events = chunks.empty() && !over ? ": keep-alive\n\n" : "";
        for (const json& chunk : chunks) append_event(events, to_wire(chunk));
        if (over) append_event(events, "[DONE]");
        if (!events.empty() && !sink.write(events.data(), events.size())) return false;
        if (over) sink.done();
        return true;
      },
      [generation](bool success) {
        if (!success) generation->cancel();
      });
}

void HttpServer::start() {
  port_ = options_.port == 0 ? server_->bind_to_any_port(options_.host)
                             : (server_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  DF_CHECK(port_ > 0, "serve: cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                          " (address in use or not available)");
  listener_ = std::thread([this] { server_->listen_after_bind(); });
}

void HttpServer::set_ready(ServingLoop& loop, ServedModel model) {
  loop_ = &loop;
  model_ = std::move(model);
  ready_ = true;
}

void HttpServer::stop() {
  if (!listener_.joinable()) return;
  server_->stop();
  listener_.join();
}

}  // namespace deepfuse::server
