/* TEMPORARY (until the runtime's rt_group_create lands): rt_group_create over
** rt_group_from_table, gathering every rank's list with MPI. Linear in the world. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include "rt.h"

rt_group *rt_group_create(const char *name, const int *members, int n);
rt_group *rt_group_create(const char *name, const int *members, int n)
{
    int w = rt_world(), maxn = 0;
    MPI_Allreduce(&n, &maxn, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    int *mine = calloc((size_t)maxn + 1, sizeof(int)), *all = calloc((size_t)(maxn + 1) * w, sizeof(int));
    mine[0] = n;
    for (int i = 0; i < n; i++) mine[i + 1] = members[i];
    MPI_Allgather(mine, maxn + 1, MPI_INT, all, maxn + 1, MPI_INT, MPI_COMM_WORLD);
    int *rows = calloc((size_t)maxn * w + 1, sizeof(int)), ng = 0;
    for (int r = 0; r < w; r++) {
        int *l = all + (size_t)r * (maxn + 1);
        if (l[0] == 0 || l[1] != r) continue;   /* the group's first member lists it */
        memcpy(rows + (size_t)ng * maxn, l + 1, sizeof(int) * (size_t)maxn);
        ng++;
    }
    rt_group_table t = { name, ng, maxn, rows };
    rt_group *g = rt_group_from_table(&t);
    free(mine);
    free(all);
    return g;   /* rows leak: the table must outlive the group */
}
