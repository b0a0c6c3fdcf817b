# tests/tests.mk: build rules for test programs. The suites themselves are tests/*/suite.sh,
# run by tests/run.sh (see docs/DESIGN.md §3, tests/README.md).

include tests/ref/ref.mk

ALL_TARGETS += ref
include tests/kernels/kernels.mk
include tests/fuzz/fuzz.mk

# -- What the suites share, built once before they run (tests/run.sh: make test-deps) ----------
# tests/run.sh runs several suites at a time, so no file two suites use may be built by them
# (two makes writing one object race). Each suite still asks make for what it needs, which is
# then a no-op, so that a suite also runs alone. What one suite alone builds (its kernel tests,
# runtime tests, fuzz harnesses, generated layouts) stays with it. TEST_SUITES: the suites to be
# run (default: all); the generator's suites need only build/gen, and the CUDA emulation's
# libraries are built only for the suites that link them.
TEST_SUITES ?= $(patsubst tests/%/suite.sh,%,$(wildcard tests/*/suite.sh))
TEST_GEN_ONLY := tmpl lua golden errors
TEST_EMU_USERS := kernels single parallel moe generate
EMU_OK := $(shell command -v $(EMU_CXX) > /dev/null 2>&1 && [ "$$(uname -m)" = x86_64 ] && echo 1)
TEST_DEPS_EMU := $(addprefix $(EMU_BUILD)/,cuda_emu.o libcuda_emu.a libgpt_emu.a \
                 librt_cuda_emu.a librt_cuda_emu_mpi.a)
.PHONY: test-deps
test-deps: build/gen $(if $(filter-out $(TEST_GEN_ONLY),$(TEST_SUITES)),all) \
           $(if $(EMU_OK),$(if $(filter $(TEST_EMU_USERS),$(TEST_SUITES)),$(TEST_DEPS_EMU)))


# tests/lr: the library's learning-rate schedule alone (lib_lr), over the single-rank runtime.
build/lr/lr_table: tests/lr/lr_table.c lib/lr.h lib/flags.h build/libgpt_cpu.a \
                   build/librt_cpu_single.a
	$(E) "LINK      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS_C) -Ilib -Iruntime -o $@ $< $(GPT_CPU_SINGLE_LIBS)
