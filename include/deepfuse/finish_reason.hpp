// Why a sequence stopped generating. The step scheduler (src/batching) decides it for both
// backends; the CUDA engine reports it with each token (deepfuse/engine.hpp).
#pragma once

namespace deepfuse {

// kv_cache_full is never reported any more: a sequence short of KV pages is preempted and
// recomputed later by the scheduler instead of ending. The value stays for callers that test it.
enum class FinishReason { none, stop_token, max_tokens, context_length, kv_cache_full };
const char* finish_reason_name(FinishReason reason);

}  // namespace deepfuse
