/*
** t_groups.c: groups built with rt_group_create from tables (t_configs: hand-written in
** tables.c, or converted from the generator's topology.json): each rank passes its own row.
** For every configuration whose world matches the
** launch and every group kind, checks that each collective touches exactly the right ranks:
** allreduce sum / max of a one-hot of the global rank gives the member set, allgather gives
** the members in group order, broadcast from every root, reduce-scatter and alltoallv route
** by group rank, and ranks listed in no group get NULL.
**   t_groups [CONFIG-NAME]     (default: every configuration of this world size)
*/
#include "t_tables.h"   // defines: t_config, t_configs, t_nconfigs
#include "t_util.h"     // defines: T_EXPECT, t_finish, t_to_dev, t_to_host, ...

static void check_kind(const t_config *c, const t_table *t)
{
    int w = rt_world(), me = rt_rank();
    rt_group *g = t_group_from_table(t);
    int row = -1, col = -1;
    for (int i = 0; i < t->ngroups * t->size; i++)
        if (t->ranks[i] == me) {
            row = i / t->size;
            col = i % t->size;
        }
    T_EXPECT((row >= 0) == (g != NULL), "[%s] %s: rank %s listed but group %s", c->name, t->name,
             row >= 0 ? "is" : "not", g ? "returned" : "NULL");
    if (!g)
        return;
    const int *want = t->ranks + (size_t)row * (size_t)t->size;
    int p = t->size;
    T_EXPECT(rt_group_size(g) == p && rt_group_rank(g) == col &&
             !strcmp(rt_group_name(g), t->name) &&
             !memcmp(rt_group_members(g), want, (size_t)p * sizeof(int)),
             "[%s] %s: size %d rank %d name %s (want %d %d %s) or members wrong", c->name,
             t->name, rt_group_size(g), rt_group_rank(g), rt_group_name(g), p, col, t->name);

    /* allreduce sum and max of a one-hot of the global rank: exactly the member set */
    int32_t *h = t_alloc((size_t)w * sizeof(int32_t));
    h[me] = 1;
    int32_t *d = t_to_dev(h, (size_t)w * sizeof(int32_t));
    rt_allreduce(d, (size_t)w, RT_I32, RT_SUM, g);
    t_to_host(h, d, (size_t)w * sizeof(int32_t));
    int32_t *h2 = t_alloc((size_t)w * sizeof(int32_t));
    h2[me] = me + 1;
    int32_t *d2 = t_to_dev(h2, (size_t)w * sizeof(int32_t));
    rt_allreduce(d2, (size_t)w, RT_I32, RT_MAX, g);
    t_to_host(h2, d2, (size_t)w * sizeof(int32_t));
    for (int r = 0; r < w; r++) {
        int member = 0;
        for (int i = 0; i < p; i++)
            member |= want[i] == r;
        T_EXPECT(h[r] == member, "[%s] %s: allreduce sum reached rank %d %d times, want %d",
                 c->name, t->name, r, h[r], member);
        T_EXPECT(h2[r] == (member ? r + 1 : 0), "[%s] %s: allreduce max [%d] = %d", c->name,
                 t->name, r, h2[r]);
    }
    rt_free(d);
    rt_free(d2);
    free(h);
    free(h2);

    /* allgather of the global rank: the members in group order */
    int64_t mine = me, *all = t_alloc((size_t)p * sizeof(int64_t));
    int64_t *dm = t_to_dev(&mine, sizeof mine), *da = t_to_dev(all, (size_t)p * sizeof(int64_t));
    rt_allgather(dm, da, 1, RT_I64, g);
    t_to_host(all, da, (size_t)p * sizeof(int64_t));
    for (int i = 0; i < p; i++)
        T_EXPECT(all[i] == want[i], "[%s] %s: allgather [%d] = %lld, want %d", c->name, t->name,
                 i, (long long)all[i], want[i]);

    /* broadcast from every root */
    for (int root = 0; root < p; root++) {
        int64_t v = me;
        rt_memcpy(dm, &v, sizeof v, RT_H2D);
        rt_broadcast(dm, 1, RT_I64, root, g);
        t_to_host(&v, dm, sizeof v);
        T_EXPECT(v == want[root], "[%s] %s: broadcast from %d gave %lld, want %d", c->name,
                 t->name, root, (long long)v, want[root]);
    }

    /* reduce-scatter: block b of member m holds (global(m)+1) * (b+1) */
    float *s = t_alloc((size_t)p * sizeof(float)), got = 0;
    for (int b = 0; b < p; b++)
        s[b] = (float)((me + 1) * (b + 1));
    float *ds = t_to_dev(s, (size_t)p * sizeof(float)), *dr = t_to_dev(&got, sizeof got);
    rt_reduce_scatter(ds, dr, 1, RT_F32, g);
    t_to_host(&got, dr, sizeof got);
    double sum = 0;
    for (int i = 0; i < p; i++)
        sum += want[i] + 1;
    T_EXPECT(got == (float)(sum * (col + 1)), "[%s] %s: reduce-scatter gave %g, want %g",
             c->name, t->name, got, sum * (col + 1));

    /* alltoallv: one element to every member b: global(me) * 1000 + b */
    size_t *cnt = t_alloc((size_t)p * sizeof(size_t)), *dis = t_alloc((size_t)p * sizeof(size_t));
    int32_t *a2 = t_alloc((size_t)p * sizeof(int32_t));
    for (int b = 0; b < p; b++) {
        cnt[b] = 1;
        dis[b] = (size_t)b;
        a2[b] = me * 1000 + b;
    }
    int32_t *da2 = t_to_dev(a2, (size_t)p * sizeof(int32_t));
    int32_t *dr2 = t_to_dev(a2, (size_t)p * sizeof(int32_t));
    rt_alltoallv(da2, cnt, dis, dr2, cnt, dis, RT_I32, g);
    t_to_host(a2, dr2, (size_t)p * sizeof(int32_t));
    for (int a = 0; a < p; a++)
        T_EXPECT(a2[a] == want[a] * 1000 + col, "[%s] %s: alltoallv from %d gave %d, want %d",
                 c->name, t->name, a, a2[a], want[a] * 1000 + col);
    rt_barrier(g);

    rt_free(dm);
    rt_free(da);
    rt_free(ds);
    rt_free(dr);
    rt_free(da2);
    rt_free(dr2);
    free(all);
    free(s);
    free(cnt);
    free(dis);
    free(a2);
    rt_group_free(g);
}

int main(int argc, char **argv)
{
    rt_init(&argc, &argv, 0, NULL);
    int ran = 0;
    for (int k = 0; k < t_nconfigs; k++) {
        const t_config *c = &t_configs[k];
        if (c->world != rt_world() || (argc > 1 && strcmp(argv[1], c->name) != 0))
            continue;
        for (int i = 0; i < c->ntables; i++)
            check_kind(c, &c->tables[i]);
        ran++;
    }
    T_EXPECT(ran > 0, "no configuration for world %d%s%s", rt_world(), argc > 1 ? " named " : "",
             argc > 1 ? argv[1] : "");
    int bad = t_finish("groups");
    rt_finalize();
    return bad;
}
