# build.mk: how to compile and link the programs of this directory -- generated, DO NOT EDIT.
# Included by the top-level Makefile (make MODEL=tiny TP=2 PP=2 DP=2), which defines MPICC, NVCC, OPT,
# RT_CPU_LIBS, RT_CUDA_LIBS and HAVE_CUDA; objects go to build/<this directory>.
#   train       CPU backend (OpenBLAS, MPI)
#   train_cuda  CUDA backend (cuBLAS, NCCL or MPI transport), when CUDA is found

GEN_OUT  := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
GEN_OBJ  := build/$(GEN_OUT)
GEN_SRCS := model.c train.c groups.c stage0.c stage1.c

GEN_OBJS := $(GEN_SRCS:%.c=$(GEN_OBJ)/%.o)
# GEN_OPT (the top Makefile's): how the generated C is compiled. The CPU kernels are written
# for the vectoriser: at -O3 with the host's vector width they run 2-10x faster than at -O2;
# -fno-math-errno and -fno-trapping-math let sqrtf and the clamps in vexpf vectorise. None of
# these flags changes a result (no -ffast-math; -std=c11 turns FMA contraction off).
GEN_CFLAGS := -std=c11 $(GEN_OPT) -g -Wall -Wextra -Werror -Iruntime -I$(GEN_OUT) -MMD -MP

$(GEN_OBJ)/%.o: $(GEN_OUT)/%.c
	$(E) "CC        $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(MPICC) $(GEN_CFLAGS) -c -o $@ $<

$(GEN_OUT)/train: $(GEN_OBJS) $(GEN_OBJ)/kernels.o build/librt_cpu.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(GEN_OBJS) $(GEN_OBJ)/kernels.o $(RT_CPU_LIBS)

$(GEN_OBJ)/kernels_cuda.o: $(GEN_OUT)/kernels.cu
	$(E) "NVCC      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) $(RT_NVCC_FLAGS) -Iruntime -I$(GEN_OUT) -c -o $@ $<

$(GEN_OUT)/train_cuda: $(GEN_OBJS) $(GEN_OBJ)/kernels_cuda.o build/librt_cuda.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(GEN_OBJS) $(GEN_OBJ)/kernels_cuda.o $(RT_CUDA_LIBS)

GEN_TARGETS := $(GEN_OUT)/train $(if $(HAVE_CUDA),$(GEN_OUT)/train_cuda)

-include $(GEN_OBJS:.o=.d) $(GEN_OBJ)/kernels.d
