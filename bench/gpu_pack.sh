#!/usr/bin/env bash
# Build the GPU session's binaries here (the GPU machine has no packages to
# build with) and pack them for `carry`: .gpu-build/pkg.tar.xz holds bin/
# (tests, benchmarks, the sample) and .devdeps/ (OpenBLAS, cmocka), which
# the GPU machine lacks. .gpu-build/, .devdeps/ and .peer/ (a copy of
# ../shared/peers and ../shared/workloads) belong in .git/info/exclude;
# the device call carries .gpu-build and .peer. On the GPU machine:
#   tar xf .gpu-build/pkg.tar.xz && bash bench/gpu_run.sh all
# With ASAN=1 the package also holds the CUDA tests built with
# AddressSanitizer and UBSan (bash bench/gpu_run.sh asan).
set -eu
B=${BUILD_GPU:-build-gpu}
make -s BUILD="$B" NVCC_FLAGS="-O3 --std=c++17 -Xptxas -O3 -gencode arch=compute_90,code=sm_90" \
    CUDA_GEN="$B/cuda-gen" binaries
# The shared libraries the binaries need that the GPU image lacks (OpenBLAS
# and its Fortran runtime, cmocka), copied from this machine.
BINS="$B/tests/test_cuda_dev $B/tests/test_cuda_eager $B/tests/test_cuda_jit $B/tests/test_codegen_cuda
  $B/tests/test_jit $B/tests/test_fusion $B/tests/test_cpu_kernels $B/tests/test_bert $B/tests/test_weights
  $B/tests/test_embed_server $B/tests/test_cuda_multi $B/tests/test_remote $B/tests/test_validate $B/tests/test_backoff $B/tests/test_warmup $B/tests/test_varlen $B/tests/test_gemm_cuda $B/tests/test_gemm_jit $B/tests/test_events $B/tests/test_budget $B/tests/test_cuda_imgset $B/tests/test_learn
  $B/bench/bench_cuda $B/bench/bench_cpu $B/bench/bench_bert $B/bench/bench_gpus $B/bench/bench_validate $B/bench/bench_nvrtc $B/bench/bench_gemm_cuda
  $B/samples/varlen_encoder $B/samples/embed_server $B/samples/embed_client"
# Every shared library the binaries need beyond the C library and the CUDA
# driver, copied from this machine (the GPU image has none of them).
rm -rf .devdeps && mkdir -p .devdeps
# redis-server too, for test_remote on the CUDA backend (gpu_run.sh remote).
REDIS=$(command -v redis-server || true)
for lib in $(ldd $BINS $REDIS 2>/dev/null | awk '/=> \// {print $3}' | sort -u); do
    case $(basename "$lib") in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*) ;;
    *) cp -L "$lib" .devdeps/ ;;
    esac
done
rm -rf .gpu-build && mkdir -p .gpu-build/stage/.gpu-build/bin
cp $BINS $REDIS .gpu-build/stage/.gpu-build/bin/
# SJ_PACK_EXTRA: more files for bin/ (e.g. a benchmark built from the base
# commit, for a side-by-side run on the same machine)
[ -n "${SJ_PACK_EXTRA:-}" ] && cp ${SJ_PACK_EXTRA} .gpu-build/stage/.gpu-build/bin/
rm -f .gpu-build/stage/.gpu-build/bin/*.d
strip .gpu-build/stage/.gpu-build/bin/*
# ASAN=1: also the CUDA tests under AddressSanitizer + UBSan (unstripped,
# with this machine's sanitizer runtimes), for `gpu_run.sh asan`.
if [ "${ASAN:-0}" = 1 ]; then
    make -s BUILD="$B-asan" OPT=-O1 \
        SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
        NVCC_FLAGS="-O3 --std=c++17 -Xptxas -O3 -gencode arch=compute_90,code=sm_90" CUDA_GEN="$B/cuda-gen" \
        "$B-asan/tests/test_cuda_dev" "$B-asan/tests/test_cuda_eager" "$B-asan/tests/test_cuda_jit"
    mkdir -p .gpu-build/stage/.gpu-build/asan
    cp "$B-asan/tests/test_cuda_dev" "$B-asan/tests/test_cuda_eager" "$B-asan/tests/test_cuda_jit" \
       .gpu-build/stage/.gpu-build/asan/
    for lib in libasan.so.8 libubsan.so.1; do
        path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')
        [ -n "$path" ] && cp -L "$path" .gpu-build/stage/.gpu-build/asan/
    done
    # the driver's and the CUDA libraries' own allocations at exit are not ours
    printf 'leak:libcuda.so\nleak:libcublasLt.so\nleak:libcublas.so\nleak:libnvrtc\n' \
        > .gpu-build/stage/.gpu-build/asan/lsan.supp
fi
cp -r .devdeps .gpu-build/stage/
tar -C .gpu-build/stage -cJf .gpu-build/pkg.tar.xz .gpu-build .devdeps
rm -rf .gpu-build/stage
ls -la .gpu-build
