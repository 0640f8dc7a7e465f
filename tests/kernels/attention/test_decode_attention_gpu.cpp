// Split-KV paged decode attention against the fp64 CPU reference (reference::attention_decode) on
// fresh random inputs: pages scattered over the pool in random order, ragged lengths (0, 1, 15,
// 16, 17, ..., max_context, beyond it), sliding windows, head_dim 64 and 128, GQA groups 1 to 16,
// plans from one split to hundreds, and CUDA-graph replays with new lengths and contents. Every
// cache element no sequence owns holds NaN and outputs are NaN-poisoned before each launch, so a
// stray read or a missed write shows. Several queries may share a sequence's pages (a speculative
// verify step's tokens, each with its own length). DEEPFUSE_TEST_QUICK=1 keeps the small cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using kernels::DecodeAttentionPlan;
using kernels::kKvPageSize;

constexpr uint16_t kNanBits = 0x7fc0;
constexpr double kTolerance = 1e-2;

int pages_for(int context) { return (context + kKvPageSize - 1) / kKvPageSize; }

struct Heads {
  int q_heads, kv_heads, head_dim;
};

// A batch of sequences in a paged KV cache. Pages are handed out from a random permutation of
// the pool; block-table entries past a sequence's pages point at a page of NaN, and every row no
// sequence owns (the tail of a last page, spare pages) is NaN too.
struct PagedBatch {
  Heads heads;
  int max_context;
  std::vector<int> seq_lens;  // what the device sees; may exceed max_context
  int max_pages_per_seq;
  int pool_pages;
  std::vector<std::vector<float>> keys, values;  // per sequence [stored length][kv_heads][head_dim]
  std::vector<float> q;                          // [batch][q_heads][head_dim]
  DeviceBuffer k_pool, v_pool, block_table, lens, q_dev;

  PagedBatch(Heads h, int context, std::vector<int> lengths, uint64_t salt, int min_pool_pages = 0)
      : heads(h), max_context(context), seq_lens(std::move(lengths)) {
    auto rng = testing::make_rng(salt);
    const int batch = static_cast<int>(seq_lens.size());
    const int d = h.head_dim;
    max_pages_per_seq = pages_for(max_context) + 1;
    int pages_used = 0;
    for (int s = 0; s < batch; ++s) pages_used += pages_for(stored_length(s));
    pool_pages = std::max(min_pool_pages, pages_used + 3);  // + the NaN page and two spares
    std::vector<int32_t> order(pool_pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const int32_t nan_page = order.back();
    std::vector<int32_t> table(static_cast<size_t>(batch) * max_pages_per_seq, nan_page);
    int next = 0;
    for (int s = 0; s < batch; ++s)
      for (int p = 0; p < pages_for(stored_length(s)); ++p) table[static_cast<size_t>(s) * max_pages_per_seq + p] = order[next++];

    const size_t page_elements = static_cast<size_t>(h.kv_heads) * kKvPageSize * d;
    std::vector<uint16_t> k_host(pool_pages * page_elements, kNanBits), v_host(k_host);
    for (int s = 0; s < batch; ++s) {
      const int length = stored_length(s);
      keys.push_back(bf16_values(rng, static_cast<size_t>(length) * h.kv_heads * d, 1.0f));
      values.push_back(bf16_values(rng, static_cast<size_t>(length) * h.kv_heads * d, 1.0f));
      for (int position = 0; position < length; ++position) {
        const int32_t page = table[static_cast<size_t>(s) * max_pages_per_seq + position / kKvPageSize];
        for (int kv = 0; kv < h.kv_heads; ++kv) {
          const size_t cache = ((static_cast<size_t>(page) * h.kv_heads + kv) * kKvPageSize + position % kKvPageSize) * d;
          const size_t dense = (static_cast<size_t>(position) * h.kv_heads + kv) * d;
          for (int i = 0; i < d; ++i) {
            k_host[cache + i] = float_to_bf16_bits(keys[s][dense + i]);
            v_host[cache + i] = float_to_bf16_bits(values[s][dense + i]);
          }
        }
      }
    }
    // |q| up to 4 gives scores with a standard deviation near 1.3 at scale 1/sqrt(d): peaked softmaxes.
    q = bf16_values(rng, static_cast<size_t>(batch) * h.q_heads * d, 4.0f);
    k_pool = DeviceBuffer::from_host(k_host);
    v_pool = DeviceBuffer::from_host(v_host);
    block_table = DeviceBuffer::from_host(table);
    lens = DeviceBuffer::from_host(std::vector<int32_t>(seq_lens.begin(), seq_lens.end()));
    q_dev = DeviceBuffer::from_host(to_bf16_bits(q));
  }

  static std::vector<float> bf16_values(std::mt19937_64& rng, size_t count, float scale) {
    std::vector<float> v = testing::random_uniform(rng, count, scale);
    for (float& e : v) e = round_to_bf16(e);
    return v;
  }

  int batch() const { return static_cast<int>(seq_lens.size()); }
  int stored_length(int s) const { return std::clamp(seq_lens[s], 0, max_context); }
  size_t out_elements() const { return static_cast<size_t>(batch()) * heads.q_heads * heads.head_dim; }

  kernels::PagedKv paged_kv(const DeviceBuffer& k, const DeviceBuffer& v, const DeviceBuffer& table) const {
    return {k.as<__nv_bfloat16>(), v.as<__nv_bfloat16>(), table.as<const int32_t>(), max_pages_per_seq, heads.kv_heads,
            heads.head_dim};
  }

  std::vector<double> reference(int s, float scale, int window) const {
    const size_t n = static_cast<size_t>(heads.q_heads) * heads.head_dim;
    std::vector<float> out(n);
    reference::attention_decode(q.data() + s * n, keys[s].data(), values[s].data(), stored_length(s), heads.q_heads,
                                heads.kv_heads, heads.head_dim, scale, window, out.data());
    return {out.begin(), out.end()};
  }
};

float default_scale(const Heads& h) { return 1.0f / std::sqrt(static_cast<float>(h.head_dim)); }

// Each sequence's output against the reference: exact zeros for length 0, otherwise no NaN and
// a relative error below kTolerance; failures name the sequence and the worst element.
void expect_matches_reference(const PagedBatch& b, const std::vector<float>& out, float scale, int window,
                              const std::string& what) {
  const size_t n = static_cast<size_t>(b.heads.q_heads) * b.heads.head_dim;
  for (int s = 0; s < b.batch(); ++s) {
    const std::vector<float> got(out.begin() + s * n, out.begin() + (s + 1) * n);
    const std::string where = what + ", sequence " + std::to_string(s) + " of length " + std::to_string(b.seq_lens[s]);
    if (b.stored_length(s) == 0) {
      const size_t nonzero = std::count_if(got.begin(), got.end(), [](float v) { return v != 0.0f; });
      EXPECT_EQ(nonzero, 0u) << where << ": a padded slot must be exactly zero";
      continue;
    }
    const std::vector<double> ref = b.reference(s, scale, window);
    size_t worst = 0;
    for (size_t i = 0; i < n; ++i)
      if (!(std::abs(got[i] - ref[i]) <= std::abs(got[worst] - ref[worst]))) worst = i;  // NaN wins
    const double error = testing::relative_error(got, ref);
    EXPECT_EQ(testing::count_nan(got), 0u) << where;
    EXPECT_LT(error, kTolerance) << where << ": relative error " << error << ", worst at q head "
                                 << worst / b.heads.head_dim << " dim " << worst % b.heads.head_dim << " (gpu "
                                 << got[worst] << ", reference " << ref[worst] << ")";
  }
}

// One eager launch into NaN-poisoned output; returns the output as floats.
std::vector<float> run_once(const PagedBatch& b, const DecodeAttentionPlan& plan, float scale, int window,
                            const DeviceBuffer& workspace) {
  DeviceBuffer out = DeviceBuffer::from_host(std::vector<uint16_t>(b.out_elements(), kNanBits));
  kernels::DecodeAttentionParams params;
  params.q = b.q_dev.as<const __nv_bfloat16>();
  params.out = out.as<__nv_bfloat16>();
  params.kv = b.paged_kv(b.k_pool, b.v_pool, b.block_table);
  params.seq_lens = b.lens.as<const int32_t>();
  params.workspace = workspace.data();
  params.scale = scale;
  params.sliding_window = window;
  DF_CHECK_CUDA(kernels::launch_decode_attention(plan, params, nullptr));
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  return bf16_bits_to_floats(out.to_host<uint16_t>(b.out_elements()));
}

struct AttentionCase {
  std::string name;
  Heads heads;
  int max_context;
  std::vector<int> seq_lens;
  int sliding_window;
  bool large;  // skipped by DEEPFUSE_TEST_QUICK=1
};

std::vector<AttentionCase> attention_cases() {
  const std::vector<int> ragged = {0, 1, 15, 16, 17, 100, 1000, 4099};
  const std::vector<int> around_window = {0, 1, 17, 99, 100, 101, 1000, 4099};
  return {
      {"ragged_q32_kv8_d128", {32, 8, 128}, 4099, ragged, 0, false},
      {"ragged_q32_kv8_d64", {32, 8, 64}, 4099, ragged, 0, false},
      {"group1_q8_kv8_d128", {8, 8, 128}, 2050, {1, 17, 333, 2050, 0}, 0, false},
      {"group7_q28_kv4_d128", {28, 4, 128}, 2050, {2050, 1, 640, 15}, 0, false},
      {"group8_q64_kv8_d128", {64, 8, 128}, 2050, {17, 2050, 0}, 0, false},
      {"group12_q24_kv2_d128", {24, 2, 128}, 1500, {1500, 31, 0, 777}, 0, false},
      {"group16_q16_kv1_d64", {16, 1, 64}, 3000, {3000, 16, 1}, 0, false},
      {"window100_q32_kv8_d128", {32, 8, 128}, 4099, around_window, 100, false},
      {"window5000_q32_kv8_d64", {32, 8, 64}, 4099, around_window, 5000, false},
      {"window37_q28_kv4_d128", {28, 4, 128}, 3001, {3001, 50, 2000, 36, 37, 38}, 37, false},
      {"clamped_beyond_max_context", {32, 8, 128}, 1000, {1055, 999, 5000, 1000}, 0, false},
      {"long_q32_kv8_d128", {32, 8, 128}, 20000, {20000}, 0, true},
      {"long_q8_kv1_d128", {8, 1, 128}, 20011, {20011, 19000}, 0, true},
      {"long_window_q32_kv8_d64", {32, 8, 64}, 32768, {32768, 5000}, 4096, true},
  };
}

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

class DecodeAttentionVsReference : public ::testing::TestWithParam<AttentionCase> {};

// Each case under plans for the device's SM count, for 1 SM (few splits) and for 1000 SMs (the
// most splits: multi-chunk merges), with blocks of 4 and of 8 warps; each plan launched twice to
// show the counters reset.
TEST_P(DecodeAttentionVsReference, EveryPlanTwice) {
  DF_REQUIRE_GPU();
  const AttentionCase& c = GetParam();
  if (testing::quick_mode() && c.large) GTEST_SKIP() << "DEEPFUSE_TEST_QUICK=1: large case skipped";
  const PagedBatch batch(c.heads, c.max_context, c.seq_lens, std::hash<std::string>{}(c.name));
  const float scale = default_scale(c.heads);
  std::vector<DecodeAttentionPlan> plans;
  for (int warps : {4, 8})
    for (int sms : {query_device().sm_count, 1, 1000})
      plans.push_back(kernels::plan_decode_attention(batch.batch(), c.heads.q_heads, c.heads.kv_heads,
                                                     c.heads.head_dim, c.max_context, sms, 0, warps,
                                                     kernels::SplitMerge::workspace));
  if (c.heads.q_heads / c.heads.kv_heads <= 8)  // splits merged in a cluster: the most it holds, and 3
    for (int splits : {0, 3})
      plans.push_back(kernels::plan_decode_attention(batch.batch(), c.heads.q_heads, c.heads.kv_heads,
                                                     c.heads.head_dim, c.max_context, query_device().sm_count,
                                                     splits, 8, kernels::SplitMerge::cluster));
  for (const DecodeAttentionPlan& plan : plans) {
    DeviceBuffer workspace(std::max<size_t>(plan.workspace_bytes, 16));
    workspace.zero();
    for (int launch = 1; launch <= 2; ++launch) {
      const std::string what = c.name + " (blocks of " + std::to_string(plan.warps_per_block) + " warps, " +
                               std::to_string(plan.splits_per_sequence) + " splits of " +
                               std::to_string(plan.pages_per_split) + " pages merged " +
                               (plan.cluster_merge ? "in a cluster" : "in L2") + ", launch " + std::to_string(launch) + ")";
      expect_matches_reference(batch, run_once(batch, plan, scale, c.sliding_window, workspace), scale,
                               c.sliding_window, what);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DecodeAttentionVsReference, ::testing::ValuesIn(attention_cases()),
                         [](const auto& info) { return info.param.name; });

// The decode step's usage: captured once, replayed while lengths, cache contents and queries
// change in device memory. Replaying the same input twice shows the workspace counters reset.
void replay_with_new_lengths_and_contents(kernels::SplitMerge merge) {
  const Heads heads{32, 8, 128};
  const int max_context = 2000;
  const int pool_pages = 4 * (pages_for(max_context) + 1) + 3;
  const PagedBatch first(heads, max_context, {5, 1999, 0, 700}, 31, pool_pages);
  const PagedBatch second(heads, max_context, {2000, 0, 17, 1}, 32, pool_pages);
  ASSERT_EQ(first.pool_pages, second.pool_pages);
  const float scale = default_scale(heads);
  const DecodeAttentionPlan plan = kernels::plan_decode_attention(
      4, heads.q_heads, heads.kv_heads, heads.head_dim, max_context, std::max(query_device().sm_count, 64), 0, 0, merge);
  ASSERT_GT(plan.splits_per_sequence, 1) << "the graph must exercise the in-launch merge";
  const std::string merged = plan.cluster_merge ? "in a cluster" : "in L2";

  // The buffers the graph captures; each replay's input is copied into them first.
  DeviceBuffer k(first.k_pool.bytes()), v(first.v_pool.bytes()), table(first.block_table.bytes()),
      lens(first.lens.bytes()), q(first.q_dev.bytes()), out(first.out_elements() * 2), workspace(plan.workspace_bytes);
  workspace.zero();
  cudaStream_t stream;
  DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto load = [&](const PagedBatch& b) {
    using Copy = std::pair<DeviceBuffer*, const DeviceBuffer*>;
    for (const auto& [to, from] : {Copy{&k, &b.k_pool}, Copy{&v, &b.v_pool}, Copy{&table, &b.block_table},
                                   Copy{&lens, &b.lens}, Copy{&q, &b.q_dev}})
      DF_CHECK_CUDA(cudaMemcpyAsync(to->data(), from->data(), from->bytes(), cudaMemcpyDeviceToDevice, stream));
    DF_CHECK_CUDA(cudaMemsetAsync(out.data(), 0xff, out.bytes(), stream));  // NaN
  };

  kernels::DecodeAttentionParams params;
  params.q = q.as<const __nv_bfloat16>();
  params.out = out.as<__nv_bfloat16>();
  params.kv = first.paged_kv(k, v, table);
  params.seq_lens = lens.as<const int32_t>();
  params.workspace = workspace.data();
  params.scale = scale;
  cudaGraph_t graph;
  DF_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched = kernels::launch_decode_attention(plan, params, stream);
  DF_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  DF_CHECK_CUDA(launched);
  cudaGraphExec_t exec;
  DF_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  int replay = 0;
  for (const PagedBatch* input : {&first, &second, &second, &first}) {
    load(*input);
    DF_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    DF_CHECK_CUDA(cudaStreamSynchronize(stream));
    const auto result = bf16_bits_to_floats(out.to_host<uint16_t>(input->out_elements()));
    expect_matches_reference(*input, result, scale, 0, "graph replay " + std::to_string(++replay) + ", merged " + merged);
  }
  DF_CHECK_CUDA(cudaGraphExecDestroy(exec));
  DF_CHECK_CUDA(cudaGraphDestroy(graph));
  DF_CHECK_CUDA(cudaStreamDestroy(stream));
}

TEST(DecodeAttentionGraph, ReplayWithNewLengthsAndContents) {
  DF_REQUIRE_GPU();
  replay_with_new_lengths_and_contents(kernels::SplitMerge::workspace);
}

TEST(DecodeAttentionGraph, ReplayWithNewLengthsAndContentsMergedInClusters) {
  DF_REQUIRE_GPU();
  replay_with_new_lengths_and_contents(kernels::SplitMerge::cluster);
}

// A speculative verify step's queries: k + 1 tokens per sequence, each a query on its sequence's
// block-table row (`sequences`) with its own length, so token j sees the keys up to its position
// and none of the later tokens' (whose keys are in the cache): the reference row by row.
TEST(DecodeAttentionVerifyRows, SeveralQueriesPerSequenceAttendCausally) {
  DF_REQUIRE_GPU();
  const Heads heads{32, 8, 128};
  constexpr int kRows = 5;  // a token and 4 drafts
  auto rng = testing::make_rng(5460);
  for (const int window : {0, 3}) {
    const PagedBatch batch(heads, 3000, {5, 1999, 17, 3000}, 5461 + window);  // each with its 5 new keys
    std::vector<int32_t> sequences, lens;
    for (int s = 0; s < batch.batch(); ++s)
      for (int j = 0; j < kRows; ++j) {
        sequences.push_back(s);
        lens.push_back(batch.seq_lens[s] - (kRows - 1) + j);
      }
    const int rows = static_cast<int>(sequences.size());
    const size_t n = static_cast<size_t>(heads.q_heads) * heads.head_dim;
    const std::vector<float> q = PagedBatch::bf16_values(rng, rows * n, 4.0f);
    const DeviceBuffer q_dev = DeviceBuffer::from_host(to_bf16_bits(q)), rows_dev = DeviceBuffer::from_host(sequences),
                       lens_dev = DeviceBuffer::from_host(lens);
    const float scale = default_scale(heads);
    std::vector<DecodeAttentionPlan> plans{kernels::plan_decode_attention(
        rows, heads.q_heads, heads.kv_heads, heads.head_dim, 3000, query_device().sm_count)};
    plans.push_back(kernels::plan_decode_attention(rows, heads.q_heads, heads.kv_heads, heads.head_dim, 3000, 1000));
    for (const DecodeAttentionPlan& plan : plans) {
      DeviceBuffer workspace(std::max<size_t>(plan.workspace_bytes, 16));
      workspace.zero();
      DeviceBuffer out = DeviceBuffer::from_host(std::vector<uint16_t>(rows * n, kNanBits));
      kernels::DecodeAttentionParams params;
      params.q = q_dev.as<const __nv_bfloat16>();
      params.out = out.as<__nv_bfloat16>();
      params.kv = batch.paged_kv(batch.k_pool, batch.v_pool, batch.block_table);
      params.seq_lens = lens_dev.as<const int32_t>();
      params.sequences = rows_dev.as<const int32_t>();
      params.workspace = workspace.data();
      params.scale = scale;
      params.sliding_window = window;
      DF_CHECK_CUDA(kernels::launch_decode_attention(plan, params, nullptr));
      DF_CHECK_CUDA(cudaDeviceSynchronize());
      const std::vector<float> got_all = bf16_bits_to_floats(out.to_host<uint16_t>(rows * n));
      for (int r = 0; r < rows; ++r) {
        const int s = sequences[r];
        std::vector<float> want(n);
        reference::attention_decode(q.data() + r * n, batch.keys[s].data(), batch.values[s].data(), lens[r],
                                    heads.q_heads, heads.kv_heads, heads.head_dim, scale, window, want.data());
        const std::vector<float> got(got_all.begin() + r * n, got_all.begin() + (r + 1) * n);
        const std::string where = "window " + std::to_string(window) + ", " +
                                  std::to_string(plan.splits_per_sequence) + " splits, sequence " + std::to_string(s) +
                                  " row " + std::to_string(r % kRows) + " of length " + std::to_string(lens[r]);
        EXPECT_EQ(testing::count_nan(got), 0u) << where;
        EXPECT_LT(testing::relative_error(got, std::vector<double>(want.begin(), want.end())), kTolerance) << where;
      }
    }
  }
}

}  // namespace
}  // namespace deepfuse
