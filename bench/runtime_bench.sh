#!/bin/sh
# bench/runtime_bench.sh: build and run the runtime benchmarks (not part of make test):
# collectives and p2p vs raw MPI (blocking and nonblocking) on 2 and 4 ranks, overlap of an
# allreduce with compute on 2 ranks (30 M and 130 M f32: DP 2 gradient buffers), the rounding of
# MPI_Allreduce vs MPI_Iallreduce on 3 and 5 ranks, rt_gemm vs OpenBLAS and oneDNN at GPT-2 124M
# shapes (f32 and bf16, 1 and 2 threads), small per-head GEMMs, the threading-trap comparison,
# and, when nvidia-smi lists a GPU, rt_gemm TFLOP/s on the CUDA backend vs the device's
# measured peak. Compute runs are pinned to cores 0-1 (taskset) with OMP_WAIT_POLICY=PASSIVE
# (oneDNN's own OpenMP threads, measured beside rt_gemm, then sleep when idle). Timings on a
# shared 2-core VM vary by ~15 %; run on a quiet machine.
#   bench/runtime_bench.sh [comm|overlap|rounding|gemm|small|threads|gpu ...]  (default: all)
cd "$(dirname "$0")/.." || exit 2
make -s bench-runtime || exit 1
MPIRUN="mpirun --oversubscribe"
[ "$(id -u)" = 0 ] && MPIRUN="mpirun --allow-run-as-root --oversubscribe"
what=${*:-comm overlap rounding gemm small threads gpu}
PIN="taskset -c 0-$(( $(nproc) < 2 ? 0 : 1 ))"
for w in $what; do
    case $w in
    comm)
        for np in 2 4; do
            $MPIRUN -np $np build/bench/runtime_bench comm < /dev/null
            echo
        done ;;
    overlap)
        $MPIRUN -np 2 build/bench/runtime_bench overlap 1M 4M 30M 130M < /dev/null
        echo ;;
    rounding)
        for np in 3 5; do
            $MPIRUN -np $np build/bench/runtime_bench rounding < /dev/null
            echo
        done ;;
    gemm|small|threads)
        OMP_WAIT_POLICY=PASSIVE $PIN build/bench/runtime_bench "$w"
        echo ;;
    gpu)
        if [ -x build/bench/runtime_bench_gpu ] && command -v nvidia-smi > /dev/null &&
           nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
            build/bench/runtime_bench_gpu
        else
            echo "gpu: skipped (no GPU, or the CUDA backend is not built)"
        fi ;;
    *)
        echo "usage: bench/runtime_bench.sh [comm|overlap|rounding|gemm|small|threads|gpu ...]" >&2
        exit 2 ;;
    esac
done
