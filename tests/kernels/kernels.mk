# tests/kernels/kernels.mk: build rules for the kernel test programs (tests/kernels/suite.sh).
# Read after the top Makefile, whose variables it uses (MPICC, NVCC, CFLAGS_C, LIB_OPT, WARN,
# RT_CPU_LIBS, RT_CUDA_LIBS, RT_NVCC_FLAGS, HAVE_CUDA), either through an include or as
#   make -f Makefile -f tests/kernels/kernels.mk KT_SRC=<dir> kernel-test[-cuda|-emu]
# KT_SRC holds kernels_cpu.c, kernels_cuda.cu and kernel_rows.h: the library's own (lib/: the
# test links the library's objects, build/lib/kernels_*.o) or a mutant copy the suite made
# (compiled here); objects and programs go to KT_BUILD (build/test/kernels/).

ifndef KERNELS_MK_INCLUDED
KERNELS_MK_INCLUDED := 1

KT_SRC   ?= lib
KT_BUILD ?= build/test/kernels
KT_FLAGS := -Iruntime -I$(KT_SRC) -Ilib -Itests/ref
KT_EXTRA ?=                 # more flags for the kernels (the suite's mutants: -Wno-error)
KT_TEST  ?= $(KT_BUILD)/kernel_test.o   # the test's object (the mutants share the suite's)
# the CUDA emulation's objects and libraries (below)
EMU_BUILD := build/emu
ifeq ($(KT_SRC),lib)
KT_CPU   := build/lib/kernels_cpu.o
KT_CUDA  := build/lib/kernels_cuda.o
KT_EMU   := $(EMU_BUILD)/kernels_cuda_emu.o
else
KT_CPU   := $(KT_BUILD)/kernels.o
KT_CUDA  := $(KT_BUILD)/kernels_cuda.o
KT_EMU   := $(KT_BUILD)/kernels_cuda_emu.o
endif
# cuDNN's attention (attn_cudnn.cu): the library's own, unless KT_CUDNN_SRC names a mutant copy
KT_CUDNN_SRC ?= lib
ifeq ($(KT_CUDNN_SRC),lib)
KT_CUDNN     := build/lib/attn_cudnn.o
KT_CUDNN_EMU := $(EMU_BUILD)/attn_cudnn_emu.o
else
KT_CUDNN     := $(KT_BUILD)/attn_cudnn.o
KT_CUDNN_EMU := $(KT_BUILD)/attn_cudnn_emu.o
endif

.PHONY: kernel-test kernel-test-cpu kernel-test-cuda kernel-test-cuda-single kernel-test-emu
kernel-test kernel-test-cpu: $(KT_BUILD)/kernel_test_cpu
kernel-test-cuda: $(KT_BUILD)/kernel_test_cuda
kernel-test-cuda-single: $(KT_BUILD)/kernel_test_cuda_single
kernel-test-emu: $(KT_BUILD)/kernel_test_emu

$(KT_BUILD)/kernel_test.o: tests/kernels/kernel_test.c lib/kernels.h
	$(E) "MPICC     $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(MPICC) $(CFLAGS_C) $(KT_FLAGS) -c -o $@ $<

# The kernels with the library's own flags (lib/lib.mk: LIB_OPT, warnings are errors).
$(KT_BUILD)/kernels.o: $(KT_SRC)/kernels_cpu.c $(KT_SRC)/kernel_rows.h lib/kernels.h
	$(E) "MPICC     $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(MPICC) -std=c11 $(LIB_OPT) -g $(WARN) $(KT_FLAGS) $(KT_EXTRA) -c -o $@ $<

$(KT_BUILD)/kernel_test_cpu: $(KT_TEST) $(KT_CPU) build/librt_cpu.a \
                             build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(KT_TEST) $(KT_CPU) build/ref/libref.a $(RT_CPU_LIBS)

$(KT_BUILD)/kernels_cuda.o: $(KT_SRC)/kernels_cuda.cu $(KT_SRC)/kernel_rows.h lib/kernels.h \
                            runtime/rt_launch.h lib/attn_cudnn.h
	$(E) "NVCC      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) $(RT_NVCC_FLAGS) $(KT_FLAGS) -c -o $@ $<

$(KT_BUILD)/attn_cudnn.o: $(KT_CUDNN_SRC)/attn_cudnn.cu lib/attn_cudnn.h
	$(E) "NVCC      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) $(RT_NVCC_FLAGS) $(KT_FLAGS) -c -o $@ $<

$(KT_BUILD)/kernel_test_cuda: $(KT_TEST) $(KT_CUDA) $(KT_CUDNN) build/librt_cuda.a \
                              build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(KT_TEST) $(KT_CUDA) $(KT_CUDNN) build/ref/libref.a $(RT_CUDA_LIBS)

# The same over the single-rank CUDA runtime (no MPI): for a GPU machine without MPI
# (bench/gpu_batch.sh).
$(KT_BUILD)/kernel_test_cuda_single: $(KT_TEST) $(KT_CUDA) $(KT_CUDNN) \
                                     build/librt_cuda_single.a build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(KT_TEST) $(KT_CUDA) $(KT_CUDNN) build/ref/libref.a \
	    $(RT_CUDA_SINGLE_LIBS)

# The CUDA kernels' own source on the CPU emulation of CUDA (tests/kernels/emu/cuda_runtime.h):
# g++, host memory from the CPU runtime; no GPU and no nvcc needed.
EMU_CXX   ?= g++
EMU_FLAGS := -std=c++17 $(LIB_OPT) -g -Wall -Wextra -Werror -DGPT_CUDA_EMU -Itests/kernels/emu
EMU_HDRS  := tests/kernels/emu/cuda_runtime.h tests/kernels/emu/cublas_v2.h \
             tests/kernels/emu/nccl.h tests/kernels/emu/cudnn.h

$(KT_EMU): $(KT_SRC)/kernels_cuda.cu $(KT_SRC)/kernel_rows.h lib/kernels.h runtime/rt_launch.h \
           lib/attn_cudnn.h $(EMU_HDRS)
	$(E) "CXX       $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(EMU_CXX) $(EMU_FLAGS) $(KT_FLAGS) $(KT_EXTRA) -x c++ -c -o $@ $<

$(KT_CUDNN_EMU): $(KT_CUDNN_SRC)/attn_cudnn.cu lib/attn_cudnn.h $(EMU_HDRS)
	$(E) "CXX       $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(EMU_CXX) $(EMU_FLAGS) $(KT_FLAGS) $(KT_EXTRA) -x c++ -c -o $@ $<

# (the emulated runtime API, cuda_libs.o, for the kernels' own device scratch; cuDNN's)
EMU_KT_OBJS = $(EMU_BUILD)/cuda_emu.o $(EMU_BUILD)/cuda_libs.o $(EMU_BUILD)/cudnn_emu.o
$(KT_BUILD)/kernel_test_emu: $(KT_TEST) $(KT_EMU) $(KT_CUDNN_EMU) $(EMU_KT_OBJS) \
                             build/librt_cpu.a build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(KT_TEST) $(KT_EMU) $(KT_CUDNN_EMU) $(EMU_KT_OBJS) \
	    build/ref/libref.a $(RT_CPU_LIBS) $(BLAS_LIBS) -lstdc++

# The emulation's own objects, the training library with the emulated CUDA kernels (lib/
# objects, host memory), and the CUDA runtime over the emulated runtime API and cuBLAS: without
# MPI (rt_single.c: no NCCL call) and with it (rt_mpi.c: the ranks share the one emulated
# device, so they talk over the MPI transport's pinned-host staging, as ranks sharing a GPU
# do). The programs over them: tests/kernels/emu.mk.
$(EMU_BUILD)/%.o: tests/kernels/emu/%.cc $(EMU_HDRS)
	$(E) "CXX       $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(EMU_CXX) $(EMU_FLAGS) $(BLAS_CFLAGS) -c -o $@ $<

EMU_RT_FLAGS = -DRT_NO_MPI
$(EMU_BUILD)/rt_cuda_emu_mpi.o: EMU_RT_FLAGS = $(RT_MPI_CFLAGS)
EMU_RT_OBJS := $(EMU_BUILD)/rt_cuda_emu.o $(EMU_BUILD)/rt_cuda_emu_mpi.o
$(EMU_RT_OBJS): runtime/rt_cuda.cu runtime/rt_internal.h runtime/rt_launch.h $(EMU_HDRS)
	$(E) "CXX       $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(EMU_CXX) $(EMU_FLAGS) $(EMU_RT_FLAGS) -Iruntime -x c++ -c -o $@ $<

$(EMU_BUILD)/libcuda_emu.a: $(EMU_BUILD)/cuda_emu.o $(EMU_BUILD)/cuda_libs.o \
                           $(EMU_BUILD)/cudnn_emu.o
$(EMU_BUILD)/libgpt_emu.a: $(LIB_OBJS) $(EMU_BUILD)/kernels_cuda_emu.o \
                           $(EMU_BUILD)/attn_cudnn_emu.o
$(EMU_BUILD)/librt_cuda_emu.a: $(RT_SINGLE_COMMON) $(EMU_BUILD)/rt_cuda_emu.o
$(EMU_BUILD)/librt_cuda_emu_mpi.a: $(RT_COMMON_OBJS) $(EMU_BUILD)/rt_cuda_emu_mpi.o
$(EMU_BUILD)/libcuda_emu.a $(EMU_BUILD)/libgpt_emu.a $(EMU_BUILD)/librt_cuda_emu.a \
$(EMU_BUILD)/librt_cuda_emu_mpi.a:
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^

# (the emulated cuBLAS multiplies with OpenBLAS)
EMU_CUDA_LIBS = $(EMU_BUILD)/librt_cuda_emu.a $(EMU_BUILD)/libcuda_emu.a $(BLAS_LIBS) -lstdc++ \
                -lpthread -lm

# The runtime's GEMM and RNG tests over the emulated CUDA runtime (tests/single).
$(EMU_BUILD)/t_%_cuda: $(RT_TEST_SINGLE_DIR)/t_%.o $(EMU_BUILD)/librt_cuda_emu.a \
                       $(EMU_BUILD)/libcuda_emu.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $< $(EMU_CUDA_LIBS)

endif
