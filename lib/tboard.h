/*
** tboard.h: TensorBoard event files (lib/tboard.c) and whole-or-nothing appends.
*/
#ifndef LIB_TBOARD_H
#define LIB_TBOARD_H

#include <stddef.h>

/* The largest event we write (a step's scalars): bytes of its serialized protocol buffer. */
#define LIB_TB_MAX 1024

typedef struct {
    const char *tag;          /* TensorBoard's name of the series ("lm loss", ...) */
    double value;             /* stored as a float, as TensorBoard's simple_value is */
} lib_tb_value;

/* Append 'n' bytes to 'fd' whole or not at all: a write that fails part-way (a full disk) is
** cut back to where it started. Returns 0 or the errno. */
int lib_append_whole(int fd, const void *buf, size_t n);

/* Create 'dir' if it is missing and a new event file in it (its name in 'path'), with the
** file_version event at 'wall' (seconds since the epoch) and, when 'start' > 0 (a resumed run),
** a SessionLog START at step 'start'. Returns its descriptor, or -1 with errno set. */
int lib_tb_open(const char *dir, double wall, long long start, char *path, size_t cap);

/* One event at 'step' holding the 'n' scalars of 'v'. Returns 0 or an errno. */
int lib_tb_scalars(int fd, double wall, long long step, const lib_tb_value *v, int n);

#endif
