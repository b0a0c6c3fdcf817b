# tests/kernels/emu.mk: the training programs over the CPU emulation of CUDA, for a generated
# directory (GEN_DIR, GEN_OBJ). Read last, after the top Makefile has read that directory's
# build.mk (GEN_OBJS) and tests/kernels/kernels.mk (the emulation's libraries, EMU_*):
#   make -f Makefile -f tests/kernels/emu.mk GEN_DIR=<dir> GEN_OBJ=<objs> <dir>/train_cuda_emu
#   train_emu            the CUDA kernels, the CPU runtime (its GEMMs and collectives)
#   train_cuda_emu       the CUDA kernels and runtime/rt_cuda.cu: train_cuda_single, emulated
#   train_cuda_emu_mpi   the same with MPI: train_cuda, emulated, for layouts of several ranks
#   generate_cuda_emu    generate_cuda (lib/generate.c over the CUDA backend), emulated
# (tests/single, tests/generate; tests/*/gpu.txt through equiv --emu).

ifdef GEN_DIR
$(GEN_DIR)/train_emu: $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a $(EMU_BUILD)/libcuda_emu.a \
                      build/librt_cpu_single.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a $(EMU_BUILD)/libcuda_emu.a \
	    $(GPT_SYS_LIBS) $(RT_CPU_SINGLE_LIBS) -lstdc++

$(GEN_DIR)/train_cuda_emu: $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a $(EMU_BUILD)/librt_cuda_emu.a \
                           $(EMU_BUILD)/libcuda_emu.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a $(GPT_SYS_LIBS) $(EMU_CUDA_LIBS)

$(GEN_DIR)/generate_cuda_emu: $(GEN_OBJS) $(GPT_GENERATE_MAIN) $(EMU_BUILD)/libgpt_emu.a \
                              $(EMU_BUILD)/librt_cuda_emu.a $(EMU_BUILD)/libcuda_emu.a \
                              build/tools/libtokenizer.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(GEN_OBJS) $(GPT_GENERATE_MAIN) $(EMU_BUILD)/libgpt_emu.a $(GPT_SYS_LIBS) \
	    $(EMU_CUDA_LIBS) build/tools/libtokenizer.a $(TOKENIZER_LIBS)

$(GEN_DIR)/train_cuda_emu_mpi: $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a \
                               $(EMU_BUILD)/librt_cuda_emu_mpi.a $(EMU_BUILD)/libcuda_emu.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(GEN_OBJS) $(EMU_BUILD)/libgpt_emu.a $(EMU_BUILD)/librt_cuda_emu_mpi.a \
	    $(EMU_BUILD)/libcuda_emu.a $(GPT_SYS_LIBS) $(BLAS_LIBS) -lstdc++ -lpthread -lm
endif
