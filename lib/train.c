/*
** train.c: main of every generated training program (gpt_main): the flags, the runtime, the
** rank's groups and stage, then the step loop and its log (stdout, --log). What it calls does
** the work: the stage (generated tables + stage.c) the model's, data.c the batches, lr.c the
** rate, weights.c and ckpt.c the files, faults.c what goes wrong. The library's top module.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"     // defines: lib_ckpt_lock, lib_ckpt_save, lib_ckpt_load, lib_ckpt_newest, ...
#include "data.h"     // defines: lib_tokens, lib_tokens_open_flags, lib_tokens_batch, ...
#include "fail.h"     // defines: lib_fail_all
#include "faults.h"   // defines: lib_faults_*, lib_signals_install, lib_check_outputs, ...
#include "flags.h"    // defines: lib_flags, lib_flags_parse, lib_flags_usage, lib_signal_name
#include "lr.h"       // defines: lib_lr
#include "stage.h"    // defines: lib, lib_stage_setup, lib_groups_create, ...
#include "tboard.h"   // defines: lib_tb_open, lib_tb_scalars, lib_append_whole
#include "tensors.h"  // defines: lib_tensors_build
#include "weights.h"  // defines: lib_weights_init, lib_weights_load, lib_weights_save, ...
#include "world.h"    // defines: lib_world_allreduce_max

/* -- The log --------------------------------------------------------------------------------- */

/* A number for the JSON log in printf's 'fmt': null when it is not finite (JSON has no NaN). */
static const char *json_fmt(char *buf, size_t cap, const char *fmt, double x)
{
    if (isfinite(x)) snprintf(buf, cap, fmt, x);
    else snprintf(buf, cap, "null");
    return buf;
}

static const char *json_num(char *buf, size_t cap, double x)
{
    return json_fmt(buf, cap, "%.9g", x);
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
    RT_CHECK(!ferror(in) && !ferror(out) && fclose(out) == 0, "%s: cannot rewrite: %s", path,
             strerror(errno));
    fclose(in);
    RT_CHECK(rename(tmp, path) == 0, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
}

/* The process's resident host memory in bytes (/proc/self/statm), 0 where it cannot be read. */
static double host_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    int ok = f && fscanf(f, "%ld %ld", &pages, &resident) == 2;
    if (f) fclose(f);
    return ok ? (double)resident * (double)sysconf(_SC_PAGESIZE) : 0;
}

/* Seconds since the epoch, for the event file's wall_time. */
static double wall_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec + now.tv_nsec * 1e-9;
}

/*
** Step 'step' (1-based) of f->steps on rank 0: its line on stdout (unless --quiet or
** --log-interval; a skipped step is reported even then), its JSON object in the --log file
** 'log' and its scalars in the event file 'tb' (-1: none). 'skipped': the steps skipped so far.
** Returns 0, or the errno of a failed write, *tb_failed saying whether the event file's.
*/
static int log_step(int log, int tb, const lib_flags *f, int step, const gpt_step_in *in,
                    const gpt_step_out *out, double ms, double comm_ms, int skipped,
                    int *tb_failed)
{
    double tok_s = (double)gpt.prog->tokens_per_step / (ms / 1e3);
    /* rank 0's memory: device bytes held now and at most (the runtime's count: the plan), and
    ** the process's resident host memory */
    size_t live, peak;
    rt_mem_stats(&live, &peak);
    double mib = 1024.0 * 1024.0, live_mib = live / mib, peak_mib = peak / mib;
    double rss_mib = host_rss_bytes() / mib;
    /* the model's FLOPs per second and device, and their share of the device's peak */
    double tflops = gpt.prog->model_flops / (ms / 1e3) / gpt.prog->world / 1e12;
    char aux[64] = "", auxj[64] = "", skip[96] = "", l[32], g[32], a[32], r[32], t[32];
    char fl[32], mfu[48] = "", mfuj[48] = "", mu[32], line[768];
    if (f->peak_tflops > 0) {
        snprintf(mfu, sizeof mfu, " | MFU %5.1f%%", 100 * tflops / f->peak_tflops);
        snprintf(mfuj, sizeof mfuj, ",\"mfu\":%s",
                 json_fmt(mu, sizeof mu, "%.4f", tflops / f->peak_tflops));
    }
    if (gpt.prog->dims.moe) {
        snprintf(aux, sizeof aux, " | aux %.6f", out->aux_loss);
        snprintf(auxj, sizeof auxj, ",\"aux_loss\":%s", json_num(a, sizeof a, out->aux_loss));
    }
    if (out->skipped)
        snprintf(skip, sizeof skip, " | skipped (%d of --skip-bad-steps %d): nothing "
                 "updated", skipped, f->skip_bad_steps);
    int shown = step % f->log_interval == 0 || step == 1 || step == f->steps || out->skipped;
    if (!f->quiet && shown)
        printf("step %5d/%d | loss %.6f%s | lr %.4e | norm %.4f | %8.1f ms | "
               "%9.0f tok/s | %7.3f TFLOP/s%s | mem %.1f MiB%s\n", step, f->steps, out->loss,
               aux, (double)in->lr, out->grad_norm, ms, tok_s, tflops, mfu, live_mib, skip);
    if (out->skipped && f->quiet)
        printf("step %d/%d: loss %g, gradient norm %g: not finite%s\n", step, f->steps,
               out->loss, out->grad_norm, skip);
    fflush(stdout);
    *tb_failed = 0;
    if (tb >= 0) {
        lib_tb_value v[11] = {
            { "lm loss", out->loss }, { "learning-rate", in->lr },
            { "grad-norm", out->grad_norm }, { "iteration-time", ms / 1e3 },
            { "tokens-per-second", tok_s }, { "throughput", tflops },
            { "mem-allocated-bytes", (double)live }, { "mem-max-allocated-bytes", (double)peak },
            { "mem-host-resident-bytes", rss_mib * mib },
        };
        int nv = 9;
        if (f->peak_tflops > 0) v[nv++] = (lib_tb_value){ "mfu", tflops / f->peak_tflops };
        if (gpt.prog->dims.moe) v[nv++] = (lib_tb_value){ "aux-loss", out->aux_loss };
        int err = lib_tb_scalars(tb, wall_now(), step, v, nv);
        if (err) {
            *tb_failed = 1;
            return err;
        }
    }
    if (log < 0) return 0;
    int n = snprintf(line, sizeof line, "{\"step\":%d,\"loss\":%s%s,\"lr\":%s,"
                     "\"grad_norm\":%s,\"ms\":%.3f,\"comm_ms\":%.3f,\"tok_s\":%s,"
                     "\"tflops\":%s%s,\"mem_mib\":%.1f,\"mem_peak_mib\":%.1f,"
                     "\"rss_mib\":%.1f%s}\n", step,
                     json_num(l, sizeof l, out->loss), auxj, json_num(r, sizeof r, in->lr),
                     json_num(g, sizeof g, out->grad_norm), ms, comm_ms,
                     json_fmt(t, sizeof t, "%.1f", tok_s),
                     json_fmt(fl, sizeof fl, "%.6g", tflops), mfuj, live_mib, peak_mib,
                     rss_mib,
                     out->skipped ? ",\"skipped\":true" : "");
    return lib_append_whole(log, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* Megatron caps the exponent of the perplexity it reports (evaluate_and_print_results). */
#define PPL_MAX_LOSS 20.0

/*
** An evaluation after step 'step' on rank 0: its line on stdout (unless --quiet), its object in
** the --log file 'log' ("final": the one after the last step) and its scalars in the event
** file 'tb' under Megatron's names. Returns 0 or the errno of a failed write, *tb_failed
** saying whether the event file's.
*/
static int log_eval(int log, int tb, const lib_flags *f, int step, int final, double loss,
                    double ms, int *tb_failed)
{
    double ppl = exp(fmin(loss, PPL_MAX_LOSS));
    char l[32], p[32], line[256];
    if (!f->quiet)
        printf("eval  %5d/%d | eval_loss %.6f | eval_ppl %.4f | %d batches of %d | %8.1f ms%s\n",
               step, f->steps, loss, ppl, f->eval_iters, gpt.prog->gbs, ms,
               final ? " | final" : "");
    fflush(stdout);
    *tb_failed = 0;
    if (tb >= 0) {
        lib_tb_value v[2] = { { "lm loss validation", loss }, { "lm loss validation ppl", ppl } };
        int err = lib_tb_scalars(tb, wall_now(), step, v, 2);
        if (err) {
            *tb_failed = 1;
            return err;
        }
    }
    if (log < 0) return 0;
    int n = snprintf(line, sizeof line, "{\"step\":%d,\"eval_loss\":%s,\"eval_ppl\":%s,"
                     "\"eval_ms\":%.3f%s}\n", step, json_num(l, sizeof l, loss),
                     json_num(p, sizeof p, ppl), ms, final ? ",\"final\":true" : "");
    return lib_append_whole(log, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/*
** One evaluation, as Megatron's evaluate(): --eval-iters global batches of the valid split
** from its next samples (*next: the global batches the evaluations read so far), forward only
** (gpt_stage.eval); the loss averaged over every token of them (each batch's is the mean over
** its tokens, reduced over the world as the step's). Every rank calls it alike.
*/
static double evaluate(const lib_flags *f, const lib_tokens *valid, long long *next,
                       const int *position, int *inputs, int *targets)
{
    const gpt_stage *st = gpt.stage;
    double sum = 0.0, tokens = 0.0;
    for (int k = 0; k < f->eval_iters; k++, *next += gpt.prog->gbs) {
        if (st->needs_inputs || st->needs_targets)
            lib_tokens_batch(valid, gpt.prog, position, *next, gpt.dp_rank, inputs, targets);
        gpt_step_in in = { .inputs = st->needs_inputs ? inputs : NULL,
                           .targets = st->needs_targets ? targets : NULL };
        gpt_step_out out = { 0 };
        st->eval(&in, &out);
        rt_sync();
        sum += out.loss * (double)gpt.prog->tokens_per_step;
        tokens += (double)gpt.prog->tokens_per_step;
    }
    return sum / tokens;
}

/* The run's first line on stdout (rank 0): the model and its parameters, the layout, the
** global batch and the tokens of a step; 'start': the steps already done (--resume). */
static void header(const gpt_program *prog, int start)
{
    long long params = 0;
    int n = lib.ebias_tensor >= 0 ? lib.ebias_tensor : lib.ntensors;  /* biases: not trained */
    for (int i = 0; i < n; i++) params += (long long)lib.tensors[i].rows * lib.tensors[i].cols;
    printf("train: %s, %.3f M parameters, %s (world %d): global batch %d sequences (MBS %d x "
           "NMB %d x DP %d) of %d tokens, %lld tokens per step; from step %d\n", prog->model,
           (double)params / 1e6, prog->layout, prog->world, prog->gbs, prog->dims.B,
           prog->dims.nmb, prog->dp, prog->dims.seq, prog->tokens_per_step, start + 1);
}

/* -- Main ----------------------------------------------------------------------------------- */

/*
** The training program: flags, runtime, groups, the stage's setup, the model's parameters
** (--resume, --init or the seed), the data, then f.steps optimizer steps with their log, the
** checkpoints, and --save at the end. Returns the exit status: 0, or 1 when an exit signal
** or limit stopped the run without --ckpt-dir; usage errors and bad inputs exit from inside
** (fail.h), every rank alike.
*/
int gpt_main(int argc, char **argv, const gpt_program *prog)
{
    const gpt_dims *D = &prog->dims;
    double t_start = rt_now();
    rt_init(&argc, &argv, prog->world, prog->layout);
    lib_flags f;
    lib_flags_parse(argc, argv, &f);
    if (f.help) {
        if (rt_rank() == 0) lib_flags_usage(stdout, prog->run_hint);
        rt_finalize();
        return 0;
    }
    lib_faults_parse();
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
    lib.ntensors = lib_tensors_build(prog, &lib.tensors, &lib.ebias_tensor);
    lib_stage_setup();
    const gpt_stage *st = gpt.stage;
    if (!f.dump_samples)
        lib_check_outputs(&f, lib_ckpt_bytes(), f.save ? lib_weights_save_bytes(&f) : 0);
    lib_signals_install(&f);

    int start = 0, updates = 0, skipped = 0;  /* steps done; optimizer updates; steps skipped */
    lib_ckpt_pos at = { .samples = 0, .valid_samples = 0 };   /* where a checkpoint left off */
    lib_ckpt_lock(&f);                        /* one job per --ckpt-dir, for the whole run */
    if (f.ckpt_dir && rt_rank() == 0) lib_ckpt_clean(f.ckpt_dir);
    if (f.resume && (start = lib_ckpt_newest(f.ckpt_dir)) >= 0) {
        lib_ckpt_load(&f, start, &at);
        if (rt_rank() == 0) printf("resumed from %s/step_%08d\n", f.ckpt_dir, start);
        if (rt_rank() == 0 && f.log) log_truncate(f.log, start);
    } else if (f.reshard_from) {
        lib_ckpt_reshard(&f, &at);
        start = at.step;
        if (rt_rank() == 0)
            printf("resharded from %s/step_%08d to %s, at sample %lld\n", f.reshard_from, start,
                   prog->layout, at.samples);
        if (rt_rank() == 0 && f.log) log_truncate(f.log, start);
    } else {
        if (f.resume && rt_rank() == 0)
            printf("no complete checkpoint in %s: starting from the beginning\n", f.ckpt_dir);
        start = 0;
        if (f.init) lib_weights_load(f.init);
        else lib_weights_init(f.seed);
    }

    updates = at.updates;
    skipped = at.skipped;
    /* the samples the steps and the evaluations have read (Megatron's consumed samples): a
    ** file before version 5 does not say; then as this program reads them */
    long long evals = f.eval_interval ? (long long)(start / f.eval_interval) * f.eval_iters : 0;
    long long consumed = at.samples >= 0 ? at.samples : (long long)start * prog->gbs;
    long long valid_next = at.valid_samples >= 0 ? at.valid_samples : evals * prog->gbs;
    lib_tokens data = { 0 };  /* every rank checks the file, so a bad one fails everywhere alike */
    lib_tokens valid = { 0 }; /* --eval-interval's valid split, or the split --dump-split names */
    int *inputs = NULL, *targets = NULL, *position = NULL;
    if (f.steps > start) {
        int dump = f.dump_samples ? lib_split_named(f.dump_split) : LIB_SPLIT_TRAIN;
        if (dump != LIB_SPLIT_TRAIN && !f.split)
            lib_fail_all(2, "--dump-split %s needs --split A,B,C", f.dump_split);
        /* datasets sized for the samples the run reads (more or fewer than this program's
        ** batches at its steps would read when the global batch changed: --reshard-from) */
        lib_tokens_open_flags(&data, &f, prog, consumed - (long long)start * prog->gbs,
                              lib_world_allreduce_max);
        if (dump != LIB_SPLIT_TRAIN || (f.eval_interval && !f.dump_samples))
            lib_tokens_open_split(&valid, &data, &f, prog,
                                  dump != LIB_SPLIT_TRAIN ? dump : LIB_SPLIT_VALID,
                                  dump != LIB_SPLIT_TRAIN ? 0 : valid_next - evals * prog->gbs,
                                  lib_world_allreduce_max);
        if (f.dump_samples) {
            lib_tokens_dump(dump != LIB_SPLIT_TRAIN ? &valid : &data, f.dump_samples, D->seq);
            rt_finalize();
            exit(0);
        }
        /* a resumed run's evaluations go on where the first run's stopped (Megatron's
        ** consumed_valid_samples on resume): valid_next */
        /* pinned on CUDA: the stages copy each micro-batch's ids without stopping the host
        ** (rt_memcpy_async; the step ends with rt_sync before the next batch is written) */
        inputs = rt_host_malloc(sizeof(int) * (size_t)D->nmb * (size_t)D->N);
        targets = rt_host_malloc(sizeof(int) * (size_t)D->nmb * (size_t)D->N);
        position = malloc(sizeof(int) * (size_t)D->T);
        RT_CHECK(inputs && targets && position, "out of memory");
        for (int t = 0; t < D->T; t++) position[t] = gpt_cp_position(t);
    }
    int log = -1, log_err = 0, log_lost = 0;   /* --log (rank 0); a failed write: errno, step */
    if (f.log && rt_rank() == 0) {
        log = open(f.log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (start > 0 ? 0 : O_TRUNC),
                   0644);
        RT_CHECK(log >= 0, "%s: cannot open: %s", f.log, strerror(errno));
    }
    int tb = -1, tb_lost = 0;                   /* --tensorboard-dir's event file (rank 0) */
    char tb_path[4096] = "";
    if (f.tb_dir && rt_rank() == 0) {
        tb = lib_tb_open(f.tb_dir, wall_now(), start, tb_path, sizeof tb_path);
        RT_CHECK(tb >= 0, "--tensorboard-dir %s: cannot create an event file there: %s",
                 f.tb_dir, strerror(errno));
    }
    if (rt_rank() == 0 && !f.quiet && f.steps > start) header(prog, start);
    const char *stopped = NULL;     /* why the run stops before --steps */
    int s;
    lib_signals_stepping();
    for (s = start; s < f.steps && !stopped; s++) {
        double t0 = rt_now(), blocked0;
        rt_comm_stats(&blocked0, NULL);
        lib_faults_step(&f, s + 1);
        if (st->needs_inputs || st->needs_targets)
            lib_tokens_batch(&data, prog, position, consumed, gpt.dp_rank, inputs, targets);
        int late = f.exit_minutes > 0 && rt_now() - t_start > 60.0 * f.exit_minutes;
        /* the optimizer's step: updates made so far (a skipped step does not count) */
        gpt_step_in in = { .step = updates, .lr = (float)lib_lr(&f, prog->gbs, updates),
                           .beta1 = (float)f.beta1, .beta2 = (float)f.beta2,
                           .eps = (float)f.eps, .wd = (float)f.wd, .clip = (float)f.clip,
                           .inputs = st->needs_inputs ? inputs : NULL,
                           .targets = st->needs_targets ? targets : NULL,
                           .stop = lib_exit_signal() || late || log_err };
        gpt_step_out out;
        st->step(&in, &out);
        rt_sync();
        lib.fault = 0;
        if (out.skipped && ++skipped > f.skip_bad_steps) lib_bad_step_stop(&f, s + 1, &out);
        updates += !out.skipped;
        consumed += prog->gbs;
        if (rt_rank() == 0) {
            double blocked;
            rt_comm_stats(&blocked, NULL);
            int tb_failed;
            int err = log_step(log, tb, &f, s + 1, &in, &out, (rt_now() - t0) * 1e3,
                               (blocked - blocked0) * 1e3, skipped, &tb_failed);
            if (err && !log_err) {  /* stop logging; every rank stops after the next step */
                log_err = err, log_lost = s + 1, tb_lost = tb_failed;
                if (log >= 0) close(log);
                if (tb >= 0) close(tb);
                log = tb = -1;
            }
        }
        /* an evaluation after every --eval-interval-th step, and one more after the last step
        ** (Megatron's final evaluation) */
        for (int final = 0; final < 2 && f.eval_interval; final++) {
            if (final ? s + 1 != f.steps : (s + 1) % f.eval_interval != 0) continue;
            double e0 = rt_now();
            double eval_loss = evaluate(&f, &valid, &valid_next, position, inputs, targets);
            int tb_failed, err = 0;
            if (rt_rank() == 0 && !log_err)
                err = log_eval(log, tb, &f, s + 1, final, eval_loss, (rt_now() - e0) * 1e3,
                               &tb_failed);
            if (err) {          /* as a step's failed write: the run stops after the next step */
                log_err = err, log_lost = s + 1, tb_lost = tb_failed;
                if (log >= 0) close(log);
                if (tb >= 0) close(tb);
                log = tb = -1;
            }
        }
        int saved = f.ckpt_every && (s + 1) % f.ckpt_every == 0;
        lib_ckpt_pos here = { .step = s + 1, .updates = updates, .skipped = skipped,
                              .samples = consumed, .valid_samples = valid_next };
        if (saved) lib_ckpt_save(&f, &here);
        if (saved && rt_rank() == 0 && !f.quiet)
            printf("saved %s/step_%08d (--ckpt-every %d)\n", f.ckpt_dir, s + 1, f.ckpt_every);
        int sig = lib_exit_signal();
        if (s + 1 < f.steps && out.stop)
            stopped = sig ? lib_signal_name(sig) : late ? "--exit-duration-in-mins" : log_err ?
                      (tb_lost ? "a failed write of --tensorboard-dir's event file" :
                       "a failed write of --log") : "another rank's signal or time limit";
        else if (s + 1 < f.steps && f.exit_interval && (s + 1) % f.exit_interval == 0)
            stopped = "--exit-interval";
        if (stopped && f.ckpt_dir && !saved) lib_ckpt_save(&f, &here);
    }
    if (log >= 0 && close(log) && !log_err) log_err = errno, log_lost = s;
    if (tb >= 0 && close(tb) && !log_err) log_err = errno, log_lost = s, tb_lost = 1;
    lib_sync();
    int rc = 0;
    if (log_err) {          /* rank 0 alone knows: its status says it (mpirun passes it on) */
        fprintf(stderr, "train: error: %s: cannot write the %s of step %d: %s; the %s has "
                "the steps before it%s\n", tb_lost ? tb_path : f.log, tb_lost ? "event" : "line",
                log_lost, strerror(log_err), tb_lost ? "event file" : "log",
                s > log_lost ? " (the run stopped after the next step, which no line records)" :
                "");
        rc = 1;
    }
    if (stopped && f.ckpt_dir) {
        if (rt_rank() == 0)
            printf("stopped by %s after step %d of %d: saved %s/step_%08d; continue with "
                   "--resume\n", stopped, s, f.steps, f.ckpt_dir, s);
    } else if (stopped) {                   /* a signal without --ckpt-dir */
        if (rt_rank() == 0)
            fprintf(stderr, "train: stopped by %s after step %d of %d: no --ckpt-dir, so no "
                    "checkpoint to resume from%s\n", stopped, s, f.steps,
                    f.save ? "; writing --save" : "");
        if (f.save) lib_weights_save(&f);
        rc = 1;
    } else if (f.save) lib_weights_save(&f);
    lib_faults_report();
    rt_host_free(inputs);
    rt_host_free(targets);
    free(position);
    lib_tokens_close(&data);
    lib_tokens_close(&valid);
    rt_finalize();
    return rc;
}
