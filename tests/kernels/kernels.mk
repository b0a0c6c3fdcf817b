# tests/kernels/kernels.mk: build rules for the kernel test programs (tests/kernels/suite.sh).
# Read after the top Makefile, whose variables it uses (MPICC, NVCC, CFLAGS_C, GEN_OPT, WARN,
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
ifeq ($(KT_SRC),lib)
KT_CPU   := build/lib/kernels_cpu.o
KT_CUDA  := build/lib/kernels_cuda.o
else
KT_CPU   := $(KT_BUILD)/kernels.o
KT_CUDA  := $(KT_BUILD)/kernels_cuda.o
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

# The kernels with the library's own flags (lib/lib.mk: GEN_OPT, warnings are errors).
$(KT_BUILD)/kernels.o: $(KT_SRC)/kernels_cpu.c $(KT_SRC)/kernel_rows.h lib/kernels.h
	$(E) "MPICC     $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(MPICC) -std=c11 $(GEN_OPT) -g $(WARN) $(KT_FLAGS) $(KT_EXTRA) -c -o $@ $<

$(KT_BUILD)/kernel_test_cpu: $(KT_TEST) $(KT_CPU) build/librt_cpu.a \
                             build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(KT_TEST) $(KT_CPU) build/ref/libref.a $(RT_CPU_LIBS)

$(KT_BUILD)/kernels_cuda.o: $(KT_SRC)/kernels_cuda.cu $(KT_SRC)/kernel_rows.h lib/kernels.h \
                            runtime/rt_launch.h
	$(E) "NVCC      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) $(RT_NVCC_FLAGS) $(KT_FLAGS) -c -o $@ $<

$(KT_BUILD)/kernel_test_cuda: $(KT_TEST) $(KT_CUDA) build/librt_cuda.a \
                              build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(KT_TEST) $(KT_CUDA) build/ref/libref.a $(RT_CUDA_LIBS)

# The same over the single-rank CUDA runtime (no MPI): for a GPU machine without MPI
# (bench/gpu_batch.sh).
$(KT_BUILD)/kernel_test_cuda_single: $(KT_TEST) $(KT_CUDA) build/librt_cuda_single.a \
                                     build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(KT_TEST) $(KT_CUDA) build/ref/libref.a $(RT_CUDA_SINGLE_LIBS)

# The CUDA kernels' own source on the CPU emulation of CUDA (tests/kernels/emu/cuda_runtime.h):
# g++, host memory from the CPU runtime; no GPU and no nvcc needed. (tests/kernels/emu.mk:
# the training programs over the emulation.)
EMU_CXX   ?= g++
EMU_FLAGS := -std=c++17 $(GEN_OPT) -g -Wall -Wextra -Werror -DGPT_CUDA_EMU -Itests/kernels/emu

$(KT_BUILD)/kernels_cuda_emu.o: $(KT_SRC)/kernels_cuda.cu $(KT_SRC)/kernel_rows.h lib/kernels.h \
                                runtime/rt_launch.h tests/kernels/emu/cuda_runtime.h
	$(E) "CXX       $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(EMU_CXX) $(EMU_FLAGS) $(KT_FLAGS) $(KT_EXTRA) -x c++ -c -o $@ $<

$(KT_BUILD)/cuda_emu.o: tests/kernels/emu/cuda_emu.cc tests/kernels/emu/cuda_runtime.h
	$(E) "CXX       $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(EMU_CXX) $(EMU_FLAGS) -c -o $@ $<

$(KT_BUILD)/kernel_test_emu: $(KT_TEST) $(KT_BUILD)/kernels_cuda_emu.o $(KT_BUILD)/cuda_emu.o \
                             build/librt_cpu.a build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(KT_TEST) $(KT_BUILD)/kernels_cuda_emu.o $(KT_BUILD)/cuda_emu.o \
	    build/ref/libref.a $(RT_CPU_LIBS) -lstdc++

endif
