/*
** train.c: main of every generated training program (gpt_main): flags, the runtime, the rank's
** groups and stage, data batching, the learning-rate schedule, the log, whole-model safetensors
** checkpoints (--init: a file or Hugging Face shards + index; --save: one file; Hugging Face
** names, layout-free) and per-rank resume checkpoints.
** The stage (generated tables + stage.c) does the model's work; this file moves bytes and
** numbers. Errors every rank detects alike are reported once, by rank 0, as "WHERE: error: ...".
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "internal.h"
#include "flags.h"
#include "safetensors.h"

static const gpt_program *P;    /* the program being run */
static const gpt_dims *D;       /* its sizes */

/* -- Errors that every rank detects alike: rank 0 reports, all exit -------------------------- */

/* "WHERE: error: message" on rank 0: WHERE is the file at fault, or "train" for flags. */
static void report(const char *where, const char *fmt, va_list ap)
{
    if (rt_rank() != 0) return;
    fprintf(stderr, "%s: error: ", where);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

/* A usage error (code 2) or a problem without a file (code 1): every rank exits. */
void lib_fail_all(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report("train", fmt, ap);
    va_end(ap);
    rt_finalize();
    exit(code);
}

/* A bad input file: "PATH: error: what is wrong (what was expected)"; every rank exits 1. */
void lib_fail_file(const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report(path, fmt, ap);
    va_end(ap);
    rt_finalize();
    exit(1);
}

/* -- Flags ---------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: train [flags]   (%s)\n"
        "  --data FILE          token file: uint16 ids, or an llm.c shard (magic 20240520),\n"
        "                       or PREFIX of a Megatron indexed dataset (PREFIX.bin/.idx)\n"
        "  --data-path [W] PREFIX [W PREFIX ...]   Megatron indexed datasets, blended with\n"
        "                       weights W as Megatron's --data-path; sampled as GPTDataset\n"
        "  --data-seed N        Megatron's --seed for the data indices (1234)\n"
        "  --dump-samples K     print the first K samples' token ids (T+1 each) and exit\n"
        "  --steps N            optimizer steps (default 10; 0 = only initialise / save)\n"
        "  --init PATH          start from a Hugging Face checkpoint: one .safetensors file,\n"
        "                       the model.safetensors.index.json of a sharded one (its shards\n"
        "                       beside it), or a directory holding that index or one\n"
        "                       model.safetensors; the model's Hugging Face tensor names and\n"
        "                       shapes, in F32, BF16 or F16\n"
        "  --save FILE          write the model after the last step (safetensors, F32)\n"
        "  --log FILE           one JSON object per step\n"
        "  --seed N             initialisation seed when there is no --init (default 1337)\n"
        "  --lr X --min-lr X    peak and final learning rate (6e-4, 0.1*lr; Megatron's\n"
        "                       --min-lr defaults to 0)\n"
        "  --lr-decay-style S   cosine (default), constant, linear, inverse-square-root or WSD\n"
        "  --warmup N           linear warm-up steps, Megatron's --lr-warmup-iters (0)\n"
        "  --lr-warmup-init X   rate of the first warm-up step (0)\n"
        "  --decay-steps N      decay ends at min-lr after N steps, Megatron's --lr-decay-iters\n"
        "                       (max(steps, warmup))\n"
        "  --lr-wsd-decay-iters N   WSD: the last N of the decay steps decay (required)\n"
        "  --lr-wsd-decay-style S   WSD: exponential, linear, cosine or minus_sqrt\n"
        "                       (exponential); schedules: README.md, \"Learning rate\"\n"
        "  --beta1 X --beta2 X --eps X --wd X --clip X    AdamW (0.9 0.95 1e-8 0.1 1.0)\n"
        "  --ckpt-dir DIR --ckpt-every N   resume checkpoints every N steps\n"
        "  --resume             continue from the newest complete checkpoint in --ckpt-dir\n"
        "  --exit-signal LIST   on these signals finish the step, save a checkpoint to\n"
        "                       --ckpt-dir and exit 0 (SIGTERM,SIGUSR1; none: default action)\n"
        "  --exit-grace S       abort S seconds after that signal if not done (0: no limit)\n"
        "  --exit-duration-in-mins X   save and exit once X minutes have passed\n"
        "  --exit-interval N    save and exit after every N-th step (Megatron's flag)\n"
        "  --skip-bad-steps N   skip up to N steps whose loss or gradient norm is not finite\n"
        "                       (default 0: stop at the first, naming the rank and tensor)\n"
        "  --timeout S          abort a collective or receive stuck for S seconds (300)\n"
        "  --quiet              no per-step line on stdout\n"
        "  --show-groups        print every rank's coordinates and groups, then exit\n",
        P->run_hint);
}

/*
** Learning rate of the optimizer step that follows 'done' completed steps (step t = done + 1
** of the log): Megatron's OptimizerParamScheduler, evaluated once before the first step and
** advanced after each. As Megatron's iteration-based training, it counts samples: n = done*G,
** with warm-up, decay and WSD-decay lengths in samples too (G = global batch in sequences).
** The samples cancel in every ratio; they matter only to inverse-square-root without warm-up
** (max(W, 1) is 1 sample, not 1 step). The operations and their order are Megatron's, so the
** double is the one Megatron computes. The formula: README.md, "Learning rate".
** 'gbs': the global batch G, in sequences. Pure (tests/lr calls it alone: tests/lr/lr_table.c).
*/
double lib_lr_at(const lib_flags *f, long long gbs, int done)
{
    long long g = gbs, n = done * g, w = f->warmup * g, s = f->decay_steps * g;
    double max_lr = f->lr, min_lr = f->min_lr, coeff;

    if (w > 0 && n <= w) return f->lr_init + (max_lr - f->lr_init) * (double)n / (double)w;
    if (f->lr_style == LR_CONSTANT) return max_lr;
    if (n > s) return min_lr;
    if (f->lr_style == LR_INVERSE_SQRT) {
        double lr = max_lr * pow((double)(w > 1 ? w : 1), 0.5) /
                    pow((double)(n > 1 ? n : 1), 0.5);
        return min_lr >= lr ? min_lr : lr;
    }
    double ratio = (double)(n - w) / (double)(s - w);
    if (f->lr_style == LR_LINEAR) coeff = 1.0 - ratio;
    else if (f->lr_style == LR_COSINE) coeff = 0.5 * (cos(M_PI * ratio) + 1.0);
    else {                                  /* WSD: stable, then the last wsd_iters decay */
        long long wsd = f->wsd_iters * g, stable = s - wsd;
        if (n <= stable) coeff = 1.0;
        else {
            double r = (double)(n - stable) / (double)wsd;
            switch (f->wsd_style) {
            case WSD_LINEAR:      coeff = 1.0 - r; break;
            case WSD_COSINE:      coeff = 0.5 * (cos(M_PI * r) + 1.0); break;
            case WSD_MINUS_SQRT:  coeff = 1.0 - sqrt(r); break;
            default:              coeff = 2.0 * pow(0.5, r) - 1.0; break;
            }
        }
    }
    return min_lr + coeff * (max_lr - min_lr);
}

/* -- Data ------------------------------------------------------------------------------------ */

typedef lib_tokens data_file;   /* a token file, or (mm) a Megatron dataset or blend */

/* *v = op over the world of every rank's *v (collectives take device memory: the stage's
** scalar scratch, X_STAT, which the memory plan holds; no allocation outside the plan). */
static void world_reduce(long long *v, rt_op op)
{
    long long *dev = (long long *)(void *)lib.stat_dev;
    rt_memcpy(dev, v, sizeof *v, RT_H2D);
    rt_allreduce(dev, 1, RT_I64, op, rt_group_world());
    rt_memcpy(v, dev, sizeof *v, RT_D2H);
}

static void world_max(long long *v) { world_reduce(v, RT_MAX); }

/*
** A Megatron indexed dataset (--data PREFIX) or blend (--data-path [W] PREFIX ...), sampled as
** Megatron's GPTDataset / BlendedDataset for steps*GBS samples of seq + 1 tokens, seed
** --data-seed (data.c); every rank builds the same indices and checks the tokens < vocab.
*/
static void data_open_indexed(data_file *d, const lib_flags *f, char *prefix)
{
    int n = f->ndata_path ? f->ndata_path : 1;
    char **words = f->ndata_path ? f->data_path : &prefix;
    double *w = NULL;
    if (n > 1 && n % 2 == 0) {         /* Megatron's get_blend_from_list: W P W P ... */
        w = malloc(sizeof *w * (size_t)(n / 2));
        char **pre = malloc(sizeof *pre * (size_t)(n / 2));
        RT_CHECK(w && pre, "out of memory");
        int numbers = 0;
        for (int k = 0; k < n / 2; k++) {
            char *end;
            w[k] = strtod(words[2 * k], &end);
            numbers += end != words[2 * k] && !*end;
            pre[k] = words[2 * k + 1];
        }
        if (numbers == n / 2) {
            words = pre;
            n /= 2;
        } else {
            if (numbers) lib_fail_all(2, "--data-path: give a weight before every prefix or none");
            free(pre);
            free(w);
            w = NULL;
        }
    }
    d->path = words[0];
    d->mm = lib_data_open(n, words, w, D->seq, (long long)f->steps * P->gbs, f->data_seed,
                          !f->quiet && !f->dump_samples);
    d->nsamples = lib_data_size(d->mm);
    if (d->nsamples < (long long)f->steps * P->gbs)
        lib_fail_file(d->path, "the blend holds %lld samples, %d steps of %d need %lld",
                      d->nsamples, f->steps, P->gbs, (long long)f->steps * P->gbs);
    if (!f->dump_samples) lib_data_check_vocab(d->mm, P->vocab, world_max);   /* ids as is */
    if (w) free(words);
    free(w);
}

/* --dump-samples K: "sample I: ids..." for samples 0..K-1 of the dataset on rank 0, and exit. */
static void data_dump(const data_file *d, int count)
{
    if (count > d->nsamples)
        lib_fail_all(2, "--dump-samples %d: the dataset has %lld samples", count, d->nsamples);
    int *tok = malloc(sizeof *tok * ((size_t)D->seq + 1));
    RT_CHECK(tok, "out of memory");
    for (int i = 0; i < count && rt_rank() == 0; i++) {
        lib_data_sample(d->mm, i, tok);
        printf("sample %d:", i);
        for (int t = 0; t <= D->seq; t++) printf(" %d", tok[t]);
        printf("\n");
    }
    fflush(stdout);
    free(tok);
    rt_finalize();
    exit(0);
}

/*
** Token ids of this rank's micro-batches for optimizer step 'step' (0-based), sequence-major:
** inputs[k][t*B + b] for micro-batch k, sample b. Sample i is tokens [i*T, i*T + T] of a token
** file, or sample i of a Megatron dataset; step s uses samples (s*GBS + j) mod nsamples,
** j = 0..GBS-1. From a token file, data-parallel rank d takes j in [d*B*NMB, (d+1)*B*NMB),
** micro-batch k the B samples from d*B*NMB + k*B; from a Megatron dataset, as Megatron's
** pretraining sampler hands them out, micro-batch k of rank d takes the B samples from
** k*B*DP + d*B. Under context parallelism a rank keeps the positions of its two chunks
** (lib_cp_position), in local order.
*/
static void data_batch(const data_file *d, int step, int dp, int *inputs, int *targets)
{
    int S = D->seq;
    unsigned char *raw = malloc(2 * ((size_t)S + 1));
    int *ids = malloc(sizeof *ids * ((size_t)S + 1));
    RT_CHECK(raw && ids, "out of memory");
    for (int k = 0; k < D->nmb; k++)
        for (int b = 0; b < D->B; b++) {
            long long j = (long long)dp * D->B * D->nmb + (long long)k * D->B + b;
            if (d->mm)      /* Megatron's sampler: micro-batch k of every rank, then k + 1 */
                j = (long long)k * (P->gbs / D->nmb) + (long long)dp * D->B + b;
            long long i = ((long long)step * P->gbs + j) % d->nsamples;
            if (d->mm) {
                lib_data_sample(d->mm, i, ids);
            } else {
                off_t at = d->first + (off_t)2 * i * S;
                ssize_t want = 2 * ((ssize_t)S + 1);
                if (pread(d->fd, raw, (size_t)want, at) != want)
                    RT_CHECK(0, "%s: cannot read sample %lld: %s", d->path, i, strerror(errno));
                for (int g = 0; g <= S; g++) ids[g] = raw[2 * g] | raw[2 * g + 1] << 8;
            }
            for (int t = 0; t < D->T; t++) {
                int g = lib_cp_position(t);       /* input at g, target at g + 1 */
                int tok = ids[g], next = ids[g + 1];
                int bad = tok < 0 || tok >= P->vocab ? tok : next < 0 || next >= P->vocab ?
                          next : -1;
                RT_CHECK(bad < 0 || d->mm, "%s: token %d at position %lld is out of range for "
                         "vocabulary %d (the file changed while training?)", d->path, bad,
                         i * S + g + (tok < P->vocab), P->vocab);
                RT_CHECK(bad < 0, "%s: token %d in sample %lld is out of range for vocabulary "
                         "%d (the file changed while training?)", d->path, bad, i, P->vocab);
                inputs[(size_t)k * D->N + (size_t)t * D->B + b] = tok;
                targets[(size_t)k * D->N + (size_t)t * D->B + b] = next;
            }
        }
    free(ids);
    free(raw);
}

/* -- The model's tensors (checkpoint order: Hugging Face GPT-2's) ---------------------------- */

static int role_pos[256];       /* a role's position among the roles of its scope */
static int scope_count[4];      /* roles per scope */

/* The tensor list from the roles: BEFORE roles, per layer its LAYER roles then per expert the
** EXPERT roles, then AFTER roles; each tensor's random stream is FNV-1a 64 of its name. */
void lib_tensors_build(const gpt_program *prog)
{
    RT_CHECK(prog->nroles <= 256, "too many tensor roles (%d)", prog->nroles);
    for (int r = 0; r < prog->nroles; r++)
        role_pos[r] = scope_count[prog->roles[r].scope]++;
    int per_layer = scope_count[GPT_LAYER] + prog->experts * scope_count[GPT_EXPERT];
    int n = scope_count[GPT_BEFORE] + prog->layers * per_layer + scope_count[GPT_AFTER];
    int nb = prog->dims.expert_bias ? prog->layers : 0;    /* the expert biases, last */
    lib.tensors = calloc((size_t)(n + nb), sizeof *lib.tensors);
    RT_CHECK(lib.tensors, "out of memory");
    lib.ntensors = n + nb;
    lib.ebias_tensor = nb ? n : -1;
    for (int l = 0; l < nb; l++) {
        /* state, not a parameter: Megatron's mlp.router.expert_bias buffer; Llama files as
        ** Hugging Face's DeepSeek-V3 name it (e_score_correction_bias) */
        lib_tensor *t = &lib.tensors[n + l];
        snprintf(t->name, sizeof t->name, prog->dims.llama
                 ? "model.layers.%d.block_sparse_moe.gate.e_score_correction_bias"
                 : "h.%d.mlp.router.expert_bias", l);
        t->rows = 1;
        t->cols = prog->experts;
        t->ndim = 1;
        t->init = GPT_INIT_ZERO;
        t->stream = rt_fnv1a64(t->name);
    }
    for (int r = 0; r < prog->nroles; r++) {
        const gpt_role *ro = &prog->roles[r];
        int layers = ro->scope == GPT_LAYER || ro->scope == GPT_EXPERT ? prog->layers : 1;
        int experts = ro->scope == GPT_EXPERT ? prog->experts : 1;
        for (int l = 0; l < layers; l++)
            for (int e = 0; e < experts; e++) {
                lib_tensor *t = &lib.tensors[lib_tensor_index(prog, r, l, e)];
                snprintf(t->name, sizeof t->name, ro->name, l, e);
                t->rows = ro->rows;
                t->cols = ro->cols;
                t->ndim = ro->ndim;
                t->init = ro->init;
                t->std = ro->std;
                t->stream = rt_fnv1a64(t->name);
            }
    }
}

int lib_tensor_index(const gpt_program *prog, int role, int layer, int expert)
{
    int per_layer = scope_count[GPT_LAYER] + prog->experts * scope_count[GPT_EXPERT];
    int at = scope_count[GPT_BEFORE] + layer * per_layer;
    switch (prog->roles[role].scope) {
    case GPT_BEFORE: return role_pos[role];
    case GPT_LAYER: return at + role_pos[role];
    case GPT_EXPERT: return at + scope_count[GPT_LAYER] + expert * scope_count[GPT_EXPERT] +
                            role_pos[role];
    default: return scope_count[GPT_BEFORE] + prog->layers * per_layer + role_pos[role];
    }
}

static int tensor_named(const char *name)
{
    for (int i = 0; i < lib.ntensors; i++)
        if (!strcmp(lib.tensors[i].name, name)) return i;
    return -1;
}

/* A resume checkpoint's file header. Version 3 adds the optimizer updates made (steps not
** skipped) and the steps skipped; version 2 files load with updates = step. */
#define CKPT_MAGIC  0x33544b4350545047ull   /* the bytes "GPTPCKT3" */
#define CKPT_MAGIC2 0x32544b4350545047ull   /* the bytes "GPTPCKT2" */

typedef struct {
    unsigned long long magic, world, stage, step, nbytes, seed, updates, skipped;
} ckpt_header;

/* -- Faults: injected (GPT_FAULT), signals, output checks (README.md, "When things go wrong") */

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
enum { MAX_FAULTS = 16, CKPT_CHUNK = 256 << 10 };

static struct { int kind, at, rank; } faults[MAX_FAULTS];
static int nfaults;
static int ckpt_points;       /* points of checkpoint writing this rank has passed */

static void faults_parse(void)
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
                         "inf_loss, signal, kill_ckpt or stall_ckpt, N >= 1 and RANK < %d (at most %d)", v,
                         rt_world(), MAX_FAULTS);
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

/* A point of checkpoint writing: GPT_FAULT=kill_ckpt@K dies at the K-th, as a node would;
** stall_ckpt@K waits there. */
static void ckpt_point(void)
{
    if (fault_now(FAULT_KILL_CKPT, ++ckpt_points)) raise(SIGKILL);
    if (fault_now(FAULT_STALL_CKPT, ckpt_points))
        for (double until = rt_now() + 60; rt_now() < until; ) sleep(1);
}

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

static void signals_install(const lib_flags *f)
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

/* SIGTERM, or else the first signal of --exit-signal's list (for GPT_FAULT=signal). */
static int first_exit_signal(const lib_flags *f)
{
    if ((unsigned)f->exit_signals & 1u << SIGTERM) return SIGTERM;
    for (int sig = 1; sig < 32; sig++)
        if ((unsigned)f->exit_signals & 1u << sig) return sig;
    return SIGTERM;
}

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

static long long save_bytes(void);

/*
** Before any training: every output (--log, --ckpt-dir, --save) can be written, its directory
** made, and there is room for what the run will write there (one resume checkpoint of every
** rank; the --save file; both when they share a file system). Rank 0 looks, as it writes the
** directories; every rank stops alike, and a long run never finds out at its end.
*/
static void check_outputs(const lib_flags *f)
{
    long long ckpt = (long long)(lib_state_bytes() + sizeof(ckpt_header));
    world_reduce(&ckpt, RT_SUM);
    long long save = f->save ? save_bytes() : 0;
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
    world_max(&bad);
    if (bad) lib_fail_file(where, "%s; checked before training, nothing was run", msg);
}

/* -- safetensors: --init reads the whole model, --save writes it -------------------------- */

/* Problems with the tensors of a checkpoint: each reported (rank 0, at most 20), counted. */
static int st_problems;

static void st_problem(const char *path, const char *fmt, ...) RT_PRINTF(2, 3);
static void st_problem(const char *path, const char *fmt, ...)
{
    if (st_problems++ < 20) {
        va_list ap;
        va_start(ap, fmt);
        report(path, fmt, ap);
        va_end(ap);
    }
}

static const char *shape_text(char *buf, size_t cap, const long long *shape, int n)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", shape[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}

/* Non-parameter buffers that Hugging Face checkpoints may hold, by name suffix; --init skips
** them: GPT-2's causal masks, Llama's rotary frequencies. */
static const char *const st_buffers[] = {
    ".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"
};

static int st_buffer(const char *name)
{
    size_t n = strlen(name);
    for (size_t k = 0; k < sizeof st_buffers / sizeof *st_buffers; k++) {
        size_t m = strlen(st_buffers[k]);
        if (n > m && !strcmp(name + n - m, st_buffers[k])) return 1;
    }
    return 0;
}

/* Hugging Face families: told apart by a tensor name only they use (anchor) and, for a
** mixture-of-experts variant, a part of a name (marker); the first row that fits is the
** family (the variants come first). For the message about another architecture's checkpoint
** and the closing line of the problems. */
static const struct { const char *family, *anchor, *marker; } st_families[] = {
    { "Mixtral", "model.embed_tokens.weight", ".block_sparse_moe." },
    { "Llama", "model.embed_tokens.weight", NULL },
    { "GPT-2", "wte.weight", NULL }, { "GPT-2", "transformer.wte.weight", NULL },
};

static const char *family_of(const char *const *names, int n)
{
    for (size_t k = 0; k < sizeof st_families / sizeof *st_families; k++) {
        int anchor = 0, marker = !st_families[k].marker;
        for (int i = 0; i < n; i++) {
            anchor |= !strcmp(names[i], st_families[k].anchor);
            marker |= st_families[k].marker && strstr(names[i], st_families[k].marker);
        }
        if (anchor && marker) return st_families[k].family;
    }
    return NULL;
}

/* The model's tensor names (a malloc'd array of lib.ntensors pointers). */
static const char **model_names(void)
{
    const char **want = malloc(sizeof *want * (size_t)lib.ntensors);
    RT_CHECK(want, "out of memory");
    for (int t = 0; t < lib.ntensors; t++) want[t] = lib.tensors[t].name;
    return want;
}

/* "'a', 'b', ..." from the first two of names[n] ("no tensors" when n = 0). */
static const char *names_text(char *buf, size_t cap, const char *const *names, int n)
{
    if (n == 0) snprintf(buf, cap, "no tensors");
    else snprintf(buf, cap, "'%s'%s%s%s%s", names[0], n > 1 ? ", '" : "", n > 1 ? names[1] : "",
                  n > 1 ? "'" : "", n > 2 ? ", ..." : "");
    return buf;
}

/* Where --init's tensors come from: one safetensors file, or the shards an index names. */
typedef struct {
    char path[ST_PATH_MAX];      /* the file, or the index (--init, or --init/NAME) */
    int is_index;
    st_index ix;                 /* is_index */
    int nfiles;                  /* 1, or the index's shards */
    st_file *files;              /* [nfiles]; fd < 0: could not be opened (err says why) */
    char (*fpath)[ST_PATH_MAX];  /* [nfiles] */
    char (*err)[256];            /* [nfiles] */
    const st_tensor **found;     /* [ntensors]: each model tensor's entry, NULL if none */
    int *found_file;             /* [ntensors]: the file of that entry */
} init_src;

/*
** Resolve --init's path and open what it names. A path that is not there, a directory without
** a checkpoint, a malformed index and (for a single file) a malformed header fail at once; the
** shards of an index are opened quietly, their failures kept for init_check_index.
*/
static void init_open(init_src *s, const char *arg)
{
    char err[256];
    memset(s, 0, sizeof *s);
    if (st_resolve(arg, s->path, sizeof s->path, &s->is_index, err, sizeof err))
        lib_fail_file(arg, "%s", err);
    if (s->is_index && st_index_read(&s->ix, s->path, err, sizeof err))
        lib_fail_file(s->path, "%s", err);
    s->nfiles = s->is_index ? s->ix.nshards : 1;
    int n = s->nfiles ? s->nfiles : 1;
    s->files = calloc((size_t)n, sizeof *s->files);
    s->fpath = calloc((size_t)n, sizeof *s->fpath);
    s->err = calloc((size_t)n, sizeof *s->err);
    s->found = calloc((size_t)lib.ntensors, sizeof *s->found);
    s->found_file = calloc((size_t)lib.ntensors, sizeof *s->found_file);
    RT_CHECK(s->files && s->fpath && s->err && s->found && s->found_file, "out of memory");
    if (!s->is_index) {
        snprintf(s->fpath[0], sizeof s->fpath[0], "%s", s->path);
        if (st_open(&s->files[0], s->path, err, sizeof err)) lib_fail_file(s->path, "%s", err);
        return;
    }
    for (int k = 0; k < s->nfiles; k++) {
        st_index_shard_path(&s->ix, k, s->path, s->fpath[k], sizeof s->fpath[k]);
        st_open(&s->files[k], s->fpath[k], s->err[k], sizeof s->err[k]);
    }
}

static void init_close(init_src *s)
{
    for (int k = 0; k < s->nfiles; k++)
        if (s->files[k].fd >= 0) st_close(&s->files[k]);
    st_index_free(&s->ix);
    free(s->files);
    free(s->fpath);
    free(s->err);
    free(s->found);
    free(s->found_file);
}

/* The first opened shard other than 'skip' that holds 'name', or -1. */
static int shard_holding(const init_src *s, const char *name, int skip)
{
    for (int k = 0; k < s->nfiles; k++)
        if (k != skip && s->files[k].fd >= 0 && st_find(&s->files[k], name)) return k;
    return -1;
}

/*
** A checkpoint of another architecture: when it is of another family (st_families) than the
** model, or fewer than a tenth of the model's tensors are named in it (the index's weight_map
** and its shards, or the file's header), fail with one line naming the first tensors of both
** (their families where known), not a line per tensor.
*/
static void init_foreign(const init_src *s)
{
    int cap = s->is_index ? s->ix.n : 0, n = 0, matched = 0;
    for (int k = 0; k < s->nfiles; k++) cap += s->files[k].fd >= 0 ? s->files[k].n : 0;
    const char **names = malloc(sizeof *names * (size_t)(cap ? cap : 1));
    char *seen = calloc((size_t)lib.ntensors, 1);
    RT_CHECK(names && seen, "out of memory");
    for (int i = 0; s->is_index && i < s->ix.n; i++)
        if (!st_buffer(s->ix.map[i].name)) names[n++] = s->ix.map[i].name;
    for (int k = 0; k < s->nfiles; k++)
        for (int i = 0; s->files[k].fd >= 0 && i < s->files[k].n; i++) {
            const char *name = s->files[k].t[i].name;
            if (!st_buffer(name) && (!s->is_index || !st_index_find(&s->ix, name)))
                names[n++] = name;
        }
    for (int i = 0; i < n; i++) {
        int t = tensor_named(names[i]);
        if (t >= 0 && !seen[t]) {
            seen[t] = 1;
            matched++;
        }
    }
    free(seen);
    const char **want = model_names();
    const char *ff = family_of(names, n), *mf = family_of(want, lib.ntensors);
    int other = ff && mf && strcmp(ff, mf);
    if (10 * matched >= lib.ntensors && !other) {
        free(names);
        free(want);
        return;
    }
    char have_text[2 * ST_NAME_MAX + 32], want_text[2 * ST_NAME_MAX + 32], needs[64];
    names_text(have_text, sizeof have_text, names, n);
    names_text(want_text, sizeof want_text, want, lib.ntensors);
    const char *what = s->is_index ? "this checkpoint" : "this file";
    free(names);
    free(want);
    if (mf) snprintf(needs, sizeof needs, "Hugging Face %s names", mf);
    else snprintf(needs, sizeof needs, "the names");
    if (other)
        lib_fail_file(s->path, "%s holds %s tensor names (%s) but the model (%s) needs %s (%s): "
                      "convert the checkpoint or pick the matching model", what, ff, have_text,
                      P->model, needs, want_text);
    char count[32] = "none";
    if (matched) snprintf(count, sizeof count, "only %d", matched);
    lib_fail_file(s->path, "%s of the model's %d tensors are in %s, which holds %s, but the "
                  "model (%s) needs %s (%s): convert the checkpoint or pick the matching model",
                  count, lib.ntensors, what, have_text, P->model, needs, want_text);
}

/* Entry e of file k for model tensor t: shape, dtype and data offsets, reported against the
** file. The first entry of a tensor is the one read; a second is a problem. */
static void check_entry(init_src *s, int k, const st_tensor *e, int t)
{
    char s1[64], s2[64];
    const char *path = s->fpath[k];
    const lib_tensor *ti = &lib.tensors[t];
    long long want[2] = { ti->rows, ti->cols };
    long long rows = e->ndim == 2 ? e->shape[0] : 1, cols = e->ndim == 2 ? e->shape[1]
                                                                     : e->shape[0];
    int ok_dtype = e->dtype == ST_F32 || e->dtype == ST_BF16 || e->dtype == ST_F16;
    if (s->found[t])
        st_problem(path, "tensor '%s' appears twice", e->name);
    else if (e->ndim != ti->ndim || rows != ti->rows || cols != ti->cols)
        st_problem(path, "tensor '%s' has shape %s, expected %s", e->name,
                   shape_text(s1, sizeof s1, e->shape,
                              e->ndim <= ST_MAX_DIMS ? e->ndim : ST_MAX_DIMS),
                   shape_text(s2, sizeof s2, want + 2 - ti->ndim, ti->ndim));
    else if (!ok_dtype)
        st_problem(path, "tensor '%s' has dtype '%s'; expected F32, BF16 or F16", e->name,
                   e->dtype_name);
    else if (!st_extent_ok(&s->files[k], e))
        st_problem(path, "tensor '%s' has data_offsets [%lld, %lld]: they must span its "
                   "%lld bytes inside the file", e->name, e->begin, e->end,
                   rows * cols * st_dtype_size(e->dtype));
    if (!s->found[t]) {
        s->found[t] = e;
        s->found_file[t] = k;
    }
}

/* One file: every tensor of its header is the model's (or a buffer), every model tensor is
** in it. */
static void init_check_file(init_src *s)
{
    const st_file *f = &s->files[0];
    for (int i = 0; i < f->n; i++) {
        const st_tensor *e = &f->t[i];
        int t = tensor_named(e->name);
        if (t >= 0) check_entry(s, 0, e, t);
        else if (!st_buffer(e->name))
            st_problem(s->path, "unexpected tensor '%s' (not a parameter of this model)",
                       e->name);
    }
    for (int t = 0; t < lib.ntensors; t++)
        if (!s->found[t]) {
            char s1[64];
            const lib_tensor *ti = &lib.tensors[t];
            long long want[2] = { ti->rows, ti->cols };
            st_problem(s->path, "missing tensor '%s' %s", ti->name,
                       shape_text(s1, sizeof s1, want + 2 - ti->ndim, ti->ndim));
        }
}

/*
** An index and its shards: each shard opened; each model tensor in the weight_map, mapped to
** a shard that holds it; each name of the weight_map and of the shards the model's (or a
** buffer); each tensor in the shard the index names, once, and checked there.
*/
static void init_check_index(init_src *s)
{
    const st_index *ix = &s->ix;
    char s1[64];
    for (int k = 0; k < s->nfiles; k++) {
        if (s->files[k].fd >= 0) continue;
        int mapped = 0;
        for (int i = 0; i < ix->n; i++) mapped += ix->map[i].shard == k;
        st_problem(s->fpath[k], "%s; the index maps %d tensor%s to this shard", s->err[k],
                   mapped, mapped == 1 ? "" : "s");
    }
    for (int t = 0; t < lib.ntensors; t++) {
        const lib_tensor *ti = &lib.tensors[t];
        const st_entry *e = st_index_find(ix, ti->name);
        if (!e) {
            long long want[2] = { ti->rows, ti->cols };
            int k = shard_holding(s, ti->name, -1);
            if (k >= 0)
                st_problem(s->path, "tensor '%s' is in '%s' but not in the weight_map",
                           ti->name, ix->shard[k]);
            else
                st_problem(s->path, "missing tensor '%s' %s", ti->name,
                           shape_text(s1, sizeof s1, want + 2 - ti->ndim, ti->ndim));
        } else if (s->files[e->shard].fd >= 0 && !st_find(&s->files[e->shard], ti->name)) {
            int k = shard_holding(s, ti->name, e->shard);
            char also[ST_NAME_MAX + 32] = "";
            if (k >= 0) snprintf(also, sizeof also, " (it is in '%s')", ix->shard[k]);
            st_problem(s->path, "tensor '%s' is mapped to '%s', which does not hold it%s",
                       ti->name, ix->shard[e->shard], also);
        }
    }
    for (int i = 0; i < ix->n; i++)
        if (tensor_named(ix->map[i].name) < 0 && !st_buffer(ix->map[i].name))
            st_problem(s->path, "unexpected tensor '%s' (not a parameter of this model)",
                       ix->map[i].name);
    for (int k = 0; k < s->nfiles; k++)
        for (int i = 0; s->files[k].fd >= 0 && i < s->files[k].n; i++) {
            const st_tensor *te = &s->files[k].t[i];
            const st_entry *e = st_index_find(ix, te->name);
            int t = tensor_named(te->name);
            if (!e) {       /* a model tensor not in the index is reported above */
                if (t < 0 && !st_buffer(te->name))
                    st_problem(s->fpath[k], "unexpected tensor '%s' (not in the index, not a "
                               "parameter of this model)", te->name);
            } else if (t >= 0 && e->shard == k) {
                check_entry(s, k, te, t);
            } else if (t >= 0 && s->files[e->shard].fd >= 0 &&
                       st_find(&s->files[e->shard], te->name)) {
                st_problem(s->fpath[k], "tensor '%s' is also in this shard; the index maps it "
                           "to '%s'", te->name, ix->shard[e->shard]);
            }
        }
}

/*
** Open --init's checkpoint (a safetensors file, an index, or a directory holding one; see
** init_open) and check it: every tensor of the model present once with its shape, in F32,
** BF16 or F16, inside its file; nothing else but Hugging Face's buffers (st_buffers). A
** checkpoint of another architecture fails in one line (init_foreign); other problems (up to
** 20 shown) are all reported, then the load fails. Fills s->found and s->found_file.
*/
static void st_check(init_src *s, const char *arg)
{
    init_open(s, arg);
    init_foreign(s);
    st_problems = 0;
    if (s->is_index) init_check_index(s);
    else init_check_file(s);
    if (st_problems) {
        const char **want = model_names();
        const char *mf = family_of(want, lib.ntensors);
        free(want);
        char names[64];
        snprintf(names, sizeof names, "%s%s", mf ? "Hugging Face " : "their Hugging Face",
                 mf ? mf : "");
        lib_fail_file(s->path, "not loaded (%d problem%s): --init needs the %d tensors of this "
                      "model, with %s names and shapes, in F32, BF16 or F16", st_problems,
                      st_problems > 1 ? "s" : "", lib.ntensors, names);
    }
}

/* Copy a host (rows, cols) block into / out of a local tensor at (lrow, lcol), stride ld, in
** the f32 parameters (lib_master). */
static void piece_copy(const lib_piece *pc, float *host, int to_device)
{
    const lib_param *lp = &lib.params[pc->param];
    float *base = lib_master(lp->p.buf) + lp->p.offset + (size_t)pc->lrow * lp->p.ld + pc->lcol;
    if (pc->cols == lp->p.ld) {
        size_t bytes = (size_t)pc->rows * pc->cols * sizeof(float);
        if (to_device) rt_memcpy(base, host, bytes, RT_H2D);
        else rt_memcpy(host, base, bytes, RT_D2H);
        return;
    }
    for (int r = 0; r < pc->rows; r++) {
        float *row = base + (size_t)r * lp->p.ld, *h = host + (size_t)r * pc->cols;
        if (to_device) rt_memcpy(row, h, (size_t)pc->cols * sizeof(float), RT_H2D);
        else rt_memcpy(h, row, (size_t)pc->cols * sizeof(float), RT_D2H);
    }
}

/* The expert bias of a layer from the --init files (every rank reads its layers' whole). */
static void ebias_load(int layer, float *bias, void *ctx)
{
    init_src *s = ctx;
    int t = lib.ebias_tensor + layer, k = s->found_file[t];
    RT_CHECK(st_read_f32(&s->files[k], s->found[t], 0, lib.tensors[t].cols, bias) == 0,
             "%s: read failed: %s", s->fpath[k], strerror(errno));
}

/* --init: every rank reads its own pieces straight from the files that hold them (no
** communication; each rank opens the checkpoint's files and checks their headers alike). */
static void load_model(const char *arg)
{
    init_src s;
    st_check(&s, arg);
    for (int i = 0; i < lib.npieces; i++) {
        const lib_piece *pc = &lib.pieces[i];
        int t = lib.params[pc->param].tensor, k = s.found_file[t];
        const lib_tensor *ti = &lib.tensors[t];
        float *host = malloc((size_t)pc->rows * pc->cols * sizeof(float));
        RT_CHECK(host, "out of memory");
        for (int r = 0; r < pc->rows; r++)
            RT_CHECK(st_read_f32(&s.files[k], s.found[t],
                                 (long long)(pc->grow + r) * ti->cols + pc->gcol, pc->cols,
                                 host + (size_t)r * pc->cols) == 0,
                     "%s: read failed: %s", s.fpath[k], strerror(errno));
        piece_copy(pc, host, 1);
        free(host);
    }
    if (lib.ebias_tensor >= 0) lib_expert_bias_each(ebias_load, &s);
    init_close(&s);
    lib_master_commit();
}

static void ebias_zero(int layer, float *bias, void *ctx)
{
    (void)ctx;
    memset(bias, 0, (size_t)lib.tensors[lib.ebias_tensor + layer].cols * sizeof(float));
}

/* Initialisation: element (r, c) of tensor t depends on (seed, t's name, r*cols + c) only. */
static void init_model(unsigned long long seed)
{
    for (int i = 0; i < lib.npieces; i++) {
        const lib_piece *pc = &lib.pieces[i];
        const lib_param *lp = &lib.params[pc->param];
        const lib_tensor *ti = &lib.tensors[lp->tensor];
        float *base = lib_master(lp->p.buf) + lp->p.offset + (size_t)pc->lrow * lp->p.ld +
                      pc->lcol;
        if (ti->init == GPT_INIT_NORMAL) {
            rt_rng_normal(base, pc->rows, pc->cols, lp->p.ld, seed, ti->stream,
                          (uint64_t)pc->grow * ti->cols + pc->gcol, (uint64_t)ti->cols, 0.0f,
                          ti->std);
        } else {
            size_t n = (size_t)pc->rows * pc->cols;
            float *host = malloc(n * sizeof(float));
            RT_CHECK(host, "out of memory");
            for (size_t k = 0; k < n; k++) host[k] = ti->init == GPT_INIT_ONE ? 1.0f : 0.0f;
            piece_copy(pc, host, 1);
            free(host);
        }
    }
    if (lib.ebias_tensor >= 0) lib_expert_bias_each(ebias_zero, NULL);   /* Megatron: zeros */
    lib_master_commit();
}

/* Where save_model writes: the temporary file, its data start, the header's tensors. */
typedef struct {
    int fd;
    long long data0;
    const st_tensor *ts;
    const char *tmp;
} save_dst;

static void ebias_save(int layer, float *bias, void *ctx)
{
    const save_dst *d = ctx;
    int t = lib.ebias_tensor + layer;
    size_t bytes = (size_t)lib.tensors[t].cols * 4;
    RT_CHECK(pwrite(d->fd, bias, bytes, (off_t)(d->data0 + d->ts[t].begin)) == (ssize_t)bytes,
             "%s: write failed: %s", d->tmp, strerror(errno));
}

/*
** --save: rank 0 writes the header into PATH.tmp, sized to its final length; every owner of a
** piece (data-parallel rank 0; tp rank 0 for replicated tensors; never the tied copy) writes
** its rows at their offsets; after a barrier rank 0 syncs and renames. Written whole or not
** at all. The values are the f32 (main) parameters.
*/
/* The --save file's tensors (F32, the model's Hugging Face names) and header; *len its size. */
static st_tensor *save_tensors(unsigned char **h, size_t *len)
{
    st_tensor *ts = calloc((size_t)lib.ntensors, sizeof *ts);
    RT_CHECK(ts, "out of memory");
    for (int t = 0; t < lib.ntensors; t++) {
        const lib_tensor *ti = &lib.tensors[t];
        snprintf(ts[t].name, sizeof ts[t].name, "%s", ti->name);
        ts[t].dtype = ST_F32;
        ts[t].ndim = ti->ndim;
        ts[t].shape[0] = ti->ndim == 2 ? ti->rows : ti->cols;
        ts[t].shape[1] = ti->cols;
    }
    *h = st_header(ts, lib.ntensors, len);
    RT_CHECK(*h, "out of memory");
    return ts;
}

/* The size of the --save file. */
static long long save_bytes(void)
{
    unsigned char *h;
    size_t len;
    st_tensor *ts = save_tensors(&h, &len);
    long long total = (long long)len + ts[lib.ntensors - 1].end;
    free(h);
    free(ts);
    return total;
}

static void save_model(const char *path)
{
    lib_master_fetch();
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unsigned char *h;
    size_t len;
    st_tensor *ts = save_tensors(&h, &len);
    long long data0 = (long long)len, total = data0 + ts[lib.ntensors - 1].end;
    if (rt_rank() == 0) {
        ckpt_point();
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        RT_CHECK(fd >= 0, "%s: cannot create: %s", tmp, strerror(errno));
        RT_CHECK(pwrite(fd, h, len, 0) == (ssize_t)len && ftruncate(fd, total) == 0,
                 "%s: write failed: %s", tmp, strerror(errno));
        close(fd);
    }
    rt_barrier(NULL);
    if (lib.npieces > 0) {
        int fd = open(tmp, O_WRONLY);
        RT_CHECK(fd >= 0, "%s: cannot open: %s", tmp, strerror(errno));
        for (int i = 0; i < lib.npieces; i++) {
            const lib_piece *pc = &lib.pieces[i];
            /* every piece is written by exactly one rank: a data-parallel replica's first
            ** rank, tp rank 0 for tp-replicated tensors, never the tied copy */
            int rep = pc->flags & GPT_REPLICATED;
            int mine = (pc->flags & GPT_EXPERT_PIECE)
                ? gpt.edp_rank == 0 && (!rep || gpt.etp_rank == 0)
                : gpt.dp_rank == 0 && gpt.cp_rank == 0 && (!rep || gpt.tp_rank == 0);
            if ((pc->flags & GPT_TIED_COPY) || !mine) continue;
            int t = lib.params[pc->param].tensor;
            const lib_tensor *ti = &lib.tensors[t];
            float *host = malloc((size_t)pc->rows * pc->cols * sizeof(float));
            RT_CHECK(host, "out of memory");
            piece_copy(pc, host, 0);
            ckpt_point();
            for (int r = 0; r < pc->rows; r++) {
                off_t at = data0 + ts[t].begin + ((off_t)(pc->grow + r) * ti->cols + pc->gcol) * 4;
                size_t bytes = (size_t)pc->cols * 4;
                RT_CHECK(pwrite(fd, host + (size_t)r * pc->cols, bytes, at) == (ssize_t)bytes,
                         "%s: write failed: %s", tmp, strerror(errno));
            }
            free(host);
        }
        RT_CHECK(fsync(fd) == 0, "%s: fsync failed: %s", tmp, strerror(errno));
        close(fd);
    }
    /* the expert biases of a stage's layers: its first dense rank (tp, cp, dp 0) */
    if (lib.ebias_tensor >= 0 && gpt.tp_rank == 0 && gpt.cp_rank == 0 && gpt.dp_rank == 0) {
        save_dst dst = { open(tmp, O_WRONLY), data0, ts, tmp };
        RT_CHECK(dst.fd >= 0, "%s: cannot open: %s", tmp, strerror(errno));
        lib_expert_bias_each(ebias_save, &dst);
        RT_CHECK(fsync(dst.fd) == 0, "%s: fsync failed: %s", tmp, strerror(errno));
        close(dst.fd);
    }
    rt_barrier(NULL);
    if (rt_rank() == 0) {
        ckpt_point();
        int fd = open(tmp, O_RDONLY);
        RT_CHECK(fd >= 0 && fsync(fd) == 0, "%s: fsync failed: %s", tmp, strerror(errno));
        close(fd);
        RT_CHECK(rename(tmp, path) == 0, "cannot rename %s to %s: %s", tmp, path,
                 strerror(errno));
    }
    rt_barrier(NULL);
    free(h);
    free(ts);
}

/* -- Resume checkpoints (per rank: parameters, moments, step) ------------------------------- */

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
        ckpt_point();
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
** Write DIR/step_N.tmp/rank_R.bin on every rank (synced), then rank 0 renames the directory to
** DIR/step_N and syncs DIR: a checkpoint is complete exactly when its name has no suffix. A
** rank that cannot write removes its file and stops the job naming the reason; the newest
** complete checkpoint stays. An older step_N (a run started again without --resume) is moved
** aside and removed only after the new one is in place.
*/
static void ckpt_save(const lib_flags *f, int step, int updates, int skipped)
{
    char dir[4096], file[4200];
    ckpt_path(dir, sizeof dir, f->ckpt_dir, step, ".tmp", -1);
    if (rt_rank() == 0) {
        ckpt_point();
        RT_CHECK(mkdir(dir, 0755) == 0 || errno == EEXIST, "%s: cannot create: %s", dir,
                 strerror(errno));
    }
    rt_barrier(NULL);
    size_t n = lib_state_bytes();
    unsigned char *buf = malloc(n ? n : 1);
    RT_CHECK(buf, "out of memory for the checkpoint");
    lib_state_io(buf, 1);
    ckpt_header hd = { CKPT_MAGIC, P->world, (unsigned long long)gpt.pp_rank,
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
    ckpt_point();
    rt_barrier(NULL);
    if (rt_rank() == 0) {
        char final[4096], old[4200];
        struct stat st;
        ckpt_path(final, sizeof final, f->ckpt_dir, step, "", -1);
        snprintf(old, sizeof old, "%s.old", final);
        int aside = stat(final, &st) == 0 && rename(final, old) == 0;
        ckpt_point();
        RT_CHECK(rename(dir, final) == 0, "cannot rename %s to %s: %s", dir, final,
                 strerror(errno));
        int dfd = open(f->ckpt_dir, O_RDONLY);
        if (dfd >= 0) { fsync(dfd); close(dfd); }
        if (aside) ckpt_remove(old);
    }
    rt_barrier(NULL);
}

/* The newest complete checkpoint's step in DIR (-1 if none); rank 0 decides for everyone. */
static int ckpt_newest(const char *d)
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
    world_max(&best);
    return (int)best;
}

/* Rank 0 removes the incomplete checkpoints (step_N.tmp, step_N.old) a stopped run left. */
static void ckpt_clean(const char *d)
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

static ckpt_header ckpt_load(const lib_flags *f, int step)
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
             hd.world == (unsigned long long)P->world &&
             hd.stage == (unsigned long long)gpt.pp_rank && hd.nbytes == n,
             "%s: written by a different program (world %llu, stage %llu, %llu bytes)", file,
             hd.world, hd.stage, hd.nbytes);
    unsigned char *buf = malloc(n ? n : 1);
    RT_CHECK(buf && fread(buf, 1, n, fp) == n, "%s: truncated", file);
    fclose(fp);
    lib_state_io(buf, 0);
    free(buf);
    return hd;
}

/*
** On resume, the log keeps its lines up to the checkpoint's step (a run killed after its last
** checkpoint logged steps that the resumed run repeats), so that it reads as one run. Rank 0.
*/
static void log_truncate(const char *path, int upto)
{
    char tmp[4096], line[512];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *in = fopen(path, "r");
    if (!in) return;                                /* no log yet: nothing to keep */
    FILE *out = fopen(tmp, "w");
    RT_CHECK(out, "%s: cannot create: %s", tmp, strerror(errno));
    int step, keep = 1;
    while (fgets(line, sizeof line, in)) {
        if (sscanf(line, "{\"step\":%d", &step) == 1) keep = step <= upto;
        if (keep) fputs(line, out);
    }
    RT_CHECK(!ferror(in) && fclose(out) == 0, "%s: cannot rewrite: %s", path, strerror(errno));
    fclose(in);
    RT_CHECK(rename(tmp, path) == 0, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
}

/* -- Main ----------------------------------------------------------------------------------- */

/* A number for the JSON log: null when it is not finite (JSON has no NaN). */
static const char *json_num(char *buf, size_t cap, double x)
{
    if (isfinite(x)) snprintf(buf, cap, "%.9g", x);
    else snprintf(buf, cap, "null");
    return buf;
}

/*
** A step whose loss or gradient norm is not finite, beyond --skip-bad-steps: stop, naming the
** step, the lowest rank holding a gradient that is not finite and its first such tensor
** (Megatron's check_for_nan_in_loss_and_grad). The step changed nothing (gpt_adamw).
*/
static void bad_step_stop(const lib_flags *f, int step, const gpt_step_out *out)
{
    const char *name;
    long long index;
    float value;
    int found = lib_first_bad_grad(&name, &index, &value);
    long long key = found ? rt_world() - rt_rank() : 0;   /* the lowest rank wins */
    world_max(&key);
    if (rt_rank() == 0) {
        fprintf(stderr, "train: error: step %d: loss %g, gradient norm %g: not finite; "
                "stopping (%s); the parameters and optimizer state are those before step %d\n",
                step, out->loss, out->grad_norm, f->skip_bad_steps ?
                "more than --skip-bad-steps such steps" : "--skip-bad-steps N skips such steps",
                step);
        if (!key) fprintf(stderr, "train: every gradient is finite: the loss alone is not\n");
        fflush(stderr);
    }
    rt_barrier(NULL);
    if (key && key == rt_world() - rt_rank()) {
        fprintf(stderr, "train: rank %d (stage %d, tp %d, dp %d): the first gradient that is "
                "not finite is %s, element %lld of this rank's part: %g\n", rt_rank(),
                gpt.pp_rank, gpt.tp_rank, gpt.dp_rank, name, index, (double)value);
        fflush(stderr);
    }
    rt_barrier(NULL);
    rt_finalize();
    exit(1);
}

int gpt_main(int argc, char **argv, const gpt_program *prog)
{
    P = prog;
    D = &prog->dims;
    double t_start = rt_now();
    rt_init(&argc, &argv, P->world, P->layout);
    lib_flags f;
    lib_flags_parse(argc, argv, &f);
    if (f.help) {
        if (rt_rank() == 0) usage(stdout);
        rt_finalize();
        return 0;
    }
    faults_parse();
    rt_set_timeout(f.timeout);
    gpt.prog = prog;
    gpt.d = prog->dims;
    lib_groups_create(prog);
    if (f.show_groups) {
        lib_groups_print(prog);
        rt_finalize();
        return 0;
    }
    gpt.stage = prog->stages[gpt.pp_rank];
    lib_tensors_build(prog);
    lib_stage_setup();
    const gpt_stage *st = gpt.stage;
    if (!f.dump_samples) check_outputs(&f);
    signals_install(&f);

    int start = 0, updates = 0, skipped = 0;  /* steps done; optimizer updates; steps skipped */
    if (f.ckpt_dir && rt_rank() == 0) ckpt_clean(f.ckpt_dir);
    if (f.resume && (start = ckpt_newest(f.ckpt_dir)) >= 0) {
        ckpt_header hd = ckpt_load(&f, start);
        updates = (int)hd.updates;
        skipped = (int)hd.skipped;
        if (rt_rank() == 0) printf("resumed from %s/step_%08d\n", f.ckpt_dir, start);
        if (rt_rank() == 0 && f.log) log_truncate(f.log, start);
    } else {
        if (f.resume && rt_rank() == 0)
            printf("no complete checkpoint in %s: starting from the beginning\n", f.ckpt_dir);
        start = 0;
        if (f.init) load_model(f.init);
        else init_model(f.seed);
    }

    data_file data = { 0 };   /* every rank checks the file, so a bad one fails everywhere alike */
    int *inputs = NULL, *targets = NULL;
    char *prefix = NULL;
    if (f.steps > start) {
        if (f.ndata_path || lib_data_is_indexed(f.data, &prefix))
            data_open_indexed(&data, &f, prefix);
        else lib_tokens_open(&data, f.data, D->seq, P->vocab, world_max);
        if (f.dump_samples) {
            if (!data.mm) lib_fail_all(2, "--dump-samples needs a Megatron dataset");
            data_dump(&data, f.dump_samples);
        }
        inputs = malloc(sizeof(int) * (size_t)D->nmb * (size_t)D->N);
        targets = malloc(sizeof(int) * (size_t)D->nmb * (size_t)D->N);
        RT_CHECK(inputs && targets, "out of memory");
    }
    FILE *log = NULL;
    if (f.log && rt_rank() == 0) {
        log = fopen(f.log, start > 0 ? "a" : "w");
        RT_CHECK(log, "%s: cannot open: %s", f.log, strerror(errno));
    }
    const char *stopped = NULL;     /* why the run stops before --steps */
    int s;
    for (s = start; s < f.steps && !stopped; s++) {
        double t0 = rt_now();
        if (fault_now(FAULT_SIGNAL, s + 1)) raise(first_exit_signal(&f));
        lib.fault = (fault_now(FAULT_NAN_GRAD, s + 1) ? LIB_FAULT_NAN_GRAD : 0) |
                    (fault_now(FAULT_INF_LOSS, s + 1) ? LIB_FAULT_INF_LOSS : 0);
        if (st->needs_inputs || st->needs_targets)
            data_batch(&data, s, gpt.dp_rank, inputs, targets);
        int late = f.exit_minutes > 0 && rt_now() - t_start > 60.0 * f.exit_minutes;
        /* the optimizer's step: updates made so far (a skipped step does not count) */
        gpt_step_in in = { .step = updates, .lr = (float)lib_lr_at(&f, P->gbs, updates),
                           .beta1 = (float)f.beta1, .beta2 = (float)f.beta2,
                           .eps = (float)f.eps, .wd = (float)f.wd, .clip = (float)f.clip,
                           .inputs = st->needs_inputs ? inputs : NULL,
                           .targets = st->needs_targets ? targets : NULL,
                           .stop = got_signal || late };
        gpt_step_out out;
        st->step(&in, &out);
        rt_sync();
        lib.fault = 0;
        if (out.skipped && ++skipped > f.skip_bad_steps) bad_step_stop(&f, s + 1, &out);
        updates += !out.skipped;
        double ms = (rt_now() - t0) * 1e3, tok_s = (double)P->tokens_per_step / (ms / 1e3);
        if (rt_rank() == 0) {
            char aux[64] = "", auxj[64] = "", skip[96] = "", l[32], g[32], a[32];
            if (D->moe) {
                snprintf(aux, sizeof aux, " | aux %.6f", out.aux_loss);
                snprintf(auxj, sizeof auxj, ",\"aux_loss\":%s",
                         json_num(a, sizeof a, out.aux_loss));
            }
            if (out.skipped)
                snprintf(skip, sizeof skip, " | skipped (%d of --skip-bad-steps %d): nothing "
                         "updated", skipped, f.skip_bad_steps);
            if (!f.quiet)
                printf("step %5d/%d | loss %.6f%s | lr %.4e | norm %.4f | %8.1f ms | "
                       "%9.0f tok/s%s\n", s + 1, f.steps, out.loss, aux, (double)in.lr,
                       out.grad_norm, ms, tok_s, skip);
            if (out.skipped && f.quiet)
                printf("step %d/%d: loss %g, gradient norm %g: not finite%s\n", s + 1, f.steps,
                       out.loss, out.grad_norm, skip);
            if (log) {
                fprintf(log, "{\"step\":%d,\"loss\":%s%s,\"lr\":%.9g,\"grad_norm\":%s,"
                        "\"ms\":%.3f,\"tok_s\":%.1f%s}\n", s + 1, json_num(l, sizeof l, out.loss),
                        auxj, (double)in.lr, json_num(g, sizeof g, out.grad_norm), ms, tok_s,
                        out.skipped ? ",\"skipped\":true" : "");
                fflush(log);
            }
            fflush(stdout);
        }
        int saved = f.ckpt_every && (s + 1) % f.ckpt_every == 0;
        if (saved) ckpt_save(&f, s + 1, updates, skipped);
        if (s + 1 < f.steps && out.stop)
            stopped = got_signal ? lib_signal_name(got_signal) : late ?
                      "--exit-duration-in-mins" : "another rank's signal or time limit";
        else if (s + 1 < f.steps && f.exit_interval && (s + 1) % f.exit_interval == 0)
            stopped = "--exit-interval";
        if (stopped && f.ckpt_dir && !saved) ckpt_save(&f, s + 1, updates, skipped);
    }
    if (log) fclose(log);
    int rc = 0;
    if (stopped && f.ckpt_dir) {
        if (rt_rank() == 0)
            printf("stopped by %s after step %d of %d: saved %s/step_%08d; continue with "
                   "--resume\n", stopped, s, f.steps, f.ckpt_dir, s);
    } else if (stopped) {                   /* a signal without --ckpt-dir */
        if (rt_rank() == 0)
            fprintf(stderr, "train: stopped by %s after step %d of %d: no --ckpt-dir, so no "
                    "checkpoint to resume from%s\n", stopped, s, f.steps,
                    f.save ? "; writing --save" : "");
        if (f.save) save_model(f.save);
        rc = 1;
    } else if (f.save) save_model(f.save);
    if (nfaults)       /* tests pick their kill_ckpt points from this */
        fprintf(stderr, "train: rank %d: GPT_FAULT: %d points of checkpoint writing passed\n",
                rt_rank(), ckpt_points);
    free(inputs);
    free(targets);
    lib_data_free(data.mm);
    free(prefix);
    rt_finalize();
    return rc;
}
