# tests/ref/ref.mk: rules for the double-precision reference in tests/ref/ (the oracle), meant
# to be included from tests/tests.mk. Builds build/ref/gpt2_ref (the reference trainer),
# build/ref/make_tokens (synthetic token files), build/ref/ref_test (the reference's own checks,
# run by tests/refcheck/suite.sh) and build/ref/libref.a (model + I/O, for kernel tests to link).
# Plain C11 and libm only: no MPI, no BLAS, no runtime. Uses CC, CFLAGS_C, Q and E from Makefile.

REF_SRC      := tests/ref
REF_BUILD    := build/ref
REF_LIB_OBJS := $(REF_BUILD)/gpt2_ref.o $(REF_BUILD)/ref_io.o
REF_OBJS     := $(REF_LIB_OBJS) $(REF_BUILD)/main.o $(REF_BUILD)/make_tokens.o \
                $(REF_BUILD)/ref_test.o
REF_PROGS    := $(REF_BUILD)/gpt2_ref $(REF_BUILD)/make_tokens $(REF_BUILD)/ref_test

.PHONY: ref
ref: $(REF_PROGS) $(REF_BUILD)/libref.a

# Optimized for this machine (-O3 -march=native): the reference runs ~40 times in make test,
# 1.9 -> 1.15 CPU s for the llama table's (8 layers, 5 steps) with the same bits, since IEEE
# arithmetic is kept: no contraction into FMAs (-ffp-contract=off) and no reassociation (no
# -ffast-math), so every sum stays in the source's order.
REF_CFLAGS := $(filter-out -O%,$(CFLAGS_C)) -O3 -march=native -ffp-contract=off
$(REF_BUILD)/%.o: $(REF_SRC)/%.c
	@mkdir -p $(@D)
	$(E) "CC        $@"
	$(Q)$(CC) $(REF_CFLAGS) -c -o $@ $<

$(REF_BUILD)/libref.a: $(REF_LIB_OBJS)
	$(E) "AR        $@"
	$(Q)rm -f $@ && $(AR) rcs $@ $^

$(REF_BUILD)/gpt2_ref: $(REF_BUILD)/main.o $(REF_BUILD)/libref.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $^ -lm

$(REF_BUILD)/ref_test: $(REF_BUILD)/ref_test.o $(REF_BUILD)/libref.a
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $^ -lm

$(REF_BUILD)/make_tokens: $(REF_BUILD)/make_tokens.o
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $^ -lm

-include $(REF_OBJS:.o=.d)
