# tests/tests.mk: build rules for test programs. The suites themselves are tests/*/suite.sh,
# run by tests/run.sh (see docs/DESIGN.md §3).

include tests/ref/ref.mk

ALL_TARGETS += ref
include tests/kernels/kernels.mk
include tests/fuzz/fuzz.mk
