# tests/kernels/emu.mk: the training programs over the CPU emulation of CUDA (tests/single).
# Read last, after the top Makefile has read the generated directory's build.mk (GEN_OBJS):
#   make -f Makefile -f tests/kernels/emu.mk GEN_DIR=<dir> GEN_OBJ=<objs> <dir>/train_cuda_emu
# The top Makefile reads tests/kernels/kernels.mk (EMU_CXX, EMU_FLAGS) through tests/tests.mk.

# The training library with the emulated CUDA kernels (lib/ objects, host memory), the CUDA
# runtime over the emulated runtime API and cuBLAS (the single-rank build: no MPI, no NCCL
# call), and for a generated directory (GEN_DIR, GEN_OBJ) its single-rank programs over them:
#   train_emu        the CUDA kernels, the CPU runtime (its GEMMs and collectives)
#   train_cuda_emu   the CUDA kernels and runtime/rt_cuda.cu: train_cuda_single, emulated
#   train_cuda_emu_mpi   the same with MPI: train_cuda, emulated, for layouts of several ranks
# and the runtime's GEMM and RNG tests over the emulated CUDA runtime.
EMU_BUILD := build/emu

$(EMU_BUILD)/kernels_cuda_emu.o: lib/kernels_cuda.cu lib/kernel_rows.h lib/kernels.h \
                                 runtime/rt_launch.h tests/kernels/emu/cuda_runtime.h
	$(E) "CXX       $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(EMU_CXX) $(EMU_FLAGS) -Iruntime -Ilib -x c++ -c -o $@ $<

$(EMU_BUILD)/rt_cuda_emu.o: runtime/rt_cuda.cu runtime/rt_internal.h runtime/rt_launch.h \
                            tests/kernels/emu/cuda_runtime.h tests/kernels/emu/cublas_v2.h \
                            tests/kernels/emu/nccl.h
	$(E) "CXX       $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(EMU_CXX) $(EMU_FLAGS) -DRT_NO_MPI -Iruntime -x c++ -c -o $@ $<

$(EMU_BUILD)/%.o: tests/kernels/emu/%.cc tests/kernels/emu/cuda_runtime.h \
                  tests/kernels/emu/cublas_v2.h tests/kernels/emu/nccl.h
	$(E) "CXX       $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(EMU_CXX) $(EMU_FLAGS) -c -o $@ $<

$(EMU_BUILD)/libcuda_emu.a: $(EMU_BUILD)/cuda_emu.o $(EMU_BUILD)/cuda_libs.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(EMU_BUILD)/libgpt_emu.a: $(LIB_OBJS) $(EMU_BUILD)/kernels_cuda_emu.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(EMU_BUILD)/librt_cuda_emu.a: $(RT_SINGLE_COMMON) $(EMU_BUILD)/rt_cuda_emu.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^

EMU_CUDA_LIBS := $(EMU_BUILD)/librt_cuda_emu.a $(EMU_BUILD)/libcuda_emu.a -lstdc++ -lpthread -lm

# The same runtime with MPI (rt_mpi.c): layouts of several ranks, whose ranks share the one
# emulated device and therefore talk over the MPI transport (pinned-host staging), as ranks
# sharing a GPU do (tests/*/gpu.txt run with equiv --emu).
$(EMU_BUILD)/rt_cuda_emu_mpi.o: runtime/rt_cuda.cu runtime/rt_internal.h runtime/rt_launch.h \
                                tests/kernels/emu/cuda_runtime.h tests/kernels/emu/cublas_v2.h \
                                tests/kernels/emu/nccl.h
	$(E) "CXX       $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(EMU_CXX) $(EMU_FLAGS) $(RT_MPI_CFLAGS) -Iruntime -x c++ -c -o $@ $<

$(EMU_BUILD)/librt_cuda_emu_mpi.a: $(RT_COMMON_OBJS) $(EMU_BUILD)/rt_cuda_emu_mpi.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(EMU_BUILD)/t_%_cuda: $(RT_TEST_SINGLE_DIR)/t_%.o $(EMU_BUILD)/librt_cuda_emu.a \
                       $(EMU_BUILD)/libcuda_emu.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $< $(EMU_CUDA_LIBS)

ifdef GEN_DIR
$(GEN_DIR)/train_emu: $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a $(EMU_BUILD)/libcuda_emu.a \
                      build/librt_cpu_single.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a $(EMU_BUILD)/libcuda_emu.a \
	    $(RT_CPU_SINGLE_LIBS) -lstdc++

$(GEN_DIR)/train_cuda_emu: $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a $(EMU_BUILD)/librt_cuda_emu.a \
                           $(EMU_BUILD)/libcuda_emu.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a $(EMU_CUDA_LIBS)

$(GEN_DIR)/train_cuda_emu_mpi: $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a \
                               $(EMU_BUILD)/librt_cuda_emu_mpi.a $(EMU_BUILD)/libcuda_emu.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a $(EMU_BUILD)/librt_cuda_emu_mpi.a \
	    $(EMU_BUILD)/libcuda_emu.a -lstdc++ -lpthread -lm
endif

