/* pi2 outputs: the rule every tool checks before it writes (pi2_out_check),
 * the registry of live temporary outputs removed on SIGINT/SIGTERM/SIGHUP,
 * and the sweep of temporaries a killed run left (see formats/common.h). */
#include "formats/common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- the registry of live temporaries ----
 * Process-wide by necessity: a signal handler has nothing else to reach.
 * A slot is claimed by compare-and-swap (0 -> 2), filled, then published
 * (-> 1); the handler reads only published slots and calls only
 * async-signal-safe functions (unlink, open, getdents64, unlinkat, rmdir). */
enum { TMP_SLOTS = 32, TMP_FREE = 0, TMP_LIVE = 1, TMP_BUSY = 2 };
static struct {
    int state;
    int fd; /* the locked descriptor (closed by the owner, never by the handler) */
    int is_dir;
    char path[4096];
} tmp_reg[TMP_SLOTS];

int pi2_tmp_register(const char *path, int fd, bool is_dir)
{
    if (strlen(path) >= sizeof tmp_reg[0].path)
        return -1;
    for (int i = 0; i < TMP_SLOTS; i++) {
        int expect = TMP_FREE;
        if (!__atomic_compare_exchange_n(&tmp_reg[i].state, &expect, TMP_BUSY, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_RELAXED))
            continue;
        strcpy(tmp_reg[i].path, path);
        tmp_reg[i].fd = fd;
        tmp_reg[i].is_dir = is_dir;
        __atomic_store_n(&tmp_reg[i].state, TMP_LIVE, __ATOMIC_RELEASE);
        return i;
    }
    return -1; /* full: still written and committed, only not removed on a signal */
}

void pi2_tmp_unregister(int slot)
{
    if (slot < 0 || slot >= TMP_SLOTS)
        return;
    __atomic_store_n(&tmp_reg[slot].state, TMP_FREE, __ATOMIC_RELEASE);
}

int pi2_tmp_find(const char *path)
{
    for (int i = 0; i < TMP_SLOTS; i++)
        if (__atomic_load_n(&tmp_reg[i].state, __ATOMIC_ACQUIRE) == TMP_LIVE && strcmp(tmp_reg[i].path, path) == 0)
            return i;
    return -1;
}

int pi2_tmp_fd(int slot)
{
    return slot >= 0 && slot < TMP_SLOTS ? tmp_reg[slot].fd : -1;
}

/* Remove the files directly inside dir, then dir: async-signal-safe (raw
 * getdents64, no malloc). Temporary directories are flat. */
static void rm_flat_dir_sigsafe(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096] __attribute__((aligned(8)));
        for (int pass = 0; pass < 64; pass++) {
            long n, removed = 0;
            lseek(fd, 0, SEEK_SET);
            while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
                for (long off = 0; off < n;) {
                    /* struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, name */
                    unsigned short reclen;
                    memcpy(&reclen, buf + off + 16, sizeof reclen);
                    const char *name = buf + off + 19;
                    if (!(name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))) &&
                        unlinkat(fd, name, 0) == 0)
                        removed++;
                    off += reclen;
                }
            }
            if (removed == 0)
                break;
        }
        close(fd);
    }
    rmdir(dir);
}

static void tmp_on_signal(int sig)
{
    int saved = errno;
    for (int dirs = 0; dirs < 2; dirs++) /* files first: some live inside a temporary directory */
        for (int i = 0; i < TMP_SLOTS; i++) {
            if (__atomic_load_n(&tmp_reg[i].state, __ATOMIC_ACQUIRE) != TMP_LIVE || tmp_reg[i].is_dir != dirs)
                continue;
            if (dirs)
                rm_flat_dir_sigsafe(tmp_reg[i].path);
            else
                unlink(tmp_reg[i].path);
        }
    errno = saved;
    raise(sig); /* SA_RESETHAND | SA_NODEFER: the default action, now */
}

void pi2_tmp_cleanup_on_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler != SIG_DFL)
            continue; /* ignored (nohup) or handled by someone else: leave it */
        struct sigaction sa = {0};
        sa.sa_handler = tmp_on_signal;
        sa.sa_flags = SA_RESETHAND | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

/* ---- stale temporaries of a killed run ---- */

/* name == base + ".tmp." + 6 characters of mkstemp's alphabet. */
static bool is_tmp_of(const char *name, const char *base, size_t bl)
{
    if (strncmp(name, base, bl) != 0 || strncmp(name + bl, ".tmp.", 5) != 0)
        return false;
    const char *s = name + bl + 5;
    for (int i = 0; i < 6; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')))
            return false;
    }
    return s[6] == 0;
}

/* Split path (trailing slashes ignored) into its directory and base name. */
static bool split_path(const char *path, char *dir, size_t dcap, char *base, size_t bcap)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    if (n - b + 1 > bcap || n == b)
        return false;
    memcpy(base, path + b, n - b);
    base[n - b] = 0;
    int w = b == 0 ? snprintf(dir, dcap, ".") : b == 1 ? snprintf(dir, dcap, "/") : snprintf(dir, dcap, "%.*s", (int)(b - 1), path);
    return w > 0 && (size_t)w < dcap;
}

int pi2_tmp_sweep(const char *path)
{
    char dir[4096], base[1024], p[4096 + 1024 + 16];
    if (!split_path(path, dir, sizeof dir, base, sizeof base))
        return 0;
    DIR *dh = opendir(dir);
    if (!dh)
        return 0;
    size_t bl = strlen(base);
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(dh)) != NULL) {
        if (!is_tmp_of(e->d_name, base, bl) || !pi2_path_join(p, sizeof p, dir, e->d_name))
            continue;
        int fd = open(p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            continue;
        struct stat st;
        /* the writer holds an flock while it writes: a lock we get means it is gone */
        if (fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) && flock(fd, LOCK_EX | LOCK_NB) == 0) {
            int ok = S_ISDIR(st.st_mode) ? (rm_flat_dir_sigsafe(p), access(p, F_OK) != 0) : unlink(p) == 0;
            if (ok) {
                fprintf(stderr, "%s: removed %s, left by an interrupted run\n", program_invocation_short_name, p);
                removed++;
            } else {
                fprintf(stderr, "%s: %s is left by an interrupted run and could not be removed; remove it\n",
                        program_invocation_short_name, p);
            }
        }
        close(fd);
    }
    closedir(dh);
    return removed;
}

/* ---- the output rule ---- */

/* The absolute path `path` names, symlinks resolved, whether it exists or
 * not (then its directory must). */
static int resolve(const char *path, char *buf, size_t cap, pi2_err *err)
{
    char tmp[PATH_MAX];
    if (realpath(path, tmp)) {
        if (strlen(tmp) >= cap)
            return pi2_err_set(err, PI2_ERANGE, "%s: path too long", path);
        strcpy(buf, tmp);
        return 0;
    }
    char dir[4096], base[1024];
    if (!split_path(path, dir, sizeof dir, base, sizeof base))
        return pi2_err_set(err, PI2_EINVAL, "'%s' is not a file name", path);
    if (!realpath(dir, tmp))
        return pi2_err_errno(err, PI2_ENOTFOUND, errno, "%s: cannot write there: directory %s", path, dir);
    int w = snprintf(buf, cap, "%s/%s", strcmp(tmp, "/") == 0 ? "" : tmp, base);
    return w > 0 && (size_t)w < cap ? 0 : pi2_err_set(err, PI2_ERANGE, "%s: path too long", path);
}

/* out against one input: the same file, or inside an input directory. */
static int check_input(const char *out, const char *rout, const struct stat *ost, bool exists, const char *in,
                       pi2_err *err)
{
    struct stat ist;
    char rin[PATH_MAX];
    bool in_exists = stat(in, &ist) == 0;
    if (in_exists && exists && ist.st_dev == ost->st_dev && ist.st_ino == ost->st_ino)
        return pi2_err_set(err, PI2_EINVAL, "%s is the input %s: write the output to another file", out, in);
    if (resolve(in, rin, sizeof rin, NULL) != 0)
        return 0; /* an input that cannot be named cannot be overwritten by name either */
    if (strcmp(rin, rout) == 0)
        return pi2_err_set(err, PI2_EINVAL, "%s is the input %s: write the output to another file", out, in);
    size_t n = strlen(rin);
    if (in_exists && S_ISDIR(ist.st_mode) && strncmp(rout, rin, n) == 0 && (rout[n] == '/' || n == 1))
        return pi2_err_set(err, PI2_EINVAL, "%s is inside the input directory %s: write the output elsewhere", out, in);
    return 0;
}

static int check_space(const char *out, const char *rout, uint64_t need, pi2_err *err)
{
    char dir[4096], base[1024];
    struct statvfs vs;
    if (need == 0 || !split_path(rout, dir, sizeof dir, base, sizeof base) || statvfs(dir, &vs) != 0)
        return 0; /* no estimate, or nothing to measure: the writes themselves report a full disk */
    uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
    if (avail >= need)
        return 0;
    bool gb = need >= 1000000000u;
    return pi2_err_set(err, PI2_ENOSPC, "%s needs about %.*f %s and %s has %.*f %s free: free some space or write elsewhere",
                       out, gb ? 2 : 1, need / (gb ? 1e9 : 1e6), gb ? "GB" : "MB", dir, gb ? 2 : 1,
                       avail / (gb ? 1e9 : 1e6), gb ? "GB" : "MB");
}

int pi2_out_check(const char *out, const char *const *inputs, size_t n_inputs, unsigned flags, uint64_t need_bytes,
                  pi2_err *err)
{
    char rout[PATH_MAX], dir[4096], base[1024];
    if (!out || !*out)
        return pi2_err_set(err, PI2_EINVAL, "the output needs a name");
    int rc = resolve(out, rout, sizeof rout, err);
    if (rc)
        return rc;
    struct stat st;
    bool exists = stat(out, &st) == 0;
    for (size_t i = 0; i < n_inputs; i++)
        if (inputs[i] && (rc = check_input(out, rout, &st, exists, inputs[i], err)) != 0)
            return rc;
    if (exists && (flags & PI2_OUT_DIR))
        return pi2_err_set(err, PI2_EINVAL, "%s: already exists (choose a new output directory)", out);
    if (exists && S_ISDIR(st.st_mode))
        return pi2_err_set(err, PI2_EINVAL, "%s is a directory: give the name of the file to write", out);
    if (exists && !S_ISREG(st.st_mode))
        return pi2_err_set(err, PI2_EINVAL, "%s is not a regular file: choose another output name", out);
    if (exists && !(flags & PI2_OUT_FORCE))
        return pi2_err_set(err, PI2_EEXIST, "%s already exists: choose another name", out);
    if (split_path(rout, dir, sizeof dir, base, sizeof base) && access(dir, W_OK) != 0)
        return pi2_err_errno(err, PI2_EIO, errno, "%s: cannot write to directory %s", out, dir);
    if ((rc = check_space(out, rout, need_bytes, err)) != 0)
        return rc;
    pi2_tmp_sweep(out);
    return 0;
}

int pi2_exit_stdout(const char *tool, int rc)
{
    errno = 0;
    bool bad = fflush(stdout) != 0 || ferror(stdout);
    int e = errno;
    if (fclose(stdout) != 0 && !bad) {
        bad = true;
        e = errno;
    }
    if (!bad)
        return rc;
    if (rc == 0)
        fprintf(stderr, "%s: cannot write to standard output: %s\n", tool, e ? strerror(e) : "write error");
    return rc ? rc : 1;
}

int pi2_cli_bad_option(const char *tool, char **argv, int c)
{
    char shortopt[3] = {'-', (char)optopt, 0};
    const char *name = optopt > 0 && optopt < 128 ? shortopt : argv[optind - 1];
    if (c == ':')
        fprintf(stderr, "%s: option '%s' needs a value; see --help\n", tool, name);
    else
        fprintf(stderr, "%s: unknown option '%s'; see --help\n", tool, name);
    return 2;
}

void pi2_cli_force_hint(pi2_err *e)
{
    size_t n = strlen(e->msg);
    if (e->code == PI2_EEXIST && n + 24 < sizeof e->msg)
        snprintf(e->msg + n, sizeof e->msg - n, " (--force replaces it)");
}
