/*
** t_tables.h: the shape of the group-table fixtures t_groups checks: named configurations,
** each a world size and the table (t_table) of every group kind. Defined by tables.c
** (hand-written) or by a file tests/runtime/topo2c.lua converts from the generator's
** topology.json.
*/
#ifndef T_TABLES_H
#define T_TABLES_H

#include "t_util.h"   // defines: t_table

typedef struct {
    const char           *name;      /* "tp2 pp2 dp2" */
    int                   world;
    int                   ntables;
    const t_table        *tables;
} t_config;

extern const t_config t_configs[];
extern const int      t_nconfigs;

#endif
