#include "server/batching/serving_loop.hpp"

#include <exception>

namespace deepfuse::server {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

const char* finish_label(SequenceEnd end) {
  switch (end) {
    case SequenceEnd::stop_token: return "stop";
    case SequenceEnd::max_tokens:
    case SequenceEnd::context_length: return "length";
    case SequenceEnd::cancelled: return "cancelled";
    default: return "error";
  }
}

}  // namespace

ServingLoop::ServingLoop(std::unique_ptr<ServingBackend> backend, Metrics& metrics)
    : backend_(std::move(backend)), metrics_(metrics) {
  metrics_.set_backend(backend_->gauges());
  thread_ = std::thread([this] { run(); });
}

ServingLoop::~ServingLoop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

SequenceKey ServingLoop::new_key() {
  std::lock_guard lock(mutex_);
  return next_key_++;
}

void ServingLoop::submit(SequenceKey key, GenerationSpec spec, EventSink sink) {
  {
    std::lock_guard lock(mutex_);
    submitted_.push_back({key, std::move(spec), std::move(sink), Clock::now()});
    ++active_;
  }
  wake_.notify_all();
}

void ServingLoop::cancel(SequenceKey key, SequenceEnd reason) {
  {
    std::lock_guard lock(mutex_);
    cancelled_.emplace_back(key, reason);
  }
  wake_.notify_all();
}

int ServingLoop::active() const {
  std::lock_guard lock(mutex_);
  return active_;
}

void ServingLoop::cancel_all() {
  {
    std::lock_guard lock(mutex_);
    cancel_everything_ = true;  // live_ belongs to the loop's thread: it cancels them there
  }
  wake_.notify_all();
}

void ServingLoop::end(SequenceKey key, SequenceEnd reason, const std::string& error) {
  const auto it = live_.find(key);
  if (it == live_.end()) return;
  SequenceEvent event;
  event.key = key;
  event.end = reason;
  event.error = error;
  it->second.sink(event);
  metrics_.request_finished(finish_label(reason));
  live_.erase(it);
  std::lock_guard lock(mutex_);
  --active_;
}

// Cancellations first (a sequence submitted and cancelled in the same round never starts).
void ServingLoop::apply_inbox() {
  std::vector<Submission> submitted;
  std::vector<std::pair<SequenceKey, SequenceEnd>> cancelled;
  bool everything = false;
  {
    std::lock_guard lock(mutex_);
    submitted.swap(submitted_);
    cancelled.swap(cancelled_);
    std::swap(everything, cancel_everything_);
  }
  for (Submission& s : submitted) {
    const int prompt = static_cast<int>(s.spec.prompt.size());
    live_.emplace(s.key, Live{std::move(s.sink), s.arrived, s.arrived, 0});
    try {
      backend_->add(s.key, std::move(s.spec));
      metrics_.prompt_tokens(prompt);
    } catch (const std::exception& e) {
      end(s.key, SequenceEnd::failed, e.what());
    }
  }
  if (everything)
    for (const auto& [key, live] : live_) cancelled.emplace_back(key, SequenceEnd::cancelled);
  for (const auto& [key, reason] : cancelled) {
    if (live_.count(key) == 0) continue;  // ended already
    backend_->cancel(key);
    end(key, reason);
  }
}

void ServingLoop::deliver(const SequenceEvent& event) {
  const auto it = live_.find(event.key);
  if (it == live_.end()) return;
  Live& live = it->second;
  const Clock::time_point now = Clock::now();
  if (event.id >= 0) {
    metrics_.generated_token();
    if (live.tokens == 0) metrics_.time_to_first_token(seconds_between(live.arrived, now));
    else metrics_.inter_token_latency(seconds_between(live.last_token, now));
    live.last_token = now;
    ++live.tokens;
  }
  live.sink(event);
  if (event.end == SequenceEnd::none) return;
  metrics_.request_latency(seconds_between(live.arrived, now));
  metrics_.request_finished(finish_label(event.end));
  live_.erase(it);
  std::lock_guard lock(mutex_);
  --active_;
}

void ServingLoop::run() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || !submitted_.empty() || !cancelled_.empty() || cancel_everything_ || backend_->has_work();
      });
      if (stopping_) return;
    }
    apply_inbox();
    if (!backend_->has_work()) {
      metrics_.set_backend(backend_->gauges());
      continue;
    }
    try {
      for (const SequenceEvent& event : backend_->step()) deliver(event);
    } catch (const std::exception& e) {
      // A failed step leaves the backend's state unknown: end everything it holds, keep serving.
      std::vector<SequenceKey> keys;
      for (const auto& [key, live] : live_) keys.push_back(key);
      for (const SequenceKey key : keys) {
        try {
          backend_->cancel(key);
        } catch (const std::exception&) {  // the backend is broken; the sequence ends regardless
        }
        end(key, SequenceEnd::failed, e.what());
      }
    }
    metrics_.set_backend(backend_->gauges());
  }
}

}  // namespace deepfuse::server
