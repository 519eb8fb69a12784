/*
 * resume.h — internal to src/train: the checkpoint header shared by checkpoints and commit
 * records, and the trainer's continuation blob (src/train/resume.c).
 * Why one header format for both: a checkpoint and a commit record carry the same settings and
 * continuation state (step, data-RNG state, data path), validated by one decoder.
 */
#ifndef MEMWALL_TRAIN_RESUME_H
#define MEMWALL_TRAIN_RESUME_H

#include <stdint.h>

#include "memwall/train.h"

#define MW_CKPT_HEADER_BYTES 1024u

/* The checkpoint header (checkpoint.c): every field at its fixed offset; decode range-checks
 * each one (hostile input), naming `path` in its messages. */
void mw_ckpt_header_encode(uint8_t *h, const struct mw_ckpt_info *in);
int mw_ckpt_header_decode(const uint8_t *h, struct mw_ckpt_info *out, const char *path);

/* With commit records on: the blob of the record that commits step `step` (the trainer's state
 * once that step's batches were drawn), handed to the engine before the step starts. */
int mw_train_journal_note(struct mw_trainer *tr, int64_t step);
/* Resume (cfg.resume): the record's step and data-RNG state into the trainer, its model checked
 * against the trainer's. */
int mw_train_resume_apply(struct mw_trainer *tr, const struct mw_offload_record *rec);

#endif
