# lib/lib.mk: the training library (lib/), compiled once per backend: build/libgpt_cpu.a
# (always) and build/libgpt_cuda.a (when the CUDA backend is found). A generated program's own
# sources (out/<dir>/*.c) link against one of them:
#   CPU : $(MPICC) prog.o $(GPT_CPU_LIBS)      CUDA: $(MPICC) prog.o $(GPT_CUDA_LIBS)
# The library is compiled with the generated code's flags (GEN_OPT: -O3 -march=native, no
# -ffast-math): its CPU kernels are written for the vectoriser. Included by the top Makefile.

LIB_BUILD   := build/lib
LIB_COMMON  := fail flags lr data tensors stage model moe groups world faults weights ckpt train safetensors main
LIB_CFLAGS   = -std=c11 $(GEN_OPT) -g $(WARN) -Iruntime -Ilib -MMD -MP
LIB_OBJS    := $(LIB_COMMON:%=$(LIB_BUILD)/%.o)

GPT_CPU_LIBS  = -Lbuild -lgpt_cpu $(RT_CPU_LIBS)
GPT_CUDA_LIBS = -Lbuild -lgpt_cuda $(RT_CUDA_LIBS)
# Single-rank programs without MPI, linked by $(CC): the same library (it calls no MPI itself)
# over the runtime's single-rank build (runtime/runtime.mk).
GPT_CPU_SINGLE_LIBS  = -Lbuild -lgpt_cpu $(RT_CPU_SINGLE_LIBS)
GPT_CUDA_SINGLE_LIBS = -Lbuild -lgpt_cuda $(RT_CUDA_SINGLE_LIBS)

$(LIB_BUILD)/%.o: lib/%.c | $(LIB_BUILD)
	$(E) "MPICC     $@"
	$(Q)$(MPICC) $(LIB_CFLAGS) -c -o $@ $<

$(LIB_BUILD)/kernels_cuda.o: lib/kernels_cuda.cu | $(LIB_BUILD)
	$(E) "NVCC      $@"
	$(Q)$(NVCC) $(RT_NVCC_FLAGS) -Ilib -MMD -MP -c -o $@ $<

build/libgpt_cpu.a: $(LIB_OBJS) $(LIB_BUILD)/kernels_cpu.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIB_BUILD):
	$(Q)mkdir -p $@

ALL_TARGETS += build/libgpt_cpu.a

ifeq ($(HAVE_CUDA),1)
build/libgpt_cuda.a: $(LIB_OBJS) $(LIB_BUILD)/kernels_cuda.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^
ALL_TARGETS += build/libgpt_cuda.a
endif

# README.md's table of training flags, printed from LIB_FLAGS (lib/flags.h). readme-flags
# writes it between README.md's train-flags markers; tests/train checks that it is current.
build/lib/flags_doc: $(LIB_BUILD)/flags_doc.o build/libgpt_cpu.a build/librt_cpu_single.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $< $(GPT_CPU_SINGLE_LIBS)
.PHONY: readme-flags
readme-flags: build/lib/flags_doc
	$(Q)build/lib/flags_doc > $(LIB_BUILD)/flags.md
	$(Q)awk -v table=$(LIB_BUILD)/flags.md \
	    '/^<!-- train-flags/ { print; while ((getline l < table) > 0) print l; skip = 1; next } \
	     /^<!-- end of train-flags/ { skip = 0 } !skip' README.md > README.md.tmp
	$(Q)if cmp -s README.md README.md.tmp; then rm README.md.tmp; \
	    else mv README.md.tmp README.md && echo "README.md: table of training flags rewritten"; fi

-include $(wildcard $(LIB_BUILD)/*.d)
