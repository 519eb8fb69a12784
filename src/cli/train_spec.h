/*
 * train_spec.h — the settings of a `memwall train` run kept in its commit record and checkpoints
 * (train_spec.c says why and how), and their return on --resume.
 */
#ifndef MEMWALL_CLI_TRAIN_SPEC_H
#define MEMWALL_CLI_TRAIN_SPEC_H

#include <stdint.h>

struct mw_cmd_spec;

/* The option table's values as text (malloc'd): paths absolute, or relative to out_dir when
 * inside it; record_dir (the first NVMe directory, or NULL) places the out-dir for a resume
 * from the commit record. 0 or a negative code with the message set. */
int train_spec_build(const struct mw_cmd_spec *cs, const char *out_dir, const char *record_dir, char **out);

#define TRAIN_SPEC_MAX_OWNED 8
struct train_spec_applied {
    int announced;                       /* flags given that change the run's results */
    char *owned[TRAIN_SPEC_MAX_OWNED];   /* resolved paths the option table points into */
    int nowned;
};
/* A resume: every option the command line did not give takes the kept value (text is split in
 * place and must outlive the options); a given one that differs is listed (allowed), announced
 * (changes results) or refused with both values. record_dir or ckpt_path says where the kept
 * paths are relative to; committed: the steps the run has made. Returns 0, 1 (the text is
 * corrupt: message printed) or 2 (a refused flag: messages printed). */
int train_spec_apply(const struct mw_cmd_spec *cs, char *text, const char *record_dir, const char *ckpt_path,
                     int64_t committed, struct train_spec_applied *ap);
void train_spec_applied_free(struct train_spec_applied *ap);

#endif
