/*
 * intervals.c — sorted, disjoint interval lists: the arithmetic behind "compute time",
 * "I/O busy", "exposed wait" and "overlap" (unions, differences and intersections of spans),
 * so each definition in docs/report.md is one line of set algebra in analyze.c.
 */
#include "report/report_internal.h"

#include <errno.h>
#include <stdlib.h>

int rp_ivls_push(struct rp_ivls *l, double a, double b)
{
    if (!(b > a)) return 0; /* empty (or NaN) intervals carry no time */
    if (rp_grow((void **)&l->v, &l->cap, l->n, sizeof *l->v)) return -ENOMEM;
    l->v[l->n].a = a;
    l->v[l->n].b = b;
    l->n++;
    return 0;
}

static int cmp_ivl(const void *x, const void *y)
{
    const struct rp_ivl *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a ? 1 : 0;
}

void rp_ivls_normalize(struct rp_ivls *l)
{
    if (l->n < 2) return;
    int sorted = 1;
    for (size_t i = 1; i < l->n && sorted; i++) sorted = l->v[i - 1].a <= l->v[i].a;
    if (!sorted) qsort(l->v, l->n, sizeof *l->v, cmp_ivl);
    size_t w = 0;
    for (size_t i = 1; i < l->n; i++) {
        if (l->v[i].a <= l->v[w].b) {
            if (l->v[i].b > l->v[w].b) l->v[w].b = l->v[i].b;
        } else l->v[++w] = l->v[i];
    }
    l->n = w + 1;
}

int rp_ivls_subtract(const struct rp_ivls *x, const struct rp_ivls *y, struct rp_ivls *out)
{
    size_t j = 0;
    for (size_t i = 0; i < x->n; i++) {
        double a = x->v[i].a, b = x->v[i].b;
        while (j < y->n && y->v[j].b <= a) j++;
        size_t k = j;
        while (k < y->n && y->v[k].a < b) {
            if (y->v[k].a > a && rp_ivls_push(out, a, y->v[k].a)) return -ENOMEM;
            if (y->v[k].b > a) a = y->v[k].b;
            if (a >= b) break;
            k++;
        }
        if (a < b && rp_ivls_push(out, a, b)) return -ENOMEM;
    }
    return 0;
}

int rp_ivls_intersect(const struct rp_ivls *x, const struct rp_ivls *y, struct rp_ivls *out)
{
    size_t i = 0, j = 0;
    while (i < x->n && j < y->n) {
        double a = MW_MAX(x->v[i].a, y->v[j].a), b = MW_MIN(x->v[i].b, y->v[j].b);
        if (a < b && rp_ivls_push(out, a, b)) return -ENOMEM;
        if (x->v[i].b < y->v[j].b) i++;
        else j++;
    }
    return 0;
}

double rp_ivls_total(const struct rp_ivls *l)
{
    double s = 0;
    for (size_t i = 0; i < l->n; i++) s += l->v[i].b - l->v[i].a;
    return s;
}

double rp_ivls_measure_in(const struct rp_ivls *l, double a, double b, size_t *cursor)
{
    size_t i = *cursor;
    while (i > 0 && l->v[i - 1].b > a) i--; /* windows may step back a little */
    while (i < l->n && l->v[i].b <= a) i++;
    *cursor = i;
    double s = 0;
    for (size_t k = i; k < l->n && l->v[k].a < b; k++)
        s += MW_MIN(b, l->v[k].b) - MW_MAX(a, l->v[k].a);
    return s;
}

void rp_ivls_free(struct rp_ivls *l)
{
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}
