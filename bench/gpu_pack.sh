#!/usr/bin/env bash
# Build the GPU session's binaries here (the GPU machine has no packages to
# build with) and pack them for `carry`: .gpu-build/pkg.tar.xz holds bin/
# (tests, benchmarks, the sample) and .devdeps/ (OpenBLAS, cmocka), which
# the GPU machine lacks. On the GPU machine:
#   tar xf .gpu-build/pkg.tar.xz && bash bench/gpu_run.sh all
set -eu
B=${BUILD_GPU:-build-gpu}
make -s BUILD="$B" NVCC_FLAGS="-O3 --std=c++17 -Xptxas -O3 -gencode arch=compute_90,code=sm_90" \
    CUDA_GEN="$B/cuda-gen" binaries
rm -rf .gpu-build && mkdir -p .gpu-build/stage/.gpu-build/bin
cp "$B"/tests/test_cuda_* "$B"/tests/test_codegen_cuda "$B"/tests/test_jit "$B"/tests/test_fusion \
   "$B"/bench/bench_cuda "$B"/bench/bench_cpu "$B"/samples/varlen_encoder .gpu-build/stage/.gpu-build/bin/
rm -f .gpu-build/stage/.gpu-build/bin/*.d
strip .gpu-build/stage/.gpu-build/bin/*
cp -r .devdeps .gpu-build/stage/
tar -C .gpu-build/stage -cJf .gpu-build/pkg.tar.xz .gpu-build .devdeps
rm -rf .gpu-build/stage
ls -la .gpu-build
