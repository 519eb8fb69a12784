/* store_impl.h — private to src/store: the store and object layout (store.c, store_io.c). */
#ifndef MEMWALL_STORE_IMPL_H
#define MEMWALL_STORE_IMPL_H

#include "memwall/store.h"
#include "memwall/tier.h"
#include "memwall/fsutil.h"

#include <pthread.h>
#include <stdatomic.h>

#define MW_STORE_MAX_DIRS 64
#define MW_STORE_LOCK_NAME "memwall.lock"

struct mw_store_extent { uint64_t off, len; }; /* bytes in a backing file */

struct mw_store_file {
    int fd;
    char *path;
    int created;                      /* this store made the file (only then is it removed at close) */
    struct mw_dir_lock *lock;         /* DIR/MW_STORE_LOCK_NAME, held while the store is open */
    int direct;                       /* opened with O_DIRECT */
    uint64_t size;                    /* bytes of this file given to the store */
    struct mw_store_extent *free_ext; /* sorted by offset, coalesced [nfree] */
    int nfree, free_cap;
};

struct mw_store_obj {
    char name[128];
    const char *iname;                /* interned in the trace (or name) — for messages/trace */
    uint64_t size;                    /* bytes */
    uint64_t stripe;                  /* bytes per stripe unit for this object */
    uint64_t *ext_off;                /* [ndirs] start of the object's extent in each file */
    uint64_t *ext_len;                /* [ndirs] bytes (0: nothing in that file) */
    uint32_t *crc;                    /* [nblocks] crc32c of each crc block */
    uint8_t *crc_valid;               /* [nblocks] 1 once written */
    uint64_t nblocks;
    struct mw_buf acct;               /* nvme tier reservation */
    uint64_t hash;                    /* of name (store.c: name_hash) */
    struct mw_store_obj *hnext;       /* next in the same bucket of the store's name index */
};

struct mw_store {
    struct mw_store_config cfg;       /* dirs copied below */
    char **dirs;                      /* [ndirs] */
    struct mw_store_file *files;      /* [ndirs] */
    int ndirs;
    struct mw_aio *aio;
    int own_aio;
    struct mw_trace *trace;           /* for interning names (store's, or the engine's) */
    pthread_mutex_t mu;               /* objects, extents, waiting */
    pthread_cond_t cv;                /* an io finished */
    /* The objects, indexed by name: a chained hash table of [nbuckets] (a power of two, or 0
     * before the first object), doubled when it holds more objects than buckets. */
    struct mw_store_obj **buckets;
    size_t nbuckets;
    uint64_t n_objects, used;         /* used: bytes of extents held */
    uint64_t outstanding;             /* ios submitted and not finished */
    _Atomic uint64_t bytes_read, bytes_written, checksum_failures;
};

#endif
