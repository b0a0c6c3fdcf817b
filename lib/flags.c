/*
** flags.c: the training program's command line (flags.h), read and documented from the one
** table LIB_FLAGS: the parser (lib_flags_parse), the usage (train --help) and README.md's
** table of training flags (lib_flags_markdown, `make readme-flags`). Every error names the
** flag and what it expects. Calls only fail.c (tests/fuzz links it with tests/fuzz/libstub.c).
*/
#define _GNU_SOURCE
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "flags.h"
#include "fail.h"     // defines: lib_fail_all

/* -- The table -------------------------------------------------------------------------------- */

/* Each row's field has its kind's type (LIB_FLAG_KINDS, flags.h). */
#define KIND_TYPE(kind, type) typedef type kind_type_##kind;
LIB_FLAG_KINDS(KIND_TYPE)
#define CHECK_FIELD(id, name, meta, kind, field, def, help) \
    _Static_assert(_Generic(((lib_flags *)0)->field, kind_type_##kind: 1, default: 0), \
                   "--" name ": the field " #field " is not of kind " #kind);
LIB_FLAGS(CHECK_FIELD)

typedef lib_flag_def flag_def;

#define FLAG_DEF(id, name, meta, kind, field, def, help) \
    { name, meta, KIND_##kind, offsetof(lib_flags, field), def, help },
static const flag_def flag_defs[] = { LIB_FLAGS(FLAG_DEF) };

#define STYLE_NAME(id, name) name,
static const char *const lr_style_names[] = { LR_STYLES(STYLE_NAME) NULL };
static const char *const wsd_style_names[] = { WSD_STYLES(STYLE_NAME) NULL };

/* The signals --exit-signal accepts (Slurm's --signal and preemption send one of these). */
static const struct { int sig; const char *name; } exit_signals[] = {
    { SIGTERM, "SIGTERM" }, { SIGUSR1, "SIGUSR1" }, { SIGUSR2, "SIGUSR2" },
    { SIGINT, "SIGINT" }, { SIGHUP, "SIGHUP" },
};
#define NSIGNALS (int)(sizeof exit_signals / sizeof exit_signals[0])

/* "SIGTERM", "SIGUSR1", ... for the signals --exit-signal accepts; NULL for others. */
const char *lib_signal_name(int sig)
{
    for (int k = 0; k < NSIGNALS; k++)
        if (exit_signals[k].sig == sig) return exit_signals[k].name;
    return NULL;
}

/* -- Reading values ----------------------------------------------------------------------- */

static void parse_num(const char *flag, const char *v, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(d))
        lib_fail_all(2, "%s expects a number, got '%s'", flag, v);
    *out = d;
}

static void parse_int(const char *flag, const char *v, int *out)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < 0 || n > 1000000000)
        lib_fail_all(2, "%s expects a non-negative integer, got '%s'", flag, v);
    *out = (int)n;
}

/* An unsigned decimal (digits only) up to 'max'; 'expects' says what, for the message. */
static void parse_unsigned(const char *flag, const char *v, unsigned long long max,
                           const char *expects, unsigned long long *out)
{
    char *end;
    errno = 0;
    *out = strtoull(v, &end, 10);
    if (errno || *v < '0' || *v > '9' || *end || *out > max)
        lib_fail_all(2, "%s expects %s, got '%s'", flag, expects, v);
}

/* "a, b, c or d" from the NULL-terminated 'names' into buf; quote: each in `backquotes`. */
static const char *name_list(char *buf, size_t cap, const char *const *names, int quote)
{
    const char *q = quote ? "`" : "";
    buf[0] = 0;
    for (int k = 0; names[k]; k++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s%s%s",
                 k == 0 ? "" : names[k + 1] ? ", " : " or ", q, names[k], q);
    return buf;
}

/* The index of 'v' in the NULL-terminated 'names', or a usage error listing them. */
static void parse_style(const char *flag, const char *v, const char *const *names, int *out)
{
    for (int k = 0; names[k]; k++)
        if (!strcmp(v, names[k])) {
            *out = k;
            return;
        }
    char list[160];
    lib_fail_all(2, "%s must be %s, got '%s'", flag, name_list(list, sizeof list, names, 0), v);
}

/* --exit-signal: "none", or names separated by commas, with or without "SIG" (SIGTERM,USR1). */
static void parse_signals(const char *flag, const char *v, int *mask)
{
    *mask = 0;
    if (!strcmp(v, "none")) return;
    const char *p = v;
    while (1) {
        size_t n = strcspn(p, ",");
        int found = 0;
        for (int k = 0; k < NSIGNALS && !found; k++) {
            const char *name = exit_signals[k].name;
            if ((n == strlen(name) && !strncmp(p, name, n)) ||
                (n == strlen(name) - 3 && !strncmp(p, name + 3, n)))
                *mask |= 1 << exit_signals[k].sig, found = 1;
        }
        if (!found || n == 0)
            lib_fail_all(2, "%s expects none or signal names from SIGTERM, SIGUSR1, SIGUSR2, "
                         "SIGINT, SIGHUP separated by commas, got '%s'", flag, v);
        if (!p[n]) return;
        p += n + 1;
    }
}

/* Value 'v' of the flag 'flag' (as written: "--lr") of definition d into its field of f. */
static void set_value(const flag_def *d, const char *flag, const char *v, void *rec)
{
    void *field = (char *)rec + d->field;
    switch (d->kind) {
    case KIND_STRING: *(const char **)field = v; break;
    case KIND_INT: parse_int(flag, v, field); break;
    case KIND_NUM: parse_num(flag, v, field); break;
    case KIND_U64: parse_unsigned(flag, v, ~0ull, "a non-negative integer", field); break;
    case KIND_U32: parse_unsigned(flag, v, 0xffffffffull, "an integer in [0, 2^32)", field); break;
    case KIND_LR_STYLE: parse_style(flag, v, lr_style_names, field); break;
    case KIND_WSD_STYLE: parse_style(flag, v, wsd_style_names, field); break;
    case KIND_SIGNALS: parse_signals(flag, v, field); break;
    default: *(int *)field = 1; break;          /* FLAG, HELP */
    }
}

/* The definition of "--NAME" (a word of the command line), or NULL. */
#define FLAG_ALIAS(alias, id) { alias, LIB_FLAG_##id },
static const struct { const char *name; int flag; } flag_aliases[] = {
    LIB_FLAG_ALIASES(FLAG_ALIAS)
};
#define NALIASES (int)(sizeof flag_aliases / sizeof flag_aliases[0])

static const flag_def *flag_named(const char *word, int *index)
{
    for (int k = 0; k < LIB_NFLAGS; k++)
        if (!strcmp(word + 2, flag_defs[k].name)) {
            *index = k;
            return &flag_defs[k];
        }
    for (int a = 0; a < NALIASES; a++)          /* Megatron's spelling: the flag itself */
        if (!strcmp(word + 2, flag_aliases[a].name)) {
            *index = flag_aliases[a].flag;
            return &flag_defs[*index];
        }
    return NULL;
}

/* ", also Megatron's `--train-iters`" for flag k's aliases, appended to 'buf' (its help). */
static void alias_note(char *buf, size_t cap, int k, int markdown)
{
    const char *q = markdown ? "`" : "";
    int n = 0;
    for (int a = 0; a < NALIASES; a++) {
        if (flag_aliases[a].flag != k) continue;
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, "%s%s--%s%s", n++ ? ", " : "; also Megatron's ", q,
                 flag_aliases[a].name, q);
    }
}

/* The value after flag argv[*i] (advancing *i), or a usage error naming the flag. */
static const char *flag_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) lib_fail_all(2, "%s needs a value (try --help)", argv[*i]);
    return argv[++*i];
}

/* -- Parsing ---------------------------------------------------------------------------------- */

/* The schedule's flags make sense together (Megatron's scheduler asserts the same bounds, except
** that --decay-steps may equal --warmup: then the warm-up ends at min-lr's step). */
static void check_lr_flags(const lib_flags *f)
{
    if (f->min_lr < 0 || f->lr < f->min_lr)
        lib_fail_all(2, "the learning rates must satisfy 0 <= --min-lr (%g) <= --lr (%g)",
                     f->min_lr, f->lr);
    if (f->lr_init > f->lr)
        lib_fail_all(2, "--lr-warmup-init (%g) must be <= --lr (%g)", f->lr_init, f->lr);
    if (f->decay_steps < f->warmup)
        lib_fail_all(2, "--decay-steps (%d) must be >= --warmup (%d)", f->decay_steps, f->warmup);
    if (f->steps > 0 && f->decay_steps < 1)
        lib_fail_all(2, "--decay-steps must be >= 1 (the step count after which the rate is "
                     "min-lr)");
    if (f->lr_style != LR_WSD && f->wsd_flag)
        lib_fail_all(2, "%s needs --lr-decay-style WSD", f->wsd_flag);
    if (f->lr_style == LR_WSD && !f->given[LIB_FLAG_LR_WSD_DECAY_ITERS])
        lib_fail_all(2, "--lr-decay-style WSD needs --lr-wsd-decay-iters N (the number of "
                     "steps of its final decay)");
    if (f->lr_style == LR_WSD && f->wsd_iters > f->decay_steps)
        lib_fail_all(2, "--lr-wsd-decay-iters (%d) must be <= --decay-steps (%d)", f->wsd_iters,
                     f->decay_steps);
}

/* 'x' as the shortest %g text that reads back as it ("0.999999999999", not "1"), into buf. */
static const char *num_text(char *buf, size_t cap, double x)
{
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, cap, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) break;
    }
    return buf;
}

/* The flag 'name' (value x) becomes a 32-bit float (gpt_step_in): it must be one, not inf. */
/* Each given flag as the command line spelled it (Megatron's spelling or ours), for errors. */
static const char *spelled[LIB_NFLAGS];

static const char *as_given(int k)
{
    static char canon[LIB_NFLAGS][48];
    if (spelled[k]) return spelled[k];
    snprintf(canon[k], sizeof canon[k], "--%s", flag_defs[k].name);
    return canon[k];
}

static void check_float(int k, double x)
{
    char t[32];
    if (fabs(x) > FLT_MAX)
        lib_fail_all(2, "%s must be at most %g in magnitude (the optimizer's numbers are 32-bit "
                     "floats), got %s", as_given(k), FLT_MAX, num_text(t, sizeof t, x));
}

/* " (0 as the optimizer's 32-bit float)" when 'x' rounds to another float 'xf', else "". */
static const char *as_float(char *buf, size_t cap, double x, float xf)
{
    if ((double)xf == x) return "";
    snprintf(buf, cap, " (%g as the optimizer's 32-bit float)", (double)xf);
    return buf;
}

/* The numbers the optimizer uses (as floats: train.c's gpt_step_in) and the exit limits are in
** their ranges, checked on the values they become. */
static void check_number_flags(const lib_flags *f)
{
    char t[32], why[64];
    check_float(LIB_FLAG_LR, f->lr);
    check_float(LIB_FLAG_MIN_LR, f->min_lr);
    check_float(LIB_FLAG_LR_WARMUP_INIT, f->lr_init);
    const int beta[2] = { LIB_FLAG_BETA1, LIB_FLAG_BETA2 };
    double bv[2] = { f->beta1, f->beta2 };
    for (int k = 0; k < 2; k++) {
        double x = bv[k];
        int below1 = x >= 0 && x < 1;           /* then the float is defined, maybe 1 */
        if (!below1 || (float)x >= 1)
            lib_fail_all(2, "%s must be in [0, 1), got %s%s", as_given(beta[k]),
                         num_text(t, sizeof t, x),
                         below1 ? as_float(why, sizeof why, x, (float)x) : "");
    }
    check_float(LIB_FLAG_EPS, f->eps);
    if (!((float)f->eps > 0))
        lib_fail_all(2, "%s must be > 0, got %s%s", as_given(LIB_FLAG_EPS),
                     num_text(t, sizeof t, f->eps),
                     as_float(why, sizeof why, f->eps, (float)f->eps));
    check_float(LIB_FLAG_WD, f->wd);
    if (f->wd < 0)
        lib_fail_all(2, "%s must be >= 0, got %s", as_given(LIB_FLAG_WD),
                     num_text(t, sizeof t, f->wd));
    check_float(LIB_FLAG_CLIP, f->clip);
    if (f->clip < 0)
        lib_fail_all(2, "%s must be >= 0 (0: no clipping), got %s", as_given(LIB_FLAG_CLIP),
                     num_text(t, sizeof t, f->clip));
    if (f->log_interval < 1)
        lib_fail_all(2, "%s must be >= 1, got %d", as_given(LIB_FLAG_LOG_INTERVAL),
                     f->log_interval);
    if (f->given[LIB_FLAG_PEAK_TFLOPS] && !(f->peak_tflops > 0 && f->peak_tflops < 1e9))
        lib_fail_all(2, "%s must be a device's peak in TFLOP/s, > 0 and below 1e9, got %s",
                     as_given(LIB_FLAG_PEAK_TFLOPS), num_text(t, sizeof t, f->peak_tflops));
    if (f->exit_grace < 0 || f->exit_minutes < 0)
        lib_fail_all(2, "--exit-grace and --exit-duration-in-mins must be >= 0");
    if (f->exit_grace > UINT_MAX)       /* faults.c: alarm(ceil(S)) */
        lib_fail_all(2, "--exit-grace must be at most %u seconds, got %s", UINT_MAX,
                     num_text(t, sizeof t, f->exit_grace));
}

/*
** --save-shard-size: bytes, or a number with a unit as Hugging Face's max_shard_size ("5GB":
** 5e9 bytes; "500MiB"); the bytes rounded down, at least 1.
*/
static long long parse_size(const char *flag, const char *v)
{
    static const struct { const char *unit; double bytes; } units[] = {
        { "KB", 1e3 }, { "MB", 1e6 }, { "GB", 1e9 }, { "TB", 1e12 },
        { "KiB", 1024.0 }, { "MiB", 1048576.0 }, { "GiB", 1073741824.0 },
        { "TiB", 1099511627776.0 }, { "B", 1 }, { "", 1 },
    };
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    double mult = 0;
    while (*end == ' ') end++;
    for (size_t k = 0; k < sizeof units / sizeof *units && !mult; k++)
        if (!strcasecmp(end, units[k].unit)) mult = units[k].bytes;
    double bytes = floor(x * mult);
    if (errno || end == v || !mult || !(bytes >= 1) || bytes > 9e18 || !(v[0] >= '0' &&
        v[0] <= '9'))
        lib_fail_all(2, "%s expects a size of at least 1 byte: bytes, or a number with KB, MB, "
                     "GB, TB (powers of 1000) or KiB, MiB, GiB, TiB, as Hugging Face's "
                     "max_shard_size (\"5GB\"); got '%s'", flag, v);
    return (long long)bytes;
}

/*
** Fill 'f' from argv[1..argc-1]: first every flag's default (LIB_FLAGS), then the command line
** in order (a flag given twice: the last counts), then the derived defaults (--min-lr,
** --decay-steps). -h or --help sets f->help and stops there. A bad flag, a bad value or a
** combination that makes no sense is a usage error (lib_fail_all(2, ...), naming the flag).
** f->data_path points into argv.
*/
void lib_flags_parse(int argc, char **argv, lib_flags *f)
{
    memset(f, 0, sizeof *f);
    memset(spelled, 0, sizeof spelled);
    for (int k = 0; k < LIB_NFLAGS; k++) {
        const flag_def *d = &flag_defs[k];
        if (d->def && d->def[0] != '=') {
            char flag[64];
            snprintf(flag, sizeof flag, "--%s", d->name);
            set_value(d, flag, d->def, f);
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            f->help = 1;
            return;
        }
        if (strncmp(a, "--", 2))
            lib_fail_all(2, "unexpected argument '%s' (every flag starts with --; try --help)", a);
        int k;
        const flag_def *d = flag_named(a, &k);
        if (!d) lib_fail_all(2, "unknown flag '%s' (try --help)", a);
        spelled[k] = a;
        if (d->kind == KIND_FLAG || d->kind == KIND_HELP) {
            set_value(d, a, NULL, f);
        } else if (d->kind == KIND_WORDS) {
            f->data_path = argv + i + 1;        /* its words: up to the next flag */
            f->ndata_path = 0;                  /* given twice: the last one counts */
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) i++, f->ndata_path++;
            if (!f->ndata_path) lib_fail_all(2, "%s needs [WEIGHT] PREFIX ...", a);
        } else {
            set_value(d, a, flag_value(argc, argv, &i), f);
        }
        f->given[k] = 1;
        if ((k == LIB_FLAG_LR_WSD_DECAY_STYLE || k == LIB_FLAG_LR_WSD_DECAY_ITERS) &&
            !f->wsd_flag)
            f->wsd_flag = a;
    }
    if (!f->given[LIB_FLAG_MIN_LR]) f->min_lr = 0.1 * f->lr;
    if (!f->given[LIB_FLAG_DECAY_STEPS])
        f->decay_steps = f->steps > f->warmup ? f->steps : f->warmup;
    check_lr_flags(f);
    if (f->steps > 0 && !f->data && !f->ndata_path && !f->show_groups)
        lib_fail_all(2, "--data FILE is needed to train (or --steps 0)");
    if (f->data && f->ndata_path) lib_fail_all(2, "--data and --data-path exclude each other");
    if ((f->ckpt_every || f->resume) && !f->ckpt_dir)
        lib_fail_all(2, "--ckpt-every and --resume need --ckpt-dir DIR");
    struct stat from_st, to_st;
    if (f->reshard_from && f->ckpt_dir && stat(f->reshard_from, &from_st) == 0 &&
        stat(f->ckpt_dir, &to_st) == 0 && from_st.st_dev == to_st.st_dev &&
        from_st.st_ino == to_st.st_ino)
        lib_fail_all(2, "--reshard-from %s is --ckpt-dir: this layout's checkpoints go to a "
                     "directory of their own (give --ckpt-dir another one)", f->reshard_from);
    if (f->reshard_from && f->init)
        lib_fail_all(2, "--reshard-from and --init exclude each other: a run starts from one "
                     "of them");
    check_number_flags(f);
    if (strcmp(f->save_dtype, "f32") && strcmp(f->save_dtype, "bf16"))
        lib_fail_all(2, "%s must be f32 or bf16, got '%s'", as_given(LIB_FLAG_SAVE_DTYPE),
                     f->save_dtype);
    f->save_bf16 = !strcmp(f->save_dtype, "bf16");
    static char save_path[4096];    /* --save DIR/ is DIR: DIR.tmp goes beside it, not in it */
    size_t n = f->save ? strlen(f->save) : 0;
    while (n > 1 && f->save[n - 1] == '/') n--;
    if (f->save && f->save[n] && n < sizeof save_path) {
        snprintf(save_path, sizeof save_path, "%.*s", (int)n, f->save);
        f->save = save_path;
    }
    f->save_shard_bytes = parse_size(as_given(LIB_FLAG_SAVE_SHARD_SIZE), f->save_shard_size);
    if (!f->save && (f->given[LIB_FLAG_SAVE_DTYPE] || f->given[LIB_FLAG_SAVE_SHARD_SIZE] ||
                     f->tokenizer))
        lib_fail_all(2, "%s is about --save, which is not given",
                     as_given(f->given[LIB_FLAG_SAVE_DTYPE] ? LIB_FLAG_SAVE_DTYPE :
                              f->given[LIB_FLAG_SAVE_SHARD_SIZE] ? LIB_FLAG_SAVE_SHARD_SIZE :
                              LIB_FLAG_TOKENIZER));
    if (f->eval_interval && !f->split)
        lib_fail_all(2, "--eval-interval evaluates on the valid split: it needs --split A,B,C "
                     "(e.g. --split 969,30,1) and a Megatron dataset");
    if (f->given[LIB_FLAG_EVAL_INTERVAL] && f->eval_interval < 1)
        lib_fail_all(2, "--eval-interval must be >= 1, got %d", f->eval_interval);
    if (f->eval_iters < 1)
        lib_fail_all(2, "--eval-iters must be >= 1 (the global batches of one evaluation), "
                     "got %d", f->eval_iters);
    if (f->given[LIB_FLAG_DUMP_SPLIT] && !f->dump_samples)
        lib_fail_all(2, "--dump-split names the split --dump-samples K prints: give both");
    if ((f->exit_minutes > 0 || f->exit_interval) && !f->ckpt_dir)
        lib_fail_all(2, "--exit-duration-in-mins and --exit-interval save a checkpoint to "
                     "resume from: they need --ckpt-dir DIR");
}

/*
** Another program's flags (generate: its own table of the same kinds, without aliases or
** WORDS): the defaults of defs[0..n), then argv[1..argc-1] into the record 'rec' (the fields
** at the rows' offsets), given[k] set for each flag on the command line. Returns 1 on -h or
** --help (parsing stops there), else 0. Errors as lib_flags_parse's (lib_fail_all).
*/
int lib_flags_table(int argc, char **argv, const lib_flag_def *defs, int n, void *rec,
                    unsigned char *given)
{
    for (int k = 0; k < n; k++)
        if (defs[k].def && defs[k].def[0] != '=') {
            char flag[64];
            snprintf(flag, sizeof flag, "--%s", defs[k].name);
            set_value(&defs[k], flag, defs[k].def, rec);
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        if (strncmp(a, "--", 2))
            lib_fail_all(2, "unexpected argument '%s' (every flag starts with --; try --help)", a);
        int k = 0;
        while (k < n && strcmp(a + 2, defs[k].name)) k++;
        if (k == n) lib_fail_all(2, "unknown flag '%s' (try --help)", a);
        RT_CHECK(defs[k].kind != KIND_WORDS, "--%s: WORDS flags are train's only", defs[k].name);
        if (defs[k].kind == KIND_FLAG || defs[k].kind == KIND_HELP)
            set_value(&defs[k], a, NULL, rec);
        else
            set_value(&defs[k], a, flag_value(argc, argv, &i), rec);
        given[k] = 1;
    }
    return 0;
}

/* -- Printing the table ---------------------------------------------------------------------- */

/* A flag's help with its kind's choices for "%s", `code` kept (markdown) or unquoted. */
static const char *help_text(char *buf, size_t cap, const flag_def *d, int markdown)
{
    char choices[160] = "", *out = buf;
    const char *signals[NSIGNALS + 1];
    for (int k = 0; k < NSIGNALS; k++) signals[k] = exit_signals[k].name;
    signals[NSIGNALS] = NULL;
    if (d->kind == KIND_LR_STYLE) name_list(choices, sizeof choices, lr_style_names, 1);
    if (d->kind == KIND_WSD_STYLE) name_list(choices, sizeof choices, wsd_style_names, 1);
    if (d->kind == KIND_SIGNALS) name_list(choices, sizeof choices, signals, 1);
    for (const char *h = d->help; *h && out + 1 < buf + cap; h++) {
        if (h[0] == '%' && h[1] == 's') {
            for (const char *c = choices; *c && out + 1 < buf + cap; c++)
                if (markdown || *c != '`') *out++ = *c;
            h++;
        } else if (markdown || *h != '`') {
            *out++ = *h;
        }
    }
    *out = 0;
    return buf;
}

/* "--name META" into buf. */
static const char *flag_text(char *buf, size_t cap, const flag_def *d)
{
    snprintf(buf, cap, "--%s%s%s", d->name, d->meta[0] ? " " : "", d->meta);
    return buf;
}

enum { USAGE_LEFT = 26, USAGE_WIDTH = 92 };   /* the help's column, the lines' length */

static void usage_rows(FILE *out, const flag_def *defs, int count, int aliases);

/*
** The usage, for train --help: "usage: train [flags]   (RUN_HINT)", then each flag of
** LIB_FLAGS in order, "--name META" and its help (with its default) folded into a column.
*/
void lib_flags_usage(FILE *out, const char *run_hint)
{
    fprintf(out, "usage: train [flags]   (%s)\n", run_hint);
    usage_rows(out, flag_defs, LIB_NFLAGS, 1);
}

/* Another program's table, after its first line 'usage' (lib_flags_table). */
void lib_flags_table_usage(FILE *out, const char *usage, const lib_flag_def *defs, int n)
{
    fprintf(out, "%s\n", usage);
    usage_rows(out, defs, n, 0);
}

/* Each flag of defs[0..count) in order, "--name META" and its help (with its default and, for
** LIB_FLAGS, its Megatron aliases) folded into a column. */
static void usage_rows(FILE *out, const flag_def *defs, int count, int aliases)
{
    for (int k = 0; k < count; k++) {
        const flag_def *d = &defs[k];
        char left[64], help[1024];
        flag_text(left, sizeof left, d);
        help_text(help, sizeof help, d, 0);
        if (aliases) alias_note(help, sizeof help, k, 0);
        if (d->def)             /* '\x1f': a space the folding keeps */
            snprintf(help + strlen(help), sizeof help - strlen(help), " (default\x1f%s)",
                     d->def + (d->def[0] == '='));
        int col = fprintf(out, "  %s", left);
        if (col + 2 > USAGE_LEFT) {
            fputc('\n', out);
            col = 0;
        }
        for (const char *w = help; *w; ) {      /* word by word, folded at USAGE_WIDTH */
            size_t n = strcspn(w, " ");
            int first = col <= USAGE_LEFT;
            if (!first && col + 1 + (int)n > USAGE_WIDTH) {
                fputc('\n', out);
                col = 0;
                first = 1;
            }
            if (first) col += fprintf(out, "%*s", USAGE_LEFT - col, "");
            else col += fprintf(out, " ");
            for (size_t c = 0; c < n; c++) fputc(w[c] == '\x1f' ? ' ' : w[c], out);
            col += (int)n;
            w += n + (w[n] == ' ');
        }
        fputc('\n', out);
    }
}

/*
** README.md's table of training flags (between its train-flags markers; `make readme-flags`
** writes it there, tests/train checks it): a markdown table, one row per flag.
*/
void lib_flags_markdown(FILE *out)
{
    fprintf(out, "| flag | default | meaning |\n|---|---|---|\n");
    for (int k = 0; k < LIB_NFLAGS; k++) {
        const flag_def *d = &flag_defs[k];
        char left[64], help[1024];
        fprintf(out, "| `%s` | ", flag_text(left, sizeof left, d));
        if (d->def) fprintf(out, "`%s`", d->def + (d->def[0] == '='));
        help_text(help, sizeof help, d, 1);
        alias_note(help, sizeof help, k, 1);
        fprintf(out, " | %s |\n", help);
    }
}
