/*
 * memwall/store.h — the NVMe store: named objects in extents of backing files.
 *
 * Why: optimizer state that does not fit in DRAM lives on SSD as many named objects
 * ("sg17.exp_avg", one per subgroup and state tensor) that are read and written whole, over
 * and over. A store keeps those objects in a few large preallocated files instead of thousands
 * of small ones, stripes them over several SSDs, and guards every byte with a checksum.
 *
 * Layout: one backing file per directory, DIR/<prefix>.<i>.dat. Objects are striped RAID-0-like
 * in stripe_size units: unit k of an object lives in file (k % ndirs); within each file the
 * object owns one contiguous extent (first-fit allocation, freed extents are reused).
 *
 * Capacity: `capacity` bytes (split evenly over the directories) are reserved at create time
 * with fallocate, so a full disk is found before training starts (-ENOSPC/-EFBIG naming the
 * directory, the bytes asked and the bytes free). preallocate = 0 skips that (files then grow
 * as objects are written; a full file system shows up as a failed write); so does a file system
 * without fallocate (ramfs), whose files get their size unreserved, with one warning.
 *
 * One run per directory: while open, the store holds flock(DIR/memwall.lock) (pid inside); a
 * second store on the directory is -EBUSY naming that pid. Backing files are created with
 * O_EXCL | O_NOFOLLOW | O_CLOEXEC (0600; directories 0700): an existing file (a run that did not
 * finish, kept for its resume) or a symlink there is -EEXIST, listing the leftover files. Close
 * removes only files this store created or reopened (unless keep_files), then the lock file.
 *
 * Resume (reopen = 1): the files of a run that did not finish are opened instead (never created,
 * still O_NOFOLLOW | O_CLOEXEC and locked; each at least the size that run reserved), objects are
 * placed at the offsets it recorded (mw_store_obj_place), and an object whose bytes are to be
 * trusted again is read once and adopted against the digest of its block checksums
 * (mw_store_obj_digest when it was written, mw_store_obj_adopt on resume).
 *
 * I/O: each file is opened (created) once and then switched to O_DIRECT with fcntl; where the
 * file system refuses it (ramfs; tmpfs before Linux 6.6) the store keeps buffered I/O and logs one
 * warning (stats.direct = 0). All object I/O goes through the async engine
 * (memwall/aio.h). Alignment: offset and buffer must be 4096-aligned; len must be a multiple of
 * 4096 unless the range ends at the object's end, in which case the buffer must still have room
 * for len rounded up to 4096 (the tail is transferred padded).
 *
 * Checksums: with checksum = 1 (default) a crc32c of every crc_block-sized block (default
 * 64 KiB; the last block of an object may be shorter) is computed on write and kept in memory;
 * a read checks every block it covers completely and fails with MW_ECHECKSUM naming the object,
 * the file and the file offset of the bad block. Writes must therefore start on a crc_block
 * boundary and end on one or at the object's end (else -EINVAL). Blocks never written are not
 * checked. The crc32c uses the SSE4.2 instruction when the CPU has it (chosen at run time),
 * else a table-driven scalar reference.
 *
 * Threading: create/delete/find take the store lock and may be called from any thread; reads
 * and writes of different objects (or disjoint ranges) may run concurrently from any threads
 * (an object must not be deleted, nor a range written, while other I/O on it is in flight);
 * completion callbacks run on an engine thread (see aio.h's contract: short, no waiting).
 *
 * Usage:
 *   struct mw_store_config c; mw_store_config_default(&c);
 *   const char *dirs[] = {"/nvme0/mw", "/nvme1/mw"}; c.dirs = dirs; c.ndirs = 2;
 *   c.capacity = 64ull << 30;
 *   struct mw_store *st; if (mw_store_open(&st, &c)) die(mw_error_msg());
 *   struct mw_store_obj *o; mw_store_obj_create(st, "sg17.exp_avg", bytes, &o);
 *   mw_store_write(st, o, 0, bytes, buf);            // synchronous
 *   struct mw_store_io io = { .obj = o, .op = MW_AIO_READ, .offset = 0, .len = bytes,
 *                             .buf = buf, .cb = done, .user = ctx };
 *   mw_store_submit(st, &io);                        // asynchronous, done(&io, ctx) later
 *   mw_store_close(st);
 */
#ifndef MEMWALL_STORE_H
#define MEMWALL_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "memwall/aio.h"
#include "memwall/common.h"
#include "memwall/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mw_trace;
struct mw_tier;
struct mw_store;      /* opaque */
struct mw_store_obj;  /* opaque; valid until deleted or the store is closed */

#define MW_STORE_ALIGN ((size_t)4096)
#define MW_STORE_ERRMSG_LEN 640

struct mw_store_config {
    const char *const *dirs;   /* one directory per SSD (created if missing) */
    int ndirs;                 /* 1..64 */
    uint64_t capacity;         /* bytes over all dirs; required (> 0) */
    uint64_t stripe_size;      /* bytes per stripe unit, multiple of 4096; default 1 MiB */
    uint64_t crc_block;        /* bytes per checksummed block, multiple of 4096; default 64 KiB */
    int checksum;              /* default 1 */
    int direct;                /* try O_DIRECT; default 1 */
    int preallocate;           /* fallocate capacity at open; default 1 */
    int keep_files;            /* leave the backing files at close; default 0 (unlinked) */
    int reopen;                /* open the existing files of a run to resume it (see above); default 0 */
    const char *file_prefix;   /* default "memwall" */
    struct mw_aio *aio;        /* engine to use; NULL: the store creates one with aio_config */
    struct mw_aio_config aio_config; /* used only when aio == NULL */
    struct mw_tier *tier;      /* nvme tier for accounting (may be NULL) */
    struct mw_trace *trace;    /* may be NULL */
};
void mw_store_config_default(struct mw_store_config *c);

int mw_store_open(struct mw_store **out, const struct mw_store_config *c);
/* Waits for outstanding I/O, closes (and unless keep_files, removes) the backing files. */
void mw_store_close(struct mw_store *st);

/* Objects. Names are unique (-EEXIST), at most 127 bytes; create, find and delete are O(1) on
 * average (a hash index of the names), at any number of objects. Size in bytes (> 0). A full store
 * is -ENOSPC with a message giving object, size and free bytes per file. */
int mw_store_obj_create(struct mw_store *st, const char *name, uint64_t size, struct mw_store_obj **out);
/* The same, with the kind the nvme tier accounts the bytes under (create uses MW_KIND_OTHER). */
int mw_store_obj_create_ex(struct mw_store *st, const char *name, uint64_t size, enum mw_alloc_kind kind,
                           struct mw_store_obj **out);
/* Resume: the same, at the given byte offset in each backing file ([ndirs]; an entry for a file
 * the object does not use is ignored). MW_EFORMAT when that range is not free (overlaps another
 * object, or past the file's end). */
int mw_store_obj_place(struct mw_store *st, const char *name, uint64_t size, enum mw_alloc_kind kind,
                       const uint64_t *file_offsets, struct mw_store_obj **out);
/* Where the object starts in backing file `file` (its extent there; 0 when it has none). */
uint64_t mw_store_obj_file_offset(const struct mw_store_obj *obj, int file);
struct mw_store_obj *mw_store_obj_find(struct mw_store *st, const char *name);
int mw_store_obj_delete(struct mw_store *st, struct mw_store_obj *obj);
const char *mw_store_obj_name(const struct mw_store_obj *obj); /* interned in the store's trace */
uint64_t mw_store_obj_size(const struct mw_store_obj *obj);

struct mw_store_io;
typedef void (*mw_store_cb)(struct mw_store_io *io, void *user);

/* One asynchronous object-range operation. Caller-owned; zero-initialise, fill the first
 * block, keep alive until done (same done/callback rules as struct mw_aio_req). */
struct mw_store_io {
    /* --- set by the caller --- */
    struct mw_store_obj *obj;
    enum mw_aio_op op;         /* MW_AIO_READ / MW_AIO_WRITE */
    uint64_t offset;           /* byte offset within the object */
    uint64_t len;              /* bytes */
    void *buf;                 /* 4096-aligned host buffer */
    mw_store_cb cb;            /* NULL: use mw_store_wait */
    void *user;
    unsigned flags;            /* MW_AIO_URGENT: issued ahead of queued non-urgent I/O;
                                  MW_STORE_VERIFY_LATER (reads): see below */
    const uint32_t *crcs;      /* writes: crc32c of each checksum block of the range, in order, taken
                                  by the caller (e.g. while the bytes were still in cache); NULL:
                                  the store computes them */
    /* --- set by the store --- */
    int result;                /* 0, -errno, MW_ECHECKSUM, MW_EFORMAT */
    char errmsg[MW_STORE_ERRMSG_LEN];
    /* --- private --- */
    struct mw_aio_req *parts_; /* one engine request per stripe unit (or one per file run) */
    uint32_t nparts_;
    uint32_t parts_left_;      /* atomic */
    int state_;                /* 0 idle, 1 in flight, 2 done (atomic) */
    struct mw_store *st_;
};

/* Reads with this flag are not checked when they land: the caller checks the blocks itself with
 * mw_store_io_verify before it uses them (the offload engine does it chunk by chunk inside its
 * update, while the bytes are in cache, instead of a separate pass over them from DRAM). Until
 * then the bytes are unchecked: the caller must not use them, nor write the range, before. */
#define MW_STORE_VERIFY_LATER (1u << 8)

/* Submit an object read or write. Returns 0 or a validation error (-EINVAL: alignment,
 * range past the object end; nothing submitted). */
int mw_store_submit(struct mw_store *st, struct mw_store_io *io);
/* Blocks until io (submitted without a callback) is done; returns io->result and copies
 * io->errmsg into this thread's mw_error_msg() on failure. */
int mw_store_wait(struct mw_store *st, struct mw_store_io *io);
int mw_store_test(struct mw_store_io *io);
/* A finished read (result 0): checks the checksum blocks that overlap bytes [lo, hi) of io->buf
 * and that the read covers completely. Returns 0, or MW_ECHECKSUM with the message set (this
 * thread's mw_error_msg() and io->errmsg), as a check on arrival would have. */
int mw_store_io_verify(struct mw_store *st, struct mw_store_io *io, uint64_t lo, uint64_t hi);

/* Synchronous convenience wrappers. */
int mw_store_read(struct mw_store *st, struct mw_store_obj *obj, uint64_t offset, uint64_t len, void *buf);
int mw_store_write(struct mw_store *st, struct mw_store_obj *obj, uint64_t offset, uint64_t len,
                   const void *buf);

struct mw_store_stats {
    uint64_t capacity;         /* bytes reserved over all files */
    uint64_t used;             /* bytes held by objects (rounded to stripe units) */
    uint64_t n_objects;
    uint64_t bytes_read, bytes_written;
    uint64_t checksum_failures;
    int direct;                /* 1 when every file is open with O_DIRECT */
};
void mw_store_stats(struct mw_store *st, struct mw_store_stats *out);

/* Durability. sync: fdatasync of every backing file (what completed writes wrote is on the
 * device, and with it the extents fallocate reserved). digest: a crc32c over the object's block
 * checksums (little-endian), -ENODATA when a block was never written. adopt: data holds the
 * object's whole content as read back (size bytes); its block checksums are computed and, when
 * their digest is `digest`, kept as the object's (reads are checked again from then on);
 * MW_ECHECKSUM (naming object, file and offset) otherwise. keep_files: changes the config's. */
int mw_store_sync(struct mw_store *st);
int mw_store_obj_digest(struct mw_store *st, const struct mw_store_obj *obj, uint32_t *digest);
int mw_store_obj_adopt(struct mw_store *st, struct mw_store_obj *obj, const void *data, uint32_t digest);
void mw_store_set_keep_files(struct mw_store *st, int keep);

/* The engine the store uses (its own or the one given). */
struct mw_aio *mw_store_aio(struct mw_store *st);
/* Where a byte of an object lives (for tests and tools): file index, path, file offset. */
int mw_store_locate(struct mw_store *st, const struct mw_store_obj *obj, uint64_t offset,
                    int *file_index, const char **path, uint64_t *file_offset);

#ifdef __cplusplus
}
#endif
#endif
