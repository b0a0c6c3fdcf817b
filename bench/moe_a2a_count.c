/*
** moe_a2a_count.c: an MPI profiling (PMPI) shim for bench/moe_bench.sh. Loaded with LD_PRELOAD
** into a generated MoE training program, it counts the MPI_Alltoallv calls the program issues
** (the CPU runtime's rt_alltoallv: the EP token exchanges and, with ETP > 1, the expert-TP
** gathers and reduce-scatters of lib/moe.c), per communicator and datatype,
** and at MPI_Finalize writes them to $MOE_A2A_OUT.<world rank>, one line each:
**     a2a <members as world ranks, comma-separated> <f32|i32|other> <calls> <bytes> <off-rank>
** bytes: sum of the send counts times the type size (the blocks a rank sends itself included);
** off-rank: the same without the rank's own block. It changes nothing the program computes; not
** part of the runtime, not used by the tests.
*/
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_RECS 64

typedef struct {
    MPI_Comm comm;
    MPI_Datatype type;
    long long calls, bytes, off;
} a2a_rec;

static a2a_rec recs[MAX_RECS];
static int nrecs;

static a2a_rec *rec_of(MPI_Comm comm, MPI_Datatype type)
{
    for (int i = 0; i < nrecs; i++)
        if (recs[i].comm == comm && recs[i].type == type) return &recs[i];
    if (nrecs == MAX_RECS) return NULL;
    recs[nrecs] = (a2a_rec){ comm, type, 0, 0, 0 };
    return &recs[nrecs++];
}

int MPI_Alltoallv(const void *s, const int *sc, const int *sd, MPI_Datatype st, void *r,
                  const int *rc, const int *rd, MPI_Datatype rt, MPI_Comm c)
{
    int n, me, size;
    PMPI_Comm_size(c, &n);
    PMPI_Comm_rank(c, &me);
    PMPI_Type_size(st, &size);
    a2a_rec *x = rec_of(c, st);
    if (x) {
        long long all = 0;
        for (int i = 0; i < n; i++) all += sc[i];
        x->calls++;
        x->bytes += all * size;
        x->off += (all - sc[me]) * size;
    }
    return PMPI_Alltoallv(s, sc, sd, st, r, rc, rd, rt, c);
}

int MPI_Finalize(void)
{
    const char *base = getenv("MOE_A2A_OUT");
    int wr;
    PMPI_Comm_rank(MPI_COMM_WORLD, &wr);
    if (base) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%d", base, wr);
        FILE *f = fopen(path, "w");
        MPI_Group world;
        PMPI_Comm_group(MPI_COMM_WORLD, &world);
        for (int i = 0; f && i < nrecs; i++) {
            MPI_Group g;
            int n;
            PMPI_Comm_group(recs[i].comm, &g);
            PMPI_Group_size(g, &n);
            int *in = malloc(sizeof(int) * (size_t)n), *out = malloc(sizeof(int) * (size_t)n);
            for (int k = 0; k < n; k++) in[k] = k;
            PMPI_Group_translate_ranks(g, n, in, world, out);
            fprintf(f, "a2a ");
            for (int k = 0; k < n; k++) fprintf(f, "%s%d", k ? "," : "", out[k]);
            fprintf(f, " %s %lld %lld %lld\n",
                    recs[i].type == MPI_FLOAT ? "f32" : recs[i].type == MPI_INT ? "i32" : "other",
                    recs[i].calls, recs[i].bytes, recs[i].off);
            free(in);
            free(out);
            PMPI_Group_free(&g);
        }
        if (f) fclose(f);
    }
    return PMPI_Finalize();
}
