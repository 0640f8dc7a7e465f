// Every transformer block of a batch-1 decode step in ONE persistent launch.
//
// Why: at batch 1 a small model pays for its kernel boundaries, not its bytes. Llama-3.2-1B's
// step streamed 2.47 GB in ~850 µs against a ~580 µs floor: every one of the 64 per-layer
// launches paid ~4-5 µs of upstream wait, dependent L2 round trips and the next grid's start, and
// while a kernel waits nobody reads weights (docs/runtime.md, "Where a batch-1 step's time
// goes"). Here one block per SM runs the whole step, and the weights never wait for the
// activations: they do not depend on them. Each block has a producer warp that streams the
// block's share of every weight matrix of every layer, in the order the block will use them,
// through a ring of shared-memory stages with bulk copies (cp.async.bulk, completion counted by
// an mbarrier per stage). Seven consumer warps wait for the activations an operation needs (a
// counter in global memory per operation kind, bumped by each block once its part is written),
// stage that vector in shared memory, and run it against the weights already waiting in the
// ring. A grid-wide hand-off costs a few µs, as a kernel boundary does, but the ring keeps
// filling meanwhile, so HBM stays busy across the hand-offs.
//
// Per layer, each block takes an even share of the rows of every matrix (row-major [rows, K]
// weights: a share is one contiguous slab, streamed in stages of up to kStageBytes):
//   qkv      x = rmsnorm(residual) (x input_norm unless folded into the weights); q | k | v rows,
//            + bias, rounded to bf16 -> qkv scratch (fp32)                    bump qkv_done
//   attention (KV head, context split) items, at most one per block, whose key and value pages
//            ride the same ring (copied right after the block's qkv slab); after every block's
//            qkv: RoPE on q and the new key (the first split appends them to the cache), online
//            softmax over the pages in shared memory -> a partial output and its (max, sum)
//                                                                             bump items_done
//   o_proj   (after every item) x = the partials merged by each block itself;
//            residual rows += x · Wo^T + o_bias                               bump o_done
//   gate_up  (after every block's o_proj) x = rmsnorm(residual) (x post-norm unless folded);
//            gate and up rows of the block's slice of I -> act = bf16(silu(g) * u) bump up_done
//   down     (after every block's gate_up) residual rows += act · Wd^T          bump down_done
// Layer 0 reads the embedding row of the token instead of the residual stream. The step leaves
// the final hidden state in `residual`; the final norm, lm_head and sampler run after it.
//
// Counters only grow during a launch (the n-th layer waits for n * blocks); the last block to
// leave zeroes them for the next launch. All blocks must be resident at once: the grid is one
// block per SM with most of its shared memory, launched cooperatively.
//
// Requires sm_90 (bulk copies); K of every matrix (H, q_size, I) a multiple of 256; head_dim 64
// or 128; at most 8 query heads per KV head. No floating-point atomics leave a block, but within
// one a row's partial sums (and the attention warps' outputs) meet in shared memory in an order
// that can vary: not bitwise deterministic across runs. Measured, and why it is not the default
// yet: docs/kernels/persistent_decode.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deepfuse::kernels {

// One layer's weights and KV pools, all row-major bf16.
struct PersistentDecodeLayer {
  const __nv_bfloat16* qkv = nullptr;         // [q_size + 2 kv_size, H]
  const __nv_bfloat16* qkv_bias = nullptr;    // [q_size + 2 kv_size] or null
  const __nv_bfloat16* input_norm = nullptr;  // [H], or null when folded into qkv's columns
  const __nv_bfloat16* o_proj = nullptr;      // [H, q_size]
  const __nv_bfloat16* o_bias = nullptr;      // [H] or null
  const __nv_bfloat16* gate_up = nullptr;     // [2I, H]: gate rows, then up rows
  const __nv_bfloat16* post_norm = nullptr;   // [H], or null when folded into gate_up's columns
  const __nv_bfloat16* down = nullptr;        // [H, I]
  __nv_bfloat16* k_pages = nullptr;           // this layer's pools (paged_kv.cuh layout)
  __nv_bfloat16* v_pages = nullptr;
};

struct PersistentDecodeShape {
  int layers = 0;
  int hidden = 0;        // H
  int intermediate = 0;  // I
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int vocab = 0;
  __host__ __device__ int q_size() const { return q_heads * head_dim; }
  __host__ __device__ int kv_size() const { return kv_heads * head_dim; }
};

struct PersistentDecodeParams {
  PersistentDecodeShape shape;
  const PersistentDecodeLayer* layers = nullptr;  // device array [shape.layers]
  const __nv_bfloat16* embed_tokens = nullptr;    // [vocab, H]
  const float* inv_freq = nullptr;                // [head_dim / 2] RoPE inverse frequencies
  const int32_t* id = nullptr;                    // the token
  const int32_t* position = nullptr;              // its position
  const int32_t* seq_len = nullptr;               // keys incl. the current token (position + 1)
  const int32_t* block_table = nullptr;           // the sequence's row of page ids
  int max_pages_per_seq = 0;
  float norm_eps = 1e-5f;
  float attention_scale = 0.0f;
  int sliding_window = 0;                         // > 0: only the last sliding_window keys
  __nv_bfloat16* residual = nullptr;              // [H] out: the last block's output
  void* workspace = nullptr;                      // persistent_decode_workspace_bytes, zeroed once
};

// Whether this device and shape can run the kernel (sm_90, the size rules above).
bool persistent_decode_supported(const PersistentDecodeShape& shape, int device);

size_t persistent_decode_workspace_bytes(const PersistentDecodeShape& shape, int num_sms);

// cudaErrorInvalidValue for shapes outside the rules or null pointers; cudaErrorNotSupported
// below sm_90.
cudaError_t launch_persistent_decode(const PersistentDecodeParams& params, cudaStream_t stream);

}  // namespace deepfuse::kernels
