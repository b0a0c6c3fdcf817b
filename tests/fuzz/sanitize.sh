#!/bin/bash
# tests/fuzz/sanitize.sh: `make test SANITIZE=1 [SUITE=...]`: runs test suites with every C
# program built under AddressSanitizer and UndefinedBehaviorSanitizer (-fsanitize=address,
# undefined -fno-sanitize-recover=all: the first report fails the program). The build happens
# in a copy of the source tree, build/sanitize/ (marked by .sanitize-tree, which makes the
# Makefile add the flags to CC and MPICC), so its objects never mix with those of build/;
# the copy is refreshed on each call (unchanged files keep their times: only what changed is
# rebuilt). Leak checking is off (ASAN_OPTIONS=detect_leaks=0): Open MPI leaks at exit, from
# components it loads and unloads itself, which LeakSanitizer can neither name nor suppress;
# the fuzz suite's harnesses, which use no MPI, check leaks all the same.
#   tests/fuzz/sanitize.sh SUITE...      (make test SANITIZE=1 passes $(SANITIZE_SUITES))
cd "$(dirname "$0")/../.." || exit 2
T=build/sanitize
mkdir -p "$T"
# the tree as it is now, less what is built (build/, out/) and git's records
tar -c --exclude=./build --exclude=./out --exclude=./.git -f - . | tar -x -C "$T" -f - || exit 2
touch "$T/.sanitize-tree"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
echo "sanitize: ASan + UBSan build in $T/ (ASAN_OPTIONS=$ASAN_OPTIONS); suites: $*"
make -C "$T" --no-print-directory -s all || exit 1
exec "$T/tests/run.sh" "$@"
