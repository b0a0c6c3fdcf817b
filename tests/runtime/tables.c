/*
** tables.c: hand-written group tables for t_groups, worked out on paper from the rank
** order tp-cp-ep-dp-pp (rank = tp + TP * (dp + DP * pp)) (docs/megatron.md §1), plus
** kinds that exercise the corners: ranks in no group (embd on middle stages), size-1
** groups, a row listed out of ascending order.
*/
#include "t_tables.h"   // defines: t_config

/* -- world 8: tp2 pp2 dp2 -------------------------------------------------------------------- */
static const int a_tp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
static const int a_dp[] = { 0, 2, 1, 3, 4, 6, 5, 7 };
static const int a_pp[] = { 0, 4, 1, 5, 2, 6, 3, 7 };
static const int a_mp[] = { 0, 1, 4, 5, 2, 3, 6, 7 };
static const int a_tpdp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
static const t_table a_tables[] = {
    { "tp", 4, 2, a_tp }, { "dp", 4, 2, a_dp }, { "pp", 4, 2, a_pp },
    { "embd", 4, 2, a_pp }, { "mp", 2, 4, a_mp }, { "tp-dp", 2, 4, a_tpdp },
};

/* -- world 8: tp1 pp8 (embd: first and last stage only) -------------------------------------- */
static const int b_tp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
static const int b_pp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
static const int b_embd[] = { 0, 7 };
static const int b_pos[] = { 0 };
static const t_table b_tables[] = {
    { "tp", 8, 1, b_tp }, { "dp", 8, 1, b_tp }, { "pp", 1, 8, b_pp },
    { "embd", 1, 2, b_embd }, { "pos-embd", 1, 1, b_pos },
};

/* -- world 8: tp4 pp2 ------------------------------------------------------------------------ */
static const int c_tp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
static const int c_pp[] = { 0, 4, 1, 5, 2, 6, 3, 7 };
static const int c_dp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
static const int c_last[] = { 4, 5, 6, 7 };
static const t_table c_tables[] = {
    { "tp", 2, 4, c_tp }, { "pp", 4, 2, c_pp }, { "dp", 8, 1, c_dp },
    { "last-stage-tp", 1, 4, c_last },
};

/* -- world 8: dp8 with a reversed ring --------------------------------------------------------- */
static const int d_dp[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
static const int d_rev[] = { 7, 6, 5, 4, 3, 2, 1, 0 };
static const int d_odd[] = { 1, 3, 5, 7 };
static const t_table d_tables[] = {
    { "dp", 1, 8, d_dp }, { "ring-rev", 1, 8, d_rev }, { "odd", 1, 4, d_odd },
};

/* -- world 4: tp2 dp2 ------------------------------------------------------------------------ */
static const int e_tp[] = { 0, 1, 2, 3 };
static const int e_dp[] = { 0, 2, 1, 3 };
static const int e_rev[] = { 3, 1, 2, 0 };
static const t_table e_tables[] = {
    { "tp", 2, 2, e_tp }, { "dp", 2, 2, e_dp }, { "shuffled", 1, 4, e_rev },
};

/* -- world 3: pp3 ---------------------------------------------------------------------------- */
static const int f_pp[] = { 0, 1, 2 };
static const int f_embd[] = { 0, 2 };
static const int f_dp[] = { 0, 1, 2 };
static const t_table f_tables[] = {
    { "pp", 1, 3, f_pp }, { "embd", 1, 2, f_embd }, { "dp", 3, 1, f_dp },
};

/* -- world 2: dp2, world 1 --------------------------------------------------------------------- */
static const int g_dp[] = { 0, 1 };
static const int g_tp[] = { 0, 1 };
static const t_table g_tables[] = { { "dp", 1, 2, g_dp }, { "tp", 2, 1, g_tp } };
static const int h_all[] = { 0 };
static const t_table h_tables[] = { { "tp", 1, 1, h_all }, { "dp", 1, 1, h_all } };

#define N(a) ((int)(sizeof a / sizeof a[0]))
const t_config t_configs[] = {
    { "tp2 pp2 dp2", 8, N(a_tables), a_tables },
    { "tp1 pp8 dp1", 8, N(b_tables), b_tables },
    { "tp4 pp2 dp1", 8, N(c_tables), c_tables },
    { "tp1 pp1 dp8", 8, N(d_tables), d_tables },
    { "tp2 pp1 dp2", 4, N(e_tables), e_tables },
    { "tp1 pp3 dp1", 3, N(f_tables), f_tables },
    { "tp1 pp1 dp2", 2, N(g_tables), g_tables },
    { "tp1 pp1 dp1", 1, N(h_tables), h_tables },
};
const int t_nconfigs = N(t_configs);
