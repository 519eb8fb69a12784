/*
 * memwall/foreign.h — a model family whose table is filled from a caller's description: the
 * "foreign" family (src/model/foreign.c) of issue 25, the seam through which a model that lives
 * in another framework (PyTorch: memwall.torch.offload) uses memwall's residency machine.
 *
 * Why a family and not a second code path: streaming, the optimizer, the planner's walk and the
 * order checks all read a model through its table (memwall/model.h): its flat arrays, its units
 * and the order a pass acquires them. A model whose passes run elsewhere has all of that except
 * the passes, so it fills exactly that part: units (ranges of one flat fp32 array, end to end in
 * flat order), their names, the forward and backward unit orders, the tensors (names and weight
 * decay), and where a unit's initial weights come from. The forward/backward, layer-major,
 * safetensors, Hugging Face and KV-cache entries refuse (-ENOTSUP, message set): the caller runs
 * the passes and reports each unit's acquire and release through mw_net_foreign_unit, which calls
 * the table's weights hook like a family's own pass would.
 *
 * The family is not in the registry (src/model/net.c): a command line cannot name it, and a
 * checkpoint cannot rebuild it (its config_decode refuses: the description is the caller's).
 *
 * Usage (src/pyapi/pysession.c does this through the residency factory):
 *     struct mw_foreign_desc d = {.n_units = 4, .unit_numel = n, .unit_names = names,
 *                                 .fwd_order = fwd, .n_fwd = 4, .bwd_order = bwd, .n_bwd = 4};
 *     struct mw_net_config c;
 *     mw_foreign_config(&c, &d);           // checked; c points at d until a net is built
 *     mw_net_init(&net, &c, &opts);         // the net keeps its own copy of d
 *     mw_net_foreign_unit(&net, MW_NET_UNIT_ACQUIRE, 0, 0);   // around each use of unit 0
 */
#ifndef MEMWALL_FOREIGN_H
#define MEMWALL_FOREIGN_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MW_FOREIGN_MAX_UNITS (1 << 20)
#define MW_FOREIGN_NAME_MAX 96 /* names, with their NUL (the optimizer's tensor names: MW_OFFLOAD_NAME_MAX) */

/* Writes unit `unit`'s n initial fp32 weights to dst (the unit's range of the model's params);
 * 0 or a negative code (set a message with mw_error_set, or one is made). */
typedef int (*mw_foreign_init_fn)(void *user, int unit, float *dst, uint64_t n);

/* One tensor of the flat array: tensors lie end to end in flat order, each inside one unit. */
struct mw_foreign_tensor {
    const char *name;  /* unique, 1..MW_FOREIGN_NAME_MAX-1 characters */
    uint64_t numel;    /* > 0 */
    int no_decay;      /* 1: AdamW's weight decay does not apply (biases, norms) */
};

struct mw_foreign_desc {
    int n_units;                     /* 1..MW_FOREIGN_MAX_UNITS */
    const uint64_t *unit_numel;      /* [n_units] elements of each unit (> 0), end to end in flat order */
    const char *const *unit_names;   /* [n_units] names for messages (NULL: "unit.<i>") */
    const int *fwd_order;            /* [n_fwd] units a forward pass acquires, in order (a unit may come twice) */
    int n_fwd;                       /* >= 1 */
    const int *bwd_order;            /* [n_bwd] units a backward pass acquires, in order */
    int n_bwd;                       /* >= 0 */
    const struct mw_foreign_tensor *tensors; /* [n_tensors] */
    int n_tensors;                   /* 0: one tensor per unit, named as the unit, with weight decay */
    mw_foreign_init_fn init_unit;    /* a unit's initial weights (NULL: zeros) */
    void *init_user;
};

/* The family's table (src/model/foreign.c), kept out of the registry. */
extern const struct mw_net_family mw_net_foreign;

/* A config for d (checked: -EINVAL naming what is wrong). c points at d: d must live until the
 * nets built from c are (mw_net_init copies it into the net). */
int mw_foreign_config(struct mw_net_config *c, const struct mw_foreign_desc *d);
/* Builds a foreign net for d (mw_foreign_config + mw_net_init; n_threads as mw_net_options). Its
 * params and grads are fresh mappings: untouched pages cost nothing. */
int mw_net_foreign_init(struct mw_net *n, const struct mw_foreign_desc *d, int n_threads);
/* The caller's pass uses unit `unit` (event MW_NET_UNIT_ACQUIRE before, MW_NET_UNIT_RELEASE after;
 * backward = 1 in a backward pass): the table's weights hook hears it, as it would from a
 * family's own pass. 0, -EINVAL (message) for a unit or event out of range, or the hook's code. */
int mw_net_foreign_unit(struct mw_net *n, int event, int unit, int backward);
/* The first error of the caller's init_unit while the whole model was initialised
 * (mw_net_init_weights cannot return one), or 0. */
int mw_net_foreign_init_status(const struct mw_net *n);

#ifdef __cplusplus
}
#endif
#endif
