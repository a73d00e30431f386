#!/usr/bin/env bash
# The GPU session's one command: run on the GPU machine (it cannot install
# packages) from a build made on a development machine.
#
#   carried:  .gpu-build/  pkg.tar.xz from bench/gpu_pack.sh: bin/ (test and bench
#                          binaries) and .devdeps/ (OpenBLAS, cmocka, ...)
#             .peer/       ../shared/peers and ../shared/workloads
#   usage:    bash bench/gpu_run.sh [tests|bench|model|sample|cpu|realmodel|multi|f32probe|graphbudget|remote|cpuscale|pdl|all|asan|warmup|nvrtc|gemm|gemmcold|attc] (results under $OUT)
#             attc: test_cuda_eager and test_varlen, then bench_cuda attention,attc (masked and
#             packed attention on tensor cores: attc.jsonl);
#             gemm: the generated tensor-core products (test_gemm_cuda, then
#             bench_gemm_cuda against cuBLASLt on the MiniLM products: gemm.jsonl;
#             test_gemm_jit, and bench_cuda w4 with SHAPEJIT_CUDA_GEMM 0 and 1);
#             gemmcold: what SHAPEJIT_CUDA_GEMM=1 costs a cold process (test_gemm_jit first,
#             then interleaved with it 0 and 1, no kernel cache and the driver's off:
#             bench_cuda newshape (first fused call after a new shape, compile and
#             tuning ms), w5cold (the declared buckets' warm-up), w5 (the cold stream);
#             then w5cold twice on one kernel cache, 0 and 1 (fill, then hit: a warm process);
#             gemmcold.txt: the compile log's ready lines);
#             remote: test_remote on the CUDA backend, with the package's redis-server
#             sidebyside: bench_cuda --quick (w0-w2) of this build and of bench_cuda_base, interleaved
#             cpuscale: bench_bert on the host's CPUs at 1 and nproc threads, this build against
#             bench_bert_pool and bench_bert_base (other commits' builds, SJ_PACK_EXTRA), interleaved,
#             this build at nproc threads with SHAPEJIT_EXEC_SPIN_US of $SJ_SPINS (default
#             "1000 5000"; impl bench_bert_spin<us>; the default is 50), bench_cpu's pool (the
#             hand-off: pool.jsonl) and smallmm (one sentence's products on 1, 2, 4, ... and
#             nproc threads: smallmm.jsonl), and ONNX Runtime
#             pdl: bench_cuda w4 with SHAPEJIT_CUDA_PDL 1 and 0 interleaved (two rounds), the
#             same with SHAPEJIT_CUDA_GEMM=1, and torch_bucket_graphs.py (w4: PyTorch's
#             layer in a CUDA graph per shape);
#             realmodel: the server's HTTP answers against the reference on CUDA, and
#             the BERT encoder on the host's CPU against ONNX Runtime and PyTorch (needs
#             .gpu-model: the model directory with reference.jsonl);
#             multi: 2 GPUs (test_cuda_multi, bench_gpus, the server on --devices 0,1)
#             bench: w0-w3; model: w4, w5 (the f16 encoder layer), attention alone and
#             the host time of a small call's parts (hostparts);
#             each with the peer; warmup: w5 from a cold process with the
#             library's warm-up first (bench_cuda --workloads w5cold), with the
#             CUDA compute cache off, then filling it, then hitting it;
#             nvrtc: bench_nvrtc's compile times per unit (one program, then
#             split over 8 threads; each unit also with its row kernels'
#             fallbacks as kernels of their own, "+fb"; the split also without
#             -minimal) and w4's compile log, then a table: unit | config |
#             wall ms | programs | slowest CPU ms
#
# The tests print their results; the benchmarks write ours.jsonl and
# torch.jsonl (the PyTorch peer, same run) and compare.txt (ratios).
set -u
what=${1:-all}
[ -f .gpu-build/pkg.tar.xz ] && tar xf .gpu-build/pkg.tar.xz
OUT=${OUT:-/tmp/sj_out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devdeps:${LD_LIBRARY_PATH:-}"
export SHAPEJIT_CACHE_DIR=/tmp/sj_cache
B=.gpu-build/bin
summary="$OUT/summary.txt"
echo "== gpu_run.sh $what $(date -u +%FT%TZ)" >> "$summary"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$summary"
echo "cpus: $(nproc); cc: $(cc --version 2>/dev/null | head -1)" | tee -a "$summary"

if [ "$what" = tests ] || [ "$what" = all ]; then
    for t in ${SJ_TESTS:-test_cuda_dev test_cuda_eager test_codegen_cuda test_cuda_jit test_gemm_cuda}; do
        [ -x "$B/$t" ] || { echo "MISSING $t" | tee -a "$summary"; continue; }
        start=$(date +%s)
        timeout ${SJ_TEST_TIMEOUT:-300} "$B/$t" > "/tmp/$t.log" 2>&1
        rc=$?
        secs=$(( $(date +%s) - start ))
        line=$(grep -E "PASSED|FAILED|skipped" "/tmp/$t.log" | tr '\n' ' ')
        echo "$t rc=$rc ${secs}s: $line" | tee -a "$summary"
        [ $rc -ne 0 ] && grep -E "ERROR|FAIL|error|Failure" "/tmp/$t.log" | head -20 | tee -a "$summary"
        cat "/tmp/$t.log" >> "$OUT/tests.log"
    done
fi

if [ "$what" = gemm ]; then
    timeout ${SJ_TEST_TIMEOUT:-300} "$B/test_gemm_cuda" > /tmp/test_gemm_cuda.log 2>&1
    echo "test_gemm_cuda rc=$?: $(grep -E "PASSED|FAILED|skipped|runs," /tmp/test_gemm_cuda.log | tr '\n' ' ')" | tee -a "$summary"
    grep -E "ERROR|Failure|out .* ref" /tmp/test_gemm_cuda.log | head -20 | tee -a "$summary"
    timeout 300 "$B/bench_gemm_cuda" > "$OUT/gemm.jsonl" 2> /tmp/bench_gemm.err
    echo "bench_gemm_cuda rc=$?" | tee -a "$summary"
    grep best_tile "$OUT/gemm.jsonl" | tee -a "$summary"
    tail -3 /tmp/bench_gemm.err >> "$summary"
    # the products generated inside fused plans (SHAPEJIT_CUDA_GEMM): the
    # test, then w4 with them off and on, interleaved, one call each
    timeout ${SJ_TEST_TIMEOUT:-300} "$B/test_gemm_jit" > /tmp/test_gemm_jit.log 2>&1
    echo "test_gemm_jit rc=$?: $(grep -E "PASSED|FAILED|skipped" /tmp/test_gemm_jit.log | tr '\n' ' ')" | tee -a "$summary"
    grep -E "ERROR|Failure|differs|model " /tmp/test_gemm_jit.log | head -30 | tee -a "$summary"
    for round in 1 2; do
        for on in 0 1; do
            SHAPEJIT_LOG=perf SHAPEJIT_CUDA_GEMM=$on timeout 300 "$B/bench_cuda" --workloads w4 > "$OUT/w4_gemm$on.r$round.jsonl" 2> /tmp/bench_w4g.err
            echo "bench_cuda w4 SHAPEJIT_CUDA_GEMM=$on round $round rc=$?" | tee -a "$summary"
            grep -E '"mode": ?"fused' "$OUT/w4_gemm$on.r$round.jsonl" | head -12 | tee -a "$summary"
            # the tuner's times and choices (first round)
            [ "$on" = 1 ] && [ "$round" = 1 ] && grep -E "product .*cuBLASLt" /tmp/bench_w4g.err | sed 's/^.*cuda: //' | head -48 >> "$summary"
        done
    done
fi

if [ "$what" = gemmcold ]; then # the generated products' cost to a cold process
    timeout ${SJ_TEST_TIMEOUT:-300} "$B/test_gemm_jit" > /tmp/test_gemm_jit.log 2>&1
    echo "test_gemm_jit rc=$?: $(grep -E "PASSED|FAILED|skipped" /tmp/test_gemm_jit.log | tr '\n' ' ')" | tee -a "$summary"
    grep -E "ERROR|Failure|differs|model |cold:" /tmp/test_gemm_jit.log | head -40 | tee -a "$summary"
    for round in ${SJ_ROUNDS:-1 2}; do
        for on in 0 1; do
            for wl in newshape w5cold w5; do
                SHAPEJIT_CACHE_DIR= CUDA_CACHE_DISABLE=1 SHAPEJIT_CUDA_GEMM=$on SHAPEJIT_LOG=compile,perf \
                    timeout 300 "$B/bench_cuda" --workloads $wl > "$OUT/${wl}_gemm$on.r$round.jsonl" 2> /tmp/gemmcold.err
                echo "bench_cuda $wl SHAPEJIT_CUDA_GEMM=$on round $round rc=$?" | tee -a "$summary"
                grep -E '"workload"' "$OUT/${wl}_gemm$on.r$round.jsonl" | tee -a "$summary"
                { echo "== $wl gemm $on round $round"; grep -E "ready \(|product .*cuBLASLt" /tmp/gemmcold.err | head -60; } >> "$OUT/gemmcold.txt"
            done
        done
    done
    # a warm process: w5cold twice on one kernel cache (the first fills it,
    # the second loads the units and the products' choice)
    for on in 0 1; do
        rm -rf /tmp/sj_gemmcold_cache
        for pass in fill hit; do
            SJ_W5COLD_CACHE=/tmp/sj_gemmcold_cache SHAPEJIT_CUDA_GEMM=$on SHAPEJIT_LOG=compile \
                timeout 300 "$B/bench_cuda" --workloads w5cold > "$OUT/w5cold_cache_gemm$on.$pass.jsonl" 2> /tmp/gemmcold.err
            echo "bench_cuda w5cold SHAPEJIT_CUDA_GEMM=$on cache $pass rc=$?" | tee -a "$summary"
            grep -E '"workload"' "$OUT/w5cold_cache_gemm$on.$pass.jsonl" | cut -c1-420 | tee -a "$summary"
            { echo "== w5cold cache gemm $on $pass"; grep -E "ready \(|cache hit" /tmp/gemmcold.err | head -20; } >> "$OUT/gemmcold.txt"
        done
    done
fi

if [ "$what" = pdl ]; then # programmatic dependent launch: w4 with it on and off, interleaved, and PyTorch's per-shape graphs
    for round in 1 2; do
        for on in 1 0; do
            SHAPEJIT_CUDA_PDL=$on timeout 200 "$B/bench_cuda" --workloads w4 > "$OUT/w4_pdl$on.r$round.jsonl" 2> /tmp/bench_w4p.err
            echo "bench_cuda w4 SHAPEJIT_CUDA_PDL=$on round $round rc=$?" | tee -a "$summary"
            grep -E '"mode": ?"fused' "$OUT/w4_pdl$on.r$round.jsonl" | head -12 | tee -a "$summary"
        done
    done
    for on in 1 0; do # with the generated products (S 16: split-K), which wait on the device too
        SHAPEJIT_CUDA_GEMM=1 SHAPEJIT_CUDA_PDL=$on timeout 200 "$B/bench_cuda" --workloads w4 > "$OUT/w4_gemm_pdl$on.jsonl" 2> /dev/null
        echo "bench_cuda w4 SHAPEJIT_CUDA_GEMM=1 SHAPEJIT_CUDA_PDL=$on rc=$?" | tee -a "$summary"
        grep -E '"mode": ?"fused' "$OUT/w4_gemm_pdl$on.jsonl" | head -12 | tee -a "$summary"
    done
    PYTHONUNBUFFERED=1 timeout ${SJ_PEER_TIMEOUT:-150} python3 .peer/peers/torch_bucket_graphs.py samples/varlen_encoder/lengths.txt \
        > "$OUT/torch_bucket.jsonl" 2> /tmp/torch_bucket.err
    echo "torch_bucket_graphs rc=$?" | tee -a "$summary"
    grep -E '"w4"' "$OUT/torch_bucket.jsonl" | tee -a "$summary"
fi

if [ "$what" = asan ]; then # needs a package made with ASAN=1 bash bench/gpu_pack.sh
    # test_cuda_eager takes about 110 s unsanitized and more than 300 s
    # under the sanitizers: give it a call of its own
    # (SJ_ASAN_TESTS=test_cuda_eager SJ_TEST_TIMEOUT=560).
    for t in ${SJ_ASAN_TESTS:-test_cuda_dev test_cuda_eager test_cuda_jit}; do
        [ -x ".gpu-build/asan/$t" ] || { echo "MISSING asan/$t" | tee -a "$summary"; continue; }
        LD_LIBRARY_PATH="$PWD/.gpu-build/asan:$LD_LIBRARY_PATH" \
        ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:halt_on_error=1 \
        LSAN_OPTIONS="suppressions=$PWD/.gpu-build/asan/lsan.supp" UBSAN_OPTIONS=print_stacktrace=1 \
            timeout ${SJ_TEST_TIMEOUT:-300} ".gpu-build/asan/$t" > "/tmp/asan_$t.log" 2>&1
        rc=$?
        echo "asan $t rc=$rc: $(grep -E "PASSED|FAILED" "/tmp/asan_$t.log" | tr '\n' ' ')" | tee -a "$summary"
        grep -E -A20 "ERROR: (Address|Leak)Sanitizer|runtime error" "/tmp/asan_$t.log" | head -60 | tee -a "$summary"
        cat "/tmp/asan_$t.log" >> "$OUT/asan.log"
    done
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
    timeout 400 "$B/bench_cuda" > "$OUT/ours.jsonl" 2> /tmp/bench_cuda.err
    echo "bench_cuda rc=$?" | tee -a "$summary"
    grep "floor" /tmp/bench_cuda.err | tee -a "$summary"
    PYTHONUNBUFFERED=1 timeout 420 python3 .peer/peers/torch_peer.py --workloads ceiling,w0,w1,w2,w3 \
        --modes eager,compile_auto,compile_dynamic > "$OUT/torch.jsonl" 2> /tmp/torch.err
    echo "torch_peer rc=$?" | tee -a "$summary"
    python3 .peer/peers/compare.py "$OUT/ours.jsonl" "$OUT/torch.jsonl" > "$OUT/compare.txt" 2>&1
    grep -E "ceiling" "$OUT/ours.jsonl" "$OUT/torch.jsonl" | tee -a "$summary"
    grep -E "^w(0|1 +16384|2 +32768|3 +2048)" "$OUT/compare.txt" | tee -a "$summary"
fi

if [ "$what" = model ] || [ "$what" = all ]; then
    timeout 300 "$B/bench_cuda" --workloads w4,w5,attention,hostparts > "$OUT/ours_model.jsonl" 2> /tmp/bench_model.err
    echo "bench_cuda w4,w5 rc=$?" | tee -a "$summary"
    tail -3 /tmp/bench_model.err >> "$summary"
    PYTHONUNBUFFERED=1 timeout ${SJ_PEER_MODEL_TIMEOUT:-280} python3 .peer/peers/torch_peer.py --workloads w4,w5 \
        --modes ${SJ_PEER_MODEL_MODES:-eager,compile_auto,compile_dynamic} > "$OUT/torch_model.jsonl" 2> /tmp/torch_model.err
    echo "torch_peer w4,w5 rc=$?" | tee -a "$summary"
    tail -3 /tmp/torch_model.err >> "$summary"
    python3 .peer/peers/compare.py "$OUT/ours_model.jsonl" "$OUT/torch_model.jsonl" > "$OUT/compare_model.txt" 2>&1
    grep -E "^w(4 +(16|512) |5)" "$OUT/compare_model.txt" | tee -a "$summary"
fi

if [ "$what" = sample ] || [ "$what" = all ]; then
    timeout 200 "$B/varlen_encoder" samples/varlen_encoder/lengths.txt --quiet > "$OUT/sample.txt" 2>&1
    echo "sample rc=$?" | tee -a "$summary"
    tail -4 "$OUT/sample.txt" | tee -a "$summary"
    timeout 200 "$B/varlen_encoder" samples/varlen_encoder/lengths.txt --quiet --threads 8 > "$OUT/sample_t8.txt" 2>&1
    echo "sample --threads 8 rc=$?" | tee -a "$summary"
    tail -4 "$OUT/sample_t8.txt" | tee -a "$summary"
fi

if [ "$what" = warmup ]; then # issue 28; each run a process of its own
    CUDA_CACHE_DISABLE=1 timeout 300 "$B/bench_cuda" --workloads w5cold > "$OUT/w5cold.jsonl" 2> /tmp/w5cold.err
    echo "bench_cuda w5cold (CUDA_CACHE_DISABLE=1) rc=$?" | tee -a "$summary"
    for pass in fills warm; do # the CUDA compute cache: filled by the first, hit by the second
        timeout 300 "$B/bench_cuda" --workloads w5cold >> "$OUT/w5cold.jsonl" 2>> /tmp/w5cold.err
        echo "bench_cuda w5cold (compute cache $pass) rc=$?" | tee -a "$summary"
    done
    tee -a "$summary" < "$OUT/w5cold.jsonl"
    tail -3 /tmp/w5cold.err >> "$summary"
    # the strongest PyTorch configuration on the same stream, same call:
    # vLLM-style graphs per bucket captured before serving (startup counted)
    PYTHONUNBUFFERED=1 timeout 300 python3 .peer/peers/torch_bucket_graphs.py samples/varlen_encoder/lengths.txt \
        > "$OUT/torch_bucket.jsonl" 2> /tmp/torch_bucket.err
    echo "torch_bucket_graphs rc=$?" | tee -a "$summary"
    grep -E '"w5"' "$OUT/torch_bucket.jsonl" | tee -a "$summary"
    tail -3 /tmp/torch_bucket.err >> "$summary"
fi

if [ "$what" = nvrtc ]; then # issue 28: NVRTC time per unit (compute cache off), one program, then split
    # each unit as today and with its row kernels' fallbacks split off ("+fb"); the split also
    # without -minimal (before issue 28's options: "nomin")
    CUDA_CACHE_DISABLE=1 timeout 300 "$B/bench_nvrtc" --reps 5 --fb > "$OUT/nvrtc.jsonl" 2>> "$summary"
    echo "bench_nvrtc --fb rc=$?" | tee -a "$summary"
    CUDA_CACHE_DISABLE=1 timeout 300 "$B/bench_nvrtc" --reps 5 --fb --split --threads 8 >> "$OUT/nvrtc.jsonl" 2>> "$summary"
    echo "bench_nvrtc --fb --split --threads 8 rc=$?" | tee -a "$summary"
    CUDA_CACHE_DISABLE=1 timeout 300 "$B/bench_nvrtc" --reps 5 --split --threads 8 --drop -minimal 2>> "$summary" |
        sed 's/"config": "split_default"/"config": "split_nomin"/' >> "$OUT/nvrtc.jsonl"
    echo "bench_nvrtc --split --threads 8 --drop -minimal rc=${PIPESTATUS[0]}" | tee -a "$summary"
    cat "$OUT/nvrtc.jsonl" >> "$summary"
    # the GPU-host table of bench/RESULTS.md: unit, config, wall ms (median), programs, slowest program's CPU ms
    echo "unit | config | wall ms | programs | slowest CPU ms" | tee -a "$summary"
    sed -E 's/.*"unit": "([^"]*)", "config": "([^"]*)".*"median_ms": ([0-9.]*).*/\1 \2 \3 &/' "$OUT/nvrtc.jsonl" |
        while read -r u c ms rest; do
            pieces=$(printf '%s' "$rest" | sed -nE 's/.*"pieces": ([0-9]+).*/\1/p')
            slow=$(printf '%s' "$rest" | sed -nE 's/.*"slowest_cpu_ms": ([0-9.]+).*/\1/p')
            cpu=$(printf '%s' "$rest" | sed -nE 's/.*"cpu_median_ms": ([0-9.]+).*/\1/p')
            echo "$u | $c | $ms | ${pieces:-1} | ${slow:-$cpu}"
        done | tee -a "$summary"
    SHAPEJIT_LOG=compile CUDA_CACHE_DISABLE=1 timeout 300 "$B/bench_cuda" --workloads w4 > "$OUT/w4_compile.jsonl" \
        2> /tmp/w4_compile.err
    echo "bench_cuda w4 with the compile log rc=$?" | tee -a "$summary"
    grep "compiled in" /tmp/w4_compile.err | head -12 | tee -a "$summary"
fi

if [ "$what" = attc ]; then # issue 26: masked and packed attention on tensor cores, their tests first
    for t in test_cuda_eager test_varlen; do
        timeout 600 "$B/$t" > "/tmp/$t.log" 2>&1
        echo "$t rc=$?" | tee -a "$summary"
        grep -E "ERROR|FAILED|Failure|mismatch|PASSED" "/tmp/$t.log" | head -20 | tee -a "$summary"
        cat "/tmp/$t.log" >> "$OUT/tests.log"
    done
    timeout 300 "$B/bench_cuda" --workloads attention,attc > "$OUT/attc.jsonl" 2> /tmp/attc.err
    echo "bench_cuda attention,attc rc=$?" | tee -a "$summary"
    tee -a "$summary" < "$OUT/attc.jsonl"
    tail -3 /tmp/attc.err >> "$summary"
fi

if [ "$what" = cpu ] || [ "$what" = all ]; then
    SHAPEJIT_BACKEND=cpu timeout 300 "$B/bench_cpu" --workloads w1,w2,w3 > "$OUT/cpu16.jsonl" 2>&1
    echo "bench_cpu rc=$?" | tee -a "$summary"
fi

if [ "$what" = realmodel ]; then
    M=.gpu-model
    SJ_MODEL_DIR=$M SJ_MODEL_REF=$M/reference.jsonl SJ_EMBED_SERVER=$B/embed_server SJ_EMBED_BACKEND=cuda \
        timeout 300 "$B/test_embed_server" > /tmp/embed_gpu.log 2>&1
    echo "test_embed_server on CUDA rc=$?: $(grep -E "PASSED|FAILED" /tmp/embed_gpu.log | tr '\n' ' ')" | tee -a "$summary"
    grep -E "on CUDA|FAIL|Failure|cosine" /tmp/embed_gpu.log | head -8 | tee -a "$summary"
    n=$(nproc)
    SHAPEJIT_BACKEND=cpu timeout 200 "$B/bench_bert" --model $M --threads "$n" --batches 1,8,32 --seconds 3 \
        > "$OUT/bert_cpu_host.jsonl" 2>> "$summary"
    echo "bench_bert cpu rc=$?" | tee -a "$summary"; cat "$OUT/bert_cpu_host.jsonl" >> "$summary"
    timeout 300 python3 bench/ort_bert_peer.py $M samples/bert/sentences.txt --threads "$n" --batches 1,8,32 --optimize \
        > "$OUT/ort_cpu_host.jsonl" 2>> "$summary"
    echo "ort rc=$?" | tee -a "$summary"; cat "$OUT/ort_cpu_host.jsonl" >> "$summary"
    timeout 300 python3 bench/st_bert_peer.py $M samples/bert/sentences.txt --device cpu --dtypes f32 --batches 1,8,32 \
        > "$OUT/torch_cpu_host.jsonl" 2>> "$summary"
    echo "torch cpu rc=$?" | tee -a "$summary"; cat "$OUT/torch_cpu_host.jsonl" >> "$summary"
fi

# 0 when GET /health on localhost:$1 answers 200 (no curl on the GPU image)
healthy() {
    exec 3<>"/dev/tcp/127.0.0.1/$1" 2>/dev/null || return 1
    printf 'GET /health HTTP/1.0\r\n\r\n' >&3
    local line
    read -r line <&3
    exec 3>&-
    case "$line" in *" 200"*) return 0 ;; *) return 1 ;; esac
}

if [ "$what" = cpuscale ]; then # the BERT encoder on the host's CPUs: this build against the base's, interleaved, and ORT
    M=.gpu-model; n=$(nproc)
    for round in 1 2; do
        for bin in bench_bert bench_bert_pool bench_bert_base; do
            [ -x "$B/$bin" ] || continue
            SHAPEJIT_BACKEND=cpu timeout 150 "$B/$bin" --model $M --threads "1,$n" --batches 1,8,32 --seconds 2 \
                2>> "$summary" | sed "s/\"impl\": \"shapejit\"/\"impl\": \"$bin\"/" >> "$OUT/bert_scale.jsonl"
            echo "$bin round $round rc=$?" | tee -a "$summary"
        done
    done
    for spin in ${SJ_SPINS:-1000 5000}; do # how long kernel threads poll before they sleep (exec_spin_us), swept
        SHAPEJIT_EXEC_SPIN_US=$spin SHAPEJIT_BACKEND=cpu timeout 150 "$B/bench_bert" --model $M --threads "$n" \
            --batches 1,8,32 --seconds 2 2>> "$summary" | sed "s/\"impl\": \"shapejit\"/\"impl\": \"bench_bert_spin$spin\"/" \
            >> "$OUT/bert_scale.jsonl"
        echo "bench_bert_spin$spin rc=$?" | tee -a "$summary"
    done
    [ -x "$B/bench_cpu" ] && timeout 100 "$B/bench_cpu" --workloads pool > "$OUT/pool.jsonl" 2>> "$summary"
    [ -x "$B/bench_cpu" ] && grep -E '"threads": '"$n"',' "$OUT/pool.jsonl" | tee -a "$summary"
    [ -x "$B/bench_cpu" ] && timeout 200 "$B/bench_cpu" --workloads smallmm > "$OUT/smallmm.jsonl" 2>> "$summary"
    [ -x "$B/bench_cpu" ] && cat "$OUT/smallmm.jsonl" >> "$summary"
    SHAPEJIT_BACKEND=cpu timeout 100 "$B/bench_bert" --model $M --threads "$n" --batches 8,32 --seconds 2 --packed \
        2>> "$summary" >> "$OUT/bert_scale.jsonl"
    timeout 200 python3 bench/ort_bert_peer.py $M samples/bert/sentences.txt --threads "1,$n" --batches 1,8,32 --seconds 2 --optimize \
        >> "$OUT/bert_scale.jsonl" 2>> "$summary"
    echo "ort rc=$?" | tee -a "$summary"
    cat "$OUT/bert_scale.jsonl" >> "$summary"
fi

if [ "$what" = sidebyside ]; then # issue 24: bench_cuda of this build against bench_cuda_base (SJ_PACK_EXTRA), interleaved
    for round in 1 2; do
        for bin in bench_cuda bench_cuda_base; do
            [ -x "$B/$bin" ] || continue
            timeout 120 "$B/$bin" --quick --workloads ${SJ_SIDE_WORKLOADS:-w0,w1,w2} 2>> "$summary" \
                | sed "s/^{/{\"build\": \"$bin\", /" >> "$OUT/sidebyside.jsonl"
            echo "$bin round $round rc=$?" | tee -a "$summary"
        done
    done
fi

if [ "$what" = remote ]; then # the remote kernel cache on the CUDA backend (redis-server from the package)
    PATH="$PWD/$B:$PATH" SJ_REMOTE_BACKEND=cuda timeout 300 "$B/test_remote" > /tmp/remote.log 2>&1
    echo "test_remote (cuda) rc=$?: $(grep -E "PASSED|FAILED|skipped" /tmp/remote.log | tr '\n' ' ')" | tee -a "$summary"
    grep -E "ERROR|LINE|FAIL" /tmp/remote.log | head -20 | tee -a "$summary"
fi

if [ "$what" = f32probe ]; then # issue 27: why alternating two batch shapes costs f32 batches on one GPU
    head -32 samples/bert/sentences.txt > /tmp/sent32.txt # 1 batch of 32: one shape; the full file: two
    for cfg in "full" "one" "full SHAPEJIT_CUDA_GRAPHS=0" "one SHAPEJIT_CUDA_GRAPHS=0" "full SHAPEJIT_CUDA_TF32=1" "one SHAPEJIT_CUDA_TF32=1"; do
        set -- $cfg
        sent=samples/bert/sentences.txt; [ "$1" = one ] && sent=/tmp/sent32.txt
        shift
        env "$@" timeout 120 "$B/bench_gpus" --model .gpu-model --sentences "$sent" --devices 0 --batch 32 \
            --seconds 3 --dtype f32 > /tmp/probe.jsonl 2> /tmp/probe.err
        echo "f32probe $cfg rc=$?: $(cat /tmp/probe.jsonl | tr '\n' ' ')" | tee -a "$summary"
        grep -c . /tmp/probe.err | sed 's/^/stderr lines: /' | tee -a "$summary"
        tail -5 /tmp/probe.err >> "$summary"
    done
fi

if [ "$what" = graphbudget ]; then # issue 30: graph memory under SHAPEJIT_GRAPH_MAX_BYTES (0: no limit) on w4 and w5
    for budget in 0 ${SJ_GRAPH_BUDGETS:-4194304 1048576}; do
        SHAPEJIT_GRAPH_MAX_BYTES=$budget timeout 200 "$B/bench_cuda" --workloads w4,w5 \
            > "$OUT/graphbudget_$budget.jsonl" 2> /tmp/gb.err
        echo "graph budget $budget rc=$?" | tee -a "$summary"
        grep -E '"fused_static"|"auto' "$OUT/graphbudget_$budget.jsonl" | tee -a "$summary"
    done
fi

if [ "$what" = multi ]; then
    timeout 300 "$B/test_cuda_multi" > /tmp/multi.log 2>&1
    echo "test_cuda_multi rc=$?: $(grep -E "PASSED|FAILED|skipped" /tmp/multi.log | tr '\n' ' ')" | tee -a "$summary"
    for dt in f32 f16; do
        timeout 240 "$B/bench_gpus" --model .gpu-model --devices 0,1 --batch 32 --seconds 5 --dtype $dt \
            >> "$OUT/gpus.jsonl" 2>> "$summary"
        echo "bench_gpus $dt rc=$?" | tee -a "$summary"
    done
    cat "$OUT/gpus.jsonl" >> "$summary"
    SJ_MODEL_DIR=.gpu-model SJ_MODEL_REF=.gpu-model/reference.jsonl SJ_EMBED_SERVER=$B/embed_server \
        SJ_EMBED_BACKEND=cuda SJ_EMBED_DEVICES=0,1 timeout 300 "$B/test_embed_server" > /tmp/embed2.log 2>&1
    echo "test_embed_server --devices 0,1 rc=$?: $(grep -E "PASSED|FAILED" /tmp/embed2.log | tr '\n' ' ')" | tee -a "$summary"
    for devs in 0 0,1; do
        rm -f /tmp/port; $B/embed_server --model .gpu-model --port 0 --port-file /tmp/port --devices $devs \
            2> /tmp/server_$devs.log &
        pid=$!
        for i in $(seq 600); do [ -s /tmp/port ] && healthy "$(cat /tmp/port)" && break; sleep 0.2; done
        $B/embed_client --port "$(cat /tmp/port)" --connections 16 --requests 4000 --batch 8 \
            > "$OUT/client_$devs.txt" 2>&1
        echo "server --devices $devs, 16 connections x 8 sentences: rc=$?" | tee -a "$summary"
        tail -6 "$OUT/client_$devs.txt" | tee -a "$summary"
        kill -TERM $pid; wait $pid
    done
fi
