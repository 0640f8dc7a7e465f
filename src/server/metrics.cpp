#include "server/metrics.hpp"

#include <algorithm>
#include <cstdio>

namespace deepfuse::server {

namespace {

std::string number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, double value, const std::string& labels = "") {
  out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::write(std::string& out, const std::string& name) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    sample(out, name + "_bucket", static_cast<double>(cumulative), "le=\"" + number(bounds_[i]) + "\"");
  }
  sample(out, name + "_bucket", static_cast<double>(count_), "le=\"+Inf\"");
  sample(out, name + "_sum", sum_);
  sample(out, name + "_count", static_cast<double>(count_));
}

Metrics::Metrics()
    : ttft_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      itl_({0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
            0.4, 0.5, 0.75, 1, 2.5}),
      e2e_({0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480}) {}

void Metrics::request_finished(const std::string& finish_reason) {
  std::lock_guard lock(mutex_);
  ++finished_[finish_reason];
}

void Metrics::request_rejected(int status) {
  std::lock_guard lock(mutex_);
  ++rejected_[status];
}

void Metrics::prompt_tokens(int count) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += count;
}

void Metrics::generated_token() {
  std::lock_guard lock(mutex_);
  ++generated_tokens_;
}

void Metrics::time_to_first_token(double seconds) {
  std::lock_guard lock(mutex_);
  ttft_.observe(seconds);
}

void Metrics::inter_token_latency(double seconds) {
  std::lock_guard lock(mutex_);
  itl_.observe(seconds);
}

void Metrics::request_latency(double seconds) {
  std::lock_guard lock(mutex_);
  e2e_.observe(seconds);
}

void Metrics::set_backend(const BackendGauges& gauges) {
  std::lock_guard lock(mutex_);
  backend_ = gauges;
}

std::string Metrics::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  header(out, "deepfuse_requests_total", "counter", "Sequences finished, by finish reason (stop, length, cancelled, error).");
  for (const char* reason : {"stop", "length", "cancelled", "error"}) {
    const auto it = finished_.find(reason);
    sample(out, "deepfuse_requests_total", it == finished_.end() ? 0.0 : static_cast<double>(it->second),
           std::string("finish_reason=\"") + reason + "\"");
  }
  header(out, "deepfuse_requests_rejected_total", "counter", "Requests answered with an error status, by status.");
  for (const auto& [status, count] : rejected_)
    sample(out, "deepfuse_requests_rejected_total", static_cast<double>(count), "status=\"" + std::to_string(status) + "\"");
  header(out, "deepfuse_prompt_tokens_total", "counter", "Prompt tokens of admitted sequences.");
  sample(out, "deepfuse_prompt_tokens_total", static_cast<double>(prompt_tokens_));
  header(out, "deepfuse_generation_tokens_total", "counter", "Tokens generated.");
  sample(out, "deepfuse_generation_tokens_total", static_cast<double>(generated_tokens_));
  header(out, "deepfuse_time_to_first_token_seconds", "histogram", "From a sequence's arrival to its first token.");
  ttft_.write(out, "deepfuse_time_to_first_token_seconds");
  header(out, "deepfuse_inter_token_latency_seconds", "histogram", "Between consecutive tokens of a sequence.");
  itl_.write(out, "deepfuse_inter_token_latency_seconds");
  header(out, "deepfuse_request_latency_seconds", "histogram", "From a sequence's arrival to its last token.");
  e2e_.write(out, "deepfuse_request_latency_seconds");
  header(out, "deepfuse_sequences_running", "gauge", "Sequences holding a decode row.");
  sample(out, "deepfuse_sequences_running", backend_.running);
  header(out, "deepfuse_sequences_waiting", "gauge", "Sequences queued or preempted.");
  sample(out, "deepfuse_sequences_waiting", backend_.waiting);
  header(out, "deepfuse_kv_pages_total", "gauge", "KV cache pages (16 tokens each).");
  sample(out, "deepfuse_kv_pages_total", backend_.kv_pages_total);
  header(out, "deepfuse_kv_pages_used", "gauge", "KV pages referenced by a sequence.");
  sample(out, "deepfuse_kv_pages_used", backend_.kv_pages_used);
  header(out, "deepfuse_kv_pages_cached", "gauge", "Unreferenced KV pages the prefix cache keeps (evictable).");
  sample(out, "deepfuse_kv_pages_cached", backend_.kv_pages_cached);
  header(out, "deepfuse_preemptions_total", "counter", "Sequences preempted for KV pages (recomputed later).");
  sample(out, "deepfuse_preemptions_total", static_cast<double>(backend_.preemptions));
  header(out, "deepfuse_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.");
  sample(out, "deepfuse_prefix_cache_queries_total", static_cast<double>(backend_.prefix_cache_queried_tokens));
  header(out, "deepfuse_prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.");
  sample(out, "deepfuse_prefix_cache_hits_total", static_cast<double>(backend_.prefix_cache_hit_tokens));
  header(out, "deepfuse_mixed_steps_total", "counter",
         "Steps whose one forward pass carried prompt chunks and decode rows together (CUDA backend).");
  sample(out, "deepfuse_mixed_steps_total", static_cast<double>(backend_.mixed_steps));
  header(out, "deepfuse_spec_draft_tokens_total", "counter", "Draft tokens verified (speculative decoding).");
  sample(out, "deepfuse_spec_draft_tokens_total", static_cast<double>(backend_.draft_tokens));
  header(out, "deepfuse_spec_accepted_tokens_total", "counter", "Of those, tokens accepted.");
  sample(out, "deepfuse_spec_accepted_tokens_total", static_cast<double>(backend_.accepted_draft_tokens));
  return out;
}

}  // namespace deepfuse::server
