/*
** rt_common.c: the bottom layer of the runtime, for both backends: dtypes, logging, failure
** messages, time, the polling back-off of the wait loops, the watchdog thread, the CPU thread
** pool (rt_parallel_for), per-thread scratch, bf16 bulk conversion, GEMM argument checks,
** device memory accounting (rt_mem_stats), FNV-1a, the communication trace, and what the two
** start-up layers (rt_mpi.c, rt_single.c) share: RT_TIMEOUT, the exit guard, group records and
** their accessors, the first half of rt_abort. It calls nothing above it: no MPI (ending the
** job is the start-up layer's, reached through rt__end_job), no device memory (it only counts
** the backends' blocks), nothing about models.
*/
#define _GNU_SOURCE
#include "rt_internal.h"   // defines: rt__state, rt__poll, rt__scratch, rt__bf16_to_f32, ...

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

rt__state rt__st = { -1, 0, 0, 1, 0, 0, 0, 300.0 };
void (*rt__end_job)(void) = NULL;

static _Thread_local int tl_in_parallel; /* inside an rt_parallel_for body */

/* -- Dtypes -------------------------------------------------------------------------------- */

static const size_t dtype_size[] = {
#define RT_DT_SIZE(name, str, size) size,
    RT_DTYPES(RT_DT_SIZE)
#undef RT_DT_SIZE
};
static const char *const dtype_name[] = {
#define RT_DT_NAME(name, str, size) str,
    RT_DTYPES(RT_DT_NAME)
#undef RT_DT_NAME
};

/*
** Size in bytes / printable name of a dtype; an invalid value aborts (name: returns "?").
*/
size_t rt_dtype_size(rt_dtype t)
{
    RT_CHECK((unsigned)t < RT_NDTYPES, "invalid dtype %d", (int)t);
    return dtype_size[t];
}

const char *rt_dtype_name(rt_dtype t)
{
    return (unsigned)t < RT_NDTYPES ? dtype_name[t] : "?";
}

/* -- Time, log, failure -------------------------------------------------------------------- */

/*
** Monotonic seconds (CLOCK_MONOTONIC); only differences are meaningful.
*/
double rt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int rt__prefix(char *buf, size_t len)
{
    if (rt__st.rank < 0)
        return snprintf(buf, len, "[rank ?/?] ");
    return snprintf(buf, len, "[rank %d/%d] ", rt__st.rank, rt__st.world);
}

/* One write(2) per line so that lines of different ranks do not interleave. */
static void emit_line(const char *head, const char *fmt, va_list ap)
{
    char buf[4096];
    int len = rt__prefix(buf, sizeof buf);
    if (head)
        len += snprintf(buf + len, sizeof buf - (size_t)len, "%s", head);
    if (len < (int)sizeof buf - 1)
        len += vsnprintf(buf + len, sizeof buf - (size_t)len, fmt, ap);
    if (len > (int)sizeof buf - 2)
        len = (int)sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t off = 0;
    while (off < len) {
        ssize_t w = write(2, buf + off, (size_t)(len - off));
        if (w <= 0 && errno != EINTR)
            break;
        if (w > 0)
            off += w;
    }
}

/*
** Print "[rank r/w] msg" (a newline is added) on stderr in one write. Any thread.
*/
void rt_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit_line(NULL, fmt, ap);
    va_end(ap);
}

/* End the job after a failure: the MPI layer's rt_abort once it runs, else this process. */
static void end_job(void) RT_NORETURN;
static void end_job(void)
{
    if (rt__end_job)
        rt__end_job();
    _exit(1);
}

/*
** Print "[rank r/w] file:line: message" and abort the job.
*/
void rt_fail(const char *file, int line, const char *fmt, ...)
{
    char head[512];
    snprintf(head, sizeof head, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    emit_line(head, fmt, ap);
    va_end(ap);
    end_job();
}

void rt__die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit_line(NULL, fmt, ap);
    va_end(ap);
    end_job();
}

/*
** Watchdog deadline for every later wait (seconds; 0 or less turns it off).
*/
void rt_set_timeout(double seconds)
{
    rt__st.timeout = seconds > 0 ? seconds : 0;
}

double rt_timeout(void)
{
    return rt__st.timeout;
}

/* -- Start-up, groups and ending the job: what rt_mpi.c and rt_single.c share ------------------ */

rt_group *rt__world;
void (*rt__abort_hook)(void) = NULL;
void (*rt__status_hook)(rt_err_kind kind, int status, char *buf, size_t len) = NULL;

static _Thread_local int tl_aborter;     /* this thread started the abort */

/*
** Read RT_TIMEOUT (seconds, >= 0; 0 = no watchdog) into the watchdog's deadline; a value that
** is not a number dies naming it.
*/
void rt__read_timeout(void)
{
    const char *e = getenv("RT_TIMEOUT");
    if (e && *e) {
        char *end;
        double v = strtod(e, &end);
        if (*end || v < 0)
            rt__die("RT_TIMEOUT='%s': expected seconds (a number >= 0; 0 = no watchdog)", e);
        rt__st.timeout = v;
    }
}

static void exit_guard(void)
{
    int aborting = __atomic_load_n(&rt__st.aborting, __ATOMIC_SEQ_CST);
    if (rt__st.inited && !rt__st.finalized && !aborting)
        rt__die("exited without rt_finalize (exit() or return from main before rt_finalize); "
                "aborting the job");
}

/*
** The end of a start-up (rank, world and the world group set): open the trace when RT_TRACE
** names a directory, start the watchdog thread, mark the runtime started and arm the guard
** that aborts the job when the process exits without rt_finalize.
*/
void rt__start_done(void)
{
    const char *trace = getenv("RT_TRACE");
    if (trace && *trace)
        rt__trace_open(trace, rt__st.rank);
    rt__wd_start();
    rt__st.inited = 1;
    atexit(exit_guard);
}

/*
** The end of a finalize, after the layer freed its communicators: stop the watchdog, free the
** world group's record, mark the runtime finalized and write the trace.
*/
void rt__finalize_done(void)
{
    rt__wd_stop();
    rt__group_release(rt__world);
    rt__world = NULL;
    rt__st.finalized = 1;
    rt__trace_close();
}

/*
** rt_abort's first half: the first caller flushes the trace and runs the backend's abort hook
** once (a failure inside the hook goes straight on), then returns to end the process; a
** failure in another thread during the abort parks that thread until the process is killed.
*/
void rt__abort_begin(void)
{
    if (__atomic_exchange_n(&rt__st.aborting, 1, __ATOMIC_SEQ_CST)) {
        if (!tl_aborter)
            for (;;)
                pause();
        return;
    }
    tl_aborter = 1;
    rt__trace_close();
    if (rt__abort_hook) {
        void (*hook)(void) = rt__abort_hook;
        rt__abort_hook = NULL;
        hook();
    }
}

static const char *const err_kind_name[] = {
#define RT_ERR_NAME(name, str) str,
    RT_ERR_KINDS(RT_ERR_NAME)
#undef RT_ERR_NAME
};

/*
** rt_fail_status's message: "[rank r/w] file:line: NCCL error: <text> (ncclAllReduce)" -- the
** called function's name is 'expr' up to its '(' -- then abort. 'text' NULL: the backend's
** rt__status_hook gives it (without the hook, the number).
*/
void rt__fail_status(const char *file, int line, rt_err_kind kind, int status,
                     const char *expr, const char *text)
{
    char buf[512] = "";
    if (!text) {
        if (rt__status_hook)
            rt__status_hook(kind, status, buf, sizeof buf);
        else
            snprintf(buf, sizeof buf, "error %d", status);
        text = buf;
    }
    int fn = (int)strcspn(expr, "(");
    rt_fail(file, line, "%s error: %s (%.*s)",
            (unsigned)kind < RT_NERR_KINDS ? err_kind_name[kind] : "runtime", text, fn, expr);
}

int rt_rank(void)       { return rt__st.rank; }
int rt_world(void)      { return rt__st.world; }
int rt_local_rank(void) { return rt__st.local_rank; }

static int int_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/*
** Check rt_group_create's arguments on this rank (rt.h): started, named, n in 0..world, every
** member a rank of the world and listed once, the caller among them. Dies naming the problem.
** Returns the caller's position in 'members' (-1 when n is 0) and sets *lowest to the smallest
** member (-1 when n is 0).
*/
int rt__group_validate(const char *name, const int *members, int n, int *lowest)
{
    RT_CHECK(rt__st.inited, "rt_group_create before rt_init");
    RT_CHECK(name, "rt_group_create: a group needs a name");
    if (n < 0 || n > rt__st.world || (n > 0 && !members))
        rt__die("rt_group_create: group %s: bad member list (%d ranks, %s)", name, n,
                members ? "set" : "NULL");
    *lowest = -1;
    if (n == 0)
        return -1;
    int pos = -1;
    int *sorted = malloc((size_t)n * sizeof *sorted);
    RT_CHECK(sorted, "out of memory");
    for (int i = 0; i < n; i++) {
        int r = members[i];
        if (r < 0 || r >= rt__st.world)
            rt__die("rt_group_create: group %s lists rank %d, outside the world of %d", name, r,
                    rt__st.world);
        if (r == rt__st.rank)
            pos = i;
        sorted[i] = r;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, int_cmp);
    for (int i = 1; i < n; i++)
        if (sorted[i] == sorted[i - 1])
            rt__die("rt_group_create: group %s lists rank %d twice", name, sorted[i]);
    *lowest = sorted[0];
    free(sorted);
    if (pos < 0)
        rt__die("rt_group_create: group %s: rank %d passed a group it is not in", name,
                rt__st.rank);
    return pos;
}

/* "group tp (ranks 0,1)" for messages; long lists are cut after 8 ranks. */
static void make_desc(rt_group *g)
{
    int len = snprintf(g->desc, sizeof g->desc, "group %s (ranks ", g->name);
    for (int i = 0; i < g->size && len < (int)sizeof g->desc - 24; i++) {
        if (g->size > 12 && i == 8) {
            len += snprintf(g->desc + len, sizeof g->desc - (size_t)len, "...,%d; %d ranks",
                            g->members[g->size - 1], g->size);
            break;
        }
        len += snprintf(g->desc + len, sizeof g->desc - (size_t)len, "%s%d", i ? "," : "",
                        g->members[i]);
    }
    if (len < (int)sizeof g->desc - 1)
        snprintf(g->desc + len, sizeof g->desc - (size_t)len, ")");
}

/*
** A new group record on communicator 'comm' (owned by the record from now on, freed by the
** layer): its name, a copy of the 'size' members and the description. The caller's position
** (rank) is the layer's to set. Aborts when out of memory.
*/
rt_group *rt__group_alloc(rt__comm comm, const char *name, const int *members, int size)
{
    rt_group *g = calloc(1, sizeof *g);
    RT_CHECK(g, "out of memory");
    g->comm = comm;
    snprintf(g->name, sizeof g->name, "%s", name);
    g->size = size;
    g->members = malloc((size_t)size * sizeof *g->members);
    RT_CHECK(g->members, "out of memory");
    memcpy(g->members, members, (size_t)size * sizeof *g->members);
    make_desc(g);
    return g;
}

/* Free a group record (its communicator is the layer's to free first); NULL is ignored. */
void rt__group_release(rt_group *g)
{
    if (!g)
        return;
    free(g->members);
    free(g);
}

rt_group *rt__group_check(rt_group *g, const char *op)
{
    if (!g)
        rt__die("%s on a NULL group (this rank is in no group of that kind; "
                "use rt_group_world() for all ranks)", op);
    return g;
}

/* Accessors (a NULL group aborts); the world group exists from rt_init to rt_finalize. */
rt_group *rt_group_world(void)
{
    return rt__world;
}

int rt_group_rank(const rt_group *g)
{
    return rt__group_check((rt_group *)g, "rt_group_rank")->rank;
}

int rt_group_size(const rt_group *g)
{
    return rt__group_check((rt_group *)g, "rt_group_size")->size;
}

const char *rt_group_name(const rt_group *g)
{
    return rt__group_check((rt_group *)g, "rt_group_name")->name;
}

const int *rt_group_members(const rt_group *g)
{
    return rt__group_check((rt_group *)g, "rt_group_members")->members;
}

/* -- Polling back-off ---------------------------------------------------------------------- */

/* Tuned with bench/runtime_bench (p2p exchange vs MPI_Sendrecv): spinning the first polls
** keeps small transfers at raw latency; for the next 2 ms, or as long as the transfer would
** take at 1 GB/s if longer, the wait keeps polling, so that MPI's progress engine (which only
** moves data inside MPI calls) runs at full speed: spinning when the job's threads on this
** node (ranks x pool) fit its CPUs, as MPI's own blocking calls do, yielding (sched_yield) the
** core to any other runnable thread when they do not (oversubscribed: the peer may need this
** core). Yielding when the cores are the job's cost the runtime's two-step allreduce 3-4x in
** median time on a loaded 2-core VM (1 M f32, 2 ranks: 4.2 ms against 1.4 ms spinning, MPI's
** 1.2 ms): a yield under load gives the core away for a time slice. After that window a sleep
** of 1/64 of the time waited (20 us .. 1 ms) bounds the added latency of a long wait (a
** pipeline bubble) to ~2 % while leaving the core free. */
enum { POLL_SPIN = 64 };
#define POLL_YIELD_S 2e-3
#define POLL_SLEEP_MIN 20e-6
#define POLL_SLEEP_MAX 1e-3

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int oversubscribed(void);

void rt__poll_start(rt__poll *p, size_t bytes)
{
    p->t0 = rt_now();
    p->polls = 0;
    p->yield_s = (double)bytes * 1e-9 > POLL_YIELD_S ? (double)bytes * 1e-9 : POLL_YIELD_S;
    p->spin = !oversubscribed();
}

double rt__poll_pause(rt__poll *p)
{
    double waited = rt_now() - p->t0;
    if (++p->polls < POLL_SPIN) {
        cpu_relax();
    } else if (waited < p->yield_s) {
        if (p->spin)
            cpu_relax();
        else
            sched_yield();
    } else {
        double s = waited / 64;
        s = s < POLL_SLEEP_MIN ? POLL_SLEEP_MIN : s > POLL_SLEEP_MAX ? POLL_SLEEP_MAX : s;
        struct timespec ts = { 0, (long)(s * 1e9) };
        nanosleep(&ts, NULL);
    }
    return waited;
}

/* -- Watchdog thread ----------------------------------------------------------------------- */

/* Blocking calls (MPI collectives, NCCL setup and kernels) are armed with a deadline; a thread
** that wakes every WD_TICK_S aborts the job when an armed call outlives it. Waits that poll
** (p2p, barriers) check their own deadline and name the pending operations. */
#define WD_TICK_S 0.05

static struct {
    pthread_mutex_t mu;
    pthread_t       tid;
    int             on, stop, armed;
    double          deadline;
    const char     *op;          /* valid while armed (the armed call is still running) */
    const rt_group *g;
} wd = { PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, 0, NULL, NULL };

static void *watchdog(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec ts = { 0, (long)(WD_TICK_S * 1e9) };
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&wd.mu);
        if (wd.stop) {
            pthread_mutex_unlock(&wd.mu);
            return NULL;
        }
        if (wd.armed && rt_now() > wd.deadline) {
            char msg[400];
            snprintf(msg, sizeof msg, "watchdog: %s%s%s did not complete within %g s", wd.op,
                     wd.g ? " on " : "", wd.g ? wd.g->desc : "", rt__st.timeout);
            pthread_mutex_unlock(&wd.mu);
            rt__die("%s", msg);
        }
        pthread_mutex_unlock(&wd.mu);
    }
}

void rt__wd_start(void)
{
    if (wd.on)
        return;
    int rc = pthread_create(&wd.tid, NULL, watchdog, NULL);
    RT_CHECK(rc == 0, "cannot start the watchdog thread: %s", strerror(rc));
    wd.on = 1;
}

void rt__wd_stop(void)
{
    if (!wd.on)
        return;
    pthread_mutex_lock(&wd.mu);
    wd.stop = 1;
    pthread_mutex_unlock(&wd.mu);
    pthread_join(wd.tid, NULL);
    wd.on = 0;
    wd.stop = 0;
}

void rt__wd_arm(const char *op, const rt_group *g)
{
    pthread_mutex_lock(&wd.mu);
    wd.op = op;
    wd.g = g;
    wd.deadline = rt__st.timeout > 0 ? rt_now() + rt__st.timeout : 1e300;
    wd.armed = 1;
    pthread_mutex_unlock(&wd.mu);
}

void rt__wd_disarm(void)
{
    pthread_mutex_lock(&wd.mu);
    wd.armed = 0;
    pthread_mutex_unlock(&wd.mu);
}

/* -- Thread pool --------------------------------------------------------------------------- */

/* One pool per process: nthreads-1 workers plus the calling (main) thread. A job is published
** by bumping 'gen'; each worker runs its range and decrements 'pending'. Waiting threads spin
** (with pause) for IDLE_SPIN_S, then sleep on a futex (the 'sleepers' / 'caller_sleeps'
** counters let the other side skip the wake-up system call when nobody sleeps). Measured here
** (bench/runtime_bench threads): waking a sleeping worker costs 25-60 us on this VM, a
** spinning one 0.1-1 us; with a 1 ms spin, serial gaps under 1 ms between parallel loops cost
** nothing. The spin only burns a core the pool owns anyway. */
#define IDLE_SPIN_S 1e-3

static struct {
    int        nthreads;
    pthread_t *tid;
    int        gen, pending, sleepers, caller_sleeps, stop, busy;
    int        start_gen;       /* 'gen' when the workers were started (a restarted pool's
                                ** workers must not take the last job of the previous ones) */
    void     (*fn)(void *, int, int);
    void      *ctx;
    int        n;
} pool = { 1, NULL, 0, 0, 0, 0, 0, 0, 0, NULL, NULL, 0 };

static void futex_wait(int *addr, int val)
{
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(int *addr, int n)
{
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static void run_range(int i)
{
    int lo = (int)((long)pool.n * i / pool.nthreads);
    int hi = (int)((long)pool.n * (i + 1) / pool.nthreads);
    if (hi > lo)
        pool.fn(pool.ctx, lo, hi);
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg, seen = pool.start_gen;
    tl_in_parallel = 1;
    for (;;) {
        double t0 = 0;
        for (int spins = 0;; spins++) {
            int g = __atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE);
            if (g != seen) {
                seen = g;
                break;
            }
            cpu_relax();
            if ((spins & 63) != 63)
                continue;
            if (t0 == 0) {
                t0 = rt_now();
            } else if (rt_now() - t0 > IDLE_SPIN_S) {
                __atomic_add_fetch(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
                futex_wait(&pool.gen, g);
                __atomic_sub_fetch(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
                t0 = 0;
            }
        }
        if (__atomic_load_n(&pool.stop, __ATOMIC_ACQUIRE))
            return NULL;
        run_range(id);
        if (__atomic_sub_fetch(&pool.pending, 1, __ATOMIC_ACQ_REL) == 0 &&
            __atomic_load_n(&pool.caller_sleeps, __ATOMIC_SEQ_CST))
            futex_wake(&pool.pending, 1);
    }
}

/*
** Start the pool with 'nthreads' threads in all (the caller counts as one). Called by rt_init,
** and by tests and benchmarks after rt__pool_shutdown to change the size; ignored while a pool
** runs.
*/
void rt__pool_init(int nthreads)
{
    if (pool.tid || nthreads <= 1)
        return;
    pool.tid = calloc((size_t)nthreads, sizeof *pool.tid);
    RT_CHECK(pool.tid, "out of memory");
    pool.nthreads = nthreads;
    pool.start_gen = pool.gen;      /* written before the workers start: they see it */
    for (int i = 1; i < nthreads; i++) {
        int rc = pthread_create(&pool.tid[i], NULL, worker, (void *)(intptr_t)i);
        RT_CHECK(rc == 0, "cannot start pool thread %d of %d: %s", i, nthreads, strerror(rc));
    }
}

void rt__pool_shutdown(void)
{
    if (!pool.tid)
        return;
    __atomic_store_n(&pool.stop, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&pool.gen, 1, __ATOMIC_SEQ_CST);
    futex_wake(&pool.gen, INT_MAX);
    for (int i = 1; i < pool.nthreads; i++)
        pthread_join(pool.tid[i], NULL);
    free(pool.tid);
    pool.tid = NULL;
    pool.nthreads = 1;
    pool.stop = 0;
}

/*
** Pool size for this rank: RT_THREADS (1 to 1024; above the online CPUs it is capped to them,
** with a warning: more threads than CPUs only wait on each other), else the CPUs of the
** affinity mask when a launcher bound the process to fewer than all CPUs, else online CPUs /
** ranks on this node (min 1).
*/
int rt__default_threads(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    CPU_ZERO(&set);
    int naff = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    const char *e = getenv("RT_THREADS");
    if (e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (*end || v < 1 || v > 1024)
            rt__die("RT_THREADS='%s': expected a whole number from 1 to 1024", e);
        if (online > 0 && v > online) {
            if (rt__st.rank == 0)
                rt_log("warning: RT_THREADS=%ld exceeds the %ld online CPUs: using %ld threads "
                       "(more only wait on each other)", v, online, online);
            v = online;
        } else if (naff > 0 && naff < online && v > naff && rt__st.rank == 0) {
            rt_log("warning: RT_THREADS=%ld but this rank is bound to %d CPU%s (mpirun binds "
                   "to cores by default: add --bind-to none or --map-by slot:PE=%ld)", v, naff,
                   naff == 1 ? "" : "s", v);
        }
        return (int)v;
    }
    if (naff > 0 && naff < online)
        return naff;
    long t = online / (rt__st.local_size > 0 ? rt__st.local_size : 1);
    return t < 1 ? 1 : (int)t;
}

/*
** Number of threads rt_parallel_for and rt_gemm use on this rank (1 = no workers).
*/
int rt_threads(void)
{
    return pool.nthreads;
}

int rt__in_parallel(void)
{
    return tl_in_parallel;
}

/* More threads of the job on this node (ranks x this rank's pool) than online CPUs? */
static int oversubscribed(void)
{
    static long online;
    if (!online)
        online = sysconf(_SC_NPROCESSORS_ONLN);
    long ranks = rt__st.local_size > 0 ? rt__st.local_size : 1;
    return ranks * pool.nthreads > online;
}

/*
** Run fn(ctx, lo, hi) over a split of [0, n) on the pool (see rt.h); returns when all ranges
** are done. Runs inline when nested, when the pool is busy (another thread) or has one thread.
*/
void rt_parallel_for(int n, void (*fn)(void *ctx, int lo, int hi), void *ctx)
{
    if (n <= 0)
        return;
    if (pool.nthreads <= 1 || n == 1 || tl_in_parallel ||
        __atomic_exchange_n(&pool.busy, 1, __ATOMIC_ACQUIRE)) {
        int was = tl_in_parallel;
        tl_in_parallel = 1;
        fn(ctx, 0, n);
        tl_in_parallel = was;
        return;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    __atomic_store_n(&pool.pending, pool.nthreads - 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&pool.gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool.sleepers, __ATOMIC_SEQ_CST) > 0)
        futex_wake(&pool.gen, INT_MAX);
    tl_in_parallel = 1;
    run_range(0);
    tl_in_parallel = 0;
    double t0 = 0;
    for (int spins = 0;; spins++) {
        int p = __atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE);
        if (p == 0)
            break;
        cpu_relax();
        if ((spins & 63) != 63)
            continue;
        if (t0 == 0) {
            t0 = rt_now();
        } else if (rt_now() - t0 > IDLE_SPIN_S) {
            __atomic_store_n(&pool.caller_sleeps, 1, __ATOMIC_SEQ_CST);
            p = __atomic_load_n(&pool.pending, __ATOMIC_SEQ_CST);
            if (p != 0)
                futex_wait(&pool.pending, p);
            __atomic_store_n(&pool.caller_sleeps, 0, __ATOMIC_SEQ_CST);
        }
    }
    __atomic_store_n(&pool.busy, 0, __ATOMIC_RELEASE);
}

/* -- GEMM arguments ------------------------------------------------------------------------ */

int rt__gemm_check(int ta, int tb, int m, int n, int k, float alpha, const void *A, int lda,
                   const void *B, int ldb, const void *C, int ldc, int batch, rt_dtype ab,
                   rt_dtype c)
{
    RT_CHECK(ab == RT_F32 || ab == RT_BF16, "rt_gemm: inputs must be f32 or bf16, not %s",
             rt_dtype_name(ab));
    RT_CHECK(c == RT_F32 || c == RT_BF16, "rt_gemm: output must be f32 or bf16, not %s",
             rt_dtype_name(c));
    RT_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0,
             "rt_gemm: negative size (m %d, n %d, k %d, batch %d)", m, n, k, batch);
    if (m == 0 || n == 0 || batch == 0)
        return RT__GEMM_NONE;
    RT_CHECK(C && ldc >= n, "rt_gemm: C %s, ldc %d < n %d", C ? "set" : "NULL", ldc, n);
    if (k == 0 || alpha == 0.0f)
        return RT__GEMM_SCALE;
    int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    RT_CHECK(A && lda >= acols, "rt_gemm: A %s, lda %d < %d (ta=%d: A is %d x %d)",
             A ? "set" : "NULL", lda, acols, ta, arows, acols);
    RT_CHECK(B && ldb >= bcols, "rt_gemm: B %s, ldb %d < %d (tb=%d: B is %d x %d)",
             B ? "set" : "NULL", ldb, bcols, tb, brows, bcols);
    return RT__GEMM_FULL;
}

/* -- Scratch and bf16 ---------------------------------------------------------------------- */

static _Thread_local struct { void *p; size_t cap; } scratch[RT__SCRATCH_SLOTS];

void *rt__scratch(int slot, size_t bytes)
{
    if (bytes > scratch[slot].cap) {
        free(scratch[slot].p);
        size_t cap = bytes + bytes / 4;
        cap = (cap + 63) & ~(size_t)63;
        scratch[slot].p = aligned_alloc(64, cap);
        if (!scratch[slot].p)
            rt__die("out of host memory: scratch buffer of %zu bytes", cap);
        scratch[slot].cap = cap;
    }
    return scratch[slot].p;
}

void rt__bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = rt__bf16_to_f32(src[i]);
}

void rt__f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = rt__f32_to_bf16(src[i]);
}

/* -- Device memory accounting ------------------------------------------------------------- */

/* Live blocks in an open-addressing table (linear probing, deletion by backward shift) from
** address to requested bytes: rt_free needs the size, and the device memory cannot carry a
** header. The table grows by doubling at half load. */
static struct {
    pthread_mutex_t mu;
    uintptr_t      *key;         /* 0: empty slot */
    size_t         *bytes;
    size_t          cap, n;      /* cap: a power of two (or 0) */
    size_t          live, peak;
} mem = { PTHREAD_MUTEX_INITIALIZER, NULL, NULL, 0, 0, 0, 0 };

static size_t mem_home(uintptr_t p)
{
    return (size_t)(((uint64_t)p * 0x9e3779b97f4a7c15ull) >> 32) & (mem.cap - 1);
}

static void mem_insert(uintptr_t p, size_t bytes)
{
    size_t i = mem_home(p);
    while (mem.key[i])
        i = (i + 1) & (mem.cap - 1);
    mem.key[i] = p;
    mem.bytes[i] = bytes;
    mem.n++;
}

void rt__mem_add(void *p, size_t bytes)
{
    pthread_mutex_lock(&mem.mu);
    if (2 * (mem.n + 1) > mem.cap) {
        uintptr_t *okey = mem.key;
        size_t *obytes = mem.bytes, ocap = mem.cap;
        mem.cap = ocap ? 2 * ocap : 1024;
        mem.key = calloc(mem.cap, sizeof *mem.key);
        mem.bytes = calloc(mem.cap, sizeof *mem.bytes);
        if (!mem.key || !mem.bytes)
            rt__die("out of host memory: device allocation table of %zu entries", mem.cap);
        mem.n = 0;
        for (size_t i = 0; i < ocap; i++)
            if (okey[i])
                mem_insert(okey[i], obytes[i]);
        free(okey);
        free(obytes);
    }
    mem_insert((uintptr_t)p, bytes);
    mem.live += bytes;
    if (mem.live > mem.peak)
        mem.peak = mem.live;
    pthread_mutex_unlock(&mem.mu);
}

size_t rt__mem_remove(void *p, const char *op)
{
    pthread_mutex_lock(&mem.mu);
    size_t i = mem.cap ? mem_home((uintptr_t)p) : 0;
    while (mem.cap && mem.key[i] && mem.key[i] != (uintptr_t)p)
        i = (i + 1) & (mem.cap - 1);
    if (!mem.cap || mem.key[i] != (uintptr_t)p) {
        pthread_mutex_unlock(&mem.mu);
        rt__die("%s(%p): not a live block from rt_malloc", op, p);
    }
    size_t bytes = mem.bytes[i];
    /* backward shift: move later entries of the probe run into the hole when their home
    ** position does not lie in the cyclic range (hole, their slot] */
    for (size_t j = (i + 1) & (mem.cap - 1); mem.key[j]; j = (j + 1) & (mem.cap - 1)) {
        size_t h = mem_home(mem.key[j]);
        int stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            mem.key[i] = mem.key[j];
            mem.bytes[i] = mem.bytes[j];
            i = j;
        }
    }
    mem.key[i] = 0;
    mem.n--;
    mem.live -= bytes;
    pthread_mutex_unlock(&mem.mu);
    return bytes;
}

/*
** rt.h's counters: bytes of the live rt_malloc blocks (and runtime workspaces), and their peak.
*/
void rt_mem_stats(size_t *live, size_t *peak)
{
    pthread_mutex_lock(&mem.mu);
    if (live)
        *live = mem.live;
    if (peak)
        *peak = mem.peak;
    pthread_mutex_unlock(&mem.mu);
}

/* -- FNV-1a --------------------------------------------------------------------------------- */

uint64_t rt_fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* -- Requests and accounting ------------------------------------------------------------------ */

static void trace_end(double blocked);

static struct {
    rt_req *first, *last;        /* live requests, in start order */
    long    ids;                 /* requests created so far */
    double  blocked, inside;     /* rt_comm_stats */
} req = { NULL, NULL, 0, 0, 0 };

/*
** A new request record for 'op' on group g (NULL: p2p), listed as live until rt__req_free;
** a start's ('async') is numbered 1, 2, ... in start order (the trace), a blocking call's 0.
** The layers fill in their parts (h, dev).
*/
rt_req *rt__req_new(const char *op, const rt_group *g, int async)
{
    rt_req *r = calloc(1, sizeof *r);
    RT_CHECK(r, "out of memory");
    r->op = op;
    r->g = g;
    r->id = async ? ++req.ids : 0;
    r->prev = req.last;
    if (req.last)
        req.last->next = r;
    else
        req.first = r;
    req.last = r;
    return r;
}

void rt__req_free(rt_req *r)
{
    if (!r)
        return;
    if (r->prev)
        r->prev->next = r->next;
    else
        req.first = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        req.last = r->prev;
    free(r);
}

/*
** 'why' (rt_finalize, rt_group_free) needs no live request on g (NULL: on any group): die
** naming the oldest one otherwise.
*/
void rt__req_none_live(const rt_group *g, const char *why)
{
    int n = 0;
    const rt_req *first = NULL;
    for (const rt_req *r = req.first; r; r = r->next)
        if (!g || r->g == g) {
            if (!first)
                first = r;
            n++;
        }
    if (first)
        rt__die("%s with %d request%s not waited (the oldest: request %ld, %s%s%s; every "
                "rt_*_start needs its rt_wait)", why, n, n == 1 ? "" : "s", first->id, first->op,
                first->g ? " on " : "", first->g ? first->g->desc : "");
}

double rt__comm_begin(void)
{
    return rt_now();
}

void rt__comm_end(double t0, int blocked)
{
    double dt = rt_now() - t0;
    req.inside += dt;
    if (blocked)
        req.blocked += dt;
    if (rt__tracing)
        trace_end(blocked ? dt : -1);
}

/*
** rt.h: the seconds this rank spent in blocking communication and rt_wait (*blocked), and in
** every communication call (*inside), since rt_init. Either may be NULL.
*/
void rt_comm_stats(double *blocked, double *inside)
{
    if (blocked)
        *blocked = req.blocked;
    if (inside)
        *inside = req.inside;
}

/* -- Trace ------------------------------------------------------------------------------------ */

int rt__tracing;
void *rt__trace_site;
static FILE *trace_file;
static int trace_times;         /* RT_TRACE_TIMES: blocked seconds at the end of a line */
static int trace_sites;         /* RT_TRACE_SITES: each line's call site */
static int trace_open_line;     /* a line is begun and not ended */
static void *line_site;         /* the call site of the open line */

/*
** Open DIR/rank_<r>.trace for this rank's trace (rt.h "Trace"); a failure aborts naming it.
*/
void rt__trace_open(const char *dir, int rank)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/rank_%05d.trace", dir, rank);
    trace_file = fopen(path, "w");
    if (!trace_file)
        rt__die("RT_TRACE: cannot create %s: %s", path, strerror(errno));
    const char *t = getenv("RT_TRACE_TIMES");
    trace_times = t && *t && strcmp(t, "0") != 0;
    t = getenv("RT_TRACE_SITES");
    trace_sites = t && *t && strcmp(t, "0") != 0;
    rt__tracing = 1;
}

/* " at <file>+0x<offset>": the call site, relative to the object that holds it. */
static void trace_site(void *site)
{
    Dl_info info;
    if (site && dladdr(site, &info) && info.dli_fname && info.dli_fbase) {
        const char *base = strrchr(info.dli_fname, '/');
        fprintf(trace_file, " at %s+0x%lx", base ? base + 1 : info.dli_fname,
                (unsigned long)((char *)site - (char *)info.dli_fbase));
    } else {
        fprintf(trace_file, " at ?");
    }
}

/* End the open line: " t=<seconds>" when timing and 'blocked' >= 0, then the newline. */
static void trace_end(double blocked)
{
    if (!trace_file || !trace_open_line)
        return;
    if (trace_sites)
        trace_site(line_site);
    if (trace_times && blocked >= 0)
        fprintf(trace_file, " t=%.6f", blocked);
    fputc('\n', trace_file);
    trace_open_line = 0;
}

/* Begin a line (a line still open from a call that did not end it is ended first). */
static void trace_begin(void)
{
    if (trace_open_line)
        trace_end(-1);
    trace_open_line = 1;
    line_site = rt__trace_site;
    rt__trace_site = NULL;
}

void rt__trace(const char *fmt, ...)
{
    if (!trace_file)
        return;
    trace_begin();
    va_list ap;
    va_start(ap, fmt);
    vfprintf(trace_file, fmt, ap);
    va_end(ap);
}

/* A start's line is whole: " start <id>" and the newline. */
static void trace_start(long id)
{
    if (id > 0) {
        fprintf(trace_file, " start %ld", id);
        trace_end(-1);
    }
}

/* "<op> <group> [<n>] <dtype> [<red>] [start <id>]" for one collective. */
void rt__trace_coll(const char *op, const rt_group *g, size_t n, rt_dtype t, int has_n,
                    const char *red, long id)
{
    const char *name = g ? g->name : "world";
    if (!trace_file)
        return;
    if (has_n && red)
        rt__trace("%s %s %zu %s %s", op, name, n, rt_dtype_name(t), red);
    else if (has_n)
        rt__trace("%s %s %zu %s", op, name, n, rt_dtype_name(t));
    else
        rt__trace("%s %s %s", op, name, rt_dtype_name(t));
    trace_start(id);
}

/* "p2p" and every op of one call, in the order given [start <id>]. */
void rt__trace_p2p(const rt_p2p_op *ops, int nops, long id)
{
    if (!trace_file)
        return;
    rt__trace("p2p");
    for (int i = 0; i < nops; i++)
        fprintf(trace_file, " %s %d %zu %s %d", ops[i].send ? "send" : "recv", ops[i].peer,
                ops[i].n, rt_dtype_name(ops[i].t), ops[i].tag);
    trace_start(id);
}

/* "wait <id> <op> [<group>]" */
void rt__trace_wait(const rt_req *r)
{
    if (r->g)
        rt__trace("wait %ld %s %s", r->id, r->op, r->g->name);
    else
        rt__trace("wait %ld %s", r->id, r->op);
}

void rt__trace_close(void)
{
    trace_end(-1);
    if (trace_file)
        fclose(trace_file);
    trace_file = NULL;
    rt__tracing = 0;
}

/* -- rt_alltoall's counts ------------------------------------------------------------------ */

size_t *rt__even_counts(int p, size_t n)
{
    static _Thread_local size_t *c;
    static _Thread_local int cap;
    if (p > cap) {
        free(c);
        c = malloc(2 * (size_t)p * sizeof *c);
        if (!c) rt__die("out of host memory: %d all-to-all counts", p);
        cap = p;
    }
    for (int i = 0; i < p; i++) {
        c[i] = n;
        c[p + i] = (size_t)i * n;
    }
    return c;
}
