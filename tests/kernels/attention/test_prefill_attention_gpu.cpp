// Causal prefill attention on the GPU (paged KV cache, tensor cores) against
// reference::attention_prefill on fresh random inputs. The cache is built the way the runtime
// leaves it at its worst: pages a random permutation of a pool, spare pages and the unused tail
// of the last page filled with NaN, block table entries past the sequence -1, the sequence in the
// middle row of the table. Outputs are NaN-poisoned, with a poisoned guard row after them that must
// survive. DEEPFUSE_TEST_QUICK=1 keeps only the small cases (for compute-sanitizer runs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/reference.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/prefill_attention.hpp"
#include "test_util.hpp"

namespace deepfuse {
namespace {

using kernels::kKvPageSize;

constexpr uint16_t kNanBits = 0x7fc0;
constexpr double kTolerance = 1e-2;
constexpr int kTableRows = 3;    // block table rows; the case's sequence is the middle one
constexpr int kSequence = 1;
constexpr int kSparePages = 3;   // NaN-filled pool pages that no block table entry names

struct PrefillCase {
  int head_dim = 128;
  int q_heads = 8;
  int kv_heads = 2;
  int q_start = 0;
  int q_len = 1;
  int window = 0;
  int check_every = 1;  // rows checked on the CPU: i % check_every == 0 and the last (long prompts)

  float scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
  uint64_t salt() const {
    return ((((static_cast<uint64_t>(head_dim) * 131 + q_heads) * 131 + kv_heads) * 100003 + q_start) * 100003 +
            q_len) * 1009 + window;
  }
};

std::string describe(const PrefillCase& c) {
  return "head_dim=" + std::to_string(c.head_dim) + " q_heads=" + std::to_string(c.q_heads) +
         " kv_heads=" + std::to_string(c.kv_heads) + " q_start=" + std::to_string(c.q_start) +
         " q_len=" + std::to_string(c.q_len) + " window=" + std::to_string(c.window);
}

std::vector<float> random_bf16(std::mt19937_64& rng, size_t count, float scale) {
  std::vector<float> values = testing::random_uniform(rng, count, scale);
  for (float& v : values) v = round_to_bf16(v);
  return values;
}

// One sequence's queries, and its keys and values both dense (for the reference) and paged (for
// the kernel).
struct PrefillInputs {
  PrefillCase shape;
  std::vector<float> q;     // [q_len, q_heads, head_dim]
  std::vector<float> k, v;  // [q_start + q_len, kv_heads, head_dim]
  DeviceBuffer q_dev, k_pages, v_pages, block_table;
  int max_pages_per_seq = 0;

  PrefillInputs(const PrefillCase& c, uint64_t salt) : shape(c) {
    auto rng = testing::make_rng(salt);
    const int kv_len = c.q_start + c.q_len;
    const size_t dim = c.head_dim;
    // Queries twice the keys' range: sharper softmax rows than a flat average over V.
    q = random_bf16(rng, static_cast<size_t>(c.q_len) * c.q_heads * dim, 2.0f);
    k = random_bf16(rng, static_cast<size_t>(kv_len) * c.kv_heads * dim, 1.0f);
    v = random_bf16(rng, static_cast<size_t>(kv_len) * c.kv_heads * dim, 1.0f);

    const int used_pages = (kv_len + kKvPageSize - 1) / kKvPageSize;
    const int pool_pages = used_pages + kSparePages;
    std::vector<int32_t> page_of(pool_pages);  // logical page i of the sequence -> pool page
    std::iota(page_of.begin(), page_of.end(), 0);
    std::shuffle(page_of.begin(), page_of.end(), rng);
    const size_t page_elements = static_cast<size_t>(c.kv_heads) * kKvPageSize * dim;
    std::vector<uint16_t> k_pool(pool_pages * page_elements, kNanBits), v_pool(pool_pages * page_elements, kNanBits);
    for (int position = 0; position < kv_len; ++position) {
      for (int h = 0; h < c.kv_heads; ++h) {
        const size_t paged = (static_cast<size_t>(page_of[position / kKvPageSize]) * c.kv_heads + h) * kKvPageSize * dim +
                             static_cast<size_t>(position % kKvPageSize) * dim;
        const size_t dense = (static_cast<size_t>(position) * c.kv_heads + h) * dim;
        for (size_t e = 0; e < dim; ++e) {
          k_pool[paged + e] = float_to_bf16_bits(k[dense + e]);
          v_pool[paged + e] = float_to_bf16_bits(v[dense + e]);
        }
      }
    }
    max_pages_per_seq = used_pages + 2;
    std::vector<int32_t> table(static_cast<size_t>(kTableRows) * max_pages_per_seq, -1);  // -1: no such page
    std::copy_n(page_of.begin(), used_pages, table.begin() + static_cast<size_t>(kSequence) * max_pages_per_seq);

    q_dev = DeviceBuffer::from_host(to_bf16_bits(q));
    k_pages = DeviceBuffer::from_host(k_pool);
    v_pages = DeviceBuffer::from_host(v_pool);
    block_table = DeviceBuffer::from_host(table);
  }

  size_t output_count() const { return static_cast<size_t>(shape.q_len) * shape.q_heads * shape.head_dim; }

  kernels::PrefillAttentionParams params(const DeviceBuffer& out) const {
    kernels::PrefillAttentionParams p;
    p.q = q_dev.as<__nv_bfloat16>();
    p.out = out.as<__nv_bfloat16>();
    p.kv.k_pages = k_pages.as<__nv_bfloat16>();
    p.kv.v_pages = v_pages.as<__nv_bfloat16>();
    p.kv.block_table = block_table.as<int32_t>();
    p.kv.max_pages_per_seq = max_pages_per_seq;
    p.kv.kv_heads = shape.kv_heads;
    p.kv.head_dim = shape.head_dim;
    p.sequence = kSequence;
    p.q_start = shape.q_start;
    p.q_len = shape.q_len;
    p.q_heads = shape.q_heads;
    p.scale = shape.scale();
    p.sliding_window = shape.window;
    return p;
  }
};

// The output buffer: q_len rows plus one guard row, all NaN.
DeviceBuffer poisoned_output(const PrefillInputs& in) {
  const size_t guard = static_cast<size_t>(in.shape.q_heads) * in.shape.head_dim;
  return DeviceBuffer::from_host(std::vector<uint16_t>(in.output_count() + guard, kNanBits));
}

// Checks the output (with its guard row) of one launch against the reference: no NaN anywhere,
// guard untouched, relative error below tolerance over the checked rows and for each checked
// (row, head) alone, naming the worst one.
void expect_matches_reference(const PrefillInputs& in, const DeviceBuffer& out) {
  const PrefillCase& c = in.shape;
  const size_t count = in.output_count();
  const size_t row_elements = static_cast<size_t>(c.q_heads) * c.head_dim;
  const std::vector<uint16_t> bits = out.to_host<uint16_t>(count + row_elements);

  const size_t guard_changed =
      std::count_if(bits.begin() + count, bits.end(), [](uint16_t b) { return b != kNanBits; });
  EXPECT_EQ(guard_changed, 0u) << describe(c) << ": wrote past the last output row";

  const std::vector<float> result = bf16_bits_to_floats(std::vector<uint16_t>(bits.begin(), bits.begin() + count));
  const auto first_nan = std::find_if(result.begin(), result.end(), [](float x) { return std::isnan(x); });
  if (first_nan != result.end()) {
    const size_t index = first_nan - result.begin();
    ADD_FAILURE() << describe(c) << ": " << testing::count_nan(result) << " NaN outputs, first at row "
                  << index / row_elements << " head " << index % row_elements / c.head_dim << " dim "
                  << index % c.head_dim;
  }

  std::vector<float> checked;
  std::vector<double> expected;
  std::vector<float> reference_row(row_elements);
  double worst_error = 0;
  int worst_row = -1, worst_head = -1;
  for (int i = 0; i < c.q_len; ++i) {
    if (i % c.check_every != 0 && i != c.q_len - 1) continue;
    reference::attention_prefill(in.q.data() + i * row_elements, in.k.data(), in.v.data(), c.q_start + i, 1, c.q_heads,
                                 c.kv_heads, c.head_dim, c.scale(), c.window, reference_row.data());
    for (int h = 0; h < c.q_heads; ++h) {
      const size_t begin = i * row_elements + static_cast<size_t>(h) * c.head_dim;
      const std::vector<float> got(result.begin() + begin, result.begin() + begin + c.head_dim);
      const std::vector<double> want(reference_row.begin() + h * c.head_dim,
                                     reference_row.begin() + (h + 1) * c.head_dim);
      const double error = testing::relative_error(got, want);
      if (!std::isnan(worst_error) && !(error <= worst_error)) {  // the first NaN stays the worst
        worst_error = error;
        worst_row = i;
        worst_head = h;
      }
      checked.insert(checked.end(), got.begin(), got.end());
      expected.insert(expected.end(), want.begin(), want.end());
    }
  }
  const double error = testing::relative_error(checked, expected);
  EXPECT_LT(error, kTolerance) << describe(c) << ": relative error " << error;
  EXPECT_LT(worst_error, kTolerance) << describe(c) << ": worst (row " << worst_row << ", head " << worst_head
                                     << ") has relative error " << worst_error;
}

void run_and_check(const PrefillCase& c) {
  SCOPED_TRACE(describe(c));
  const PrefillInputs in(c, c.salt());
  const DeviceBuffer out = poisoned_output(in);
  ASSERT_EQ(kernels::launch_prefill_attention(in.params(out), nullptr), cudaSuccess) << describe(c);
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  expect_matches_reference(in, out);
}

// ---- Every chunk length (1, odd, one tile, tile + odd, several tiles) from position 0 and from
// an offset that is not a multiple of the page size, for each head size and GQA group.

using HeadShape = std::tuple<int, int, int>;  // head_dim, q_heads, kv_heads
class PrefillAttentionVsReference : public ::testing::TestWithParam<HeadShape> {};

TEST_P(PrefillAttentionVsReference, EveryChunkLengthAndStart) {
  DF_REQUIRE_GPU();
  const auto [head_dim, q_heads, kv_heads] = GetParam();
  for (int q_len : {1, 17, 64, 100, 300}) {
    if (testing::quick_mode() && q_len > 100) continue;
    for (int q_start : {0, 37}) run_and_check({head_dim, q_heads, kv_heads, q_start, q_len, 0});
  }
}

INSTANTIATE_TEST_SUITE_P(HeadShapes, PrefillAttentionVsReference,
                         ::testing::Values(HeadShape{64, 4, 4}, HeadShape{64, 8, 2}, HeadShape{64, 28, 4},
                                           HeadShape{128, 4, 4}, HeadShape{128, 8, 2}, HeadShape{128, 28, 4}),
                         [](const auto& info) {  // no structured binding: its commas would split the macro
                           return "d" + std::to_string(std::get<0>(info.param)) + "_q" +
                                  std::to_string(std::get<1>(info.param)) + "_kv" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Windows shorter than the prompt (so whole key tiles fall out of sight), of one key, exactly a
// key tile, one past it, and longer than the cache (no effect).
TEST(PrefillAttention, SlidingWindow) {
  DF_REQUIRE_GPU();
  const std::vector<PrefillCase> cases = {
      {128, 8, 2, 0, 300, 50},  {64, 28, 4, 37, 100, 16}, {128, 4, 4, 200, 17, 64}, {64, 8, 2, 37, 300, 1},
      {128, 28, 4, 37, 300, 65}, {64, 4, 4, 0, 64, 63},   {128, 8, 2, 37, 100, 500},
  };
  for (const PrefillCase& c : cases) {
    if (testing::quick_mode() && c.q_len > 100) continue;
    run_and_check(c);
  }
}

// Chunked prefill deep into a sequence: most keys come from earlier chunks.
TEST(PrefillAttention, LateChunks) {
  DF_REQUIRE_GPU();
  for (const PrefillCase& c : {PrefillCase{128, 28, 4, 1000, 17, 0}, PrefillCase{64, 8, 2, 555, 64, 0},
                               PrefillCase{128, 8, 2, 777, 1, 0}, PrefillCase{64, 7, 1, 1234, 100, 300}})
    run_and_check(c);
}

// Long prompts: every 37th query row (and the last) checked on the CPU.
TEST(PrefillAttention, LongPrompts) {
  DF_REQUIRE_GPU();
  if (testing::quick_mode()) GTEST_SKIP() << "DEEPFUSE_TEST_QUICK=1: long prompts skipped";
  run_and_check({128, 4, 2, 0, 4096, 0, 37});
  run_and_check({64, 7, 1, 1000, 3001, 700, 37});  // chunk of a 4001-token prompt, Mistral-style window
}

// A 32k-token prompt: 512 query tiles, offsets past 2^31 bytes nowhere but well past 2^24 elements.
TEST(PrefillAttention, Prompt32k) {
  DF_REQUIRE_GPU();
  if (testing::quick_mode()) GTEST_SKIP() << "DEEPFUSE_TEST_QUICK=1: long prompts skipped";
  run_and_check({128, 2, 1, 0, 32768, 0, 997});
}

// The launcher is graph-capturable: captured once (its first launch in this process), replayed with
// new queries in the same buffer.
TEST(PrefillAttention, GraphReplayWithNewQueries) {
  DF_REQUIRE_GPU();
  const PrefillCase c{128, 8, 2, 37, 100, 0};
  PrefillInputs in(c, c.salt() + 1);
  DeviceBuffer out = poisoned_output(in);
  DF_CHECK_CUDA(cudaDeviceSynchronize());  // inputs uploaded on the legacy stream
  cudaStream_t stream;
  DF_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  DF_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ASSERT_EQ(kernels::launch_prefill_attention(in.params(out), stream), cudaSuccess);
  DF_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  DF_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    if (replay > 0) {
      auto rng = testing::make_rng(c.salt() + 2);
      in.q = random_bf16(rng, in.q.size(), 2.0f);
      in.q_dev.upload(to_bf16_bits(in.q).data(), in.q.size() * sizeof(uint16_t));
      const std::vector<uint16_t> poison(out.bytes() / sizeof(uint16_t), kNanBits);
      out.upload(poison.data(), out.bytes());
      DF_CHECK_CUDA(cudaDeviceSynchronize());  // the copies ran on the legacy stream; `stream` does not wait for it
    }
    DF_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    DF_CHECK_CUDA(cudaStreamSynchronize(stream));
    SCOPED_TRACE("replay " + std::to_string(replay));
    expect_matches_reference(in, out);
  }
  DF_CHECK_CUDA(cudaGraphExecDestroy(exec));
  DF_CHECK_CUDA(cudaGraphDestroy(graph));
  DF_CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace deepfuse
