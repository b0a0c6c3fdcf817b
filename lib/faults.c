/*
** faults.c: the faults of faults.h. GPT_FAULT's faults are injected at the points the tests
** name (a step, a point of checkpoint writing); exit signals only set a flag that the step
** loop reads (and, a second time, stop the rank at once); the output check and the bad-step
** stop take their decision on every rank alike (world.h), then report once.
*/
#define _GNU_SOURCE
#include <errno.h>
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
** Exit signals (--exit-signal): the first sets got_signal (the step loop stops after the step
** and saves) and starts the --exit-grace alarm; a second one, or the alarm, ends this rank at
** once with a line on stderr (async-signal-safe: write and _exit only). The checkpoint being
** written is then incomplete, which --resume ignores.
*/
static volatile sig_atomic_t got_signal;
static unsigned grace_s;
static char abort_second[256], abort_grace[256];

static void on_exit_signal(int sig)
{
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

/*
** Before any training: every output (--log, --ckpt-dir, --save) can be written, its directory
** made, and there is room for what the run will write there (one resume checkpoint of every
** rank, 'ckpt_bytes' each; the --save file of 'save_bytes'; both when they share a file
** system). Rank 0 looks, as it writes the directories; every rank stops alike
** (lib_fail_file), and a long run never finds out at its end. Collective over the world.
*/
void lib_check_outputs(const lib_flags *f, long long ckpt_bytes, long long save_bytes)
{
    long long ckpt = ckpt_bytes, save = save_bytes;
    lib_world_allreduce(&ckpt, RT_SUM);
    char msg[600] = "", d[4096], probe[4200];
    const char *where = "train";
    struct stat st, sd;
    if (rt_rank() == 0 && f->log) {
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
    if (rt_rank() == 0 && !*msg && f->save) {
        where = f->save;
        snprintf(probe, sizeof probe, "%s.tmp", f->save);
        if (!stat(f->save, &st) && S_ISDIR(st.st_mode))
            snprintf(msg, sizeof msg, "is a directory (--save takes a file name)");
        else if (make_dirs(dir_of(f->save, d, sizeof d)))
            snprintf(msg, sizeof msg, "cannot create its directory: %s (--save)",
                     strerror(errno));
        else if (can_create(probe, msg, sizeof msg) && !same_fs)
            room_for(d, save, "--save", msg, sizeof msg);
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
