/*
** plot: draw the JSONL logs of one or several training runs (train --log FILE) as one SVG
** picture: a panel per quantity (by default the loss with the validation loss, the learning
** rate, the gradient norm and the throughput), one colour per run, the step on the x axis.
** Any number a log line holds can be a panel (--panels). A null (a skipped step's loss) breaks
** the line. The picture is written whole or not at all (FILE.tmp, then renamed).
*/
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The picture's geometry, in SVG user units (pixels). */
enum {
    PANEL_W = 460, PANEL_H = 290,       /* one panel, its axes' labels included */
    PAD_L = 64, PAD_R = 16, PAD_T = 28, PAD_B = 36,   /* plot area inside a panel */
    COLS = 2, HEAD_H = 40, LEGEND_ROW = 18, NTICKS = 5,
    MAX_RUNS = 10, MAX_PANELS = 8,
};
#define Y_ROOM 0.04         /* share of a panel's value range added below and above */

/* One colour per run (the first ten of the usual qualitative palette). */
static const char *const palette[MAX_RUNS] = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
};

/* A panel: the log key it draws, its title, and a second key drawn dashed with points in the
** same panel (the validation loss beside the loss), or NULL. */
typedef struct { const char *key, *title, *extra; } panel;

static const panel known_panels[] = {
    { "loss", "loss", "eval_loss" },
    { "lr", "learning rate", NULL },
    { "grad_norm", "gradient norm", NULL },
    { "tok_s", "throughput (tokens/s)", NULL },
    { "tflops", "TFLOP/s per device", NULL },
    { "mfu", "model FLOPs utilisation", NULL },
    { "eval_loss", "validation loss", NULL },
    { "eval_ppl", "validation perplexity", NULL },
};

typedef struct { double *x, *y; int n, cap; } series;    /* y NaN: a gap */

typedef struct {
    const char *path;
    char label[64];
    series s[MAX_PANELS], extra[MAX_PANELS];
} run;

static const char *progname = "plot";
static const char *tmp_path;        /* removed when we die: nothing half-written remains */

static void die(const char *fmt, ...)
{
    va_list ap;
    if (tmp_path) remove(tmp_path);
    fprintf(stderr, "%s: error: ", progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: %s [-o OUT.svg] [--title T] [--panels K1,K2,...] RUN.jsonl [RUN.jsonl ...]\n"
        "  Draws the --log files of training runs (up to %d) as one SVG picture.\n"
        "  -o FILE        the picture (default plot.svg; '-': standard output)\n"
        "  --title T      its title (default: the runs' file names)\n"
        "  --panels LIST  the log keys to draw, one panel each (at most %d; default\n"
        "                 loss,lr,grad_norm,tok_s; 'loss' also draws eval_loss)\n",
        progname, MAX_RUNS, MAX_PANELS);
}

static void push(series *s, double x, double y)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->x = realloc(s->x, (size_t)s->cap * sizeof *s->x);
        s->y = realloc(s->y, (size_t)s->cap * sizeof *s->y);
        if (!s->x || !s->y) die("out of memory");
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
}

/* Key 'key' of the log line 'o' into s at step x: a number, a null (a gap), or absent. */
static void take(series *s, json_t *o, const char *key, double x, const char *where)
{
    json_t *v = json_object_get(o, key);
    if (!v) return;
    if (json_is_number(v)) push(s, x, json_number_value(v));
    else if (json_is_null(v)) push(s, x, NAN);
    else die("%s: \"%s\" is not a number", where, key);
}

static void read_run(run *r, const panel *const *pn, int np)
{
    FILE *f = fopen(r->path, "r");
    if (!f) die("cannot open %s: %s", r->path, strerror(errno));
    char *line = NULL, where[512];
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, steps = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        snprintf(where, sizeof where, "%s:%d", r->path, lineno);
        if (strspn(line, " \t\r\n") == (size_t)len) continue;
        json_error_t err;
        json_t *o = json_loadb(line, (size_t)len, JSON_DECODE_INT_AS_REAL, &err);
        if (!o) die("%s: not JSON: %s (a log written by train --log holds one object a line)",
                    where, err.text);
        if (!json_is_object(o)) die("%s: not a JSON object", where);
        json_t *st = json_object_get(o, "step");
        if (!json_is_number(st)) die("%s: no \"step\" number", where);
        double x = json_number_value(st);
        for (int k = 0; k < np; k++) {
            take(&r->s[k], o, pn[k]->key, x, where);
            if (pn[k]->extra) take(&r->extra[k], o, pn[k]->extra, x, where);
        }
        steps++;
        json_decref(o);
    }
    if (ferror(f)) die("cannot read %s: %s", r->path, strerror(errno));
    free(line);
    fclose(f);
    if (!steps) die("%s: no log lines", r->path);
}

/* -- Axes -------------------------------------------------------------------------------------- */

typedef struct { double lo, hi; } range;

static void widen(range *g, const series *s)
{
    for (int i = 0; i < s->n; i++) {
        if (!isfinite(s->y[i])) continue;
        if (s->y[i] < g->lo) g->lo = s->y[i];
        if (s->y[i] > g->hi) g->hi = s->y[i];
    }
}

/* The tick spacing of about NTICKS ticks over g: 1, 2 or 5 times a power of ten. */
static double tick_step(range g)
{
    double raw = (g.hi - g.lo) / NTICKS, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* A range that can be drawn: a single value gets room around it. */
static range padded(range g)
{
    if (g.lo > g.hi) return (range){ 0, 1 };
    if (g.hi - g.lo <= 1e-12 * fmax(fabs(g.lo), fabs(g.hi))) {
        double d = g.lo != 0 ? fabs(g.lo) * 0.05 : 1;
        return (range){ g.lo - d, g.hi + d };
    }
    return g;
}

static double map(double v, range g, double a, double b)
{
    return a + (v - g.lo) / (g.hi - g.lo) * (b - a);
}

/* -- Drawing ----------------------------------------------------------------------------------- */

static void text_escaped(FILE *o, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", o); break;
        case '>': fputs("&gt;", o); break;
        case '&': fputs("&amp;", o); break;
        case '"': fputs("&quot;", o); break;
        default: fputc(*s, o);
        }
    }
}

/* s as polylines (split at gaps) in the plot area (x0, y0)-(x1, y1) of ranges gx, gy. The
** coordinates carry two decimals: the values read back to 1/100 of a pixel. */
static void draw_series(FILE *o, const series *s, range gx, range gy, double x0, double y0,
                        double x1, double y1, const char *colour, int dashed)
{
    int open = 0;
    for (int i = 0; i <= s->n; i++) {
        int ok = i < s->n && isfinite(s->y[i]);
        if (ok && !open) {
            fprintf(o, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s "
                    "points=\"", dashed ? "extra" : "main", colour,
                    dashed ? " stroke-dasharray=\"5,3\"" : "");
            open = 1;
        } else if (!ok && open) {
            fputs("\"/>\n", o);
            open = 0;
        }
        if (ok) fprintf(o, "%s%.2f,%.2f", open == 2 ? " " : "", map(s->x[i], gx, x0, x1),
                        map(s->y[i], gy, y1, y0)), open = 2;
    }
    if (dashed)
        for (int i = 0; i < s->n; i++)
            if (isfinite(s->y[i]))
                fprintf(o, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2.5\" fill=\"%s\"/>\n",
                        map(s->x[i], gx, x0, x1), map(s->y[i], gy, y1, y0), colour);
}

static void draw_panel(FILE *o, const panel *p, int k, const run *runs, int nruns, double px,
                       double py)
{
    range gx = { INFINITY, -INFINITY }, gy = { INFINITY, -INFINITY };
    int points = 0, extras = 0;
    for (int r = 0; r < nruns; r++) {
        extras |= runs[r].extra[k].n > 0;
        const series *both[2] = { &runs[r].s[k], &runs[r].extra[k] };
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < both[j]->n; i++) {
                if (!isfinite(both[j]->y[i])) continue;
                points++;
                if (both[j]->x[i] < gx.lo) gx.lo = both[j]->x[i];
                if (both[j]->x[i] > gx.hi) gx.hi = both[j]->x[i];
            }
        widen(&gy, both[0]);
        widen(&gy, both[1]);
    }
    double x0 = px + PAD_L, x1 = px + PANEL_W - PAD_R, y0 = py + PAD_T, y1 = py + PANEL_H - PAD_B;
    fprintf(o, "<g class=\"panel\" data-key=\"%s\">\n<text x=\"%.1f\" y=\"%.1f\" "
            "font-weight=\"bold\">", p->key, x0, py + 18.0);
    text_escaped(o, p->title);
    if (extras) fputs(" (dashed, points: validation)", o);
    fputs("</text>\n", o);
    fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#999\"/>\n", x0, y0, x1 - x0, y1 - y0);
    if (!points) {
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#999\">no "
                "\"%s\" in these logs</text>\n</g>\n", (x0 + x1) / 2, (y0 + y1) / 2, p->key);
        return;
    }
    gx = padded(gx);
    gy = padded(gy);
    double room = (gy.hi - gy.lo) * Y_ROOM;     /* the lines clear the frame */
    gy.lo -= room;
    gy.hi += room;
    /* the ranges the data map to, for a reader of the picture (and the tests) */
    fprintf(o, "<desc>x %.17g %.17g y %.17g %.17g area %.2f %.2f %.2f %.2f</desc>\n", gx.lo,
            gx.hi, gy.lo, gy.hi, x0, y0, x1, y1);
    for (int axis = 0; axis < 2; axis++) {
        range g = axis ? gy : gx;
        double d = tick_step(g);
        for (double t = ceil(g.lo / d) * d; t <= g.hi + d * 1e-9; t += d) {
            double v = fabs(t) < d * 1e-9 ? 0 : t;      /* no "-0" or "1e-17" at zero */
            if (axis)
                fprintf(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#eee\"/>"
                        "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\" font-size=\"11\">%.6g"
                        "</text>\n", x0, map(v, g, y1, y0), x1, map(v, g, y1, y0), x0 - 4,
                        map(v, g, y1, y0) + 4, v);
            else
                fprintf(o, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#eee\"/>"
                        "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" font-size=\"11\">%.6g"
                        "</text>\n", map(v, g, x0, x1), y0, map(v, g, x0, x1), y1,
                        map(v, g, x0, x1), y1 + 14, v);
        }
    }
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\">step</text>\n",
            (x0 + x1) / 2, y1 + 28);
    for (int r = 0; r < nruns; r++) {
        draw_series(o, &runs[r].s[k], gx, gy, x0, y0, x1, y1, palette[r], 0);
        draw_series(o, &runs[r].extra[k], gx, gy, x0, y0, x1, y1, palette[r], 1);
    }
    fputs("</g>\n", o);
}

static void draw(FILE *o, const char *title, const panel *const *pn, int np, const run *runs,
                 int nruns)
{
    int rows = (np + COLS - 1) / COLS;
    int head = HEAD_H + LEGEND_ROW * ((nruns + 1) / 2);
    int w = COLS * PANEL_W, h = head + rows * PANEL_H;
    fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"13\">\n"
            "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n<text x=\"%d\" y=\"24\" "
            "font-size=\"16\" font-weight=\"bold\">", w, h, w, h, w, h, PAD_L);
    text_escaped(o, title);
    fputs("</text>\n", o);
    for (int r = 0; r < nruns; r++) {
        int lx = PAD_L + (r % 2) * PANEL_W, ly = HEAD_H + LEGEND_ROW * (r / 2);
        fprintf(o, "<g class=\"legend\"><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" "
                "stroke=\"%s\" stroke-width=\"3\"/><text x=\"%d\" y=\"%d\">", lx, ly - 4,
                lx + 20, ly - 4, palette[r], lx + 26, ly);
        text_escaped(o, runs[r].label);
        fputs("</text></g>\n", o);
    }
    for (int k = 0; k < np; k++)
        draw_panel(o, pn[k], k, runs, nruns, (double)(k % COLS) * PANEL_W,
                   (double)head + (double)(k / COLS) * PANEL_H);
    fputs("</svg>\n", o);
}

/* -- Main -------------------------------------------------------------------------------------- */

/* The panel of key (one of known_panels, or a plain one titled by its key). */
static const panel *panel_of(const char *key, panel *plain)
{
    for (size_t i = 0; i < sizeof known_panels / sizeof known_panels[0]; i++)
        if (!strcmp(known_panels[i].key, key)) return &known_panels[i];
    *plain = (panel){ key, key, NULL };
    return plain;
}

int main(int argc, char **argv)
{
    const char *out = "plot.svg", *title = NULL;
    char *panels = NULL;
    run runs[MAX_RUNS] = { 0 };
    int nruns = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--title") || !strcmp(a, "--panels")) {
            if (i + 1 >= argc) die("%s needs a value (try '%s --help')", a, progname);
            const char *v = argv[++i];
            if (!strcmp(a, "-o")) out = v;
            else if (!strcmp(a, "--title")) title = v;
            else panels = strdup(v);
        } else if (a[0] == '-' && a[1]) {
            die("unknown option '%s' (try '%s --help')", a, progname);
        } else {
            if (nruns == MAX_RUNS) die("at most %d runs in one picture", MAX_RUNS);
            runs[nruns].path = a;
            const char *base = strrchr(a, '/') ? strrchr(a, '/') + 1 : a;
            snprintf(runs[nruns].label, sizeof runs[nruns].label, "%s", base);
            char *dot = strstr(runs[nruns].label, ".jsonl");
            if (dot && dot != runs[nruns].label && !dot[6]) *dot = 0;
            nruns++;
        }
    }
    if (!nruns) {
        usage(stderr);
        return 2;
    }
    const panel *pn[MAX_PANELS];
    panel plain[MAX_PANELS];
    int np = 0;
    char *list = panels ? panels : strdup("loss,lr,grad_norm,tok_s"), *save = NULL;
    for (char *k = strtok_r(list, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        if (np == MAX_PANELS) die("--panels: at most %d panels", MAX_PANELS);
        if (!*k) continue;
        pn[np] = panel_of(k, &plain[np]);
        np++;
    }
    if (!np) die("--panels: no key given");
    for (int r = 0; r < nruns; r++) read_run(&runs[r], pn, np);
    int any = 0;
    for (int r = 0; r < nruns; r++)
        for (int k = 0; k < np; k++) any |= runs[r].s[k].n > 0 || runs[r].extra[k].n > 0;
    if (!any) die("none of the panels' keys (--panels) is in the logs");

    char deftitle[512] = "";
    if (!title) {
        for (int r = 0; r < nruns; r++)
            snprintf(deftitle + strlen(deftitle), sizeof deftitle - strlen(deftitle), "%s%s",
                     r ? ", " : "", runs[r].label);
        title = deftitle;
    }
    FILE *o = stdout;
    char *tmp = NULL;
    if (strcmp(out, "-")) {
        tmp = malloc(strlen(out) + 5);
        if (!tmp) die("out of memory");
        sprintf(tmp, "%s.tmp", out);
        o = fopen(tmp, "w");
        if (!o) die("cannot write %s: %s", tmp, strerror(errno));
        tmp_path = tmp;
    }
    draw(o, title, pn, np, runs, nruns);
    if (o != stdout) {
        if (ferror(o) | fclose(o)) die("cannot write %s: %s", tmp, strerror(errno));
        if (rename(tmp, out)) die("cannot rename %s to %s: %s", tmp, out, strerror(errno));
        tmp_path = NULL;
    } else if (fflush(o) || ferror(o)) {
        die("cannot write standard output: %s", strerror(errno));
    }
    return 0;
}
