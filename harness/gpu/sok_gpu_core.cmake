# Builds the framework-free core (CPU sources + CUDA sources) into one static library,
# `sok_gpu_core`, and the code shared by the GPU tests and benchmarks (key routing, the dense-table
# lookup) into `sok_gpu_harness`. Included by tests/gpu and benchmarks/gpu (no Bazel, no
# TensorFlow).
get_filename_component(SOK_REPO_ROOT "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
set(SOK_CORE "${SOK_REPO_ROOT}/addons/sparse_operation_kit/core")

# The CUDA sources are every core/cuda/*.cu, as in the Bazel build (core/BUILD).
file(GLOB SOK_CORE_CUDA_SOURCES CONFIGURE_DEPENDS "${SOK_CORE}/cuda/*.cu")
file(GLOB SOK_CORE_SOURCES CONFIGURE_DEPENDS "${SOK_CORE}/*.cc")
add_library(sok_gpu_core STATIC
  ${SOK_CORE_SOURCES}
  ${SOK_CORE_CUDA_SOURCES})
target_include_directories(sok_gpu_core PUBLIC ${SOK_REPO_ROOT})
target_compile_features(sok_gpu_core PUBLIC cxx_std_17)
set_target_properties(sok_gpu_core PROPERTIES POSITION_INDEPENDENT_CODE ON
                      CUDA_SEPARABLE_COMPILATION OFF)
target_link_libraries(sok_gpu_core PUBLIC CUDA::cudart)
# The table's kernels compute initial values and optimizer updates with initializer.h /
# optimizer.h: no FMA contraction there, so the arithmetic rounds like the CPU build's.
set_source_files_properties(${SOK_CORE}/cuda/table.cu ${SOK_CORE}/cuda/table_optimizer.cu
                            ${SOK_CORE}/cuda/table_storage.cu PROPERTIES COMPILE_OPTIONS "-fmad=false")
target_compile_options(sok_gpu_core PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--threads=2>)

# -DSOK_STATIC_CUDART=ON: the CUDA runtime linked statically into every program of tests/gpu
# and benchmarks/gpu (a binary to carry to another machine with a matching driver;
# build_harness.sh sets it).
option(SOK_STATIC_CUDART "link the CUDA runtime statically" OFF)
if(SOK_STATIC_CUDART)
  set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
  get_target_property(_sok_core_libs sok_gpu_core INTERFACE_LINK_LIBRARIES)
  list(TRANSFORM _sok_core_libs REPLACE "^CUDA::cudart$" "CUDA::cudart_static")
  set_target_properties(sok_gpu_core PROPERTIES INTERFACE_LINK_LIBRARIES "${_sok_core_libs}")
endif()

add_library(sok_gpu_harness STATIC
  ${SOK_REPO_ROOT}/harness/gpu/dense_lookup.cu
  ${SOK_REPO_ROOT}/harness/gpu/key_routing.cu)
set_target_properties(sok_gpu_harness PROPERTIES POSITION_INDEPENDENT_CODE ON
                      CUDA_SEPARABLE_COMPILATION OFF)
target_link_libraries(sok_gpu_harness PUBLIC sok_gpu_core)

# NCCL (multi-GPU programs only): /usr/include/nccl.h on the GPU machines, or NCCL_ROOT.
find_path(NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_ROOT}/include ${NCCL_ROOT}/include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS $ENV{NCCL_ROOT}/lib ${NCCL_ROOT}/lib)
