# bench/bench.mk: rules for the benchmark programs (never part of make test). Included by the
# top Makefile. `make bench-runtime` builds them; bench/runtime_bench.sh builds and runs them.

BENCH_DIR := build/bench

$(BENCH_DIR)/runtime_bench: bench/runtime_bench.c build/librt_cpu.a | $(BENCH_DIR)
	$(E) "MPICC     $@"
	$(Q)$(MPICC) $(CFLAGS_C) $(RT_CFLAGS) $(BLAS_CFLAGS) -o $@ $< $(RT_CPU_LIBS)

$(BENCH_DIR)/runtime_bench_gpu: bench/runtime_bench_gpu.c build/librt_cuda.a | $(BENCH_DIR)
	$(E) "MPICC     $@"
	$(Q)$(MPICC) $(CFLAGS_C) $(RT_CFLAGS) -o $@ $< $(RT_CUDA_LIBS)

$(BENCH_DIR):
	$(Q)mkdir -p $@

.PHONY: bench-runtime
bench-runtime: $(BENCH_DIR)/runtime_bench \
               $(if $(filter 1,$(HAVE_CUDA)),$(BENCH_DIR)/runtime_bench_gpu)

-include $(wildcard $(BENCH_DIR)/*.d)
