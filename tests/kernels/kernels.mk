# tests/kernels/kernels.mk: build rules for the kernel test programs (tests/kernels/suite.sh).
# Read after the top Makefile, whose variables it uses (MPICC, NVCC, CFLAGS_C, RT_CPU_LIBS,
# RT_CUDA_LIBS, RT_NVCC_FLAGS, HAVE_CUDA), either through an include or as
#   make -f Makefile -f tests/kernels/kernels.mk KT_GEN=<generated dir> kernel-test[-cuda]
# KT_GEN is a directory the generator wrote (any model and layout: the kernels take their
# sizes as arguments); objects and programs go to build/test/kernels/.

ifndef KERNELS_MK_INCLUDED
KERNELS_MK_INCLUDED := 1

KT_GEN   ?= build/test/kernels/gen
KT_BUILD ?= build/test/kernels
KT_FLAGS := -Iruntime -I$(KT_GEN) -Itests/ref
KT_EXTRA ?=                 # more flags for kernels.c (the suite's mutants: -Wno-error)

.PHONY: kernel-test kernel-test-cuda
kernel-test: $(KT_BUILD)/kernel_test_cpu
kernel-test-cuda: $(KT_BUILD)/kernel_test_cuda

$(KT_BUILD)/kernel_test.o: tests/kernels/kernel_test.c $(KT_GEN)/model.h
	$(E) "MPICC     $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(MPICC) $(CFLAGS_C) $(KT_FLAGS) -c -o $@ $<

# The generated kernels with the generated programs' own flags (build.mk: -Wall -Wextra -Werror)
# plus ours: a warning here is a generator bug.
$(KT_BUILD)/kernels.o: $(KT_GEN)/kernels.c $(KT_GEN)/model.h
	$(E) "MPICC     $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(MPICC) $(CFLAGS_C) $(KT_FLAGS) $(KT_EXTRA) -c -o $@ $<

$(KT_BUILD)/kernel_test_cpu: $(KT_BUILD)/kernel_test.o $(KT_BUILD)/kernels.o build/librt_cpu.a \
                             build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(KT_BUILD)/kernel_test.o $(KT_BUILD)/kernels.o build/ref/libref.a \
	    $(RT_CPU_LIBS)

$(KT_BUILD)/kernels_cuda.o: $(KT_GEN)/kernels.cu $(KT_GEN)/model.h
	$(E) "NVCC      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(NVCC) $(RT_NVCC_FLAGS) $(KT_FLAGS) -c -o $@ $<

$(KT_BUILD)/kernel_test_cuda: $(KT_BUILD)/kernel_test.o $(KT_BUILD)/kernels_cuda.o \
                              build/librt_cuda.a build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(KT_BUILD)/kernel_test.o $(KT_BUILD)/kernels_cuda.o \
	    build/ref/libref.a $(RT_CUDA_LIBS)

endif
