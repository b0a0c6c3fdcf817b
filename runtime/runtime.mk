# runtime/runtime.mk: rules for the runtime libraries build/librt_cpu.a (always) and
# build/librt_cuda.a (when nvcc, cuBLAS and NCCL are found), the link flags generated programs
# use, and the runtime's test programs (run by tests/runtime/suite.sh). Included by the top
# Makefile; adds rules and appends to ALL_TARGETS / CLEAN_FILES only.
#
# Generated programs (compiled with $(MPICC) $(RT_CFLAGS), linked from the repository root):
#   CPU : $(MPICC) prog.o $(RT_CPU_LIBS)
#   CUDA: $(MPICC) prog.o kernels.o $(RT_CUDA_LIBS)      (kernels.o from $(NVCC))
# Single-rank programs without MPI (build/librt_*_single.a, below):
#   CPU : $(CC) prog.o $(RT_CPU_SINGLE_LIBS)     CUDA: $(CC) prog.o $(RT_CUDA_SINGLE_LIBS)

RT_BUILD     := build/runtime
RT_CFLAGS    := -Iruntime
RT_CPU_LIBS  = $(LD_FAST) -Lbuild -lrt_cpu $(BLAS_LIBS) $(DNNL_LIBS) -lpthread -lm
RT_CUDA_SYS  := $(LD_FAST) -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
                -lcublasLt -lcublas -lnccl -lcudart -lstdc++ -lpthread -lm -ldl -lrt
RT_CUDA_LIBS := -Lbuild -lrt_cuda $(RT_CUDA_SYS)
RT_CPU_SINGLE_LIBS  = $(LD_FAST) -Lbuild -lrt_cpu_single $(BLAS_LIBS) $(DNNL_LIBS) -lpthread -lm
RT_CUDA_SINGLE_LIBS := -Lbuild -lrt_cuda_single $(RT_CUDA_SYS)

# nvcc compiles rt_cuda.cu (C++17) against MPI's headers; GPU code for A100 and H100 plus
# PTX for later parts.
RT_CUDA_ARCH   ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
                  -gencode arch=compute_90,code=compute_90
# (mpicc --showme:compile repeats the flags it is given: not the sanitizer's, which nvcc refuses)
RT_MPI_CFLAGS  := $(filter-out $(SAN_FLAGS),$(shell $(MPICC) --showme:compile 2>/dev/null))
RT_NVCC_BASE   := -std=c++17 $(OPT) -g $(RT_CUDA_ARCH) -Werror all-warnings \
                  -Xcompiler -Wall,-Wextra,-Wshadow,-Werror
RT_NVCC_FLAGS  := $(RT_NVCC_BASE) $(RT_MPI_CFLAGS) -Iruntime

RT_COMMON_OBJS := $(RT_BUILD)/rt_common.o $(RT_BUILD)/rt_mpi.o
RT_CPU_OBJS    := $(RT_COMMON_OBJS) $(RT_BUILD)/rt_cpu.o
RT_CUDA_OBJS   := $(RT_COMMON_OBJS) $(RT_BUILD)/rt_cuda.o

$(RT_BUILD)/%.o: runtime/%.c | $(RT_BUILD)
	$(E) "MPICC     $@"
	$(Q)$(MPICC) $(CFLAGS_C) $(BLAS_CFLAGS) -c -o $@ $<

# The CPU backend's GEMMs run on oneDNN: say so when it is missing (rather than "no such file").
$(RT_BUILD)/rt_cpu.o: runtime/rt_cpu.c | $(RT_BUILD)
	$(Q)test -n "$(HAVE_DNNL)" || { echo "runtime: oneDNN not found (oneapi/dnnl/dnnl.h):" \
	    "install the Debian package libdnnl-dev (make deps)" >&2; exit 1; }
	$(E) "MPICC     $@"
	$(Q)$(MPICC) $(CFLAGS_C) $(BLAS_CFLAGS) -c -o $@ $<

$(RT_BUILD)/rt_cuda.o: runtime/rt_cuda.cu | $(RT_BUILD)
	$(E) "NVCC      $@"
	$(Q)$(NVCC) $(RT_NVCC_FLAGS) -MMD -MP -c -o $@ $<

build/librt_cpu.a: $(RT_CPU_OBJS)
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(RT_BUILD):
	$(Q)mkdir -p $@

ALL_TARGETS += build/librt_cpu.a

ifeq ($(HAVE_CUDA),1)
build/librt_cuda.a: $(RT_CUDA_OBJS)
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^
ALL_TARGETS += build/librt_cuda.a
else
.PHONY: build/librt_cuda.a runtime-cuda-notice
build/librt_cuda.a runtime-cuda-notice:
	@echo "runtime: CUDA backend not built (needs nvcc, cuBLAS and NCCL under $(CUDA_HOME))"
ALL_TARGETS += runtime-cuda-notice
endif

# -- Single-rank libraries without MPI (runtime/rt_single.c in place of rt_mpi.c) ---------------
# Every object again, by the plain compilers with -DRT_NO_MPI (no MPI header, no MPI symbol):
# for programs of one rank on machines without MPI (tests/single/suite.sh checks with ldd).
RT_SINGLE_BUILD   := $(RT_BUILD)/single
RT_SINGLE_COMMON  := $(RT_SINGLE_BUILD)/rt_common.o $(RT_SINGLE_BUILD)/rt_single.o

$(RT_SINGLE_BUILD)/%.o: runtime/%.c | $(RT_SINGLE_BUILD)
	$(E) "CC        $@"
	$(Q)$(CC) $(CFLAGS_C) -DRT_NO_MPI $(BLAS_CFLAGS) -c -o $@ $<

$(RT_SINGLE_BUILD)/rt_cuda.o: runtime/rt_cuda.cu | $(RT_SINGLE_BUILD)
	$(E) "NVCC      $@"
	$(Q)$(NVCC) $(RT_NVCC_BASE) -DRT_NO_MPI -Iruntime -MMD -MP -c -o $@ $<

build/librt_cpu_single.a: $(RT_SINGLE_COMMON) $(RT_SINGLE_BUILD)/rt_cpu.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^

build/librt_cuda_single.a: $(RT_SINGLE_COMMON) $(RT_SINGLE_BUILD)/rt_cuda.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(RT_SINGLE_BUILD):
	$(Q)mkdir -p $@

ALL_TARGETS += build/librt_cpu_single.a $(if $(HAVE_CUDA),build/librt_cuda_single.a)

# -- Test programs (tests/runtime/suite.sh runs `make -s runtime-tests`) ------------------------
# Each test source builds twice where it makes sense: *_cpu against librt_cpu.a and, with CUDA,
# *_cuda against librt_cuda.a (same source: tests move data with rt_memcpy, as programs do).

RT_TEST_DIR   := $(RT_BUILD)/test
RT_TESTS      := coll async gemm rng fault groups trace
RT_TEST_CPU   := $(patsubst %,$(RT_TEST_DIR)/t_%_cpu,$(RT_TESTS))
RT_TEST_CUDA  := $(patsubst %,$(RT_TEST_DIR)/t_%_cuda,$(RT_TESTS))

$(RT_TEST_DIR)/%.o: tests/runtime/%.c | $(RT_TEST_DIR)
	$(E) "MPICC     $@"
	$(Q)$(MPICC) $(CFLAGS_C) $(RT_CFLAGS) -c -o $@ $<

$(RT_TEST_DIR)/t_%_cpu: $(RT_TEST_DIR)/t_%.o build/librt_cpu.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $< $(RT_CPU_LIBS)

# t_groups links the group tables of one configuration (hand-written: tests/runtime/tables.c).
$(RT_TEST_DIR)/t_groups_cpu: $(RT_TEST_DIR)/t_groups.o $(RT_TEST_DIR)/tables.o build/librt_cpu.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(RT_TEST_DIR)/t_groups.o $(RT_TEST_DIR)/tables.o $(RT_CPU_LIBS)

$(RT_TEST_DIR)/t_groups_cuda: $(RT_TEST_DIR)/t_groups.o $(RT_TEST_DIR)/tables.o build/librt_cuda.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(RT_TEST_DIR)/t_groups.o $(RT_TEST_DIR)/tables.o $(RT_CUDA_LIBS)

# Tables converted from the generator's topology.json (tests/runtime/topo2c.lua) by the suite:
# GROUPS_DIR/tables.c -> GROUPS_DIR/t_groups (make GROUPS_DIR=<dir> <dir>/t_groups; the
# directory is in the suite's scratch, wherever TEST_SCRATCH puts it).
ifdef GROUPS_DIR
$(GROUPS_DIR)/t_groups: $(GROUPS_DIR)/tables.c $(RT_TEST_DIR)/t_groups.o build/librt_cpu.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) $(CFLAGS_C) $(RT_CFLAGS) -Itests/runtime -o $@ $< $(RT_TEST_DIR)/t_groups.o \
	    $(RT_CPU_LIBS)
endif

$(RT_TEST_DIR)/t_%_cuda: $(RT_TEST_DIR)/t_%.o build/librt_cuda.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $< $(RT_CUDA_LIBS)

$(RT_TEST_DIR):
	$(Q)mkdir -p $@

# The same sources without MPI, over librt_cpu_single.a (tests/single/suite.sh; not t_fault,
# which calls MPI itself): build/runtime/test/single/t_<name>.
RT_TEST_SINGLE_DIR := $(RT_TEST_DIR)/single
RT_TEST_SINGLE     := $(patsubst %,$(RT_TEST_SINGLE_DIR)/t_%,coll async gemm rng groups)

$(RT_TEST_SINGLE_DIR)/%.o: tests/runtime/%.c | $(RT_TEST_SINGLE_DIR)
	$(E) "CC        $@"
	$(Q)$(CC) $(CFLAGS_C) -DRT_NO_MPI $(RT_CFLAGS) -c -o $@ $<

$(RT_TEST_SINGLE_DIR)/t_%: $(RT_TEST_SINGLE_DIR)/t_%.o build/librt_cpu_single.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $< $(RT_CPU_SINGLE_LIBS)

$(RT_TEST_SINGLE_DIR)/t_groups: $(RT_TEST_SINGLE_DIR)/t_groups.o $(RT_TEST_SINGLE_DIR)/tables.o \
                                build/librt_cpu_single.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(filter %.o,$^) $(RT_CPU_SINGLE_LIBS)

# The CUDA ones over librt_cuda_single.a, for a GPU machine without MPI (bench/gpu_batch.sh).
$(RT_TEST_SINGLE_DIR)/t_%_cuda: $(RT_TEST_SINGLE_DIR)/t_%.o build/librt_cuda_single.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $< $(RT_CUDA_SINGLE_LIBS)

$(RT_TEST_SINGLE_DIR):
	$(Q)mkdir -p $@

# The MPI ones over the CUDA emulation's runtime with MPI (tests/kernels/kernels.mk builds the
# libraries: runtime/rt_cuda.cu on the CPU, its ranks on the MPI transport): run by
# tests/runtime/suite.sh. (build/emu/t_<name>_cuda, the single-rank ones: tests/kernels.mk.)
build/emu/t_%_cuda_mpi: $(RT_TEST_DIR)/t_%.o build/emu/librt_cuda_emu_mpi.a build/emu/libcuda_emu.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $< build/emu/librt_cuda_emu_mpi.a build/emu/libcuda_emu.a $(BLAS_LIBS) \
	    -lstdc++ -lpthread -lm

.PHONY: runtime-tests runtime-tests-cuda runtime-tests-single
runtime-tests: build/librt_cpu.a $(RT_TEST_CPU)
runtime-tests-single: $(RT_TEST_SINGLE)
ifeq ($(HAVE_CUDA),1)
runtime-tests-cuda: build/librt_cuda.a $(RT_TEST_CUDA)
else
runtime-tests-cuda:
	@echo "runtime: CUDA backend not built (needs nvcc, cuBLAS and NCCL under $(CUDA_HOME))"; exit 1
endif

-include $(wildcard $(RT_BUILD)/*.d $(RT_TEST_DIR)/*.d $(RT_SINGLE_BUILD)/*.d \
    $(RT_TEST_SINGLE_DIR)/*.d)
