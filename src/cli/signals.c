/*
 * signals.c — SIGINT and SIGTERM for long commands (memwall train): the first asks the run to
 * stop after the step in flight, cleanly and resumable; a second SIGINT ends the process at once
 * (the commit record and checkpoints stay valid: they are only ever replaced atomically).
 *
 * Why blocked, with a thread that takes them: the threads made after the start (OpenMP's, the
 * offload engine's, MPI's) inherit the mask, so none of their system calls is interrupted with
 * EINTR (io_uring waits, fdatasync, MPI progress). Threads that existed before (OpenBLAS starts
 * its pool when the library is loaded) run a handler instead (SA_RESTART; it only sets a flag,
 * writes a line or _exits). The run polls mw_cli_stop_signal() between steps.
 */
#include "cli/commands.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_stop_sig, g_running, g_done;
static pthread_t g_thr;
static sigset_t g_set, g_old;
static const char *g_what = "memwall";

static void say(const char *s) { ssize_t k = write(2, s, strlen(s)); (void)k; }

/* Async-signal-safe: atomics, write(2), _exit. */
static void on_signal(int sig)
{
    const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    if (atomic_load(&g_done) && !atomic_load(&g_stop_sig)) { /* the run is over: its exit goes on */
        atomic_store(&g_stop_sig, sig);
        say("\n");
        say(g_what);
        say(": ");
        say(name);
        say(": the run has finished; exiting (send it again to exit at once)\n");
        return;
    }
    if (atomic_exchange(&g_stop_sig, sig)) { /* the second one: at once */
        say("\n");
        say(g_what);
        say(": ");
        say(name);
        say(" again: exiting now (what was committed stays resumable)\n");
        _exit(128 + sig);
    }
    say("\n");
    say(g_what);
    say(": ");
    say(name);
    say(": stopping after the step in flight (send it again to exit at once)\n");
}

static void handler(int sig) { on_signal(sig); }

/* Signals pending on the threads that block them (ours) are taken here. */
static void *watch(void *arg)
{
    (void)arg;
    for (;;) { /* to the process's exit (mw_cli_signals_stop) */
        int sig = sigwaitinfo(&g_set, NULL);
        if (sig > 0) on_signal(sig);
    }
    return NULL;
}

int mw_cli_signals_start(const char *what)
{
    g_what = what;
    atomic_store(&g_stop_sig, 0);
    atomic_store(&g_done, 0);
    sigemptyset(&g_set);
    /* A signal ignored when we start (a background job of a script: SIGINT) stays ignored. */
    int sigs[2] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        struct sigaction sa;
        if (sigaction(sigs[i], NULL, &sa) == 0 && sa.sa_handler != SIG_IGN) sigaddset(&g_set, sigs[i]);
    }
    /* Threads that exist already (OpenBLAS starts its pool when it is loaded) do not block them:
     * there the handler runs. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 2; i++)
        if (sigismember(&g_set, sigs[i])) sigaction(sigs[i], &sa, NULL);
    if (pthread_sigmask(SIG_BLOCK, &g_set, &g_old)) return -1;
    if (pthread_create(&g_thr, NULL, watch, NULL)) {
        pthread_sigmask(SIG_SETMASK, &g_old, NULL);
        return -1;
    }
    atomic_store(&g_running, 1);
    return 0;
}

int mw_cli_stop_signal(void) { return atomic_load(&g_stop_sig); }

void mw_cli_signals_stop(void)
{
    /* The watcher, the mask and the handler stay until the process exits: a signal after the run's
     * last poll finds it finished (its model and commit record written) and has nothing left to
     * stop; it is told so, and the exit status is the run's. Restoring the default action here let
     * such a signal kill a finished run with 130 and no word on how to continue (cli_train_signal
     * under ASan, whose exit-time leak check widens the window). A second one still exits at once
     * (an exit stuck in MPI's shutdown). */
    if (!atomic_load(&g_running)) return;
    atomic_store(&g_stop_sig, 0);
    atomic_store(&g_done, 1);
}
