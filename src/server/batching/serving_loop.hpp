// The thread that owns the backend: request threads submit sequences and cancellations to its
// inbox; it applies them between steps, runs steps while there is work, and hands every token to
// the sink of its sequence. It also keeps the per-sequence timing behind the latency metrics.
//
// Sinks run on the loop's thread and must not block (the HTTP layer's push into a queue).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "server/batching/serving_backend.hpp"
#include "server/metrics.hpp"

namespace deepfuse::server {

using EventSink = std::function<void(const SequenceEvent&)>;

class ServingLoop {
 public:
  ServingLoop(std::unique_ptr<ServingBackend> backend, Metrics& metrics);
  ~ServingLoop();  // stops the thread; sequences still running get no more events

  const ServingBackend& backend() const { return *backend_; }

  SequenceKey new_key();
  // Queues the sequence; its events go to `sink` until one ends it (end != none).
  void submit(SequenceKey key, GenerationSpec spec, EventSink sink);
  // Drops the sequence; the sink gets one event ending it with `reason` (cancelled, or stop_token
  // when the request found a stop string in the text), unless it ended already.
  void cancel(SequenceKey key, SequenceEnd reason = SequenceEnd::cancelled);
  // Sequences submitted and not yet ended.
  int active() const;
  // Cancels every sequence (shutdown after the grace period).
  void cancel_all();

 private:
  struct Live {
    EventSink sink;
    std::chrono::steady_clock::time_point arrived, last_token;
    int tokens = 0;
  };
  void run();
  void apply_inbox();
  void deliver(const SequenceEvent& event);
  void end(SequenceKey key, SequenceEnd reason, const std::string& error = {});

  std::unique_ptr<ServingBackend> backend_;
  Metrics& metrics_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  struct Submission {
    SequenceKey key;
    GenerationSpec spec;
    EventSink sink;
    std::chrono::steady_clock::time_point arrived;
  };
  std::vector<Submission> submitted_;
  std::vector<std::pair<SequenceKey, SequenceEnd>> cancelled_;
  bool cancel_everything_ = false;
  bool stopping_ = false;
  SequenceKey next_key_ = 1;
  int active_ = 0;

  std::unordered_map<SequenceKey, Live> live_;  // loop thread only
  std::thread thread_;
};

}  // namespace deepfuse::server
