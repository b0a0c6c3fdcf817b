/*
** parallel_mpicount.c: an MPI profiling (PMPI) shim for bench/parallel_bench.sh. Loaded with
** LD_PRELOAD into a generated training program, it counts the collectives the program issues
** (calls and payload bytes per communicator, the communicator named by its members as world
** ranks) and, at MPI_Finalize, writes them with the rank's peak resident memory to
** $MPICOUNT_OUT.<rank>. It changes nothing the program computes; not part of the runtime and
** not used by the tests. Payload N of a call (what the bench's formulas take):
**   allreduce        count * size            (each rank's whole buffer)
**   allgather        group * recvcount * size (the gathered buffer)
**   reduce_scatter   group * recvcount * size (the buffer before scattering)
**   send             count * size            (point to point)
** An MPI_Alltoall counts as a reduce_scatter (group * count * size): the runtime's only use of
** it is the exchange of a bf16 sum (runtime/rt_mpi.c: bf16 travels as bf16 and each member
** reduces its block), which moves what a ring reduce-scatter moves. A call on 2-byte elements
** (bf16, moved as MPI_UINT16_T) is counted apart, as "<op>.bf16".
** It also follows aligned_alloc / free, the allocator of the CPU runtime's rt_malloc (the
** program's "device" memory: parameters, gradients, optimizer state, activations, scratch),
** and reports the peak of the bytes it holds.
** Output lines: "<op> <member,member,...> <calls> <payload bytes>", then "hwm_kib <VmHWM>" and
** "rt_peak_bytes <peak of aligned_alloc'd bytes held>".
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COMMS 64
#define MAX_OPS   16           /* 8 ops, then the same on 2-byte elements */

typedef struct {
    MPI_Comm comm;
    char members[512];
    int size;
    long long calls[MAX_OPS], bytes[MAX_OPS];
} comm_stat;

static const char *const op_names[MAX_OPS] = {
    "allreduce", "allgather", "reduce_scatter", "bcast", "send", "alltoallv", "", "",
    "allreduce.bf16", "allgather.bf16", "reduce_scatter.bf16", "bcast.bf16", "send.bf16",
    "alltoallv.bf16", "", "" };
enum { OP_AR, OP_AG, OP_RS, OP_BC, OP_SEND, OP_A2A };

static comm_stat stats[MAX_COMMS];
static int nstats;

/* The record of 'comm', created on first use with its members as world ranks. */
static comm_stat *stat_of(MPI_Comm comm)
{
    for (int i = 0; i < nstats; i++)
        if (stats[i].comm == comm) return &stats[i];
    if (nstats == MAX_COMMS) return NULL;
    comm_stat *s = &stats[nstats++];
    memset(s, 0, sizeof *s);
    s->comm = comm;
    MPI_Group g, world;
    PMPI_Comm_size(comm, &s->size);
    PMPI_Comm_group(comm, &g);
    PMPI_Comm_group(MPI_COMM_WORLD, &world);
    int *in = malloc(sizeof(int) * (size_t)s->size), *out = malloc(sizeof(int) * (size_t)s->size);
    for (int i = 0; i < s->size; i++) in[i] = i;
    PMPI_Group_translate_ranks(g, s->size, in, world, out);
    size_t at = 0;
    for (int i = 0; i < s->size && at + 12 < sizeof s->members; i++)
        at += (size_t)snprintf(s->members + at, sizeof s->members - at, "%s%d", i ? "," : "",
                               out[i]);
    free(in);
    free(out);
    PMPI_Group_free(&g);
    PMPI_Group_free(&world);
    return s;
}

static int type_size(MPI_Datatype t)
{
    int size = 0;
    PMPI_Type_size(t, &size);
    return size;
}

static long long type_bytes(MPI_Datatype t, long long n)
{
    return n * type_size(t);
}

/* bytes of elements of type t (2-byte elements: counted as "<op>.bf16") */
static void count_t(MPI_Comm comm, int op, long long bytes, MPI_Datatype t)
{
    comm_stat *s = stat_of(comm);
    if (!s) return;
    if (type_size(t) == 2) op += 8;
    s->calls[op]++;
    s->bytes[op] += bytes;
}
#define count(comm, op, bytes) count_t(comm, op, bytes, t)

static int comm_size(MPI_Comm c)
{
    int n = 1;
    PMPI_Comm_size(c, &n);
    return n;
}

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
    count(c, OP_AR, type_bytes(t, n));
    return PMPI_Allreduce(s, r, n, t, op, c);
}

int MPI_Iallreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                   MPI_Request *q)
{
    count(c, OP_AR, type_bytes(t, n));
    return PMPI_Iallreduce(s, r, n, t, op, c, q);
}

int MPI_Allgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt,
                  MPI_Comm c)
{
    count_t(c, OP_AG, type_bytes(rt, (long long)rn * comm_size(c)), rt);
    return PMPI_Allgather(s, sn, st, r, rn, rt, c);
}

int MPI_Reduce_scatter_block(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op,
                             MPI_Comm c)
{
    count(c, OP_RS, type_bytes(t, (long long)n * comm_size(c)));
    return PMPI_Reduce_scatter_block(s, r, n, t, op, c);
}

int MPI_Bcast(void *b, int n, MPI_Datatype t, int root, MPI_Comm c)
{
    count(c, OP_BC, type_bytes(t, n));
    return PMPI_Bcast(b, n, t, root, c);
}

int MPI_Isend(const void *b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c,
              MPI_Request *q)
{
    count(c, OP_SEND, type_bytes(t, n));
    return PMPI_Isend(b, n, t, dest, tag, c, q);
}

int MPI_Alltoallv(const void *s, const int *sc, const int *sd, MPI_Datatype st, void *r,
                  const int *rc, const int *rd, MPI_Datatype rt, MPI_Comm c)
{
    long long n = 0;
    for (int i = 0; i < comm_size(c); i++) n += sc[i];
    count_t(c, OP_A2A, type_bytes(st, n), st);
    return PMPI_Alltoallv(s, sc, sd, st, r, rc, rd, rt, c);
}

int MPI_Alltoall(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt,
                 MPI_Comm c)
{
    count_t(c, OP_RS, type_bytes(st, (long long)sn * comm_size(c)), st);
    return PMPI_Alltoall(s, sn, st, r, rn, rt, c);
}

/* -- aligned_alloc / free: bytes held (a pointer table, so other frees are told apart) ------ */

#define TABLE (1 << 16)
static struct { void *p; size_t n; } held[TABLE];
static long long cur_bytes, peak_bytes;

void *aligned_alloc(size_t align, size_t n)
{
    static void *(*real)(size_t, size_t);
    if (!real) real = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
    void *p = real(align, n);
    if (p) {
        size_t h = ((size_t)p >> 6) & (TABLE - 1);
        for (int k = 0; k < TABLE && held[h].p; k++) h = (h + 1) & (TABLE - 1);
        if (!held[h].p) {
            held[h].p = p;
            held[h].n = n;
            cur_bytes = __atomic_add_fetch(&cur_bytes, (long long)n, __ATOMIC_RELAXED);
            if (cur_bytes > peak_bytes) peak_bytes = cur_bytes;
        }
    }
    return p;
}

void free(void *p)
{
    static void (*real)(void *);
    static int resolving;
    if (!real) {
        if (resolving) return;   /* dlsym freeing its own memory: leak it */
        resolving = 1;
        real = (void (*)(void *))dlsym(RTLD_NEXT, "free");
        resolving = 0;
    }
    if (p) {
        size_t h = ((size_t)p >> 6) & (TABLE - 1);
        for (int k = 0; k < TABLE && held[h].p; k++, h = (h + 1) & (TABLE - 1))
            if (held[h].p == p) {
                __atomic_sub_fetch(&cur_bytes, (long long)held[h].n, __ATOMIC_RELAXED);
                held[h].p = (void *)1;   /* a tombstone keeps later probes going */
                held[h].n = 0;
                break;
            }
    }
    real(p);
}

/* Peak resident set of this process in KiB (VmHWM), or -1. */
static long hwm_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) v = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return v;
}

int MPI_Finalize(void)
{
    const char *out = getenv("MPICOUNT_OUT");
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (out && *out) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", out, rank);
        FILE *f = fopen(path, "w");
        if (f) {
            for (int i = 0; i < nstats; i++)
                for (int k = 0; k < MAX_OPS; k++)
                    if (stats[i].calls[k] && stats[i].size > 1)
                        fprintf(f, "%s %s %lld %lld\n", op_names[k], stats[i].members,
                                stats[i].calls[k], stats[i].bytes[k]);
            fprintf(f, "hwm_kib %ld\n", hwm_kib());
            fprintf(f, "rt_peak_bytes %lld\n", peak_bytes);
            fclose(f);
        }
    }
    return PMPI_Finalize();
}
