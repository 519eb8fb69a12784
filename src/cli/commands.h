/*
 * commands.h — the memwall subcommands. Each lives in its own file src/cli/cmd_<name>.c and
 * takes the arguments after its name. Return value is the process exit code:
 * 0 success, 1 runtime failure, 2 usage error.
 */
#ifndef MEMWALL_CLI_COMMANDS_H
#define MEMWALL_CLI_COMMANDS_H

#include <stddef.h>

int mw_cmd_train(int argc, char **argv);         /* cmd_train.c */
int mw_cmd_report(int argc, char **argv);        /* cmd_report.c */
int mw_cmd_plan(int argc, char **argv);          /* cmd_plan.c */
int mw_cmd_bench_io(int argc, char **argv);      /* cmd_bench_io.c */
int mw_cmd_bench_adam(int argc, char **argv);    /* cmd_bench_adam.c */
int mw_cmd_bench_offload(int argc, char **argv); /* cmd_bench_offload.c */
int mw_cmd_tokenize(int argc, char **argv);      /* cmd_tokenize.c */
int mw_cmd_eval(int argc, char **argv);          /* cmd_eval.c */
int mw_cmd_data(int argc, char **argv);          /* cmd_data.c */
int mw_cmd_generate(int argc, char **argv);      /* cmd_generate.c */

/* Prints "memwall: <what> failed: <detail from mw_error_msg()>" to stderr. */
void mw_cli_fail(const char *what, int err);
/* Multi-rank runs: failure messages name the rank ("memwall (rank 1 of 2): ..."). */
void mw_cli_set_rank(int rank, int world);

/* The model of `--init-hf DIR` (hf) or `--resume CKPT` (ckpt; one of the two): its config into nc,
 * and for a directory the weights' path (DIR/model.safetensors, or DIR for a sharded checkpoint:
 * mw_net_hf_weights) into weights[n]. 0, 1 (runtime
 * failure, printed) or 2 (usage, printed, naming cmd). model_source.c */
struct mw_net_config;
int mw_cli_model_config(const char *cmd, const char *hf, const char *ckpt, struct mw_net_config *nc, char *weights,
                        size_t n);

/* SIGINT/SIGTERM (signals.c): blocked in every thread from here on and watched by one; the first
 * sets the stop signal (polled between steps), a second SIGINT or SIGTERM exits at once with
 * 128 + the signal. `what` prefixes the messages. */
int mw_cli_signals_start(const char *what);
int mw_cli_stop_signal(void);   /* 0, or the signal that asked the run to stop */
void mw_cli_signals_stop(void); /* the run is over: to the exit, a signal is told so (a second exits at once) */

#endif
