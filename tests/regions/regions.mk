# tests/regions/regions.mk: how tests/regions/suite.sh builds t_regions against one generated
# output directory. Read together with the top-level Makefile (for MPICC, OPT, RT_CPU_LIBS):
#   make -f Makefile -f tests/regions/regions.mk REGIONS_OUT=<out dir> REGIONS_BIN=<program>
# The program #includes <out dir>/model.c and links its kernels.c and groups.c, the runtime
# and the reference (build/ref/libref.a).

REGIONS_SRCS = tests/regions/t_regions.c $(REGIONS_OUT)/kernels.c $(REGIONS_OUT)/groups.c

$(REGIONS_BIN): $(REGIONS_SRCS) $(REGIONS_OUT)/model.c $(REGIONS_OUT)/model.h \
                build/librt_cpu.a build/ref/libref.a
	$(E) "LINK      $@"
	$(Q)mkdir -p $(@D)
	$(Q)$(MPICC) -std=c11 $(OPT) -g -Wall -Wextra -Werror -Iruntime -Itests/ref \
	    -I$(REGIONS_OUT) -o $@ $(REGIONS_SRCS) build/ref/libref.a $(RT_CPU_LIBS)
