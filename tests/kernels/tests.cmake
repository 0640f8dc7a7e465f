# One folder per op, mirroring src/kernels/<op>/: *_gpu binaries are GPU tests (label gpu, skipped
# without a device); the others are host-side checks (label cpu) that must hold where a GPU is
# present too (scripts/device/gpu.sh runs them there; the two whose paths differ with a device are
# labelled gpu as well).
set(kernel_tests ${CMAKE_CURRENT_LIST_DIR})

deepfuse_test(test_decode_attention_plan ${kernel_tests}/attention/test_decode_attention_plan.cpp CPU_AND_GPU)
deepfuse_test(test_decode_attention_gpu ${kernel_tests}/attention/test_decode_attention_gpu.cpp GPU)
deepfuse_test(test_prefill_attention_params ${kernel_tests}/attention/test_prefill_attention_params.cpp CPU_AND_GPU)
deepfuse_test(test_prefill_attention_gpu ${kernel_tests}/attention/test_prefill_attention_gpu.cpp GPU)

deepfuse_test(test_dequantize_gpu ${kernel_tests}/dequantize/test_dequantize_gpu.cpp GPU)
deepfuse_test(test_quantize_fp8_gpu ${kernel_tests}/quantize/test_quantize_fp8_gpu.cpp GPU)

deepfuse_test(test_embedding_checks ${kernel_tests}/embedding/test_embedding_checks.cpp)
deepfuse_test(test_embedding_gpu ${kernel_tests}/embedding/test_embedding_gpu.cpp GPU)

deepfuse_test(test_gemm_gpu ${kernel_tests}/gemm/test_gemm_gpu.cpp GPU)
deepfuse_test(test_gemm_fp8_gpu ${kernel_tests}/gemm/test_gemm_fp8_gpu.cpp GPU)

deepfuse_test(test_gemv_residual_gpu ${kernel_tests}/gemv/test_gemv_residual_gpu.cpp GPU)

deepfuse_test(test_mlp_shape_checks ${kernel_tests}/mlp/test_mlp_shape_checks.cpp)
deepfuse_test(test_mlp_gpu ${kernel_tests}/mlp/test_mlp_gpu.cpp GPU)
deepfuse_test(test_mlp_batched_gpu ${kernel_tests}/mlp/test_mlp_batched_gpu.cpp GPU)
deepfuse_test(test_swiglu_wgmma_plan ${kernel_tests}/mlp/test_swiglu_wgmma_plan.cpp)
deepfuse_test(test_swiglu_wgmma_gpu ${kernel_tests}/mlp/test_swiglu_wgmma_gpu.cpp GPU)

deepfuse_test(test_norm_checks ${kernel_tests}/norm/test_norm_checks.cpp)
deepfuse_test(test_rms_norm_gpu ${kernel_tests}/norm/test_rms_norm_gpu.cpp GPU)

deepfuse_test(test_qkv_rope_fused_gpu ${kernel_tests}/qkv/test_qkv_rope_fused_gpu.cpp GPU)

deepfuse_test(test_rope_kv_append_checks ${kernel_tests}/rope_kv/test_rope_kv_append_checks.cpp)
deepfuse_test(test_rope_kv_append_gpu ${kernel_tests}/rope_kv/test_rope_kv_append_gpu.cpp GPU)

deepfuse_test(test_sampling_checks ${kernel_tests}/sampling/test_sampling_checks.cpp)
deepfuse_test(test_speculative_accept_gpu ${kernel_tests}/sampling/test_speculative_accept_gpu.cpp GPU)
deepfuse_test(test_sampling_gpu ${kernel_tests}/sampling/test_sampling_gpu.cpp GPU)
deepfuse_test(test_token_penalties_gpu ${kernel_tests}/sampling/test_token_penalties_gpu.cpp GPU)

deepfuse_test(test_kernel_limits ${kernel_tests}/test_kernel_limits.cpp)
