// The server's Prometheus metrics, in the text exposition format (version 0.0.4) that
// GET /metrics returns. Debian packages no Prometheus client library for C++, and the format for
// a handful of counters, gauges and histograms is a few lines, so it is written here.
//
// Counters and histograms are updated by the serving loop as tokens come out; the gauges are the
// backend's, copied after every step. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "server/batching/serving_backend.hpp"

namespace deepfuse::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // The _bucket, _sum and _count lines of metric `name`.
  void write(std::string& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  // A request ended (finish reason: "stop", "length", "cancelled", "error"), or was refused with `status`.
  void request_finished(const std::string& finish_reason);
  void request_rejected(int status);
  void prompt_tokens(int count);
  void generated_token();
  void time_to_first_token(double seconds);
  void inter_token_latency(double seconds);
  void request_latency(double seconds);
  void set_backend(const BackendGauges& gauges);

  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, uint64_t> finished_;   // by finish reason
  std::map<int, uint64_t> rejected_;           // by HTTP status
  uint64_t prompt_tokens_ = 0;
  uint64_t generated_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
  BackendGauges backend_;
};

}  // namespace deepfuse::server
