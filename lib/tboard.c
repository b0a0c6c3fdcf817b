/*
** tboard.c: TensorBoard's event files (--tensorboard-dir), written by rank 0 as the step's log
** line is. A file is a sequence of records: the data's length (uint64, little-endian), its
** masked CRC-32C, the data, its masked CRC-32C; each record's data is one serialized
** tensorflow.Event protocol buffer. We write three kinds: the first (wall_time, step 0,
** file_version "brain.Event:2"), a SessionLog START when a run resumes (TensorBoard then drops
** what an earlier run logged from that step on), and one per step with a Summary of simple
** scalar values. The protocol buffer encoding is written out here (varints, fixed64 doubles,
** fixed32 floats, length-delimited fields): the messages are small and fixed. Each record goes
** out in one write, whole or not at all (lib_append_whole).
*/
#define _GNU_SOURCE
#include "tboard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* -- Writing whole ----------------------------------------------------------------------------- */

int lib_append_whole(int fd, const void *buf, size_t n)
{
    off_t at = lseek(fd, 0, SEEK_END);
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int why = w < 0 ? errno : ENOSPC;
            if (at >= 0 && ftruncate(fd, at)) { /* the cut failed too: the record stays cut */ }
            return why;
        }
        done += (size_t)w;
    }
    return 0;
}

/* -- Records ----------------------------------------------------------------------------------- */

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: records are small. */
static uint32_t crc32c(const unsigned char *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    }
    return ~c;
}

/* TFRecord's masking of a CRC, so that a CRC of data holding CRCs is not degenerate. */
static uint32_t masked(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* One record around the 'n' bytes of 'data' (n <= LIB_TB_MAX), written whole. */
static int record(int fd, const unsigned char *data, size_t n)
{
    unsigned char rec[12 + LIB_TB_MAX + 4];
    le(rec, n, 8);
    le(rec + 8, masked(crc32c(rec, 8)), 4);
    memcpy(rec + 12, data, n);
    le(rec + 12 + n, masked(crc32c(data, n)), 4);
    return lib_append_whole(fd, rec, 12 + n + 4);
}

/* -- Protocol buffers -------------------------------------------------------------------------- */

typedef struct { unsigned char b[LIB_TB_MAX]; size_t n; int over; } pb;

static void put(pb *m, const void *p, size_t n)
{
    if (m->over || m->n + n > sizeof m->b) { m->over = 1; return; }
    memcpy(m->b + m->n, p, n);
    m->n += n;
}

static void varint(pb *m, uint64_t v)
{
    unsigned char t[10];
    int k = 0;
    do {
        t[k] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) t[k] |= 0x80;
        k++;
    } while (v);
    put(m, t, (size_t)k);
}

static void key(pb *m, int field, int wire) { varint(m, (uint64_t)field << 3 | (uint64_t)wire); }

/* A fixed-width field: 8 bytes (wire type 1: a double) or 4 (wire type 5: a float). */
static void fixed(pb *m, int field, uint64_t bits, int bytes)
{
    unsigned char t[8];
    le(t, bits, bytes);
    key(m, field, bytes == 8 ? 1 : 5);
    put(m, t, (size_t)bytes);
}

static void f_double(pb *m, int field, double x)
{
    uint64_t u;
    memcpy(&u, &x, 8);
    fixed(m, field, u, 8);
}

static void f_float(pb *m, int field, float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    fixed(m, field, u, 4);
}

static void f_bytes(pb *m, int field, const void *p, size_t n)
{
    key(m, field, 2);
    varint(m, n);
    put(m, p, n);
}

/* Event: wall_time 1 (double), step 2 (int64), file_version 3 (string), summary 5 (Summary),
** session_log 6 (SessionLog). */
static void event_head(pb *e, double wall, long long step)
{
    f_double(e, 1, wall);
    key(e, 2, 0);
    varint(e, (uint64_t)step);
}

static int event_write(int fd, const pb *e)
{
    return e->over ? EMSGSIZE : record(fd, e->b, e->n);
}

/* -- The file ---------------------------------------------------------------------------------- */

int lib_tb_open(const char *dir, double wall, long long start, char *path, size_t cap)
{
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    if (mkdir(dir, 0777) && errno != EEXIST) return -1;
    /* TensorBoard reads the files whose names hold "tfevents", in name order */
    int n = snprintf(path, cap, "%s/events.out.tfevents.%010lld.%s.%ld.gpt", dir,
                     (long long)wall, host, (long)getpid());
    if (n < 0 || (size_t)n >= cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    pb e = { .n = 0 };
    event_head(&e, wall, start);
    f_bytes(&e, 3, "brain.Event:2", 13);
    int err = event_write(fd, &e);
    if (!err && start > 0) {    /* a resumed run: SessionLog{status 1: START} */
        pb s = { .n = 0 }, l = { .n = 0 };
        key(&l, 1, 0);
        varint(&l, 1);
        event_head(&s, wall, start);
        f_bytes(&s, 6, l.b, l.n);
        err = event_write(fd, &s);
    }
    if (err) {
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

int lib_tb_scalars(int fd, double wall, long long step, const lib_tb_value *v, int n)
{
    pb sum = { .n = 0 }, e = { .n = 0 };
    for (int i = 0; i < n; i++) {   /* Summary.value 1: Value{tag 1, simple_value 2} */
        pb val = { .n = 0 };
        f_bytes(&val, 1, v[i].tag, strlen(v[i].tag));
        f_float(&val, 2, (float)v[i].value);
        if (val.over) sum.over = 1;
        f_bytes(&sum, 1, val.b, val.n);
    }
    if (sum.over) return EMSGSIZE;
    event_head(&e, wall, step);
    f_bytes(&e, 5, sum.b, sum.n);
    return event_write(fd, &e);
}
