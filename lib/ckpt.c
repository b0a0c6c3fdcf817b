/*
** ckpt.c: resume checkpoints (ckpt.h): per rank, its parameters, optimizer state and step
** (stage.h: lib_state_io), written so that a checkpoint is either complete or ignored, with
** GPT_FAULT's points of writing (faults.h) for the tests that kill a rank while it saves. Each
** file records the program that wrote it (model, layout, rank) and a checksum, which --resume
** checks; one job at a time holds a checkpoint directory (its LOCK file). Called by gpt_main:
** --ckpt-dir at start-up, --ckpt-every, the exit signals and limits, --resume.
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>   // defines: XXH3_64bits, XXH3_state_t (libxxhash)

#include "ckpt.h"
#include "fail.h"     // defines: lib_fail_file
#include "faults.h"   // defines: lib_fault_point
#include "stage.h"    // defines: lib_state_bytes, lib_state_io, gpt (prog, pp_rank)
#include "world.h"    // defines: lib_world_allreduce_max, lib_world_barrier

enum { CKPT_CHUNK = 256 << 10 };   /* bytes written between two points of GPT_FAULT */

/*
** A resume checkpoint's file (docs: README.md, "Resume checkpoints"): the header, then the
** texts it counts (the model's, the layout's, the command that made the program: gpt_program's
** model_text, layout_text, made_by), the index of the state (version 5: stage.h
** lib_state_block, LIB_STATE_BLOCK_WORDS words each), then the rank's state bytes
** (lib_state_io). Every number is a little-endian uint64. Version 5 adds the global batch and
** the index, so that a program of another layout can take its values (--reshard-from);
** version 4 added to version 3's header the rank, its coordinates, the hashes of the model's
** and the layout's texts and a checksum of the whole file; version 3 added to version 2's the
** optimizer updates made (steps not skipped) and the steps skipped.
*/
#define CKPT_MAGIC  0x35544b4350545047ull   /* the bytes "GPTPCKT5" */
#define CKPT_MAGIC4 0x34544b4350545047ull   /* the bytes "GPTPCKT4" */
#define CKPT_MAGIC3 0x33544b4350545047ull   /* the bytes "GPTPCKT3" */
#define CKPT_MAGIC2 0x32544b4350545047ull   /* the bytes "GPTPCKT2" */
enum { CKPT_V2_WORDS = 6, CKPT_V3_WORDS = 8, CKPT_V4_WORDS = 24 };  /* the older headers: the
                                                                   ** first words of ours */
enum { CKPT_TEXT_MAX = 1 << 20 };               /* a text longer than this: a damaged header */
#define CKPT_BLOCKS_MAX (1ull << 32)            /* more blocks than this: a damaged header */

typedef struct {
    uint64_t magic, world, stage, step, nbytes, seed, updates, skipped;  /* version 3's */
    uint64_t rank;
    uint64_t coord[7];        /* tp cp dp pp ep etp edp: the rank's coordinates (stage.h gpt) */
    uint64_t model_hash, layout_hash;   /* XXH3-64 of the model's and the layout's texts */
    uint64_t model_len, layout_len, made_len;   /* bytes of the three texts after the header */
    uint64_t checksum;        /* XXH3-64 of the whole file, this field counted as 0 */
    uint64_t gbs, nblocks;    /* version 5: the global batch; the blocks of the state's index; */
    uint64_t samples, valid_samples;   /* the samples the steps and the evaluations read */
} ckpt_header;

/* The header's words in a file of this version. */
static size_t header_words(int version)
{
    return version == 5 ? sizeof(ckpt_header) / sizeof(uint64_t) :
           version == 4 ? CKPT_V4_WORDS : version == 3 ? CKPT_V3_WORDS : CKPT_V2_WORDS;
}

/* -- What a file records of its program ------------------------------------------------------ */

/* The bytes of a header's index (0 before version 5). */
static size_t index_bytes(const ckpt_header *hd)
{
    return (size_t)hd->nblocks * LIB_STATE_BLOCK_WORDS * sizeof(uint64_t);
}

/* This rank's index as stored: its blocks' words (malloc'd), *n blocks. */
static uint64_t *index_here(uint64_t *n)
{
    lib_state_block *b;
    int nb = lib_state_blocks(&b);
    uint64_t *w = malloc(sizeof *w * LIB_STATE_BLOCK_WORDS * (size_t)(nb ? nb : 1));
    RT_CHECK(w, "out of memory for the checkpoint's index");
    for (int i = 0; i < nb; i++) {
        const uint64_t v[LIB_STATE_BLOCK_WORDS] = { b[i].tensor, b[i].kind, b[i].size, b[i].grow,
                                                    b[i].gcol, b[i].rows, b[i].cols, b[i].ld,
                                                    b[i].at };
        memcpy(w + (size_t)i * LIB_STATE_BLOCK_WORDS, v, sizeof v);
    }
    free(b);
    *n = (uint64_t)nb;
    return w;
}

/* This rank's header for the state of step 'step' ('n' bytes), checksum still 0. */
static ckpt_header ckpt_header_here(unsigned long long seed, int step, size_t n, int updates,
                                    int skipped)
{
    const gpt_program *p = gpt.prog;
    ckpt_header hd = {
        .magic = CKPT_MAGIC, .world = (uint64_t)p->world, .stage = (uint64_t)gpt.pp_rank,
        .step = (uint64_t)step, .nbytes = n, .seed = seed, .updates = (uint64_t)updates,
        .skipped = (uint64_t)skipped, .rank = (uint64_t)rt_rank(),
        .coord = { (uint64_t)gpt.tp_rank, (uint64_t)gpt.cp_rank, (uint64_t)gpt.dp_rank,
                   (uint64_t)gpt.pp_rank, (uint64_t)gpt.ep_rank, (uint64_t)gpt.etp_rank,
                   (uint64_t)gpt.edp_rank },
        .model_hash = XXH3_64bits(p->model_text, strlen(p->model_text)),
        .layout_hash = XXH3_64bits(p->layout_text, strlen(p->layout_text)),
        .model_len = strlen(p->model_text), .layout_len = strlen(p->layout_text),
        .made_len = strlen(p->made_by), .gbs = (uint64_t)p->gbs,
    };
    return hd;
}

/* The checksum of a version 4 or 5 file: XXH3-64 of its header's words (with checksum 0), its
** texts ('texts': model_len + layout_len + made_len bytes, then in version 5 the index's
** nblocks * LIB_STATE_BLOCK_WORDS words) and its state ('data': nbytes). */
static uint64_t ckpt_checksum(const ckpt_header *hd, int version, const char *texts,
                              const void *data)
{
    ckpt_header h = *hd;
    h.checksum = 0;
    XXH3_state_t *st = XXH3_createState();
    RT_CHECK(st, "out of memory for the checkpoint's checksum");
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, &h, header_words(version) * sizeof(uint64_t));
    XXH3_64bits_update(st, texts, (size_t)(h.model_len + h.layout_len + h.made_len +
                                           index_bytes(&h)));
    XXH3_64bits_update(st, data, (size_t)h.nbytes);
    uint64_t sum = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return sum;
}

/* The value of 'key' (klen bytes) in a "key=value\n" text, *vlen its length; NULL if none. */
static const char *text_value(const char *text, const char *key, size_t klen, int *vlen)
{
    for (const char *l = text; *l; ) {
        const char *eol = strchr(l, '\n');
        if (!eol) eol = l + strlen(l);
        if ((size_t)(eol - l) > klen && !strncmp(l, key, klen) && l[klen] == '=') {
            *vlen = (int)(eol - l - (long)klen - 1);
            return l + klen + 1;
        }
        l = *eol ? eol + 1 : eol;
    }
    return NULL;
}

/* The first field of text 'a' whose key 'b' lacks or gives another value, into 'out' as
** "KEY VALUE there, VALUE here" (there: the file's text; 'swap': 'a' is this program's, 'b'
** the file's); 0 when 'b' has every field of 'a' alike. */
static int text_diff(const char *a, const char *b, int swap, char *out, size_t cap)
{
    for (const char *l = a; *l; ) {
        const char *eol = strchr(l, '\n'), *eq = strchr(l, '=');
        if (!eol) eol = l + strlen(l);
        if (eq && eq < eol) {
            int klen = (int)(eq - l), alen = (int)(eol - eq - 1), blen = 0;
            const char *bv = text_value(b, l, (size_t)klen, &blen);
            if (!bv || blen != alen || strncmp(bv, eq + 1, (size_t)alen)) {
                if (!bv) bv = "(none)", blen = 6;
                if (swap)
                    snprintf(out, cap, "%.*s %.*s there, %.*s here", klen, l, blen, bv, alen,
                             eq + 1);
                else
                    snprintf(out, cap, "%.*s %.*s there, %.*s here", klen, l, alen, eq + 1,
                             blen, bv);
                return 1;
            }
        }
        l = *eol ? eol + 1 : eol;
    }
    return 0;
}

/* The first field in which a file's text 'there' and this program's 'here' differ, into
** 'out' ("KEY A there, B here"): this program's fields in order, then those only the file has. */
static void first_difference(const char *there, const char *here, char *out, size_t cap)
{
    if (!text_diff(here, there, 1, out, cap) && !text_diff(there, here, 0, out, cap))
        snprintf(out, cap, "their texts differ");
}

/*
** Whether this rank's file of a checkpoint (its header 'hd' and its 'texts', read by
** ckpt_read) was written by this program: its model, its layout, the rank and its
** coordinates, world, stage and size. Returns 0, or -1 with the first difference in 'msg'.
*/
static int ckpt_same_program(const ckpt_header *hd, const char *texts, char *msg, size_t cap)
{
    ckpt_header here = ckpt_header_here(0, 0, lib_state_bytes(), 0, 0);
    const gpt_program *p = gpt.prog;
    char diff[600];
    const char *made = texts + hd->model_len + hd->layout_len;
    const char *what = NULL;
    char *tm = strndup(texts, (size_t)hd->model_len);
    char *tl = strndup(texts + hd->model_len, (size_t)hd->layout_len);
    RT_CHECK(tm && tl, "out of memory for the checkpoint");
    if (hd->model_hash != here.model_hash || strcmp(tm, p->model_text)) {
        what = "model";
        first_difference(tm, p->model_text, diff, sizeof diff);
    } else if (hd->layout_hash != here.layout_hash || strcmp(tl, p->layout_text)) {
        what = "layout";
        first_difference(tl, p->layout_text, diff, sizeof diff);
    }
    free(tm);
    free(tl);
    if (what) {
        snprintf(msg, cap, "written by a different %s: %s; resume with the program that "
                 "wrote it (%.*s), or %s", what, diff, (int)hd->made_len, made,
                 *what == 'l' ? "start this layout from it with --reshard-from and another "
                 "--ckpt-dir" : "give this run another --ckpt-dir");
        return -1;
    }
    if (hd->rank != here.rank || memcmp(hd->coord, here.coord, sizeof hd->coord) ||
        hd->world != here.world || hd->stage != here.stage || hd->nbytes != here.nbytes) {
        snprintf(msg, cap, "written by rank %llu of %llu (stage %llu, tp %llu, cp %llu, dp %llu, "
                 "%llu bytes), read by rank %llu of %llu (stage %llu, tp %llu, cp %llu, dp %llu, "
                 "%llu bytes) of the same model and layout: a damaged or moved file",
                 (unsigned long long)hd->rank, (unsigned long long)hd->world,
                 (unsigned long long)hd->stage, (unsigned long long)hd->coord[0],
                 (unsigned long long)hd->coord[1], (unsigned long long)hd->coord[2],
                 (unsigned long long)hd->nbytes, (unsigned long long)here.rank,
                 (unsigned long long)here.world, (unsigned long long)here.stage,
                 (unsigned long long)here.coord[0], (unsigned long long)here.coord[1],
                 (unsigned long long)here.coord[2], (unsigned long long)here.nbytes);
        return -1;
    }
    return 0;
}

static void ckpt_path(char *out, size_t cap, const char *dir, int step, const char *suffix,
                      int rank)
{
    if (rank < 0) snprintf(out, cap, "%s/step_%08d%s", dir, step, suffix);
    else snprintf(out, cap, "%s/step_%08d%s/rank_%05d.bin", dir, step, suffix, rank);
}

/* Remove a checkpoint directory (its rank files, then itself); 0 or -1 with errno. */
static int ckpt_remove(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char file[4400];
    if (!d) return -1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
            unlink(file);
        }
    closedir(d);
    return rmdir(dir);
}

/* Write n bytes in CKPT_CHUNK pieces (each a point of GPT_FAULT=kill_ckpt); 0 or -1. */
static int write_points(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        size_t k = n < CKPT_CHUNK ? n : CKPT_CHUNK;
        lib_fault_point();
        ssize_t w = write(fd, p, k);
        if (w <= 0) {
            if (w < 0 && errno == EINTR) continue;
            if (w == 0) errno = ENOSPC;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/*
** The checkpoint of step 'step' (its optimizer updates and skipped steps with it) in
** DIR = --ckpt-dir: DIR/step_N.tmp/rank_R.bin on every rank (synced), then rank 0 renames the
** directory to DIR/step_N and syncs DIR: a checkpoint is complete exactly when its name has no
** suffix. A rank that cannot write removes its file and stops the job naming the reason; the
** newest complete checkpoint stays. An older step_N (a run started again without --resume) is
** moved aside and removed only after the new one is in place. Collective over the world.
*/
void lib_ckpt_save(const lib_flags *f, const lib_ckpt_pos *at)
{
    int step = at->step;
    char dir[4096], file[4200];
    lib_sync();
    ckpt_path(dir, sizeof dir, f->ckpt_dir, step, ".tmp", -1);
    if (rt_rank() == 0) {
        lib_fault_point();
        RT_CHECK(mkdir(dir, 0755) == 0 || errno == EEXIST, "%s: cannot create: %s", dir,
                 strerror(errno));
    }
    lib_world_barrier();
    size_t n = lib_state_bytes();
    unsigned char *buf = malloc(n ? n : 1);
    RT_CHECK(buf, "out of memory for the checkpoint");
    lib_state_io(buf, 1);
    /* the header, the texts and the index, written as one piece before the state */
    ckpt_header hd = ckpt_header_here(f->seed, step, n, at->updates, at->skipped);
    hd.samples = (uint64_t)at->samples;
    hd.valid_samples = (uint64_t)at->valid_samples;
    uint64_t *index = index_here(&hd.nblocks);
    size_t ntext = (size_t)(hd.model_len + hd.layout_len + hd.made_len);
    unsigned char *head = malloc(sizeof hd + ntext + index_bytes(&hd));
    RT_CHECK(head, "out of memory for the checkpoint");
    char *texts = (char *)head + sizeof hd;
    memcpy(texts, gpt.prog->model_text, (size_t)hd.model_len);
    memcpy(texts + hd.model_len, gpt.prog->layout_text, (size_t)hd.layout_len);
    memcpy(texts + hd.model_len + hd.layout_len, gpt.prog->made_by, (size_t)hd.made_len);
    memcpy(texts + ntext, index, index_bytes(&hd));
    free(index);
    hd.checksum = ckpt_checksum(&hd, 5, texts, buf);
    memcpy(head, &hd, sizeof hd);
    ckpt_path(file, sizeof file, f->ckpt_dir, step, ".tmp", rt_rank());
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write_points(fd, head, sizeof hd + ntext + index_bytes(&hd)) == 0 &&
             write_points(fd, buf, n) == 0 && fsync(fd) == 0;
    int why = errno;
    if (fd >= 0 && close(fd) && ok) ok = 0, why = errno;
    if (!ok) unlink(file);
    RT_CHECK(ok, "%s: cannot write the checkpoint of step %d: %s (the newest complete "
             "checkpoint in %s is intact)", file, step, strerror(why), f->ckpt_dir);
    free(head);
    free(buf);
    lib_fault_point();
    lib_world_barrier();
    if (rt_rank() == 0) {
        char final[4096], old[4200];
        struct stat st;
        ckpt_path(final, sizeof final, f->ckpt_dir, step, "", -1);
        snprintf(old, sizeof old, "%s.old", final);
        int aside = stat(final, &st) == 0 && rename(final, old) == 0;
        lib_fault_point();
        RT_CHECK(rename(dir, final) == 0, "cannot rename %s to %s: %s", dir, final,
                 strerror(errno));
        int dfd = open(f->ckpt_dir, O_RDONLY);
        if (dfd >= 0) { fsync(dfd); close(dfd); }
        if (aside) ckpt_remove(old);
    }
    lib_world_barrier();
}

/* The newest complete checkpoint's step in DIR (-1 if none); rank 0 decides for everyone.
** Collective over the world. */
int lib_ckpt_newest(const char *d)
{
    long long best = -1;
    if (rt_rank() == 0) {
        DIR *dir = opendir(d);
        struct dirent *e;
        while (dir && (e = readdir(dir))) {
            int step, used = 0;
            if (sscanf(e->d_name, "step_%8d%n", &step, &used) == 1 && used == 13 &&
                e->d_name[13] == 0 && step > best)
                best = step;
        }
        if (dir) closedir(dir);
    }
    lib_world_allreduce_max(&best);
    return (int)best;
}

/* The incomplete checkpoints (step_N.tmp, step_N.old) a stopped run left in DIR are removed,
** each with a line on stdout. Rank 0 only. */
void lib_ckpt_clean(const char *d)
{
    DIR *dir = opendir(d);
    struct dirent *e;
    char path[4400];
    while (dir && (e = readdir(dir))) {
        int step, used = 0;
        if (sscanf(e->d_name, "step_%8d%n", &step, &used) == 1 && used == 13 &&
            (!strcmp(e->d_name + 13, ".tmp") || !strcmp(e->d_name + 13, ".old"))) {
            snprintf(path, sizeof path, "%s/%s", d, e->d_name);
            if (ckpt_remove(path) == 0)
                printf("removed %s: an incomplete checkpoint of a run stopped while saving\n",
                       path);
        }
    }
    if (dir) closedir(dir);
}

/*
** Read checkpoint file 'file' whole: its header into 'hd' (a version 2 or 3 header filled in:
** updates = step for version 2), its texts and index into *texts (malloc'd; NULL before version
** 4) and its state into 'data' when it holds 'n' bytes as this rank's does; when 'data' is NULL,
** into *state (malloc'd). Checks that it is a checkpoint, is as long as its header says and,
** from version 4, that its checksum holds. Returns its version (2 .. 5), or 0 with what is
** wrong in 'msg'.
*/
static int ckpt_read_state(const char *file, ckpt_header *hd, char **texts, unsigned char *data,
                           size_t n, unsigned char **state, char *msg, size_t cap)
{
    struct stat st;
    int version = 0;
    unsigned char *other = NULL;
    memset(hd, 0, sizeof *hd);
    *texts = NULL;
    FILE *fp = fopen(file, "rb");
    if (!fp || fstat(fileno(fp), &st)) {
        snprintf(msg, cap, "cannot read: %s", strerror(errno));
        goto out;
    }
    if (fread(&hd->magic, sizeof hd->magic, 1, fp) != 1) {
        if (ferror(fp)) snprintf(msg, cap, "cannot read: %s", strerror(errno));
        else snprintf(msg, cap, "truncated: %lld bytes, shorter than its header",
                      (long long)st.st_size);
        goto out;
    }
    version = hd->magic == CKPT_MAGIC ? 5 : hd->magic == CKPT_MAGIC4 ? 4 :
              hd->magic == CKPT_MAGIC3 ? 3 : hd->magic == CKPT_MAGIC2 ? 2 : 0;
    size_t words = header_words(version);
    if (!version) {
        snprintf(msg, cap, "not a resume checkpoint (it does not start with GPTPCKT5, 4, 3 or "
                 "2)");
        goto out;
    }
    if (fread(&hd->world, sizeof hd->magic, words - 1, fp) != words - 1) {
        snprintf(msg, cap, "truncated: %lld bytes, shorter than its header",
                 (long long)st.st_size);
        version = 0;
        goto out;
    }
    if (version == 2) hd->updates = hd->step;
    if (hd->model_len > CKPT_TEXT_MAX || hd->layout_len > CKPT_TEXT_MAX ||
        hd->made_len > CKPT_TEXT_MAX || hd->nbytes > (unsigned long long)st.st_size ||
        hd->nblocks > CKPT_BLOCKS_MAX) {
        snprintf(msg, cap, "damaged: its header's sizes cannot be (texts of %llu, %llu and %llu "
                 "bytes, %llu index blocks, a state of %llu bytes in a file of %lld)",
                 (unsigned long long)hd->model_len, (unsigned long long)hd->layout_len,
                 (unsigned long long)hd->made_len, (unsigned long long)hd->nblocks,
                 (unsigned long long)hd->nbytes, (long long)st.st_size);
        version = 0;
        goto out;
    }
    unsigned long long ntext = version < 4 ? 0 : hd->model_len + hd->layout_len + hd->made_len +
                               index_bytes(hd);
    unsigned long long want = words * sizeof hd->magic + ntext + hd->nbytes;
    if (want != (unsigned long long)st.st_size) {
        snprintf(msg, cap, "truncated or damaged: %lld bytes, not the %llu its header says",
                 (long long)st.st_size, want);
        version = 0;
        goto out;
    }
    /* the state: into 'data' when it is this rank's size, else only for the checksum */
    unsigned char *into = data;
    if (!data) into = *state = malloc(hd->nbytes ? hd->nbytes : 1);
    else if (hd->nbytes != n && version >= 4) into = other = malloc(hd->nbytes ? hd->nbytes : 1);
    *texts = malloc(ntext + 1);
    if (!*texts || !into) {
        snprintf(msg, cap, "out of memory for the checkpoint");
        version = 0;
        goto out;
    }
    if (fread(*texts, 1, ntext, fp) != ntext ||
        ((!data || hd->nbytes == n || version >= 4) &&
         fread(into, 1, hd->nbytes, fp) != hd->nbytes)) {
        snprintf(msg, cap, "cannot read: %s", ferror(fp) ? strerror(errno) : "truncated");
        version = 0;
        goto out;
    }
    (*texts)[ntext] = 0;
    uint64_t sum = version >= 4 ? ckpt_checksum(hd, version, *texts, into) : 0;
    if (version >= 4 && sum != hd->checksum) {
        snprintf(msg, cap, "damaged: its checksum does not match (XXH3-64 written %016llx, "
                 "read %016llx): its bytes changed on the disk or on the way",
                 (unsigned long long)hd->checksum, (unsigned long long)sum);
        version = 0;
    }
out:
    if (fp) fclose(fp);
    free(other);
    if (!version && state) {
        free(*state);
        *state = NULL;
    }
    return version;
}

static int ckpt_read(const char *file, ckpt_header *hd, char **texts, unsigned char *data,
                     size_t n, char *msg, size_t cap)
{
    return ckpt_read_state(file, hd, texts, data, n, NULL, msg, cap);
}

/*
** Stop every rank alike when some rank's file is wrong: the lowest such rank prints
** "FILE: error: MSG" (its own file and message: the others cannot know them), then every rank
** exits 1. Returns when no rank has anything ('msg' empty on every rank). Collective.
*/
static void ckpt_fail_any(const char *file, const char *msg)
{
    long long key = *msg ? rt_world() - rt_rank() : 0;   /* the lowest rank wins */
    lib_world_allreduce_max(&key);
    if (!key) return;
    if (key == rt_world() - rt_rank()) {
        fprintf(stderr, "%s: error: %s\n", file, msg);
        fflush(stderr);
    }
    lib_world_barrier();
    rt_finalize();
    exit(1);
}

/*
** Load this rank's file of the checkpoint of step 'step' in --ckpt-dir: the parameters and the
** optimizer state, and *updates, *skipped (the optimizer updates made, the steps skipped; a
** version 2 file has updates = step, skipped = 0). A file that is damaged (checksum,
** length), or was written by another program (model, layout, rank, world, stage, size: each
** named as "KEY A there, B here"), stops every rank alike before anything is loaded.
** Version 2 and 3 files record no model or layout: they load after the checks they allow
** (world, stage, size), with a warning on rank 0, so that a run begun before version 4
** continues. Collective over the world.
*/
void lib_ckpt_load(const lib_flags *f, int step, lib_ckpt_pos *at)
{
    char file[4200], msg[1400] = "", *texts = NULL;
    ckpt_path(file, sizeof file, f->ckpt_dir, step, "", rt_rank());
    size_t n = lib_state_bytes();
    ckpt_header hd;
    unsigned char *buf = malloc(n ? n : 1);
    RT_CHECK(buf, "out of memory for the checkpoint");
    int version = ckpt_read(file, &hd, &texts, buf, n, msg, sizeof msg);
    size_t used = strlen(msg);
    if (!version)
        snprintf(msg + used, sizeof msg - used, "; to resume from the checkpoint before it, "
                 "move %s/step_%08d aside", f->ckpt_dir, step);
    else if (version >= 4) ckpt_same_program(&hd, texts, msg, sizeof msg);
    else if (hd.world != (unsigned long long)gpt.prog->world ||
             hd.stage != (unsigned long long)gpt.pp_rank || hd.nbytes != n)
        snprintf(msg, sizeof msg, "written by a different program (world %llu, stage %llu, "
                 "%llu bytes; here world %d, stage %d, %zu bytes)",
                 (unsigned long long)hd.world, (unsigned long long)hd.stage,
                 (unsigned long long)hd.nbytes, gpt.prog->world, gpt.pp_rank, n);
    free(texts);
    ckpt_fail_any(file, msg);
    long long old = version < 4 ? version : 0;   /* version 4: checked as 5, without an index */
    lib_world_allreduce_max(&old);
    if (old && rt_rank() == 0)
        printf("%s/step_%08d: warning: a version %lld checkpoint records no model or layout: "
               "only its world, stage and size are checked; resume it only with the program "
               "that wrote it\n", f->ckpt_dir, step, old);
    lib_state_io(buf, 0);
    free(buf);
    *at = (lib_ckpt_pos){ .step = step, .updates = (int)hd.updates, .skipped = (int)hd.skipped,
                          .samples = version == 5 ? (long long)hd.samples : -1,
                          .valid_samples = version == 5 ? (long long)hd.valid_samples : -1 };
}

/*
** One job per checkpoint directory (--ckpt-dir): rank 0 takes an exclusive flock on DIR/LOCK,
** held until the process ends (the kernel then drops it, a kill -9 included, so a crashed job
** leaves no stale lock), and writes "host H, pid P, started T" into it, and on a second line
** "mark M", a number of this run that every other rank must then read there: a directory that
** is not the same for every rank (not on a shared file system) stops the job. When another job
** holds it, every rank stops alike (exit 1) naming the holder, before any checkpoint is cleaned,
** loaded or written. Nothing without --ckpt-dir or with --dump-samples. Call it after
** lib_check_outputs made the directory; once (a second call does nothing). Collective over the
** world.
*/
static int lock_fd = -1;          /* rank 0: DIR/LOCK, open for the rest of the run (closing
                                  ** it would unlock) */
static int locked;                /* every rank: lib_ckpt_lock has run */

void lib_ckpt_lock(const lib_flags *f)
{
    char path[4200], msg[800] = "";
    long long mark = 0;             /* rank 0's: a number every rank must read in the lock */
    if (!f->ckpt_dir || f->dump_samples || locked) return;
    snprintf(path, sizeof path, "%s/LOCK", f->ckpt_dir);
    if (rt_rank() == 0) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            snprintf(msg, sizeof msg, "cannot open the lock of --ckpt-dir: %s", strerror(errno));
        else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            char holder[512] = "";
            int busy = errno == EWOULDBLOCK, why = errno;
            ssize_t k = busy ? pread(fd, holder, sizeof holder - 1, 0) : 0;
            holder[k > 0 ? k : 0] = 0;
            holder[strcspn(holder, "\n")] = 0;
            if (busy)
                snprintf(msg, sizeof msg, "another job is using this checkpoint directory (%s); "
                         "one job per --ckpt-dir: wait for it to end, or give this run another "
                         "--ckpt-dir", *holder ? holder : "it has not written its name yet");
            else
                snprintf(msg, sizeof msg, "cannot lock: %s", strerror(why));
            close(fd);
        } else {
            char host[256] = "?", when[64] = "?", line[512];
            time_t now = time(NULL);
            struct tm tm;
            gethostname(host, sizeof host - 1);
            host[sizeof host - 1] = 0;
            if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
            /* the second line: a number the other ranks look for (below) */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            mark = ((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec) ^ (long long)getpid();
            if (mark < 0) mark = -(mark + 1);
            int len = snprintf(line, sizeof line, "host %s, pid %d, started %s\nmark %lld\n",
                               host, (int)getpid(), when, mark);
            /* synced: on a network file system the other nodes read it next */
            if (ftruncate(fd, 0) || pwrite(fd, line, (size_t)len, 0) != len || fsync(fd))
                snprintf(msg, sizeof msg, "cannot write the lock of --ckpt-dir: %s",
                         strerror(errno));
            lock_fd = fd;
        }
    }
    long long bad = *msg != 0;
    lib_world_allreduce_max(&bad);
    if (bad) lib_fail_file(path, "%s; nothing was run", msg);
    /* Every rank writes its checkpoint file into the directory and rank 0 renames the step's
    ** directory into place: all must see the same directory. Each rank looks for rank 0's
    ** mark in the lock file (the highest rank that does not find it is named). */
    lib_world_allreduce_max(&mark);
    if (rt_rank() != 0) {
        char text[600] = "";
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t k = fd >= 0 ? pread(fd, text, sizeof text - 1, 0) : -1;
        if (fd >= 0) close(fd);
        text[k > 0 ? k : 0] = 0;
        char *m = strstr(text, "\nmark ");
        if (!m || strtoll(m + 6, NULL, 10) != mark) bad = rt_rank();
    }
    lib_world_allreduce_max(&bad);
    if (bad)
        lib_fail_file(f->ckpt_dir, "rank %lld does not see the lock file rank 0 wrote in it: "
                      "--ckpt-dir must be one directory every rank sees (a file system shared "
                      "by all nodes: rank 0 renames the ranks' checkpoint files into place); "
                      "nothing was run", bad);
    locked = 1;
}

/* The bytes of this rank's checkpoint file (for the start-up check of their room, faults.h). */
long long lib_ckpt_bytes(void)
{
    const gpt_program *p = gpt.prog;
    uint64_t nb;
    free(index_here(&nb));
    return (long long)(lib_state_bytes() + sizeof(ckpt_header) + strlen(p->model_text) +
                       strlen(p->layout_text) + strlen(p->made_by) +
                       nb * LIB_STATE_BLOCK_WORDS * sizeof(uint64_t));
}

/* -- Another layout's checkpoint (--reshard-from) -------------------------------------------- */

/* What a block holds, for resharding: 0 the f32 parameters (f32 training's parameters, bf16
** training's main parameters), 1 and 2 AdamW's moments, 3 an expert bias; -1 nothing taken
** (bf16 parameters: the main ones hold them exactly; main parameters of this program: its
** lib_master_commit makes them from the f32 parameters). */
static int value_class(uint64_t kind, uint64_t size, int reader)
{
    switch (kind) {
    case LIB_STATE_PARAM: return size == 4 || reader ? 0 : -1;
    case LIB_STATE_MAIN: return reader ? -1 : 0;
    case LIB_STATE_EXP_AVG: return 1;
    case LIB_STATE_EXP_AVG_SQ: return 2;
    case LIB_STATE_EBIAS: return 3;
    default: return -1;
    }
}

static const char *const class_name[] = { "parameters", "first moments (exp_avg)",
                                          "second moments (exp_avg_sq)", "expert bias" };

/* Read the header, texts and index of checkpoint file 'file' (not its state): 0, or -1 with
** what is wrong in 'msg'. *texts: malloc'd, the texts then the index. */
static int ckpt_read_head(const char *file, ckpt_header *hd, char **texts, char *msg, size_t cap)
{
    struct stat st;
    int rc = -1;
    memset(hd, 0, sizeof *hd);
    *texts = NULL;
    FILE *fp = fopen(file, "rb");
    if (!fp || fstat(fileno(fp), &st)) {
        snprintf(msg, cap, "cannot read: %s", strerror(errno));
        goto out;
    }
    if (fread(hd, sizeof(uint64_t), CKPT_V2_WORDS, fp) != CKPT_V2_WORDS) {
        snprintf(msg, cap, "truncated: %lld bytes, shorter than its header", (long long)st.st_size);
        goto out;
    }
    if (hd->magic != CKPT_MAGIC) {
        int v = hd->magic == CKPT_MAGIC4 ? 4 : hd->magic == CKPT_MAGIC3 ? 3 :
                hd->magic == CKPT_MAGIC2 ? 2 : 0;
        if (v)
            snprintf(msg, cap, "a version %d checkpoint: it has no index of its state, so no "
                     "other layout can read it; resume it with the program that wrote it and "
                     "let that write a checkpoint (version 5), then reshard from that one", v);
        else
            snprintf(msg, cap, "not a resume checkpoint (it does not start with GPTPCKT5)");
        goto out;
    }
    size_t words = header_words(5);
    if (fread((uint64_t *)hd + CKPT_V2_WORDS, sizeof(uint64_t), words - CKPT_V2_WORDS, fp) !=
        words - CKPT_V2_WORDS) {
        snprintf(msg, cap, "truncated: %lld bytes, shorter than its header", (long long)st.st_size);
        goto out;
    }
    unsigned long long ntext = hd->model_len + hd->layout_len + hd->made_len;
    if (hd->model_len > CKPT_TEXT_MAX || hd->layout_len > CKPT_TEXT_MAX ||
        hd->made_len > CKPT_TEXT_MAX || hd->nblocks > CKPT_BLOCKS_MAX ||
        words * sizeof(uint64_t) + ntext + index_bytes(hd) + hd->nbytes !=
        (unsigned long long)st.st_size) {
        snprintf(msg, cap, "truncated or damaged: %lld bytes, not what its header says",
                 (long long)st.st_size);
        goto out;
    }
    ntext += index_bytes(hd);
    *texts = malloc(ntext + 1);
    if (!*texts || fread(*texts, 1, ntext, fp) != ntext) {
        snprintf(msg, cap, "cannot read: %s", *texts ? "truncated" : "out of memory");
        goto out;
    }
    (*texts)[ntext] = 0;
    rc = 0;
out:
    if (fp) fclose(fp);
    if (rc) {
        free(*texts);
        *texts = NULL;
    }
    return rc;
}

/* One block a rank needs, with where its values go and which of them it has found. */
typedef struct {
    lib_state_block b;
    int cls;                    /* value_class */
    size_t bit;                 /* its first element's bit in 'found' */
    int next;                   /* the next need of the same tensor; -1 */
} reshard_need;

typedef struct {
    reshard_need *need;
    int nneed;
    int *first;                 /* [lib.ntensors]: the first need of each tensor; -1 */
    unsigned char *found;       /* a bit per needed element */
    size_t nbits;
    unsigned char *state;       /* the state image (lib_state_io's bytes): moments, biases */
    float **master;             /* [nbuffers]: each buffer's f32 parameters */
} reshard_plan;

static void reshard_plan_make(reshard_plan *p)
{
    lib_state_block *b;
    int n = lib_state_blocks(&b);
    memset(p, 0, sizeof *p);
    p->need = calloc((size_t)(n ? n : 1), sizeof *p->need);
    p->first = malloc(sizeof *p->first * (size_t)lib.ntensors);
    p->state = calloc(1, lib_state_bytes() + 1);
    p->master = calloc((size_t)gpt.stage->nbuffers + 1, sizeof *p->master);
    RT_CHECK(p->need && p->first && p->state && p->master, "out of memory for resharding");
    for (int t = 0; t < lib.ntensors; t++) p->first[t] = -1;
    for (int i = n - 1; i >= 0; i--) {   /* backwards: each tensor's list in block order */
        int cls = value_class(b[i].kind, b[i].size, 1);
        if (cls < 0) continue;
        reshard_need *r = &p->need[p->nneed++];
        r->b = b[i];
        r->cls = cls;
        r->next = p->first[b[i].tensor];
        p->first[b[i].tensor] = (int)(r - p->need);
    }
    for (int i = 0; i < p->nneed; i++) {
        p->need[i].bit = p->nbits;
        p->nbits += (size_t)(p->need[i].b.rows * p->need[i].b.cols);
    }
    p->found = calloc(p->nbits / 8 + 1, 1);
    RT_CHECK(p->found, "out of memory for resharding");
    for (int i = 0; i < gpt.stage->nbuffers; i++) {
        p->master[i] = calloc(gpt.stage->buffers[i].size + 1, sizeof(float));
        RT_CHECK(p->master[i], "out of memory for resharding");
    }
    free(b);
}

static void reshard_plan_free(reshard_plan *p)
{
    for (int i = 0; i < gpt.stage->nbuffers; i++) free(p->master[i]);
    free(p->master);
    free(p->state);
    free(p->found);
    free(p->first);
    free(p->need);
}

/* Block 'a' of another program's file (its stored words) against this rank's needs: copies
** the values it holds that are not found yet from 'data' (its state; NULL: only counts them).
** Returns the values it gives (or would give). */
static size_t reshard_take(reshard_plan *p, const uint64_t *w, const unsigned char *data)
{
    lib_state_block a = { .tensor = w[0], .kind = w[1], .size = w[2], .grow = w[3],
                          .gcol = w[4], .rows = w[5], .cols = w[6], .ld = w[7], .at = w[8] };
    int cls = value_class(a.kind, a.size, 0);
    size_t given = 0;
    if (cls < 0) return 0;
    for (int i = p->first[a.tensor]; i >= 0; i = p->need[i].next) {
        reshard_need *r = &p->need[i];
        if (r->cls != cls) continue;
        uint64_t r0 = a.grow > r->b.grow ? a.grow : r->b.grow;
        uint64_t r1 = a.grow + a.rows < r->b.grow + r->b.rows ? a.grow + a.rows :
                      r->b.grow + r->b.rows;
        uint64_t c0 = a.gcol > r->b.gcol ? a.gcol : r->b.gcol;
        uint64_t c1 = a.gcol + a.cols < r->b.gcol + r->b.cols ? a.gcol + a.cols :
                      r->b.gcol + r->b.cols;
        for (uint64_t row = r0; row < r1; row++)
            for (uint64_t c = c0; c < c1; c++) {
                size_t bit = r->bit + (size_t)((row - r->b.grow) * r->b.cols + (c - r->b.gcol));
                if (p->found[bit / 8] >> (bit % 8) & 1) continue;
                given++;
                if (!data) continue;
                float v;
                memcpy(&v, data + a.at + ((row - a.grow) * a.ld + (c - a.gcol)) * 4, 4);
                size_t at = (size_t)((row - r->b.grow) * r->b.ld + (c - r->b.gcol));
                if (cls == 0) p->master[r->b.buf][r->b.pos + at] = v;
                else memcpy(p->state + r->b.at + at * 4, &v, 4);
                p->found[bit / 8] |= (unsigned char)(1u << (bit % 8));
            }
    }
    return given;
}

/* Whether a stored block fits the model and its file: its tensor, kind, element size, its
** rectangle inside the tensor and its bytes inside the state. */
static int block_ok(const uint64_t *w, uint64_t nbytes)
{
    if (w[0] >= (uint64_t)lib.ntensors || w[1] >= LIB_STATE_KINDS || (w[2] != 4 && w[2] != 2) ||
        !w[5] || !w[6] || w[6] > w[7])
        return 0;
    const lib_tensor *t = &lib.tensors[w[0]];
    if (w[3] > (uint64_t)t->rows || w[5] > (uint64_t)t->rows - w[3] ||
        w[4] > (uint64_t)t->cols || w[6] > (uint64_t)t->cols - w[4])
        return 0;
    uint64_t span, bytes, end;   /* the block's last byte + 1, without overflow */
    return !__builtin_mul_overflow(w[5] - 1, w[7], &span) &&
           !__builtin_add_overflow(span, w[6], &span) &&
           !__builtin_mul_overflow(span, w[2], &bytes) &&
           !__builtin_add_overflow(w[8], bytes, &end) && end <= nbytes;
}

/*
** --reshard-from DIR: this run starts from the newest complete checkpoint in DIR, written by
** any layout of the same model (its global batch too may differ: the samples read so far
** carry over, *at's). Every rank reads every file's
** header and index (rank_R.bin of each rank R of that run), checks them all (each file there,
** the same model, step and global batch, an index that fits the model), then reads whole the
** files that hold values it still needs, checking each one's checksum, and takes from them its
** parameters (f32), AdamW moments and expert biases; it finally checks that it found every
** value. Anything wrong stops every rank alike before anything is loaded or written. *step,
** *updates, *skipped: the checkpoint's. Collective over the world.
*/
void lib_ckpt_reshard(const lib_flags *f, lib_ckpt_pos *at)
{
    const char *dir = f->reshard_from;
    char file[4200], msg[1400] = "", *texts = NULL;
    int s = lib_ckpt_newest(dir);
    if (s < 0)
        lib_fail_file(dir, "--reshard-from: no complete checkpoint (step_N/) here to start from");
    ckpt_path(file, sizeof file, dir, s, "", 0);
    ckpt_header h0, hd;
    if (!ckpt_read_head(file, &h0, &texts, msg, sizeof msg)) {
        char *tm = strndup(texts, (size_t)h0.model_len), diff[600];
        RT_CHECK(tm, "out of memory for the checkpoint");
        const char *made = texts + h0.model_len + h0.layout_len;
        if (strcmp(tm, gpt.prog->model_text)) {
            first_difference(tm, gpt.prog->model_text, diff, sizeof diff);
            snprintf(msg, sizeof msg, "written by a program of a different model: %s; only "
                     "the layout can change (that program: %.*s)", diff, (int)h0.made_len, made);
        }
        free(tm);
    }
    free(texts);
    if (!*msg && (h0.world < 1 || h0.world > INT_MAX))
        snprintf(msg, sizeof msg, "damaged: its header's world (%llu ranks) cannot be",
                 (unsigned long long)h0.world);
    if (*msg) lib_fail_file(file, "%s; nothing was loaded", msg);

    reshard_plan p;
    reshard_plan_make(&p);
    unsigned long long world = h0.world;
    uint64_t **index = calloc(world, sizeof *index), *nblocks = calloc(world, sizeof *nblocks);
    RT_CHECK(index && nblocks, "out of memory for resharding");
    /* every file's header and index: checked alike on every rank */
    for (unsigned long long r = 0; r < world && !*msg; r++) {
        ckpt_path(file, sizeof file, dir, s, "", (int)r);
        if (ckpt_read_head(file, &hd, &texts, msg, sizeof msg)) break;
        if (hd.world != world || hd.rank != r || hd.step != h0.step || hd.gbs != h0.gbs ||
            hd.model_hash != h0.model_hash || hd.layout_hash != h0.layout_hash)
            snprintf(msg, sizeof msg, "not a file of the run that wrote rank_00000.bin beside "
                     "it (rank %llu of %llu, step %llu there; rank %llu of %llu, step %llu "
                     "expected): a damaged or moved file", (unsigned long long)hd.rank,
                     (unsigned long long)hd.world, (unsigned long long)hd.step, r, world,
                     (unsigned long long)h0.step);
        size_t ntext = (size_t)(hd.model_len + hd.layout_len + hd.made_len);
        index[r] = malloc(index_bytes(&hd) + 1);
        RT_CHECK(index[r], "out of memory for resharding");
        memcpy(index[r], texts + ntext, index_bytes(&hd));
        nblocks[r] = hd.nblocks;
        for (uint64_t k = 0; k < hd.nblocks && !*msg; k++)
            if (!block_ok(index[r] + k * LIB_STATE_BLOCK_WORDS, hd.nbytes))
                snprintf(msg, sizeof msg, "damaged: block %llu of its index does not fit the "
                         "model or the file", (unsigned long long)k);
        free(texts);
        texts = NULL;
    }
    if (*msg) lib_fail_file(file, "%s; nothing was loaded", msg);
    /* the files that hold values this rank needs, whole and checked; the first file's values
    ** win (replicas hold the same) */
    for (unsigned long long r = 0; r < world && !*msg; r++) {
        size_t want = 0;
        for (uint64_t k = 0; k < nblocks[r]; k++)
            want += reshard_take(&p, index[r] + k * LIB_STATE_BLOCK_WORDS, NULL);
        if (!want) continue;
        ckpt_header fh;
        char *ft = NULL;
        unsigned char *data = NULL;
        ckpt_path(file, sizeof file, dir, s, "", (int)r);
        if (ckpt_read_state(file, &fh, &ft, NULL, 0, &data, msg, sizeof msg) != 5) {
            if (!*msg) snprintf(msg, sizeof msg, "changed while it was read");
            free(ft);
            free(data);
            break;
        }
        free(ft);
        for (uint64_t k = 0; k < nblocks[r]; k++)
            reshard_take(&p, index[r] + k * LIB_STATE_BLOCK_WORDS, data);
        free(data);
    }
    /* every value found */
    if (!*msg)
        for (int i = 0; i < p.nneed && !*msg; i++) {
            const reshard_need *r = &p.need[i];
            for (size_t e = 0; e < r->b.rows * r->b.cols; e++) {
                size_t bit = r->bit + e;
                if (p.found[bit / 8] >> (bit % 8) & 1) continue;
                ckpt_path(file, sizeof file, dir, s, "", -1);
                snprintf(msg, sizeof msg, "no file holds the %s of %s at [%llu, %llu] (its "
                         "files do not cover the model: a rank file missing or replaced?)",
                         class_name[r->cls], lib.tensors[r->b.tensor].name,
                         (unsigned long long)(r->b.grow + e / r->b.cols),
                         (unsigned long long)(r->b.gcol + e % r->b.cols));
                break;
            }
        }
    for (unsigned long long r = 0; r < world; r++) free(index[r]);
    free(index);
    free(nblocks);
    if (*msg) {
        size_t used = strlen(msg);
        snprintf(msg + used, sizeof msg - used, "; nothing was loaded");
    }
    ckpt_fail_any(file, msg);
    lib_state_io(p.state, 0);
    for (int i = 0; i < gpt.stage->nbuffers; i++)
        rt_memcpy(lib_master(i), p.master[i], gpt.stage->buffers[i].size * sizeof(float),
                  RT_H2D);
    lib_master_commit();
    reshard_plan_free(&p);
    *at = (lib_ckpt_pos){ .step = (int)h0.step, .updates = (int)h0.updates,
                          .skipped = (int)h0.skipped, .samples = (long long)h0.samples,
                          .valid_samples = (long long)h0.valid_samples };
}
