/*
 * svg.c — the tiny SVG toolkit the HTML report draws with: a chart frame (axes, "nice" ticks,
 * grid, unit-named labels), data-to-pixel scales, escaping and the palette. Charts are inline
 * SVG with <title> tooltips only: no script, so the page cannot raise console errors and works
 * offline in any browser.
 */
#include "report/svg.h"

#include <math.h>
#include <string.h>

static const char *const kind_colors[MW_REPORT_NKINDS] = {
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#bab0ac"};
static const char *const phase_colors[MW_PHASE_COUNT] = {
    "#ffffff", "#dbe9f6", "#fde3c8", "#dcefd8", "#eeeeee", "#efe0f0"};
static const char *const pair_colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"};

const char *rp_kind_color(int kind) { return kind_colors[kind >= 0 && kind < MW_REPORT_NKINDS ? kind : 6]; }
const char *rp_phase_color(int phase) { return phase_colors[phase >= 0 && phase < MW_PHASE_COUNT ? phase : 0]; }
const char *rp_pair_color(int pair) { return pair_colors[(pair < 0 ? 0 : pair) % 6]; }
/* allreduce, reduce_scatter, allgather, comm wait: apart from the tier-pair colours. */
static const char *const comm_colors[RP_COMM_WAIT + 1] = {"#17becf", "#bcbd22", "#7f7f7f", "#ff7f0e"};
const char *rp_comm_color(int op) { return comm_colors[op >= 0 && op <= RP_COMM_WAIT ? op : 0]; }

void rp_esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

double rp_nice_step(double range, int target)
{
    if (!(range > 0)) return 1;
    double raw = range / target, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

double rp_cx(const struct rp_chart *c, double x)
{
    double w = c->w - c->ml - c->mr;
    return c->ml + (c->x1 > c->x0 ? (x - c->x0) / (c->x1 - c->x0) * w : 0);
}

double rp_cy(const struct rp_chart *c, double y)
{
    double h = c->h - c->mt - c->mb;
    double v = c->y1 > c->y0 ? (y - c->y0) / (c->y1 - c->y0) : 0;
    if (v < 0) v = 0;
    if (v > 1.02) v = 1.02;
    return c->h - c->mb - v * h;
}

static void fmt_tick(char *b, size_t n, double v, double step)
{
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (dec > 6) dec = 6;
    snprintf(b, n, "%.*f", dec, fabs(v) < step * 1e-6 ? 0.0 : v);
}

void rp_chart_begin(struct rp_chart *c, const char *title)
{
    FILE *f = c->f;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "role=\"img\"><title>", c->w, c->h, c->w, c->h);
    rp_esc(f, title);
    fprintf(f, "</title>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" stroke=\"#ccc\"/>\n",
            c->ml, c->mt, c->w - c->ml - c->mr, c->h - c->mt - c->mb);
}

void rp_chart_axes(struct rp_chart *c)
{
    FILE *f = c->f;
    char b[32];
    if (!c->no_x) {
        double st = rp_nice_step(c->x1 - c->x0, 8);
        for (double x = ceil(c->x0 / st) * st; x <= c->x1 + st * 1e-9; x += st) {
            double px = rp_cx(c, x);
            fmt_tick(b, sizeof b, x * c->x_scale, st * c->x_scale);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/>"
                       "<text x=\"%.1f\" y=\"%d\" class=\"tk\" text-anchor=\"middle\">%s</text>\n",
                    px, c->mt, px, c->h - c->mb, px, c->h - c->mb + 14, b);
        }
        fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"ax\" text-anchor=\"end\">", c->w - c->mr, c->h - 4);
        rp_esc(f, c->xlabel);
        fputs("</text>\n", f);
    }
    if (!c->no_y) {
        double st = rp_nice_step(c->y1 - c->y0, 5);
        for (double y = ceil(c->y0 / st) * st; y <= c->y1 + st * 1e-9; y += st) {
            double py = rp_cy(c, y);
            fmt_tick(b, sizeof b, y, st);
            fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\" stroke-dasharray=\"2,3\"/>"
                       "<text x=\"%d\" y=\"%.1f\" class=\"tk\" text-anchor=\"end\">%s</text>\n",
                    c->ml, py, c->w - c->mr, py, c->ml - 4, py + 4, b);
        }
        fprintf(f, "<text x=\"12\" y=\"%d\" class=\"ax\" transform=\"rotate(-90 12 %d)\" text-anchor=\"end\">",
                c->mt + 4, c->mt + 4);
        rp_esc(f, c->ylabel);
        fputs("</text>\n", f);
    }
}

void rp_chart_end(struct rp_chart *c)
{
    fputs("</svg>\n", c->f);
}

void rp_legend(FILE *f, const char *const *names, const char *const *colors, int n)
{
    fputs("<div class=\"legend\">", f);
    for (int i = 0; i < n; i++) {
        if (!names[i]) continue;
        fprintf(f, "<span><i style=\"background:%s\"></i>", colors[i]);
        rp_esc(f, names[i]);
        fputs("</span>", f);
    }
    fputs("</div>\n", f);
}

/* Binary units for byte axes, decimal for rates; returns the divisor and sets the unit name. */
double rp_bytes_unit(double max, const char **unit)
{
    if (max >= 0.5 * (double)(1ull << 30)) { *unit = "GiB"; return (double)(1ull << 30); }
    if (max >= 0.5 * (double)(1ull << 20)) { *unit = "MiB"; return (double)(1ull << 20); }
    *unit = "KiB";
    return 1024.0;
}

double rp_rate_unit(double max, const char **unit)
{
    if (max >= 0.5e9) { *unit = "GB/s"; return 1e9; }
    if (max >= 0.5e6) { *unit = "MB/s"; return 1e6; }
    *unit = "kB/s";
    return 1e3;
}
