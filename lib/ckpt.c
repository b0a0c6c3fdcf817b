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
** model_text, layout_text, made_by), then the rank's state bytes (lib_state_io). Every number
** is a little-endian uint64. Version 4 adds to version 3's header the rank, its coordinates,
** the hashes of the model's and the layout's texts and a checksum of the whole file; version 3
** added to version 2's the optimizer updates made (steps not skipped) and the steps skipped.
*/
#define CKPT_MAGIC  0x34544b4350545047ull   /* the bytes "GPTPCKT4" */
#define CKPT_MAGIC3 0x33544b4350545047ull   /* the bytes "GPTPCKT3" */
#define CKPT_MAGIC2 0x32544b4350545047ull   /* the bytes "GPTPCKT2" */
enum { CKPT_V2_WORDS = 6, CKPT_V3_WORDS = 8 };  /* the older headers: the first words of ours */
enum { CKPT_TEXT_MAX = 1 << 20 };               /* a text longer than this: a damaged header */

typedef struct {
    uint64_t magic, world, stage, step, nbytes, seed, updates, skipped;  /* version 3's */
    uint64_t rank;
    uint64_t coord[7];        /* tp cp dp pp ep etp edp: the rank's coordinates (stage.h gpt) */
    uint64_t model_hash, layout_hash;   /* XXH3-64 of the model's and the layout's texts */
    uint64_t model_len, layout_len, made_len;   /* bytes of the three texts after the header */
    uint64_t checksum;        /* XXH3-64 of the whole file, this field counted as 0 */
} ckpt_header;

/* -- What a file records of its program ------------------------------------------------------ */

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
        .made_len = strlen(p->made_by),
    };
    return hd;
}

/* The checksum of a version 4 file: XXH3-64 of its header (with checksum 0), its texts
** ('texts': model_len + layout_len + made_len bytes) and its state ('data': nbytes). */
static uint64_t ckpt_checksum(const ckpt_header *hd, const char *texts, const void *data)
{
    ckpt_header h = *hd;
    h.checksum = 0;
    XXH3_state_t *st = XXH3_createState();
    RT_CHECK(st, "out of memory for the checkpoint's checksum");
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, &h, sizeof h);
    XXH3_64bits_update(st, texts, (size_t)(h.model_len + h.layout_len + h.made_len));
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
                 "wrote it (%.*s), or give this run another --ckpt-dir", what, diff,
                 (int)hd->made_len, made);
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
void lib_ckpt_save(const lib_flags *f, int step, int updates, int skipped)
{
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
    /* the header and the texts, written as one piece before the state */
    ckpt_header hd = ckpt_header_here(f->seed, step, n, updates, skipped);
    size_t ntext = (size_t)(hd.model_len + hd.layout_len + hd.made_len);
    unsigned char *head = malloc(sizeof hd + ntext);
    RT_CHECK(head, "out of memory for the checkpoint");
    char *texts = (char *)head + sizeof hd;
    memcpy(texts, gpt.prog->model_text, (size_t)hd.model_len);
    memcpy(texts + hd.model_len, gpt.prog->layout_text, (size_t)hd.layout_len);
    memcpy(texts + hd.model_len + hd.layout_len, gpt.prog->made_by, (size_t)hd.made_len);
    hd.checksum = ckpt_checksum(&hd, texts, buf);
    memcpy(head, &hd, sizeof hd);
    ckpt_path(file, sizeof file, f->ckpt_dir, step, ".tmp", rt_rank());
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write_points(fd, head, sizeof hd + ntext) == 0 &&
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
** updates = step for version 2), its texts into *texts (malloc'd; NULL before version 4) and its
** state into 'data' when it holds 'n' bytes as this rank's does. Checks that it is a checkpoint,
** is as long as its header says and, from version 4, that its checksum holds. Returns its
** version (2, 3, 4), or 0 with what is wrong in 'msg'.
*/
static int ckpt_read(const char *file, ckpt_header *hd, char **texts, unsigned char *data,
                     size_t n, char *msg, size_t cap)
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
    version = hd->magic == CKPT_MAGIC ? 4 : hd->magic == CKPT_MAGIC3 ? 3 :
              hd->magic == CKPT_MAGIC2 ? 2 : 0;
    size_t words = version == 4 ? sizeof *hd / sizeof hd->magic :
                   version == 3 ? CKPT_V3_WORDS : CKPT_V2_WORDS;
    if (!version) {
        snprintf(msg, cap, "not a resume checkpoint (it does not start with GPTPCKT4, 3 or 2)");
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
        hd->made_len > CKPT_TEXT_MAX || hd->nbytes > (unsigned long long)st.st_size) {
        snprintf(msg, cap, "damaged: its header's sizes cannot be (texts of %llu, %llu and %llu "
                 "bytes, a state of %llu bytes in a file of %lld)",
                 (unsigned long long)hd->model_len, (unsigned long long)hd->layout_len,
                 (unsigned long long)hd->made_len, (unsigned long long)hd->nbytes,
                 (long long)st.st_size);
        version = 0;
        goto out;
    }
    unsigned long long ntext = version < 4 ? 0 : hd->model_len + hd->layout_len + hd->made_len;
    unsigned long long want = words * sizeof hd->magic + ntext + hd->nbytes;
    if (want != (unsigned long long)st.st_size) {
        snprintf(msg, cap, "truncated or damaged: %lld bytes, not the %llu its header says",
                 (long long)st.st_size, want);
        version = 0;
        goto out;
    }
    /* the state: into 'data' when it is this rank's size, else only for the checksum */
    unsigned char *into = data;
    if (hd->nbytes != n && version == 4) into = other = malloc(hd->nbytes ? hd->nbytes : 1);
    *texts = malloc(ntext + 1);
    if (!*texts || !into) {
        snprintf(msg, cap, "out of memory for the checkpoint");
        version = 0;
        goto out;
    }
    if (fread(*texts, 1, ntext, fp) != ntext ||
        ((hd->nbytes == n || version == 4) && fread(into, 1, hd->nbytes, fp) != hd->nbytes)) {
        snprintf(msg, cap, "cannot read: %s", ferror(fp) ? strerror(errno) : "truncated");
        version = 0;
        goto out;
    }
    (*texts)[ntext] = 0;
    uint64_t sum = version == 4 ? ckpt_checksum(hd, *texts, into) : 0;
    if (version == 4 && sum != hd->checksum) {
        snprintf(msg, cap, "damaged: its checksum does not match (XXH3-64 written %016llx, "
                 "read %016llx): its bytes changed on the disk or on the way",
                 (unsigned long long)hd->checksum, (unsigned long long)sum);
        version = 0;
    }
out:
    if (fp) fclose(fp);
    free(other);
    return version;
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
void lib_ckpt_load(const lib_flags *f, int step, int *updates, int *skipped)
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
    else if (version == 4) ckpt_same_program(&hd, texts, msg, sizeof msg);
    else if (hd.world != (unsigned long long)gpt.prog->world ||
             hd.stage != (unsigned long long)gpt.pp_rank || hd.nbytes != n)
        snprintf(msg, sizeof msg, "written by a different program (world %llu, stage %llu, "
                 "%llu bytes; here world %d, stage %d, %zu bytes)",
                 (unsigned long long)hd.world, (unsigned long long)hd.stage,
                 (unsigned long long)hd.nbytes, gpt.prog->world, gpt.pp_rank, n);
    free(texts);
    ckpt_fail_any(file, msg);
    long long old = version < 4 ? version : 0;
    lib_world_allreduce_max(&old);
    if (old && rt_rank() == 0)
        printf("%s/step_%08d: warning: a version %lld checkpoint records no model or layout: "
               "only its world, stage and size are checked; resume it only with the program "
               "that wrote it\n", f->ckpt_dir, step, old);
    lib_state_io(buf, 0);
    free(buf);
    *updates = (int)hd.updates;
    *skipped = (int)hd.skipped;
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
    return (long long)(lib_state_bytes() + sizeof(ckpt_header) + strlen(p->model_text) +
                       strlen(p->layout_text) + strlen(p->made_by));
}
