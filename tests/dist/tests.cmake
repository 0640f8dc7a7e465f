# src/dist and the one-shot all-reduce kernel it drives. The *_gpu tests need two or more GPUs with
# peer access and skip themselves otherwise.
deepfuse_test(test_all_reduce_checks ${CMAKE_CURRENT_LIST_DIR}/test_all_reduce_checks.cpp)
deepfuse_test(test_one_shot_all_reduce_gpu ${CMAKE_CURRENT_LIST_DIR}/test_one_shot_all_reduce_gpu.cpp GPU)
deepfuse_test(test_nccl_group_gpu ${CMAKE_CURRENT_LIST_DIR}/test_nccl_group_gpu.cpp GPU)
deepfuse_test(test_tensor_split ${CMAKE_CURRENT_LIST_DIR}/test_tensor_split.cpp)
deepfuse_test(test_tensor_parallel_gpu ${CMAKE_CURRENT_LIST_DIR}/test_tensor_parallel_gpu.cpp GPU)
deepfuse_test(test_epilogue_exchange_gpu ${CMAKE_CURRENT_LIST_DIR}/test_epilogue_exchange_gpu.cpp GPU)
