// `deepfuse score`: one teacher-forced forward over the prompt's ids (given, or from --prompt or
// --chat through the tokenizer); per-token log-likelihood and perplexity, and with --json the
// full logits (the format parity checks and evaluations read). On the cuda backend the logits come
// from Engine::score, a prefill of all ids, in the same format.
#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cli/model_session.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/logprobs.hpp"

namespace deepfuse::cli {

namespace {

struct ScoreArgs {
  ModelArgs model;
  std::string json_path;
  bool compare_unquantized = false;
};

// --compare-unquantized: the same prompt on the checkpoint's own 16-bit weights, and how far the
// quantized next-token distributions are from those.
void print_quantization_cost(const ScoreArgs& args, const LoadedModel& quantized, std::span<const float> logits,
                             std::span<const int32_t> ids) {
  ModelArgs plain = args.model;
  plain.engine.quantize.clear();
  plain.engine.quantize_lm_head = false;
  LoadedModel original;
  original.config = quantized.config;
  original.backend = quantized.backend;
  load_weights(plain, original);
  const std::vector<float> reference = score_logits(original, ids);
  const NextTokenAgreement a = compare_next_token(reference, logits, static_cast<size_t>(quantized.config.vocab_size));
  std::printf("--quantize %s against the 16-bit weights: top-1 agreement %zu/%zu (%.1f%%), mean KL %.6g nats\n",
              args.model.engine.quantize.c_str(), a.top1_agree, a.positions,
              100.0 * static_cast<double>(a.top1_agree) / static_cast<double>(a.positions), a.mean_kl);
}

// log softmax(logits)[id], in double.
double log_probability(std::span<const float> logits, int32_t id) {
  double max_logit = logits[0];
  for (float v : logits) max_logit = std::max<double>(max_logit, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(v - max_logit);
  return logits[id] - max_logit - std::log(sum);
}

int run_score(const ScoreArgs& args) {
  DF_CHECK(!args.compare_unquantized || !args.model.engine.quantize.empty(), "--compare-unquantized needs --quantize fp8");
  std::vector<int32_t> ids;
  LoadedModel model = prepare_model(args.model, ids);
  load_weights(args.model, model);
  const std::vector<float> logits = score_logits(model, ids);
  const size_t vocab = model.config.vocab_size;

  // Written whole after the forward succeeded: a failure leaves no partial file behind.
  if (!args.json_path.empty()) {
    nlohmann::json out;
    out["input_ids"] = ids;
    out["logits"] = nlohmann::json::array();
    for (size_t t = 0; t < ids.size(); ++t)
      out["logits"].push_back(std::vector<float>(logits.begin() + t * vocab, logits.begin() + (t + 1) * vocab));
    std::ofstream file(args.json_path, std::ios::trunc);
    DF_CHECK(file.good(), "--json: cannot write " + args.json_path);
    file << out.dump() << "\n";
    DF_CHECK(file.good(), "--json: write failed for " + args.json_path);
  }

  std::printf("position  token  log-likelihood\n");
  double total = 0;
  for (size_t t = 1; t < ids.size(); ++t) {
    const double lp = log_probability(std::span(logits).subspan((t - 1) * vocab, vocab), ids[t]);
    total += lp;
    std::printf("%8zu  %5d  %14.6f\n", t, ids[t], lp);
  }
  const size_t scored = ids.size() - 1;
  if (scored == 0) {
    std::printf("tokens scored: 0 (a single token has nothing to predict)\n");
  } else {
    std::printf("tokens scored: %zu, mean log-likelihood: %.6f, perplexity: %.4f\n", scored, total / scored,
                std::exp(-total / scored));
  }
  if (args.compare_unquantized) print_quantization_cost(args, model, logits, ids);
  return 0;
}

}  // namespace

void register_score(CLI::App& app, Action& action) {
  auto* command = app.add_subcommand("score", "Teacher-forced log-likelihood and perplexity of a prompt");
  auto args = std::make_shared<ScoreArgs>();
  add_model_options(*command, args->model);
  command->add_option("--json", args->json_path, R"(write {"input_ids": [...], "logits": [[...]...]} to this file)");
  command->add_flag("--compare-unquantized", args->compare_unquantized,
                    "with --quantize: also score the 16-bit weights and print the top-1 agreement and mean KL "
                    "of the next-token distributions over the prompt");
  command->callback([args, &action] { action = [args] { return run_score(*args); }; });
}

}  // namespace deepfuse::cli
