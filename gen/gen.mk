# gen/gen.mk: rules for build/gen, the generator: the C host (main, host, tmpl, buf, diag, and
# tables: the lists shared with the library, lib/gpt_tables.h) and
# the re2c lexer of the template engine. The Lua passes (gen/lua/*.lua) are read at run time
# from <root>/gen/lua; luac5.4 (Debian's lua5.4) precompiles each to build/obj/gen/lua/*.luac,
# which build/gen loads instead while it is at least as new as its source (gen/host.c: about
# 10 ms less per run; without luac, or with a source edited since, the source is read).
# Included by the top-level Makefile, which defines CC, RE2C, CFLAGS_C, LUA_CFLAGS, LUA_LIBS, Q
# and E.
#
# Objects and the generated lexer go in build/obj/gen/: build/gen itself is the executable,
# so it cannot also be a directory.

GEN_BIN  := build/gen
GEN_ODIR := build/obj/gen
GEN_OBJS := $(addprefix $(GEN_ODIR)/,main.o host.o tmpl.o buf.o diag.o tables.o tmpl_lex.o)

LUAC     ?= $(shell command -v luac5.4 2> /dev/null)
GEN_LUAC := $(if $(LUAC),$(patsubst gen/lua/%.lua,$(GEN_ODIR)/lua/%.luac,$(wildcard gen/lua/*.lua)))

ALL_TARGETS += $(GEN_BIN)

$(GEN_BIN): $(GEN_OBJS) | $(GEN_LUAC)
	$(E) "LINK      $@"
	$(Q)$(CC) -o $@ $(GEN_OBJS) $(LUA_LIBS)

# the chunk keeps the name gen/lua/X.lua (messages and tracebacks as from the source) and its
# line information (no -s)
$(GEN_ODIR)/lua/%.luac: gen/lua/%.lua
	$(E) "LUAC      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(LUAC) -o $@ $<

$(GEN_ODIR)/%.o: gen/%.c | $(GEN_ODIR)
	$(E) "CC        $@"
	$(Q)$(CC) $(CFLAGS_C) $(LUA_CFLAGS) -Igen -c -o $@ $<

# re2c output keeps its #line directives, so compile errors point at gen/tmpl_lex.re.
$(GEN_ODIR)/tmpl_lex.c: gen/tmpl_lex.re | $(GEN_ODIR)
	$(E) "RE2C      $@"
	$(Q)$(RE2C) -W -Werror --no-generation-date --no-version -c -o $@ $<

$(GEN_ODIR)/tmpl_lex.o: $(GEN_ODIR)/tmpl_lex.c
	$(E) "CC        $@"
	$(Q)$(CC) $(CFLAGS_C) $(LUA_CFLAGS) -Igen -c -o $@ $<

$(GEN_ODIR):
	$(Q)mkdir -p $@

-include $(GEN_OBJS:.o=.d)
