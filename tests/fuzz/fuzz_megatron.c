/*
** fuzz_megatron.c: harness for Megatron-LM's indexed datasets (lib/data.c: lib_data_open,
** lib_data_check_vocab, lib_data_sample): PREFIX.idx + PREFIX.bin, alone or blended.
** Input: 1 byte of options (bit 0: a blend of the dataset with itself, weights 1:3; bits 1-3:
** sequence length 2..9; bits 4-7: 1 + 4k samples asked for), a 4-byte little-endian length
** L, L bytes of .idx, then the .bin. Every sample of an accepted dataset must read back in
** range; an internal check (RT_CHECK) that fires on a file is a bug: bad files are rejected
** with lib_fail_file.
*/
#define _GNU_SOURCE
#include "libstub.h"        // defines: FZ_TRY, fz_msg
#include "data_tracked.h"   // defines: lib_data_open, lib_data_sample, fz_release

enum { VOCAB = 512, MAX_SAMPLES = 64 };

static void world_max_one(long long *v)
{
    (void)v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5) return 0;
    unsigned opt = data[0];
    size_t lidx = (size_t)data[1] | (size_t)data[2] << 8 | (size_t)data[3] << 16 |
                  (size_t)data[4] << 24;
    data += 5, size -= 5;
    if (lidx > size) lidx = size;
    fz_file(0, "d.idx", data, lidx);
    fz_file(1, "d.bin", data + lidx, size - lidx);
    static char prefix[300];
    snprintf(prefix, sizeof prefix, "%s/d", fz_dir());
    int seq = 2 + (int)(opt >> 1 & 7);
    long long request = 1 + 4 * (long long)(opt >> 4);
    static char *prefixes[2];
    prefixes[0] = prefixes[1] = prefix;
    static const double weights[2] = { 1, 3 };
    static lib_data *d;
    d = NULL;
    int r = FZ_TRY();
    if (r == FZ_OK) {
        char *pre;
        if (!lib_data_is_indexed(prefix, &pre)) fz_bug("d.idx not seen as an index");
        fz_free(pre);
        d = lib_data_open(opt & 1 ? 2 : 1, prefixes, opt & 1 ? weights : NULL, NULL,
                          LIB_SPLIT_TRAIN, seq, request, opt, 0);
        lib_data_check_vocab(d, VOCAB, world_max_one);
        long long n = lib_data_size(d);
        int out[16];
        for (long long i = 0; i < n && i < MAX_SAMPLES; i++) {
            lib_data_sample(d, i, out);
            for (int k = 0; k <= seq; k++)
                if (out[k] < 0 || out[k] >= VOCAB)
                    fz_bug("sample %lld token %d is %d, after the vocabulary check", i, k,
                           out[k]);
        }
        lib_data_free(d);
    } else if (r == FZ_INTERNAL && !strstr(fz_msg, "out of memory")) {
        fz_bug("an internal check failed on a dataset: %s", fz_msg);
    }
    fz_release();
    return 0;
}
