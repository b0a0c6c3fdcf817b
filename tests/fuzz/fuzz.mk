# tests/fuzz/fuzz.mk: the fuzzing harnesses (tests/fuzz/fuzz_*.c), each built two ways from
# the same sources. Included by tests/tests.mk.
#   build/fuzz-<h>    gcc, ASan + UBSan, with replay.c: replays corpora and crash files
#                     (tests/fuzz/suite.sh; `make fuzz-replay`)
#   build/fuzzer-<h>  clang's libFuzzer, ASan + UBSan (bench/fuzz.sh; `make fuzzers`, needs
#                     clang and libclang-rt-14-dev)
# The executables sit in build/ itself: the model harness finds the repository root from its
# own path, as build/gen does. Objects: build/obj/fuzz/ (gcc) and build/obj/fuzzer/ (clang).

FUZZ_HARNESSES := tmpl_lex tmpl_parse model gen_cli safetensors tokens megatron flags
FUZZ_CC        ?= clang
FUZZ_SAN       := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_INC        = $(LUA_CFLAGS) -Igen -I$(GEN_ODIR) -Ilib -Iruntime -Itests/fuzz
FUZZ_CFLAGS     = -std=c11 -O1 -g $(WARN) -MMD -MP $(FUZZ_SAN) $(FUZZ_INC)
FUZZER_CFLAGS   = -std=c11 -O1 -g $(WARN) -MMD -MP -fsanitize=fuzzer-no-link,address,undefined \
                  -fno-sanitize-recover=all -fno-omit-frame-pointer $(FUZZ_INC)

# What each harness links besides itself and fz.c (gen: the generator's C but main.c, which
# fuzz_gen_cli.c includes; data.c is included by its harnesses, data_tracked.h).
FUZZ_GEN       := host tmpl buf diag tables tmpl_lex
FUZZ_USES_tmpl_lex    := $(FUZZ_GEN)
FUZZ_USES_tmpl_parse  := $(FUZZ_GEN)
FUZZ_USES_model       := $(FUZZ_GEN)
FUZZ_USES_gen_cli     := $(FUZZ_GEN)
FUZZ_USES_safetensors := safetensors
FUZZ_USES_tokens      := libstub
FUZZ_USES_megatron    := libstub
FUZZ_USES_flags       := flags libstub

# $(call fuzz_rules,DIR,COMPILER,CFLAGS,PREFIX,MAIN,LINKFLAGS): objects in build/obj/DIR,
# executables build/PREFIX-<h>. COMPILER, CFLAGS and LINKFLAGS are variable names (their values
# hold commas); MAIN is replay.o, or nothing for libFuzzer's own main.
define fuzz_rules
build/obj/$(1)/%.o: gen/%.c | build/obj/$(1)
	$$(E) "CC        $$@"
	$$(Q)$$($(2)) $$($(3)) -c -o $$@ $$<
build/obj/$(1)/tmpl_lex.o: $$(GEN_ODIR)/tmpl_lex.c | build/obj/$(1)
	$$(E) "CC        $$@"
	$$(Q)$$($(2)) $$($(3)) -c -o $$@ $$<
build/obj/$(1)/%.o: lib/%.c | build/obj/$(1)
	$$(E) "CC        $$@"
	$$(Q)$$($(2)) $$($(3)) -c -o $$@ $$<
build/obj/$(1)/%.o: tests/fuzz/%.c | build/obj/$(1)
	$$(E) "CC        $$@"
	$$(Q)$$($(2)) $$($(3)) -c -o $$@ $$<
build/obj/$(1):
	$$(Q)mkdir -p $$@
$$(foreach h,$$(FUZZ_HARNESSES),$$(eval $$(call fuzz_link,$(1),$(2),$(4),$(5),$(6),$$(h))))
-include $$(wildcard build/obj/$(1)/*.d)
endef

# $(call fuzz_link,DIR,COMPILER,PREFIX,MAIN,LINKFLAGS,HARNESS)
define fuzz_link
build/$(3)-$(6): $$(addprefix build/obj/$(1)/,fuzz_$(6).o fz.o $(4) \
                   $$(addsuffix .o,$$(FUZZ_USES_$(6))))
	$$(E) "LINK      $$@"
	$$(Q)$$($(2)) $$($(5)) -o $$@ $$^ $$(if $$(filter host,$$(FUZZ_USES_$(6))),$$(LUA_LIBS)) -lm
endef

FUZZ_LINK   = $(FUZZ_SAN)
FUZZER_LINK = -fsanitize=fuzzer,address,undefined
$(eval $(call fuzz_rules,fuzz,CC,FUZZ_CFLAGS,fuzz,replay.o,FUZZ_LINK))
$(eval $(call fuzz_rules,fuzzer,FUZZ_CC,FUZZER_CFLAGS,fuzzer,,FUZZER_LINK))

.PHONY: fuzz-replay fuzzers
fuzz-replay: $(FUZZ_HARNESSES:%=build/fuzz-%)
fuzzers: $(FUZZ_HARNESSES:%=build/fuzzer-%)
