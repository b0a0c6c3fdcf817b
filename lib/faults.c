/*
** faults.c: the faults of faults.h. GPT_FAULT's faults are injected at the points the tests
** name (a step, a point of checkpoint writing); exit signals only set a flag that the step
** loop reads (and, a second time, stop the rank at once); the output check and the bad-step
** stop take their decision on every rank alike (world.h), then report once.
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "faults.h"
#include "fail.h"     // defines: lib_fail_all, lib_fail_file
#include "hfdir.h"    // defines: lib_hf_is_dir, lib_hf_check
#include "stage.h"    // defines: lib (fault), LIB_FAULT_*, lib_first_bad_grad
#include "world.h"    // defines: lib_world_allreduce, lib_world_allreduce_max, lib_world_barrier

/* -- Injected faults (GPT_FAULT) ------------------------------------------------------------ */

/*
** GPT_FAULT, for tests only: faults to inject, comma-separated KIND@N[:RANK] (RANK 0 if not
** given): nan_grad@S puts a NaN in the rank's first counted gradient at step S (1-based, as the
** log); inf_loss@S makes the rank's loss share infinite at step S; signal@S makes the rank send
** itself the first --exit-signal at the start of step S; kill_ckpt@K kills the rank (SIGKILL)
** at the K-th point of writing checkpoints or --save (every 256 KiB and each step between);
** stall_ckpt@K makes it wait there for a minute (a slow file system).
** Rank 0 announces them, so that a run with faults is never taken for a clean one.
*/
#define FAULTS(_) _(NAN_GRAD, "nan_grad") _(INF_LOSS, "inf_loss") _(SIGNAL, "signal") \
    _(KILL_CKPT, "kill_ckpt") _(STALL_CKPT, "stall_ckpt")
#define FAULT_ENUM(id, name) FAULT_##id,
#define FAULT_NAME(id, name) name,
enum { FAULTS(FAULT_ENUM) };
static const char *const fault_names[] = { FAULTS(FAULT_NAME) NULL };
enum { MAX_FAULTS = 16 };

static struct { int kind, at, rank; } faults[MAX_FAULTS];
static int nfaults;
static int ckpt_points;       /* points of checkpoint writing this rank has passed */

/* Read GPT_FAULT (every rank alike); a malformed value is a usage error on every rank. */
void lib_faults_parse(void)
{
    const char *v = getenv("GPT_FAULT"), *p = v;
    if (!v || !*v) return;
    while (*p) {
        size_t n = strcspn(p, "@");
        int kind = -1, at = 0, rank = 0, used = 0;
        for (int k = 0; fault_names[k]; k++)
            if (strlen(fault_names[k]) == n && !strncmp(p, fault_names[k], n)) kind = k;
        int ok = kind >= 0 && nfaults < MAX_FAULTS &&
                 sscanf(p + n, "@%9d%n", &at, &used) == 1 && at >= 1;
        p += ok ? n + (size_t)used : 0;
        if (ok && *p == ':') {
            ok = sscanf(p, ":%9d%n", &rank, &used) == 1 && rank >= 0 && rank < rt_world();
            p += used;
        }
        if (!ok || (*p && *p != ','))
            lib_fail_all(2, "GPT_FAULT='%s': expected KIND@N[:RANK],... with KIND nan_grad, "
                         "inf_loss, signal, kill_ckpt or stall_ckpt, N >= 1 and RANK < %d "
                         "(at most %d)", v, rt_world(), MAX_FAULTS);
        faults[nfaults].kind = kind;
        faults[nfaults].at = at;
        faults[nfaults++].rank = rank;
        p += *p == ',';
    }
    if (rt_rank() == 0) fprintf(stderr, "train: GPT_FAULT=%s: injecting faults (for tests)\n", v);
}

static int fault_now(int kind, int at)
{
    for (int k = 0; k < nfaults; k++)
        if (faults[k].kind == kind && faults[k].at == at && faults[k].rank == rt_rank()) return 1;
    return 0;
}

/* SIGTERM, or else the first signal of --exit-signal's list (for GPT_FAULT=signal). */
static int first_exit_signal(const lib_flags *f)
{
    if ((unsigned)f->exit_signals & 1u << SIGTERM) return SIGTERM;
    for (int sig = 1; sig < 32; sig++)
        if ((unsigned)f->exit_signals & 1u << sig) return sig;
    return SIGTERM;
}

/*
** The start of step 'step' (1-based): GPT_FAULT=signal@step sends this rank the first exit
** signal (lib_signals_install); nan_grad@step and inf_loss@step set the stage's lib.fault for
** the step, which the caller clears after it.
*/
void lib_faults_step(const lib_flags *f, int step)
{
    if (fault_now(FAULT_SIGNAL, step)) raise(first_exit_signal(f));
    lib.fault = (fault_now(FAULT_NAN_GRAD, step) ? LIB_FAULT_NAN_GRAD : 0) |
                (fault_now(FAULT_INF_LOSS, step) ? LIB_FAULT_INF_LOSS : 0);
}

/* A point of checkpoint writing (weights.c, ckpt.c): GPT_FAULT=kill_ckpt@K dies at the K-th,
** as a node would; stall_ckpt@K waits there. */
void lib_fault_point(void)
{
    if (fault_now(FAULT_KILL_CKPT, ++ckpt_points)) raise(SIGKILL);
    if (fault_now(FAULT_STALL_CKPT, ckpt_points))
        for (double until = rt_now() + 60; rt_now() < until; ) sleep(1);
}

/* At the end of a run with faults: the points of checkpoint writing this rank passed (tests
** pick their kill_ckpt points from this line). */
void lib_faults_report(void)
{
    if (nfaults)
        fprintf(stderr, "train: rank %d: GPT_FAULT: %d points of checkpoint writing passed\n",
                rt_rank(), ckpt_points);
}

/* -- Exit signals ------------------------------------------------------------------------- */

/*
** Exit signals (--exit-signal): before the first step (start-up: loading, opening the files)
** one ends this rank at once, as nothing is trained yet; then the first sets got_signal (the step loop stops after the step
** and saves) and starts the --exit-grace alarm; a second one, or the alarm, ends this rank at
** once with a line on stderr (async-signal-safe: write and _exit only). The checkpoint being
** written is then incomplete, which --resume ignores.
*/
static volatile sig_atomic_t got_signal, stepping;
static unsigned grace_s;
static char abort_second[256], abort_grace[256], abort_start[256];

static void on_exit_signal(int sig)
{
    if (!stepping) {          /* start-up: nothing to save; a blocking open or read ends too */
        ssize_t r = write(2, abort_start, strlen(abort_start));
        (void)r;
        _exit(128 + sig);
    }
    if (got_signal) {
        ssize_t r = write(2, abort_second, strlen(abort_second));
        (void)r;
        _exit(128 + sig);
    }
    got_signal = sig;
    if (grace_s) alarm(grace_s);
}

static void on_grace_alarm(int sig)
{
    (void)sig;
    ssize_t r = write(2, abort_grace, strlen(abort_grace));
    (void)r;
    _exit(1);
}

/* Install the handlers of --exit-signal's signals and of --exit-grace's alarm (none when the
** list is empty). */
void lib_signals_install(const lib_flags *f)
{
    if (!f->exit_signals) return;
    snprintf(abort_second, sizeof abort_second, "train: rank %d: a second signal: stopping "
             "now, without a checkpoint (the newest complete one is intact)\n", rt_rank());
    snprintf(abort_start, sizeof abort_start, "train: rank %d: an exit signal before the first "
             "step: stopping now (nothing trained yet, nothing to save)\n", rt_rank());
    grace_s = (unsigned)ceil(f->exit_grace);
    snprintf(abort_grace, sizeof abort_grace, "train: rank %d: --exit-grace %u s ran out: "
             "stopping now, without a checkpoint (the newest complete one is intact)\n",
             rt_rank(), grace_s);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_exit_signal;
    for (int sig = 1; sig < 32; sig++)
        if ((unsigned)f->exit_signals & 1u << sig) sigaction(sig, &sa, NULL);
    sa.sa_handler = on_grace_alarm;
    sigaction(SIGALRM, &sa, NULL);
}

/* The step loop starts: from now on an exit signal stops the run after the step that runs. */
void lib_signals_stepping(void)
{
    stepping = 1;
}

/* The exit signal received (the first one), or 0: the run stops after the step that runs. */
int lib_exit_signal(void)
{
    return got_signal;
}

/* -- Outputs checked at start-up ---------------------------------------------------------- */

/* mkdir -p: 0, or -1 with errno. */
static int make_dirs(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return errno = ENAMETOOLONG, -1;
    for (char *q = buf + 1; ; q++) {
        if (*q == '/' || !*q) {
            char c = *q;
            *q = 0;
            if (mkdir(buf, 0755) && errno != EEXIST) return -1;
            *q = c;
            if (!c) break;
        }
    }
    struct stat st;
    if (stat(buf, &st)) return -1;
    return S_ISDIR(st.st_mode) ? 0 : (errno = ENOTDIR, -1);
}

/* The directory part of a file path ("." when none), into buf. */
static const char *dir_of(const char *path, char *buf, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return ".";
    snprintf(buf, cap, "%.*s", (int)(slash == path ? 1 : slash - path), path);
    return buf;
}

static const char *human(char *buf, size_t cap, double bytes)
{
    const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int u = 0;
    while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
    return buf;
}

/* Room for 'need' bytes in the file system holding 'dir'? Else a message into msg. */
static int room_for(const char *dir, long long need, const char *what, char *msg, size_t cap)
{
    struct statvfs vf;
    if (statvfs(dir, &vf)) return 1;            /* no answer: the writes will tell */
    double have = (double)vf.f_bavail * (double)vf.f_frsize;
    if (have >= (double)need) return 1;
    char h[32], n[32];
    snprintf(msg, cap, "not enough free space for %s: %s free, %s needed", what,
             human(h, sizeof h, have), human(n, sizeof n, (double)need));
    return 0;
}

/* Create and remove 'probe': 0 with msg set when that fails. */
static int can_create(const char *probe, char *msg, size_t cap)
{
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        snprintf(msg, cap, "cannot write here: %s", strerror(errno));
        return 0;
    }
    close(fd);
    unlink(probe);
    return 1;
}

/* -- The files of a run, checked at start-up --------------------------------------------- */

/* Every file the run reads (inputs) or writes (outputs), for the checks below. */
enum { IO_MAX = 64 };
typedef struct {
    char path[4200];
    const char *flag;         /* the flag that names it: "--init", "--log", ... */
    int exists;
    struct stat st;           /* when it exists (stat: symbolic links followed) */
} io_file;
typedef struct { io_file f[IO_MAX]; int n; } io_list;

static void io_add(io_list *l, const char *flag, const char *fmt, const char *path,
                   const char *suffix)
{
    if (l->n == IO_MAX) return;
    io_file *e = &l->f[l->n++];
    if (snprintf(e->path, sizeof e->path, fmt, path, suffix) >= (int)sizeof e->path) {
        l->n--;               /* beyond PATH_MAX: no such file */
        return;
    }
    e->flag = flag;
    e->exists = stat(e->path, &e->st) == 0;
}

static int same_inode(const io_file *a, const io_file *b)
{
    return a->exists && b->exists && a->st.st_dev == b->st.st_dev && a->st.st_ino == b->st.st_ino;
}

static int ends_with(const char *s, const char *end)
{
    size_t n = strlen(s), k = strlen(end);
    return n >= k && !strcmp(s + n - k, end);
}

/* --init's files: the path; for a directory, or an index beside its shards, every
** .safetensors and .json file there (the shards an index names live beside it). */
static void io_add_init(io_list *l, const char *init)
{
    struct stat st;
    char dir[4096];
    io_add(l, "--init", "%s%s", init, "");
    const char *d = !stat(init, &st) && S_ISDIR(st.st_mode) ? init :
                    ends_with(init, ".json") ? dir_of(init, dir, sizeof dir) : NULL;
    DIR *dp = d ? opendir(d) : NULL;
    struct dirent *e;
    while (dp && (e = readdir(dp))) {
        if (!ends_with(e->d_name, ".safetensors") && !ends_with(e->d_name, ".json")) continue;
        io_add(l, "--init", "%s/%s", d, e->d_name);
        if (same_inode(&l->f[l->n - 1], &l->f[0])) l->n--;     /* --init itself */
    }
    if (dp) closedir(dp);
}

/* What a file is, for a message, when it is not a regular file. */
static const char *file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ?
           "a character device" : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" :
           "not a regular file";
}

/* The same file: one inode, or (not yet made) one path, its directory's real path compared. */
static int same_file(const io_file *a, const io_file *b)
{
    if (a->exists && b->exists) return same_inode(a, b);
    if (a->exists || b->exists) return 0;
    char da[4096], db[4096], ra[PATH_MAX], rb[PATH_MAX];
    const char *ba = strrchr(a->path, '/'), *bb = strrchr(b->path, '/');
    ba = ba ? ba + 1 : a->path;
    bb = bb ? bb + 1 : b->path;
    return !strcmp(ba, bb) && realpath(dir_of(a->path, da, sizeof da), ra) &&
           realpath(dir_of(b->path, db, sizeof db), rb) && !strcmp(ra, rb);
}

/*
** The paths of the run's files, before anything is opened (rank 0; a message into msg and
** the file into *where when one is wrong): every path, with the longest suffix the run adds to
** it, fits the system's PATH_MAX, so that no write fails half-way at the first checkpoint; an
** input that exists is a regular file (--init: or a directory), and an output that exists is a
** regular file (--ckpt-dir: a directory): a FIFO or a device would block or swallow the run's
** writes; no output is an input (by inode: the output would destroy it) or another output.
*/
static void check_paths(const lib_flags *f, char *msg, size_t cap, const char **where)
{
    /* the longest names the run makes of each output (ckpt.c, weights.c, train.c) */
    static const struct { const char *flag, *longest; } suffix[] = {
        { "--ckpt-dir", "/step_00000000.old/rank_00000.bin" },
        { "--save", ".tmp/model.safetensors.index.json" }, { "--log", ".tmp" },
    };
    static io_list io;        /* large: not on the stack */
    const char *out[3] = { f->ckpt_dir, f->save, f->log };
    for (int k = 0; k < 3; k++) {
        if (!out[k]) continue;
        size_t n = strlen(out[k]), most = PATH_MAX - 1 - strlen(suffix[k].longest);
        if (n > most) {
            *where = suffix[k].flag;
            snprintf(msg, cap, "the path is %zu characters long: at most %zu, so that the "
                     "files the run writes there (PATH%s) fit the system's %d", n, most,
                     suffix[k].longest, PATH_MAX);
            return;
        }
    }
    io.n = 0;
    if (f->init) io_add_init(&io, f->init);
    if (f->data) {
        io_add(&io, "--data", "%s%s", f->data, "");
        io_add(&io, "--data", "%s%s", f->data, ".bin");
        io_add(&io, "--data", "%s%s", f->data, ".idx");
    }
    for (int k = 0; k < f->ndata_path; k++) {
        io_add(&io, "--data-path", "%s%s", f->data_path[k], ".bin");
        io_add(&io, "--data-path", "%s%s", f->data_path[k], ".idx");
    }
    int inputs = io.n;
    if (f->log) io_add(&io, "--log", "%s%s", f->log, "");
    if (f->save) io_add(&io, "--save", "%s%s", f->save, "");
    for (int i = 0; i < io.n; i++) {
        const io_file *e = &io.f[i];
        int dir_ok = !strcmp(e->flag, "--init") && i == 0;
        if (e->exists && !S_ISREG(e->st.st_mode) && !(dir_ok && S_ISDIR(e->st.st_mode)) &&
            !(i >= inputs && S_ISDIR(e->st.st_mode))) {   /* outputs: the checks below */
            *where = e->path;
            snprintf(msg, cap, "is %s: %s takes a regular file%s", file_kind(e->st.st_mode),
                     e->flag, dir_ok ? " or a directory" : i < inputs ? "" :
                     " (a FIFO or device would block or lose the run's writes)");
            return;
        }
    }
    for (int i = inputs; i < io.n; i++)
        for (int j = 0; j < i; j++)
            if (same_file(&io.f[i], &io.f[j])) {
                *where = io.f[i].path;
                if (j < inputs)
                    snprintf(msg, cap, "%s would overwrite the input %s reads; give %s "
                             "another path", io.f[i].flag, io.f[j].flag, io.f[i].flag);
                else
                    snprintf(msg, cap, "%s and %s name the same file; give %s another path",
                             io.f[i].flag, io.f[j].flag, io.f[i].flag);
                return;
            }
}

/*
** Before any training: the paths of every input and output (check_paths), then every output
** (--log, --ckpt-dir, --save: a file, or a Hugging Face directory as lib_hf_check allows) can
** be written, its directory made, and there is room for what
** the run will write there (one resume checkpoint of every rank, 'ckpt_bytes' each; the --save
** file of 'save_bytes'; both when they share a file system). Rank 0 looks, as it writes the
** directories; every rank stops alike (lib_fail_file), and a long run never finds out at its
** end. Collective over the world.
*/
void lib_check_outputs(const lib_flags *f, long long ckpt_bytes, long long save_bytes)
{
    long long ckpt = ckpt_bytes, save = save_bytes;
    lib_world_allreduce(&ckpt, RT_SUM);
    char msg[600] = "", d[4096], probe[4200];
    const char *where = "train";
    struct stat st, sd;
    if (rt_rank() == 0) check_paths(f, msg, sizeof msg, &where);
    if (rt_rank() == 0 && !*msg && f->log) {
        FILE *fp = NULL;
        where = f->log;
        if (make_dirs(dir_of(f->log, d, sizeof d)) || !(fp = fopen(f->log, "a")))
            snprintf(msg, sizeof msg, "cannot write the log: %s (--log)", strerror(errno));
        if (fp) fclose(fp);
    }
    int same_fs = 0;
    if (rt_rank() == 0 && !*msg && f->ckpt_dir) {
        where = f->ckpt_dir;
        snprintf(probe, sizeof probe, "%s/.probe_%d", f->ckpt_dir, (int)getpid());
        if (make_dirs(f->ckpt_dir))
            snprintf(msg, sizeof msg, "cannot create the checkpoint directory: %s (--ckpt-dir)",
                     strerror(errno));
        else if (can_create(probe, msg, sizeof msg)) {
            same_fs = f->save && !stat(f->ckpt_dir, &sd) &&
                      !stat(dir_of(f->save, d, sizeof d), &st) && st.st_dev == sd.st_dev;
            room_for(f->ckpt_dir, ckpt + (same_fs ? save : 0), same_fs ?
                     "a resume checkpoint and --save" : "a resume checkpoint (every rank's "
                     "parameters and optimizer state)", msg, sizeof msg);
        }
    }
    int save_dir_form = f->save && lib_hf_is_dir(f->save);
    int dir_only = f->tokenizer || f->given[LIB_FLAG_SAVE_SHARD_SIZE];   /* DIR's flags */
    if (rt_rank() == 0 && !*msg && f->save && !save_dir_form && dir_only) {
        where = f->save;
        snprintf(msg, sizeof msg, "%s is about --save DIR (a Hugging Face directory), and this "
                 "--save names one .safetensors file", f->tokenizer ? "--tokenizer" :
                 "--save-shard-size");
    }
    if (rt_rank() == 0 && !*msg && save_dir_form) {
        const char *save_dir;
        where = f->save;
        if (make_dirs(save_dir = dir_of(f->save, d, sizeof d)))
            snprintf(msg, sizeof msg, "cannot create its directory: %s (--save)",
                     strerror(errno));
        else if (lib_hf_check(f->save, f->tokenizer, msg, sizeof msg, &where) && !same_fs)
            room_for(save_dir, save, "--save", msg, sizeof msg);
    } else if (rt_rank() == 0 && !*msg && f->save) {
        const char *save_dir;
        where = f->save;
        snprintf(probe, sizeof probe, "%s.tmp", f->save);
        if (make_dirs(save_dir = dir_of(f->save, d, sizeof d)))
            snprintf(msg, sizeof msg, "cannot create its directory: %s (--save)",
                     strerror(errno));
        else if (can_create(probe, msg, sizeof msg) && !same_fs)
            room_for(save_dir, save, "--save", msg, sizeof msg);   /* "." is not in d */
    }
    long long bad = *msg != 0;
    lib_world_allreduce_max(&bad);
    if (bad) lib_fail_file(where, "%s; checked before training, nothing was run", msg);
}

/* -- A step that is not finite ------------------------------------------------------------ */

/*
** A step whose loss or gradient norm is not finite, beyond --skip-bad-steps: stop, naming the
** step, the lowest rank holding a gradient that is not finite and its first such tensor
** (Megatron's check_for_nan_in_loss_and_grad). The step changed nothing (gpt_adamw). Every
** rank calls it alike; it does not return (exit status 1).
*/
void lib_bad_step_stop(const lib_flags *f, int step, const gpt_step_out *out)
{
    const char *name;
    long long index;
    float value;
    lib_sync();
    int found = lib_first_bad_grad(&name, &index, &value);
    long long key = found ? rt_world() - rt_rank() : 0;   /* the lowest rank wins */
    lib_world_allreduce_max(&key);
    if (rt_rank() == 0) {
        fprintf(stderr, "train: error: step %d: loss %g, gradient norm %g: not finite; "
                "stopping (%s); the parameters and optimizer state are those before step %d\n",
                step, out->loss, out->grad_norm, f->skip_bad_steps ?
                "more than --skip-bad-steps such steps" : "--skip-bad-steps N skips such steps",
                step);
        if (!key) fprintf(stderr, "train: every gradient is finite: the loss alone is not\n");
        fflush(stderr);
    }
    lib_world_barrier();
    if (key && key == rt_world() - rt_rank()) {
        fprintf(stderr, "train: rank %d (stage %d, tp %d, dp %d): the first gradient that is "
                "not finite is %s, element %lld of this rank's part: %g\n", rt_rank(),
                gpt.pp_rank, gpt.tp_rank, gpt.dp_rank, name, index, (double)value);
        fflush(stderr);
    }
    lib_world_barrier();
    rt_finalize();
    exit(1);
}
