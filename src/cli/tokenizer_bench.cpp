// `deepfuse bench tokenizer --model DIR`: encoding speed in tokens/s over a few MB of text
// (a file, or generated mixed English/code/Unicode prose), single-threaded, as documents of a
// few KB each the way a server sees prompts.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/tokenizer.hpp"

namespace deepfuse::cli {
namespace {

struct TokenizerBenchArgs {
  std::string model_dir;
  std::string text_file;
  double megabytes = 4;
  std::string json_path;
};

// Deterministic text of about `bytes` bytes mixing what prompts contain.
std::string generate_text(size_t bytes) {
  static const char* const words[] = {
      "the", "model", "tokenizer", "inference", "kernel", "memory", "bandwidth", "we're", "don't", "it's",
      "attention", "decode", "latency", "throughput", "2024", "3.14159", "1,000,000", "naïve", "café", "Straße",
      "日本語", "中文", "テキスト", "😀", "👍🏽", "def", "return", "x**2", "{\"key\": [1, 2]}", "https://example.com/a?b=c",
      "supercalifragilistic", "QUICK", "Brown", "fox", "jumps", "over", "lazy", "dog", "—", "¿Qué?"};
  std::mt19937 rng(1234);
  std::uniform_int_distribution<size_t> pick(0, std::size(words) - 1);
  std::uniform_int_distribution<int> punctuation(0, 19);
  std::string text;
  text.reserve(bytes + 64);
  while (text.size() < bytes) {
    text += words[pick(rng)];
    const int p = punctuation(rng);
    text += p == 0 ? ".\n\n" : p == 1 ? ", " : p == 2 ? "\t" : p == 3 ? "\n    " : " ";
  }
  return text;
}

std::vector<std::string> split_documents(const std::string& text, size_t document_bytes) {
  std::vector<std::string> documents;
  for (size_t start = 0; start < text.size();) {
    size_t end = std::min(text.size(), start + document_bytes);
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;  // whole characters
    documents.push_back(text.substr(start, end - start));
    start = end;
  }
  return documents;
}

int run_tokenizer_bench(const TokenizerBenchArgs& args) {
  const Tokenizer tokenizer = Tokenizer::from_directory(args.model_dir);
  std::string text;
  if (!args.text_file.empty()) {
    std::ifstream in(args.text_file, std::ios::binary);
    DF_CHECK(in.good(), "cannot read " + args.text_file);
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  } else {
    text = generate_text(static_cast<size_t>(args.megabytes * 1024 * 1024));
  }
  const auto documents = split_documents(text, 4096);
  tokenizer.encode(documents.front());  // warm-up: regex JIT, allocations

  const auto start = std::chrono::steady_clock::now();
  size_t tokens = 0;
  for (const auto& document : documents) tokens += tokenizer.encode(document, false).size();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const double megabytes = static_cast<double>(text.size()) / (1024.0 * 1024.0);
  std::printf("%-12s %10s %12s %10s %14s %10s\n", "documents", "MB", "tokens", "seconds", "tokens/s", "MB/s");
  std::printf("%-12zu %10.2f %12zu %10.3f %14.0f %10.2f\n", documents.size(), megabytes, tokens, seconds,
              static_cast<double>(tokens) / seconds, megabytes / seconds);
  if (!args.json_path.empty()) {
    std::ofstream out(args.json_path);
    DF_CHECK(out.good(), "cannot write " + args.json_path);
    out << nlohmann::json{{"model", args.model_dir}, {"bytes", text.size()}, {"documents", documents.size()},
                          {"tokens", tokens}, {"seconds", seconds}, {"tokens_per_second", tokens / seconds}}
               .dump(2)
        << "\n";
  }
  return 0;
}

}  // namespace

void register_bench_tokenizer(CLI::App& bench, Action& action) {
  auto* command = bench.add_subcommand("tokenizer", "Encoding speed (tokens/s) of a model's tokenizer");
  auto args = std::make_shared<TokenizerBenchArgs>();
  command->add_option("--model", args->model_dir, "model directory with tokenizer.json")->required();
  command->add_option("--file", args->text_file, "text to encode (default: generated mixed text)");
  command->add_option("--mb", args->megabytes, "megabytes of generated text")->check(CLI::PositiveNumber);
  command->add_option("--json", args->json_path, "write the result as JSON to this file");
  command->callback([args, &action] { action = [args] { return run_tokenizer_bench(*args); }; });
}

}  // namespace deepfuse::cli
