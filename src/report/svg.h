/*
 * svg.h — helpers shared by the HTML report's chart writers (svg.c). Not a public header.
 */
#ifndef MEMWALL_REPORT_SVG_H
#define MEMWALL_REPORT_SVG_H

#include "report/report_internal.h"

#include <stdio.h>

struct rp_chart {
    FILE *f;
    int w, h;                 /* px */
    int ml, mr, mt, mb;       /* margins, px */
    double x0, x1, y0, y1;    /* data ranges */
    double x_scale;           /* tick label = x * x_scale (e.g. 1e3 for ms) */
    const char *xlabel, *ylabel; /* with their units */
    int no_x, no_y;           /* skip an axis */
};

void rp_esc(FILE *f, const char *s);
double rp_nice_step(double range, int target);
double rp_cx(const struct rp_chart *c, double x);
double rp_cy(const struct rp_chart *c, double y);
void rp_chart_begin(struct rp_chart *c, const char *title);
void rp_chart_axes(struct rp_chart *c);
void rp_chart_end(struct rp_chart *c);
void rp_legend(FILE *f, const char *const *names, const char *const *colors, int n);
double rp_bytes_unit(double max, const char **unit);
double rp_rate_unit(double max, const char **unit);

#endif
