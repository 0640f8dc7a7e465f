list(APPEND DEEPFUSE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/all_reduce/one_shot_all_reduce.cu
  ${CMAKE_CURRENT_LIST_DIR}/attention/prefill_attention.cu
  ${CMAKE_CURRENT_LIST_DIR}/attention/decode_attention.cu
  ${CMAKE_CURRENT_LIST_DIR}/common/trace.cpp
  ${CMAKE_CURRENT_LIST_DIR}/embedding/embedding.cu
  ${CMAKE_CURRENT_LIST_DIR}/fill/fill.cu
  ${CMAKE_CURRENT_LIST_DIR}/gemm/cublaslt_gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/common/cluster_gemv.cu
  ${CMAKE_CURRENT_LIST_DIR}/gemv/gemv_residual.cu
  ${CMAKE_CURRENT_LIST_DIR}/mlp/swiglu_elementwise.cu
  ${CMAKE_CURRENT_LIST_DIR}/mlp/swiglu_fused.cu
  ${CMAKE_CURRENT_LIST_DIR}/qkv/qkv_rope_fused.cu
  ${CMAKE_CURRENT_LIST_DIR}/norm/folded_norm.cu
  ${CMAKE_CURRENT_LIST_DIR}/norm/rms_norm.cu
  ${CMAKE_CURRENT_LIST_DIR}/rope_kv/rope_kv_append.cu
  ${CMAKE_CURRENT_LIST_DIR}/sampling/sampling.cu
  ${CMAKE_CURRENT_LIST_DIR}/sampling/token_penalties.cu)
