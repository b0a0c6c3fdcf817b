# lib/lib.mk: the training library (lib/), compiled once per backend: build/libgpt_cpu.a
# (always) and build/libgpt_cuda.a (when the CUDA backend is found). A generated program's own
# sources (out/<dir>/*.c) link against one of them:
#   CPU : $(MPICC) prog.o $(GPT_CPU_LIBS)      CUDA: $(MPICC) prog.o $(GPT_CUDA_LIBS)
# The library is compiled with LIB_OPT (-O3 -march=native, no -ffast-math): its CPU kernels
# are written for the vectoriser. Included by the top Makefile.

# The library's modules in layers, bottom first (docs/DESIGN.md §1 draws them). A module is its
# header and its .c files; the stage is one module of four files (stage.h). A module calls only
# into modules of lower layers, never up and never sideways, so there is no cycle; its includes
# follow the same order (gpt.h, the generated programs' interface, and rt.h are everyone's).
# tests/layering checks the built objects and the includes against this list.
#
#   9  main  generate_main                  the entry points: call gpt_main, gpt_generate
#   8  train  generate                      gpt_main: the step loop and its log; gpt_generate:
#                                           the generate program (KV cache, sampling, text)
#   7  weights  ckpt                        --init/--save (safetensors); resume checkpoints
#   6  faults                               GPT_FAULT, exit signals, output checks, bad steps
#   5  world  hfdir                         host values reduced over the world, barriers;
#                                           the Hugging Face directory of --save DIR
#   4  stage (stage model moe groups)       setup, layers, MoE, groups: the stage's machinery
#   3  lr  data  tensors                    learning rate, training data, the tensor list
#   2  flags  ops                           the command line (one table: LIB_FLAGS); the
#                                           linear layers and context-parallel steps
#   1  fail  safetensors  tboard  kernels   failing alike; safetensors files; TensorBoard's
#                                           event files; the kernels
#
# LIB_LAYERS writes the same bottom first: layers separated by spaces, modules in a layer by
# commas, the files of a module by '+'. kernels is kernels_cpu.c or kernels_cuda.cu (one per
# backend library; the CUDA one with attn_cudnn.cu, cuDNN's attention, which it calls).
LIB_LAYERS  := fail,safetensors,tboard,kernels flags,ops lr,data,tensors stage+model+moe+groups world,hfdir \
               faults weights,ckpt train,generate main,generate_main

LIB_BUILD   := build/lib
lib_comma   := ,
LIB_COMMON  := $(filter-out kernels,$(subst +, ,$(subst $(lib_comma), ,$(LIB_LAYERS))))
LIB_CFLAGS   = -std=c11 $(LIB_OPT) -g $(WARN) -Iruntime -Ilib -MMD -MP
# generate_main.o, the generate programs' main, is linked as an object (build.mk), not from the
# archive, whose main is train's (main.o): an archive with two mains would give either.
LIB_OBJS    := $(filter-out %/generate_main.o,$(LIB_COMMON:%=$(LIB_BUILD)/%.o))
GPT_GENERATE_MAIN := $(LIB_BUILD)/generate_main.o

# GPT_SYS_LIBS: what the library itself needs besides the runtime (ckpt.c's checksums: xxHash,
# Debian's libxxhash-dev; hfdir.c's JSON: jansson, libjansson-dev; both installed by make deps).
GPT_SYS_LIBS  = $(LD_FAST) -lxxhash -ljansson
GPT_CPU_LIBS  = -Lbuild -lgpt_cpu $(GPT_SYS_LIBS) $(RT_CPU_LIBS)
GPT_CUDA_LIBS = -Lbuild -lgpt_cuda $(GPT_SYS_LIBS) $(RT_CUDA_LIBS)
# Single-rank programs without MPI, linked by $(CC): the same library (it calls no MPI itself)
# over the runtime's single-rank build (runtime/runtime.mk).
GPT_CPU_SINGLE_LIBS  = -Lbuild -lgpt_cpu $(GPT_SYS_LIBS) $(RT_CPU_SINGLE_LIBS)
GPT_CUDA_SINGLE_LIBS = -Lbuild -lgpt_cuda $(GPT_SYS_LIBS) $(RT_CUDA_SINGLE_LIBS)

$(LIB_BUILD)/%.o: lib/%.c | $(LIB_BUILD)
	$(E) "MPICC     $@"
	$(Q)$(MPICC) $(LIB_CFLAGS) -c -o $@ $<

$(LIB_BUILD)/kernels_cuda.o $(LIB_BUILD)/attn_cudnn.o: $(LIB_BUILD)/%.o: lib/%.cu | $(LIB_BUILD)
	$(E) "NVCC      $@"
	$(Q)$(NVCC) $(RT_NVCC_FLAGS) -Ilib -MMD -MP -c -o $@ $<

build/libgpt_cpu.a: $(LIB_OBJS) $(LIB_BUILD)/kernels_cpu.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIB_BUILD):
	$(Q)mkdir -p $@

ALL_TARGETS += build/libgpt_cpu.a $(GPT_GENERATE_MAIN)

ifeq ($(HAVE_CUDA),1)
# (attn_cudnn.o opens libcudnn.so.9 itself, at run time: nothing to link)
build/libgpt_cuda.a: $(LIB_OBJS) $(LIB_BUILD)/kernels_cuda.o $(LIB_BUILD)/attn_cudnn.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^
ALL_TARGETS += build/libgpt_cuda.a
endif

# The same objects at -O0 (no inlining: each call stays in the function the source has it in),
# one section per function, for tests/layering's check of which communication each function
# issues (a function calls rt_X only if its name says X).
LIB_SECT_BUILD := $(LIB_BUILD)/sections
$(LIB_SECT_BUILD)/%.o: lib/%.c | $(LIB_SECT_BUILD)
	$(E) "MPICC     $@"
	$(Q)$(MPICC) $(LIB_CFLAGS) -O0 -ffunction-sections -c -o $@ $<
$(LIB_SECT_BUILD):
	$(Q)mkdir -p $@
.PHONY: lib-sections lib-layers readme-flags
lib-sections: $(LIB_COMMON:%=$(LIB_SECT_BUILD)/%.o) $(GPT_GENERATE_MAIN)
lib-layers:
	@echo $(LIB_LAYERS)

# README.md's table of training flags, printed from LIB_FLAGS (lib/flags.h). readme-flags
# writes it between README.md's train-flags markers; tests/train checks that it is current.
build/lib/flags_doc: $(LIB_BUILD)/flags_doc.o build/libgpt_cpu.a build/librt_cpu_single.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $< $(GPT_CPU_SINGLE_LIBS)
readme-flags: build/lib/flags_doc
	$(Q)build/lib/flags_doc > $(LIB_BUILD)/flags.md
	$(Q)awk -v table=$(LIB_BUILD)/flags.md \
	    '/^<!-- train-flags/ { print; while ((getline l < table) > 0) print l; skip = 1; next } \
	     /^<!-- end of train-flags/ { skip = 0 } !skip' README.md > README.md.tmp
	$(Q)if cmp -s README.md README.md.tmp; then rm README.md.tmp; \
	    else mv README.md.tmp README.md && echo "README.md: table of training flags rewritten"; fi

-include $(wildcard $(LIB_BUILD)/*.d $(LIB_SECT_BUILD)/*.d)
