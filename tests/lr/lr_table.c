/*
** lr_table.c: the training library's learning-rate schedule alone (lib_lr, lib/lr.c), for
** tests/lr: the flags read by the library's own parser (lib_flags_parse, with its defaults),
** then the rate of every step 1..--steps for a global batch of --gbs sequences, one JSON line a
** step as the training log writes it ({"step":t,"lr":...}: the rate the step is given, a float).
** No model, no data read, no MPI (built over the single-rank runtime: tests/tests.mk).
**
**   lr_table --gbs G --steps N [the training program's flags...]
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"      // defines: lib_flags, lib_flags_parse
#include "lr.h"         // defines: lib_lr

int main(int argc, char **argv)
{
    char **args = calloc((size_t)argc + 1, sizeof *args);
    long long gbs = 0;
    int n = 0;
    if (!args) return 2;
    args[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gbs") && i + 1 < argc) gbs = atoll(argv[++i]);
        else args[n++] = argv[i];
    }
    if (gbs < 1) {
        fprintf(stderr, "usage: lr_table --gbs G --steps N [training flags...]\n");
        return 2;
    }
    lib_flags f;
    lib_flags_parse(n, args, &f);
    for (int done = 0; done < f.steps; done++)
        printf("{\"step\":%d,\"lr\":%.9g}\n", done + 1, (double)(float)lib_lr(&f, gbs, done));
    free(args);
    return 0;
}
