/*
** tokenize: turn text files into byte tokens (vocabulary 256) for the training programs.
** Writes little-endian uint16 token ids, either bare (nanoGPT's .bin) or as an llm.c token shard
** (1024-byte header: int32 magic 20240520, version 1, token count; then the tokens).
** Not a real tokenizer: one token per byte, which is what models with vocab 256 expect.
*/
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LLMC_MAGIC   20240520
#define LLMC_VERSION 1
#define LLMC_HEADER_INTS 256

static const char *progname = "tokenize";

static void usage(FILE *f)
{
    fprintf(f,
        "usage: %s [--llmc] -o OUTPUT INPUT...\n"
        "  Concatenate the INPUT files and write one uint16 token per byte to OUTPUT.\n"
        "  --llmc   write an llm.c token shard (1024-byte header) instead of a bare .bin\n"
        "  -o FILE  output file, written to FILE.tmp and renamed when complete\n", progname);
}

static const char *tmp_path;   /* removed when we die, so nothing half-written remains */

static void die(const char *fmt, const char *arg)
{
    int saved = errno;
    if (tmp_path) remove(tmp_path);
    errno = saved;
    fprintf(stderr, "%s: error: ", progname);
    fprintf(stderr, fmt, arg, strerror(errno));
    fputc('\n', stderr);
    exit(1);
}

/* Little-endian stores, independent of the host's byte order. */
static void put_u16(FILE *f, unsigned v)
{
    fputc((int)(v & 0xff), f);
    fputc((int)(v >> 8), f);
}

static void put_i32(FILE *f, int32_t v)
{
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++) fputc((int)((u >> (8 * i)) & 0xff), f);
}

int main(int argc, char **argv)
{
    const char *out = NULL;
    int llmc = 0, first = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--llmc")) llmc = 1;
        else if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { usage(stdout); return 0; }
        else if (argv[i][0] == '-') { usage(stderr); return 2; }
        else { first = i; break; }
    }
    if (!out || !first) { usage(stderr); return 2; }

    size_t len = strlen(out) + 5;
    char *tmp = malloc(len);
    if (!tmp) { fprintf(stderr, "%s: out of memory\n", progname); return 1; }
    snprintf(tmp, len, "%s.tmp", out);
    FILE *fo = fopen(tmp, "wb");
    if (!fo) die("cannot create '%s': %s", tmp);
    tmp_path = tmp;
    if (llmc) for (int i = 0; i < LLMC_HEADER_INTS; i++) put_i32(fo, 0);   /* filled below */

    long long ntok = 0;
    for (int i = first; i < argc; i++) {
        FILE *fi = fopen(argv[i], "rb");
        if (!fi) die("cannot open '%s': %s", argv[i]);
        int c;
        while ((c = fgetc(fi)) != EOF) { put_u16(fo, (unsigned)c); ntok++; }
        if (ferror(fi)) die("cannot read '%s': %s", argv[i]);
        fclose(fi);
    }
    if (llmc) {
        if (ntok > INT32_MAX) { fprintf(stderr, "%s: error: too many tokens for an llm.c shard\n",
                                        progname); return 1; }
        rewind(fo);
        put_i32(fo, LLMC_MAGIC);
        put_i32(fo, LLMC_VERSION);
        put_i32(fo, (int32_t)ntok);
    }
    if (fflush(fo) || fsync(fileno(fo)) || fclose(fo)) die("cannot write '%s': %s", tmp);
    if (rename(tmp, out)) die("cannot rename to '%s': %s", out);
    tmp_path = NULL;
    fprintf(stderr, "%s: %lld tokens -> %s\n", progname, ntok, out);
    free(tmp);
    return 0;
}
