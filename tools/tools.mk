# tools/tools.mk: user tools (tokenizer) and the demo corpus. Included by the top Makefile.

TOOLS := build/tools/tokenize build/tools/libtokenizer.a
ALL_TARGETS += $(TOOLS)

# libtokenizer.a: byte-level BPE from a Hugging Face tokenizer.json (tools/tokenizer.h), on PCRE2
# and jansson (Debian's libpcre2-dev, libjansson-dev). A program linking it adds TOKENIZER_LIBS.
TOKENIZER_LIBS := -lpcre2-8 -ljansson -lpthread
build/tools/tokenizer.o: tools/tokenizer.c tools/tokenizer.h
	$(E) "CC        $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS_C) -O3 -c -o $@ $<
build/tools/libtokenizer.a: build/tools/tokenizer.o
	$(E) "AR        $@"
	$(Q)rm -f $@ && ar rcs $@ $^
build/tools/tokenize: tools/tokenize.c tools/tokenizer.h build/tools/libtokenizer.a
	$(E) "CC        $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS_C) -o $@ $< build/tools/libtokenizer.a $(TOKENIZER_LIBS) $(LDFLAGS_TOOLS)

build/tools/%: tools/%.c
	$(E) "CC        $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS_C) -o $@ $< $(LDFLAGS_TOOLS)

-include $(wildcard build/tools/*.d)

# The demo corpus: English text from Debian's fortunes package (no internet needed), as byte
# tokens. Files are taken in sorted order so the corpus is the same on every machine.
FORTUNES_DIR ?= /usr/share/games/fortunes
.PHONY: data
data: data/corpus.bin
data/corpus.bin: build/tools/tokenize
	@test -d $(FORTUNES_DIR) || { echo "make: error: $(FORTUNES_DIR) missing; run 'make deps' (package fortunes)"; exit 1; }
	$(Q)mkdir -p data
	$(Q)build/tools/tokenize -o $@ $$(LC_ALL=C ls -d $(FORTUNES_DIR)/* | grep -v -E '\.(dat|u8)$$' | while read f; do test -f "$$f" && echo "$$f"; done)

# stcompare: compare / list / check safetensors files; reads them with the library's reader.
TOOLS += build/tools/stcompare
ALL_TARGETS += build/tools/stcompare
build/tools/stcompare: tools/stcompare.c lib/safetensors.c lib/safetensors.h
	$(E) "CC        $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS_C) -Ilib -o $@ tools/stcompare.c lib/safetensors.c -lm

# stshard: a safetensors file as Hugging Face lays out a checkpoint (shards + index JSON).
TOOLS += build/tools/stshard
ALL_TARGETS += build/tools/stshard
build/tools/stshard: tools/stshard.c lib/safetensors.c lib/safetensors.h
	$(E) "CC        $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS_C) -Ilib -o $@ tools/stshard.c lib/safetensors.c

# plot: the JSONL logs of training runs (train --log) as one SVG picture; reads JSON with jansson.
TOOLS += build/tools/plot
ALL_TARGETS += build/tools/plot
build/tools/plot: tools/plot.c
	$(E) "CC        $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(CC) $(CFLAGS_C) -o $@ $< -ljansson -lm
