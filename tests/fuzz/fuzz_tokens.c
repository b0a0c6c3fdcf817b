/*
** fuzz_tokens.c: harness for the token files of --data FILE (lib/data.c, lib_tokens_open):
** nanoGPT's uint16 .bin and llm.c's shards (magic 20240520, a 1024-byte header). The input
** is the file. An accepted file must hold at least one sample and agree with its size.
*/
#define _GNU_SOURCE
#include "libstub.h"        // defines: FZ_TRY, fz_msg
#include "data_tracked.h"   // defines: lib_tokens_open, fz_release

enum { SEQ = 8, VOCAB = 50257 };

/* One rank: the world's maximum is the value itself. */
static void world_max_one(long long *v)
{
    (void)v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fz_file(0, "tokens.bin", data, size);
    static lib_tokens t;    /* static: unchanged by the longjmp */
    memset(&t, 0, sizeof t);
    t.fd = -1;
    int r = FZ_TRY();
    if (r == FZ_OK) {
        lib_tokens_open(&t, path, SEQ, VOCAB, world_max_one);
        if (t.nsamples < 1 || t.nsamples * SEQ + 1 > t.ntok)
            fz_bug("%lld samples of %d from %lld tokens", t.nsamples, SEQ, t.ntok);
        if (t.first + 2 * t.ntok != (long long)size)
            fz_bug("%lld tokens at byte %lld in a file of %zu bytes", t.ntok, t.first, size);
    } else if (r == FZ_INTERNAL && !strstr(fz_msg, "out of memory")) {
        fz_bug("an internal check failed on a token file: %s", fz_msg);
    }
    fz_release();           /* closes t.fd too (a run keeps it open: lib_tokens_close) */
    return 0;
}
