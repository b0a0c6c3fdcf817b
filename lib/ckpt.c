/*
** ckpt.c: resume checkpoints (ckpt.h): per rank, its parameters, optimizer state and step
** (stage.h: lib_state_io), written so that a checkpoint is either complete or ignored, with
** GPT_FAULT's points of writing (faults.h) for the tests that kill a rank while it saves.
** Called by gpt_main: --ckpt-every, the exit signals and limits, --resume.
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "faults.h"   // defines: lib_fault_point
#include "stage.h"    // defines: lib_state_bytes, lib_state_io, gpt (prog, pp_rank)
#include "world.h"    // defines: lib_world_allreduce_max, lib_world_barrier

enum { CKPT_CHUNK = 256 << 10 };   /* bytes written between two points of GPT_FAULT */

/* A resume checkpoint's file header. Version 3 adds the optimizer updates made (steps not
** skipped) and the steps skipped; version 2 files load with updates = step. */
#define CKPT_MAGIC  0x33544b4350545047ull   /* the bytes "GPTPCKT3" */
#define CKPT_MAGIC2 0x32544b4350545047ull   /* the bytes "GPTPCKT2" */

typedef struct {
    unsigned long long magic, world, stage, step, nbytes, seed, updates, skipped;
} ckpt_header;

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
    ckpt_header hd = { CKPT_MAGIC, gpt.prog->world, (unsigned long long)gpt.pp_rank,
                       (unsigned long long)step, n, f->seed, (unsigned long long)updates,
                       (unsigned long long)skipped };
    ckpt_path(file, sizeof file, f->ckpt_dir, step, ".tmp", rt_rank());
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write_points(fd, &hd, sizeof hd) == 0 && write_points(fd, buf, n) == 0 &&
             fsync(fd) == 0;
    int why = errno;
    if (fd >= 0 && close(fd) && ok) ok = 0, why = errno;
    if (!ok) unlink(file);
    RT_CHECK(ok, "%s: cannot write the checkpoint of step %d: %s (the newest complete "
             "checkpoint in %s is intact)", file, step, strerror(why), f->ckpt_dir);
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
** Load this rank's file of the checkpoint of step 'step' in --ckpt-dir: the parameters and the
** optimizer state, and *updates, *skipped (the optimizer updates made, the steps skipped; a
** version 2 file has updates = step, skipped = 0). A file of another program (world, stage,
** size) or a short one stops the job (RT_CHECK).
*/
void lib_ckpt_load(const lib_flags *f, int step, int *updates, int *skipped)
{
    char file[4200];
    ckpt_path(file, sizeof file, f->ckpt_dir, step, "", rt_rank());
    size_t n = lib_state_bytes();
    ckpt_header hd;
    memset(&hd, 0, sizeof hd);
    FILE *fp = fopen(file, "rb");
    RT_CHECK(fp && fread(&hd, 6 * sizeof hd.magic, 1, fp) == 1, "%s: cannot read: %s", file,
             strerror(errno));
    if (hd.magic == CKPT_MAGIC)
        RT_CHECK(fread(&hd.updates, 2 * sizeof hd.magic, 1, fp) == 1, "%s: truncated", file);
    else if (hd.magic == CKPT_MAGIC2) hd.updates = hd.step;
    RT_CHECK((hd.magic == CKPT_MAGIC || hd.magic == CKPT_MAGIC2) &&
             hd.world == (unsigned long long)gpt.prog->world &&
             hd.stage == (unsigned long long)gpt.pp_rank && hd.nbytes == n,
             "%s: written by a different program (world %llu, stage %llu, %llu bytes)", file,
             hd.world, hd.stage, hd.nbytes);
    unsigned char *buf = malloc(n ? n : 1);
    RT_CHECK(buf && fread(buf, 1, n, fp) == n, "%s: truncated", file);
    fclose(fp);
    lib_state_io(buf, 0);
    free(buf);
    *updates = (int)hd.updates;
    *skipped = (int)hd.skipped;
}

/* The bytes of this rank's checkpoint file (for the start-up check of their room, faults.h). */
long long lib_ckpt_bytes(void)
{
    return (long long)(lib_state_bytes() + sizeof(ckpt_header));
}
