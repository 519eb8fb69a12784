/* tier_impl.h — private to src/tier: the built-in buffer types (tier_buft.c). */
#ifndef MEMWALL_TIER_IMPL_H
#define MEMWALL_TIER_IMPL_H

#include "memwall/tier.h"

/* The built-in buffer type of a tier id (host, emulated device, accounting-only nvme). */
const struct mw_buft_iface *mw_buft_builtin_(enum mw_tier_id id);

#endif
