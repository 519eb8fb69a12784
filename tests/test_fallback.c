/*
 * test_fallback.c — the two automatic fallbacks, provoked for real in a forked child with a
 * seccomp filter: io_uring_setup fails with ENOSYS (as in containers that block io_uring), so
 * the AUTO engine must pick the thread pool with one warning and a forced io_uring must fail
 * clearly; and open(O_DIRECT) fails with EINVAL (as on file systems that refuse it), so the
 * store must fall back to buffered I/O with one warning and still round-trip and checksum.
 */
#include "memwall/aio.h"
#include "memwall/store.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static int g_warnings;
static char g_last[512];
static void on_log(enum mw_log_level lvl, const char *msg, void *user)
{
    (void)user;
    if (lvl >= MW_LOG_WARN) g_warnings++;
    snprintf(g_last, sizeof g_last, "%s", msg);
}

#if defined(__x86_64__) && defined(__NR_io_uring_setup)
static int install_filter(void)
{
    /* io_uring_setup: ENOSYS. O_DIRECT: EINVAL, whether asked for at open or set later with
     * fcntl(F_SETFL), as a file system without it answers. */
    struct sock_filter f[] = {
        /*  0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        /*  1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 10),
        /*  2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        /*  3 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 10, 0),
        /*  4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 2),
        /*  5 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])), /* low word of flags */
        /*  6 */ BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECT, 6, 5),
        /*  7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fcntl, 0, 4),
        /*  8 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        /*  9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, F_SETFL, 0, 2),
        /* 10 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        /* 11 */ BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECT, 1, 0),
        /* 12 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* 13 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
        /* 14 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

static int child(const char *dir)
{
    if (install_filter()) { fprintf(stderr, "child: seccomp refused: %s\n", strerror(errno)); return 77; }
    mw_log_set(on_log, NULL);
    struct mw_aio_config c;
    mw_aio_config_default(&c);
    struct mw_aio *aio;
    if (mw_aio_init(&aio, &c)) return 10;
    if (mw_aio_backend(aio) != MW_AIO_THREADS) return 11;
    if (g_warnings != 1 || !strstr(g_last, "io_uring unavailable")) { fprintf(stderr, "log: %s\n", g_last); return 12; }
    mw_aio_free(aio);
    c.backend = MW_AIO_URING;
    int rc = mw_aio_init(&aio, &c);
    if (rc != -ENOSYS || !strstr(mw_error_msg(), "io_uring")) { fprintf(stderr, "%d %s\n", rc, mw_error_msg()); return 13; }

    struct mw_store_config sc;
    mw_store_config_default(&sc);
    const char *dirs[1] = {dir};
    sc.dirs = dirs;
    sc.ndirs = 1;
    sc.capacity = 1 << 20;
    struct mw_store *st;
    if (mw_store_open(&st, &sc)) { fprintf(stderr, "%s\n", mw_error_msg()); return 14; }
    if (g_warnings != 2 || !strstr(g_last, "O_DIRECT")) { fprintf(stderr, "log: %s\n", g_last); return 15; }
    struct mw_store_stats ss;
    mw_store_stats(st, &ss);
    if (ss.direct) return 16;
    struct mw_store_obj *o;
    if (mw_store_obj_create(st, "buffered", 100000, &o)) return 17;
    unsigned char *w = NULL, *r = NULL;
    if (posix_memalign((void **)&w, 4096, 102400) || posix_memalign((void **)&r, 4096, 102400)) return 18;
    uint64_t s = 3;
    for (int i = 0; i < 100000; i++) w[i] = (unsigned char)tu_rand(&s);
    if (mw_store_write(st, o, 0, 100000, w) || mw_store_read(st, o, 0, 100000, r) || memcmp(w, r, 100000)) return 19;
    mw_store_close(st);
    free(w);
    free(r);
    return 0;
}
#endif

int main(void)
{
#if defined(__x86_64__) && defined(__NR_io_uring_setup)
    const char *dir = tu_scratch_dir("fallback");
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) _exit(child(dir));
    int status = 0;
    waitpid(pid, &status, 0);
    REQUIRE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) SKIP("seccomp filters are not allowed here");
    CHECK_MSG(WEXITSTATUS(status) == 0, "child failed at step %d", WEXITSTATUS(status));
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    TEST_END();
#else
    SKIP("the seccomp filter of this test is written for x86-64");
#endif
}
