/*
** replay.c: main() for a harness built without libFuzzer: runs LLVMFuzzerTestOneInput once
** on each file named, and on every file of each directory named (in sorted order). This is how
** `make test` (tests/fuzz/suite.sh, gcc with ASan and UBSan) replays the corpora and the
** crash reproducers as regression tests. Prints "N inputs" at the end; a bug aborts.
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"   // defines: LLVMFuzzerTestOneInput

static int replayed;

/* Run the harness on the contents of 'path' (a copy in a buffer of exactly that size). */
static void replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    size_t cap = 1 << 12, n = 0;
    unsigned char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: out of memory\n");
        exit(2);
    }
    unsigned char *exact = malloc(n ? n : 1);   /* so ASan sees reads past the input */
    memcpy(exact, buf, n);
    free(buf);
    if (getenv("REPLAY_VERBOSE")) fprintf(stderr, "replay: %s\n", path);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    replayed++;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 2;
        }
        if (!S_ISDIR(st.st_mode)) {
            replay_file(argv[i]);
            continue;
        }
        struct dirent **list;
        int n = scandir(argv[i], &list, NULL, by_name);
        if (n < 0) {
            perror(argv[i]);
            return 2;
        }
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], list[k]->d_name);
            if (list[k]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode))
                replay_file(path);
            free(list[k]);
        }
        free(list);
    }
    printf("%d inputs\n", replayed);
    return 0;
}
