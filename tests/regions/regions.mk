# tests/regions/regions.mk: how tests/regions/suite.sh builds t_regions against one generated
# output directory. Read together with the top-level Makefile (MPICC, OPT, GPT_CPU_LIBS):
#   make -f Makefile -f tests/regions/regions.mk REGIONS_OUT=<out dir> REGIONS_BIN=<program>
# The program #includes the directory's stage0.c (its generated layer, embedding and head are
# the code under test, static there), so stage0.c is a prerequisite but not compiled on its
# own; it links the directory's program.c (the layout's tables), the library, the runtime and
# the reference (build/ref/libref.a).

REGIONS_SRCS = tests/regions/t_regions.c $(REGIONS_OUT)/program.c

$(REGIONS_BIN): $(REGIONS_SRCS) $(REGIONS_OUT)/stage0.c $(REGIONS_OUT)/model.h \
                build/libgpt_cpu.a build/librt_cpu.a build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(MPICC) -std=c11 $(OPT) -g -Wall -Wextra -Werror -Iruntime -Ilib -Itests/ref \
	    -I$(REGIONS_OUT) -o $@ $(REGIONS_SRCS) build/ref/libref.a $(GPT_CPU_LIBS)
