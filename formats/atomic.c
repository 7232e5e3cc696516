/* pi2 outputs written whole or not at all: the atomic file writer
 * (pi2_afile_*: a temporary beside the output, renamed into place on
 * commit) and its directory twin (pi2_dir_*), both registered with the
 * temporaries' registry (formats/output.c) so a signal removes them
 * (contracts in formats/common.h). */
#include "formats/common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- atomic writer ---- */

struct pi2_afile {
    int fd;
    uint64_t size;
    uint64_t behind; /* written-behind up to here (afile_behind) */
    char *path;
    char *tmp;
    int lockfd; /* a second descriptor whose flock marks the temporary live until it is renamed */
    int slot;   /* in the registry of temporaries removed on a signal */
};
enum { AFILE_WINDOW = 64u << 20 };

static int64_t afile_fail_budget = -1;

void pi2_afile_fail_after(int64_t bytes) { afile_fail_budget = bytes; }

int pi2_afile_open(pi2_afile **out, const char *path, pi2_err *err)
{
    *out = NULL;
    pi2_afile *f = calloc(1, sizeof *f);
    size_t n = strlen(path);
    if (f) {
        f->path = pi2_strdup(path);
        f->tmp = malloc(n + 16);
    }
    if (!f || !f->path || !f->tmp) {
        if (f) {
            free(f->path);
            free(f->tmp);
        }
        free(f);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    }
    snprintf(f->tmp, n + 16, "%s.tmp.XXXXXX", path);
    pi2_tmp_sweep(path);
    f->fd = mkostemp(f->tmp, O_CLOEXEC);
    if (f->fd < 0) {
        int e = errno;
        free(f->path);
        free(f->tmp);
        free(f);
        return pi2_err_errno(err, PI2_EIO, e, "%s: cannot create temporary file", path);
    }
    fchmod(f->fd, 0644);
    f->lockfd = open(f->tmp, O_RDONLY | O_CLOEXEC);
    if (f->lockfd >= 0)
        flock(f->lockfd, LOCK_EX | LOCK_NB);
    f->slot = pi2_tmp_register(f->tmp, f->lockfd, false);
    *out = f;
    return 0;
}

/* Write-behind: each AFILE_WINDOW written is sent to the disk, and the one
 * before it, written by then, leaves the page cache. The cache then holds
 * two windows of the file, not all of it: pages freed just before are
 * reused (fresh memory costs a fault per page at first touch under a
 * hypervisor that backs it lazily), and a large output does not push
 * everything else out. Advisory: failures are harmless (commit syncs). */
static void afile_behind(pi2_afile *f)
{
    while (f->size - f->behind >= AFILE_WINDOW) {
        uint64_t at = f->behind;
        sync_file_range(f->fd, (off_t)at, (off_t)AFILE_WINDOW, SYNC_FILE_RANGE_WRITE);
        if (at >= AFILE_WINDOW) {
            sync_file_range(f->fd, (off_t)(at - AFILE_WINDOW), (off_t)AFILE_WINDOW,
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
            posix_fadvise(f->fd, (off_t)(at - AFILE_WINDOW), (off_t)AFILE_WINDOW, POSIX_FADV_DONTNEED);
        }
        f->behind = at + AFILE_WINDOW;
    }
}

int pi2_afile_write(pi2_afile *f, const void *buf, size_t n, pi2_err *err)
{
    const uint8_t *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        if (afile_fail_budget >= 0) {
            if ((uint64_t)afile_fail_budget < chunk) {
                if (afile_fail_budget == 0)
                    return pi2_err_errno(err, PI2_EIO, ENOSPC, "%s: write failed", f->path);
                chunk = (size_t)afile_fail_budget;
            }
            afile_fail_budget -= (int64_t)chunk;
        }
        ssize_t w = write(f->fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return pi2_err_errno(err, PI2_EIO, errno, "%s: write failed", f->path);
        }
        if (w == 0)
            return pi2_err_errno(err, PI2_EIO, ENOSPC, "%s: write failed", f->path);
        p += w;
        n -= (size_t)w;
        f->size += (uint64_t)w;
        afile_behind(f);
    }
    return 0;
}

uint64_t pi2_afile_size(const pi2_afile *f) { return f->size; }
int pi2_afile_fd(const pi2_afile *f) { return f->fd; }

/* Unregister and unlock (after the temporary was renamed or removed). */
static void afile_free(pi2_afile *f)
{
    pi2_tmp_unregister(f->slot);
    if (f->lockfd >= 0)
        close(f->lockfd);
    free(f->path);
    free(f->tmp);
    free(f);
}

void pi2_fsync_dir_of(const char *path)
{
    char *dup = pi2_strdup(path);
    if (!dup)
        return;
    int dfd = open(dirname(dup), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dup);
}

int pi2_afile_commit(pi2_afile *f, pi2_err *err)
{
    int rc = 0;
    if (fsync(f->fd) != 0)
        rc = pi2_err_errno(err, PI2_EIO, errno, "%s: fsync failed", f->path);
    /* synced pages leave the page cache: a model just written would
     * otherwise stay cached in the writer's 4 KiB pages, and a reader that
     * maps it could not get 2 MiB ones (runtime/PERF.md, "Huge pages") */
    if (rc == 0)
        posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED); /* advisory: failure is harmless */
    if (close(f->fd) != 0 && rc == 0)
        rc = pi2_err_errno(err, PI2_EIO, errno, "%s: close failed", f->path);
    f->fd = -1;
    if (rc == 0 && rename(f->tmp, f->path) != 0)
        rc = pi2_err_errno(err, PI2_EIO, errno, "%s: cannot rename temporary file into place", f->path);
    if (rc != 0) {
        unlink(f->tmp);
        afile_free(f);
        return rc;
    }
    /* Make the rename durable. */
    pi2_fsync_dir_of(f->path);
    afile_free(f);
    return 0;
}

void pi2_afile_abort(pi2_afile *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    unlink(f->tmp);
    afile_free(f);
}

int pi2_dir_begin(const char *dir, char *tmp, size_t cap, pi2_err *err)
{
    struct stat st;
    if (stat(dir, &st) == 0)
        return pi2_err_set(err, PI2_EINVAL, "%s: already exists (choose a new output directory)", dir);
    pi2_tmp_sweep(dir);
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') /* "out/" -> "out.tmp.XXXXXX" */
        dl--;
    if (dl + 12 > cap)
        return pi2_err_set(err, PI2_ERANGE, "%s: path too long", dir);
    memcpy(tmp, dir, dl);
    memcpy(tmp + dl, ".tmp.XXXXXX", 12);
    if (!mkdtemp(tmp))
        return pi2_err_errno(err, PI2_EIO, errno, "%s: cannot create directory", dir);
    chmod(tmp, 0755); /* mkdtemp makes it private; a model dir is not */
    int fd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        flock(fd, LOCK_EX | LOCK_NB);
        if (pi2_tmp_register(tmp, fd, true) < 0)
            close(fd);
    }
    return 0;
}

/* Forget the temporary directory tmp: unregister, unlock. */
static void dir_forget(const char *tmp)
{
    int slot = pi2_tmp_find(tmp);
    if (slot < 0)
        return;
    int fd = pi2_tmp_fd(slot);
    pi2_tmp_unregister(slot);
    if (fd >= 0)
        close(fd);
}

int pi2_dir_commit(const char *tmp, const char *dir, pi2_err *err)
{
    if (rename(tmp, dir) != 0) {
        int e = errno;
        pi2_dir_abort(tmp);
        return pi2_err_errno(err, PI2_EIO, e, "%s: cannot rename %s into place", dir, tmp);
    }
    dir_forget(tmp);
    return 0;
}

void pi2_dir_abort(const char *tmp)
{
    DIR *dh = opendir(tmp);
    if (dh) {
        struct dirent *e;
        char path[4400];
        while ((e = readdir(dh)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            if (pi2_path_join(path, sizeof path, tmp, e->d_name))
                unlink(path);
        }
        closedir(dh);
    }
    rmdir(tmp);
    dir_forget(tmp);
}
