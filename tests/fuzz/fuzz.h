/*
** fuzz.h: what the fuzzing harnesses (tests/fuzz/fuzz_*.c) share. Each harness defines
** libFuzzer's entry point and is linked either with clang's libFuzzer (bench/fuzz.sh) or with
** replay.c, which feeds it the files of a corpus (tests/fuzz/suite.sh, under gcc's ASan and
** UBSan). A harness must be deterministic, free what it allocates, and write only under
** fz_dir(). A bug is a crash, a sanitizer report, a hang or fz_bug(); a rejected input is not.
*/
#ifndef FUZZ_H
#define FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The harness's private temporary directory (made on first use, removed at exit). */
const char *fz_dir(void);

/* Write size bytes to fz_dir()/name and return that path (a static buffer per name slot:
** slot 0..3, so that a harness can hold a few paths at once). */
const char *fz_file(int slot, const char *name, const void *data, size_t size);

/* A command line from an input: argv[0] = prog, then the input's NUL-separated words (at
** most FZ_MAX_ARGS), argv[argc] = NULL; *text holds the words (free it). Returns argc. */
enum { FZ_MAX_ARGS = 256 };
int fz_argv(const uint8_t *data, size_t size, const char *prog, char **argv, char **text);

/* A property that must hold for every input failed: print "fuzz: bug: ..." and abort. */
void fz_bug(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
