/*
** fuzz_safetensors.c: harness for the safetensors reader (lib/safetensors.c): the input is
** the file for st_open (its header parsed, every tensor looked up, the extent of each checked
** and, where it holds, its elements read as f32), and the same bytes as a Hugging Face index
** for st_index_read. Errors are returned, never fatal; an accepted file must be coherent.
*/
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"          // defines: LLVMFuzzerTestOneInput, fz_file, fz_bug
#include "safetensors.h"   // defines: st_open, st_read_f32, st_index_read, ...

enum { MAX_READ = 1 << 16 };   /* elements read per tensor at most */

static void check_file(const char *path)
{
    st_file f;
    char err[256];
    if (st_open(&f, path, err, sizeof err) != 0) {
        if (!err[0]) fz_bug("st_open failed without a message");
        return;
    }
    if (f.data < 8 || f.data > f.size || f.n < 0) fz_bug("data at %lld of %lld", f.data, f.size);
    static float out[MAX_READ];
    for (int i = 0; i < f.n; i++) {
        const st_tensor *t = &f.t[i];
        if (!st_find(&f, t->name)) fz_bug("tensor %d's name is not found", i);
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS + 1) fz_bug("tensor %d has %d dims", i, t->ndim);
        (void)st_dtype_text(t->dtype);
        if (!st_extent_ok(&f, t) || t->ndim > ST_MAX_DIMS) continue;
        long long n = st_numel(t);
        if (n < 0) fz_bug("tensor %d has %lld elements", i, n);
        if (t->begin < 0 || t->end > f.size - f.data || t->begin > t->end)
            fz_bug("tensor %d: extent [%lld, %lld) accepted, data holds %lld bytes", i,
                   t->begin, t->end, f.size - f.data);
        if (t->dtype == ST_F32 || t->dtype == ST_BF16 || t->dtype == ST_F16) {
            long long m = n < MAX_READ ? n : MAX_READ;
            if (st_read_f32(&f, t, 0, m, out) != 0) fz_bug("tensor %d: cannot read", i);
            if (n > m && st_read_f32(&f, t, n - m, m, out) != 0)
                fz_bug("tensor %d: cannot read its end", i);
        }
    }
    st_close(&f);
}

static void check_index(const char *path)
{
    st_index ix;
    char err[256];
    if (st_index_read(&ix, path, err, sizeof err) == 0) {
        for (int i = 0; i < ix.n; i++) {
            const st_entry *e = &ix.map[i];
            if (st_index_find(&ix, e->name) != e) fz_bug("index entry %d is not found", i);
            if (e->shard < 0 || e->shard >= ix.nshards) fz_bug("entry %d: shard %d", i, e->shard);
            char shard[ST_PATH_MAX];
            st_index_shard_path(&ix, e->shard, path, shard, sizeof shard);
        }
    } else if (!err[0]) {
        fz_bug("st_index_read failed without a message");
    }
    st_index_free(&ix);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_file(fz_file(0, "x.safetensors", data, size));
    check_index(fz_file(1, "model.safetensors.index.json", data, size));
    return 0;
}
