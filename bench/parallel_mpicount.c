/*
** parallel_mpicount.c: an MPI profiling (PMPI) shim for bench/parallel_bench.sh and
** bench/cp_bench.sh. Loaded with LD_PRELOAD into a generated training program, it counts what
** the rank hands to MPI, per communicator (named by its MPI name and its members as world
** ranks) and, at MPI_Finalize, writes it with the rank's peak resident memory to
** $MPICOUNT_OUT.<rank>. It changes nothing the program computes; not part of the runtime and
** not used by the tests.
** The CPU runtime (runtime/rt_mpi.c) moves its all-reduces, reduce-scatters and all-gathers
** itself, as MPI_Isend / MPI_Irecv on the group's communicator (named after the group: "tp",
** "dp-cp", "mp", "world", ...), and every rt_p2p (pipeline tags 0/1, CP ring tags 2/3) on its
** own copy of the world named "p2p"; so what a rank sends on a communicator is what the
** runtime's algorithms move, counted as:
**   send             count * size of each MPI_Isend / MPI_Send (bytes this rank sends)
**   recv             count * size of each MPI_Irecv / MPI_Recv (bytes it posts to receive; the
**                    runtime posts exact sizes)
** and the MPI collectives the runtime still calls (group creation's check, broadcast,
** all-to-all), as payload N per call:
**   allreduce        count * size            (each rank's whole buffer)
**   allgather        group * recvcount * size (the gathered buffer)
**   reduce_scatter   group * recvcount * size (the buffer before scattering)
**   bcast            count * size
**   alltoallv        the send counts' bytes, the rank's own block included
** A call on 2-byte elements (bf16, moved as MPI_UINT16_T) is counted apart, as "<op>.bf16".
** On "p2p" the sends are also counted by tag, as "send@tag<t>" (t < 16, whatever the element
** size; "send@tag16+" the others): the pipeline's tags 0/1 apart from the CP ring's 2/3.
** It also follows aligned_alloc / free, the allocator of the CPU runtime's rt_malloc (the
** program's "device" memory: parameters, gradients, optimizer state, activations, scratch),
** and reports the peak of the bytes it holds.
** Output lines: "<op> <name> <member,member,...> <calls> <bytes>" (name "-" for a communicator
** without one; the send@tag lines repeat bytes of the send lines), then "hwm_kib <VmHWM>" and
** "rt_peak_bytes <peak of aligned_alloc'd bytes held>".
*/
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COMMS 256
#define MAX_OPS   16           /* 8 ops, then the same on 2-byte elements */
#define MAX_TAGS  16           /* p2p sends counted by tag below this, the rest together */

typedef struct {
    MPI_Comm comm;             /* MPI_COMM_NULL once freed (a later communicator may reuse
                               ** the handle: it gets a record of its own) */
    char name[MPI_MAX_OBJECT_NAME];
    char members[512];
    int size;
    long long calls[MAX_OPS], bytes[MAX_OPS];
    long long tag_calls[MAX_TAGS + 1], tag_bytes[MAX_TAGS + 1];   /* "p2p" sends by tag */
} comm_stat;

static const char *const op_names[MAX_OPS] = {
    "send", "recv", "allreduce", "allgather", "reduce_scatter", "bcast", "alltoallv", "",
    "send.bf16", "recv.bf16", "allreduce.bf16", "allgather.bf16", "reduce_scatter.bf16",
    "bcast.bf16", "alltoallv.bf16", "" };
enum { OP_SEND, OP_RECV, OP_AR, OP_AG, OP_RS, OP_BC, OP_A2A };

static comm_stat stats[MAX_COMMS];
static int nstats;

/* comm's MPI name into out (spaces made '_', "-" when it has none). */
static void name_of(MPI_Comm comm, char *out)
{
    int len = 0;
    out[0] = 0;
    PMPI_Comm_get_name(comm, out, &len);
    for (char *c = out; *c; c++)
        if (*c == ' ') *c = '_';
    if (!out[0]) strcpy(out, "-");
}

/* The record of 'comm', created on first use with its members as world ranks. */
static comm_stat *stat_of(MPI_Comm comm)
{
    for (int i = 0; i < nstats; i++)
        if (stats[i].comm == comm) return &stats[i];
    if (nstats == MAX_COMMS) return NULL;
    comm_stat *s = &stats[nstats++];
    memset(s, 0, sizeof *s);
    s->comm = comm;
    name_of(comm, s->name);
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

/* The runtime names a group's communicator after its first call on it (group creation's
** check): the record follows. */
int MPI_Comm_set_name(MPI_Comm comm, const char *name)
{
    int rc = PMPI_Comm_set_name(comm, name);
    for (int i = 0; i < nstats; i++)
        if (stats[i].comm == comm) name_of(comm, stats[i].name);
    return rc;
}

int MPI_Comm_free(MPI_Comm *comm)
{
    for (int i = 0; i < nstats; i++)
        if (stats[i].comm == *comm) stats[i].comm = MPI_COMM_NULL;
    return PMPI_Comm_free(comm);
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

/* a send of 'bytes' with 'tag' on comm: by tag too when comm is the runtime's "p2p" */
static void count_send(MPI_Comm comm, long long bytes, MPI_Datatype t, int tag)
{
    count(comm, OP_SEND, bytes);
    comm_stat *s = stat_of(comm);
    if (!s || strcmp(s->name, "p2p")) return;
    int k = tag >= 0 && tag < MAX_TAGS ? tag : MAX_TAGS;
    s->tag_calls[k]++;
    s->tag_bytes[k] += bytes;
}

static int comm_size(MPI_Comm c)
{
    int n = 1;
    PMPI_Comm_size(c, &n);
    return n;
}

/* -- Point to point: what the runtime's own collectives and rt_p2p move ---------------------- */

int MPI_Isend(const void *b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c,
              MPI_Request *q)
{
    count_send(c, type_bytes(t, n), t, tag);
    return PMPI_Isend(b, n, t, dest, tag, c, q);
}

int MPI_Send(const void *b, int n, MPI_Datatype t, int dest, int tag, MPI_Comm c)
{
    count_send(c, type_bytes(t, n), t, tag);
    return PMPI_Send(b, n, t, dest, tag, c);
}

int MPI_Irecv(void *b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Request *q)
{
    count(c, OP_RECV, type_bytes(t, n));
    return PMPI_Irecv(b, n, t, src, tag, c, q);
}

int MPI_Recv(void *b, int n, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status *st)
{
    count(c, OP_RECV, type_bytes(t, n));
    return PMPI_Recv(b, n, t, src, tag, c, st);
}

/* -- MPI's collectives ------------------------------------------------------------------------ */

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

int MPI_Iallgather(const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt,
                   MPI_Comm c, MPI_Request *q)
{
    count_t(c, OP_AG, type_bytes(rt, (long long)rn * comm_size(c)), rt);
    return PMPI_Iallgather(s, sn, st, r, rn, rt, c, q);
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
    count_t(c, OP_A2A, type_bytes(st, (long long)sn * comm_size(c)), st);
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
                        fprintf(f, "%s %s %s %lld %lld\n", op_names[k], stats[i].name,
                                stats[i].members, stats[i].calls[k], stats[i].bytes[k]);
            for (int i = 0; i < nstats; i++)
                for (int k = 0; k <= MAX_TAGS; k++)
                    if (stats[i].tag_calls[k] && stats[i].size > 1)
                        fprintf(f, "send@tag%d%s %s %s %lld %lld\n", k, k == MAX_TAGS ? "+" : "",
                                stats[i].name, stats[i].members, stats[i].tag_calls[k],
                                stats[i].tag_bytes[k]);
            fprintf(f, "hwm_kib %ld\n", hwm_kib());
            fprintf(f, "rt_peak_bytes %lld\n", peak_bytes);
            fclose(f);
        }
    }
    return PMPI_Finalize();
}
