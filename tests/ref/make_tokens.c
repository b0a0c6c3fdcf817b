/*
** make_tokens.c: build/ref/make_tokens, writes a deterministic synthetic token file for tests:
** a fixed random pattern of 'period' tokens repeated, each token replaced by a random one with
** probability 'noise', so a model can learn it and its loss falls. Not a tokenizer (tools/ has
** that). Output: headerless uint16 (nanoGPT .bin) or, with --shard, an llm.c shard.
*/
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "make_tokens"

static const char usage_text[] =
    "usage: " PROG " --vocab V --tokens N [--seed S] [--period P] [--noise X] [--shard] OUT\n"
    "  writes N tokens in [0, V): a random pattern of P tokens (default 16) repeated, each\n"
    "  token replaced by a uniform random one with probability X (default 0.1); seed default 1.\n"
    "  --shard writes an llm.c shard (1024-byte header: 20240520, 1, N) instead of raw uint16.\n";

/* splitmix64, used sequentially: state += golden ratio, then the output mix. */
static uint64_t next_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform double in [0, 1). */
static double next_unit(uint64_t *state)
{
    return (double)(next_u64(state) >> 11) * (1.0 / 9007199254740992.0);
}

static int fail(const char *fmt, const char *arg)
{
    fprintf(stderr, PROG ": error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    return 2;
}

static void put_le(unsigned char *p, uint32_t x, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(x >> (8 * i));
}

int main(int argc, char **argv)
{
    long vocab = 0, ntok = 0, period = 16;
    unsigned long long seed = 1;
    double noise = 0.1;
    int shard = 0;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end = NULL;
        if (strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            return 0;
        } else if (strcmp(a, "--shard") == 0) {
            shard = 1;
            continue;
        } else if (strncmp(a, "--", 2) != 0) {
            if (out != NULL)
                return fail("more than one output file ('%s')", a);
            out = a;
            continue;
        }
        if (i + 1 >= argc)
            return fail("missing value after %s", a);
        const char *v = argv[++i];
        if (strcmp(a, "--vocab") == 0) vocab = strtol(v, &end, 10);
        else if (strcmp(a, "--tokens") == 0) ntok = strtol(v, &end, 10);
        else if (strcmp(a, "--period") == 0) period = strtol(v, &end, 10);
        else if (strcmp(a, "--seed") == 0) seed = strtoull(v, &end, 10);
        else if (strcmp(a, "--noise") == 0) noise = strtod(v, &end);
        else return fail("unknown flag '%s'", a);
        if (*v == '\0' || *end != '\0')
            return fail("bad number '%s'", v);
    }
    if (out == NULL || vocab < 1 || vocab > 65536 || ntok < 1 || ntok > 2147483647L ||
        period < 1 || noise < 0 || noise > 1)
        return fail("%s", "need OUT, --vocab in [1, 65536], --tokens >= 1, --period >= 1, "
                          "--noise in [0, 1] (--help for usage)");

    uint64_t state = seed;
    uint16_t *pattern = malloc((size_t)period * sizeof *pattern);
    size_t head = shard ? 1024 : 0, size = head + 2 * (size_t)ntok;
    unsigned char *bytes = calloc(size, 1);
    if (pattern == NULL || bytes == NULL)
        return fail("%s", "out of memory");
    for (long p = 0; p < period; p++)
        pattern[p] = (uint16_t)(next_u64(&state) % (uint64_t)vocab);
    if (shard) {
        put_le(bytes, 20240520u, 4);
        put_le(bytes + 4, 1u, 4);
        put_le(bytes + 8, (uint32_t)ntok, 4);
    }
    for (long i = 0; i < ntok; i++) {
        uint16_t tok = pattern[i % period];
        if (next_unit(&state) < noise)
            tok = (uint16_t)(next_u64(&state) % (uint64_t)vocab);
        put_le(bytes + head + 2 * (size_t)i, tok, 2);
    }

    size_t tmplen = strlen(out) + 5;
    char *tmp = malloc(tmplen);
    if (tmp == NULL)
        return fail("%s", "out of memory");
    snprintf(tmp, tmplen, "%s.tmp", out);
    FILE *fp = fopen(tmp, "wb");
    if (fp == NULL) {
        fprintf(stderr, "%s: error: cannot write: %s\n", tmp, strerror(errno));
        return 1;
    }
    int bad = fwrite(bytes, 1, size, fp) != size;
    bad |= fclose(fp) != 0;
    if (bad || rename(tmp, out) != 0) {
        fprintf(stderr, "%s: error: write failed\n", out);
        remove(tmp);
        return 1;
    }
    free(tmp);
    free(bytes);
    free(pattern);
    return 0;
}
