# build.mk: how to compile and link the programs of this directory -- generated, DO NOT EDIT.
# Included by the top-level Makefile (make MODEL=tiny_llama TP=2 PP=2 DP=1 CP=2 SP=1), which defines CC, MPICC, GEN_OPT,
# GPT_CPU_LIBS, GPT_CUDA_LIBS, their _SINGLE_ variants and HAVE_CUDA (lib/lib.mk); objects go
# to build/<this directory>.
# The sources here are plain C for both backends: the backend is the library they link.
#   train       CPU backend: build/libgpt_cpu.a (kernels on the thread pool, OpenBLAS, MPI)
#   train_cuda  CUDA backend: build/libgpt_cuda.a (CUDA kernels, cuBLAS, NCCL), when found
#   train_single, train_cuda_single   the same two linked by $(CC) against the single-rank
#               runtime (build/librt_*_single.a): no MPI library; they run layouts of one rank
#               only (a bigger one is refused at start), so the top Makefile builds them
#               (GEN_SINGLE_TARGETS) for those; `make <this directory>/train_single` does it
#               for any layout.
#   generate, generate_cuda   text generation (lib/generate.c): the model of this directory on
#               one process whatever its layout (the same sources: only the model's roles and
#               sizes are used), linked like train_single, with the library's generate_main.o

GEN_OUT  := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
GEN_OBJ  ?= build/$(GEN_OUT)
GEN_SRCS := program.c stage0.c stage1.c

GEN_OBJS := $(GEN_SRCS:%.c=$(GEN_OBJ)/%.o)
GEN_CFLAGS := -std=c11 $(GEN_OPT) -g -Wall -Wextra -Werror -Iruntime -Ilib -I$(GEN_OUT) -MMD -MP

$(GEN_OBJ)/%.o: $(GEN_OUT)/%.c
	$(E) "CC        $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(MPICC) $(GEN_CFLAGS) -c -o $@ $<

$(GEN_OUT)/train: $(GEN_OBJS) build/libgpt_cpu.a build/librt_cpu.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(GEN_OBJS) $(GPT_CPU_LIBS)

$(GEN_OUT)/train_cuda: $(GEN_OBJS) build/libgpt_cuda.a build/librt_cuda.a
	$(E) "LINK      $@"
	$(Q)$(MPICC) -o $@ $(GEN_OBJS) $(GPT_CUDA_LIBS)

$(GEN_OUT)/train_single: $(GEN_OBJS) build/libgpt_cpu.a build/librt_cpu_single.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(GEN_OBJS) $(GPT_CPU_SINGLE_LIBS)

$(GEN_OUT)/train_cuda_single: $(GEN_OBJS) build/libgpt_cuda.a build/librt_cuda_single.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(GEN_OBJS) $(GPT_CUDA_SINGLE_LIBS)

$(GEN_OUT)/generate: $(GEN_OBJS) $(GPT_GENERATE_MAIN) build/libgpt_cpu.a build/librt_cpu_single.a \
                     build/tools/libtokenizer.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(GEN_OBJS) $(GPT_GENERATE_MAIN) $(GPT_CPU_SINGLE_LIBS) \
	    build/tools/libtokenizer.a $(TOKENIZER_LIBS)

$(GEN_OUT)/generate_cuda: $(GEN_OBJS) $(GPT_GENERATE_MAIN) build/libgpt_cuda.a \
                          build/librt_cuda_single.a build/tools/libtokenizer.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(GEN_OBJS) $(GPT_GENERATE_MAIN) $(GPT_CUDA_SINGLE_LIBS) \
	    build/tools/libtokenizer.a $(TOKENIZER_LIBS)

GEN_TARGETS := $(GEN_OUT)/train $(if $(HAVE_CUDA),$(GEN_OUT)/train_cuda)
GEN_SINGLE_TARGETS := $(GEN_OUT)/train_single $(if $(HAVE_CUDA),$(GEN_OUT)/train_cuda_single)
GEN_GENERATE_TARGETS := $(GEN_OUT)/generate $(if $(HAVE_CUDA),$(GEN_OUT)/generate_cuda)

-include $(GEN_OBJS:.o=.d)
