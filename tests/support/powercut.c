/*
 * The power-loss model's shim, preloaded (LD_PRELOAD) into `ferry run` by
 * tests/support/powercut.rs: it keeps, beside the files of one directory,
 * the image a power cut would leave of them.
 *
 *   POWERCUT_DIR     the directory whose files are tracked (absolute; its
 *                    direct children only: ferry's data_dir)
 *   POWERCUT_SHADOW  where the durable image is kept: SHADOW/NAME is what
 *                    the disk holds of DIR/NAME for certain, and
 *                    SHADOW/NAME.pending every write to it since its last
 *                    fsync, in order (records: u64 offset, u64 length or
 *                    TRUNCATE, then the bytes)
 *
 * Every write to a tracked file goes to the file as usual (the process sees
 * nothing different) and is also appended to its pending log. fsync or
 * fdatasync of a tracked file (any of its descriptors, as on Linux) replays
 * the log onto the image, after the real call returned. A process killed at
 * any instant therefore leaves in SHADOW exactly what was fsynced, and in
 * the logs what was written after, which the test may drop, or tear.
 *
 * Names are metadata, and metadata is taken as durable at once: an unlink
 * or a rename of a tracked file is done on the image too (a file never
 * fsynced has no image: a cut leaves it absent). Writes through mmap are
 * not seen; SQLite maps only its -shm file, which it never syncs and
 * rebuilds when it is gone.
 *
 * Two faults on demand, for the store's failure paths:
 *
 *   POWERCUT_FSYNC_EIO_IF  a path: while a file is there, fsync and
 *                          fdatasync of a tracked file fail with EIO, and
 *                          the writes pending since its last sync are
 *                          dropped from the image, as a kernel that
 *                          marks the pages it failed to write clean
 *                          ("fsyncgate"): a later sync that succeeds does
 *                          not bring them back, though the process still
 *                          reads them from the file.
 *   POWERCUT_NO_FLOCK      set: flock fails with ENOLCK, as on a file
 *                          system without locks.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FD 65536
#define MAX_NAMES 256
#define TRUNCATE UINT64_MAX

static char dir[PATH_MAX];
static size_t dir_len;
static char shadow[PATH_MAX];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* A tracked name and its pending log's descriptor (-1: not open yet). */
struct name {
    char name[NAME_MAX + 1];
    int pending;
};
static struct name names[MAX_NAMES];
static int n_names;
/* fd -> 1 + index into names; 0: not tracked. */
static int fd_name[MAX_FD];

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_close)(int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_pwritev64)(int, const struct iovec *, int, off_t);
static int (*real_ftruncate64)(int, off_t);
static int (*real_truncate64)(const char *, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned);
static void (*real_sync)(void);
static int (*real_syncfs)(int);
static int (*real_flock)(int, int);
static char fail_sync_if[PATH_MAX];
static int no_flock;

static void die(const char *what) {
    char line[512];
    int n = snprintf(line, sizeof line, "powercut shim: %s: %s\n", what, strerror(errno));
    if (n > 0)
        (void)!write(2, line, (size_t)n);
    abort();
}

static void *next(const char *symbol) {
    void *f = dlsym(RTLD_NEXT, symbol);
    if (!f) {
        errno = ENOSYS;
        die(symbol);
    }
    return f;
}

static void init_once(void) {
    real_open = next("open64");
    real_openat = next("openat64");
    real_close = next("close");
    real_write = next("write");
    real_writev = next("writev");
    real_pwrite64 = next("pwrite64");
    real_pwritev64 = next("pwritev64");
    real_ftruncate64 = next("ftruncate64");
    real_truncate64 = next("truncate64");
    real_fsync = next("fsync");
    real_fdatasync = next("fdatasync");
    real_unlink = next("unlink");
    real_unlinkat = next("unlinkat");
    real_rename = next("rename");
    real_renameat = next("renameat");
    real_renameat2 = next("renameat2");
    real_sync = next("sync");
    real_syncfs = next("syncfs");
    real_flock = next("flock");
    const char *f = getenv("POWERCUT_FSYNC_EIO_IF");
    if (f)
        snprintf(fail_sync_if, sizeof fail_sync_if, "%s", f);
    no_flock = getenv("POWERCUT_NO_FLOCK") != NULL;
    const char *d = getenv("POWERCUT_DIR");
    const char *s = getenv("POWERCUT_SHADOW");
    if (!d || !s || d[0] != '/' || s[0] != '/') {
        errno = EINVAL;
        die("POWERCUT_DIR and POWERCUT_SHADOW must be absolute paths");
    }
    snprintf(dir, sizeof dir, "%s", d);
    dir_len = strlen(dir);
    while (dir_len > 1 && dir[dir_len - 1] == '/')
        dir[--dir_len] = 0;
    snprintf(shadow, sizeof shadow, "%s", s);
}

static pthread_once_t initialized = PTHREAD_ONCE_INIT;

/* Another preloaded library's constructor (libfaketime's) may call into
 * this one before its own constructor ran: every entry point makes sure. */
static void init(void) { pthread_once(&initialized, init_once); }

__attribute__((constructor)) static void init_at_load(void) { init(); }

/* The tracked name `path` (relative to `dirfd`) stands for, or NULL. */
static const char *tracked_name(int dirfd, const char *path, char *buf) {
    char full[PATH_MAX];
    if (!path)
        return NULL;
    if (path[0] == '/') {
        snprintf(full, sizeof full, "%s", path);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            if (!getcwd(base, sizeof base))
                return NULL;
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t n = readlink(link, base, sizeof base - 1);
            if (n < 0)
                return NULL;
            base[n] = 0;
        }
        snprintf(full, sizeof full, "%s/%s", base, path);
    }
    if (strncmp(full, dir, dir_len) != 0 || full[dir_len] != '/')
        return NULL;
    const char *rest = full + dir_len + 1;
    if (!rest[0] || strchr(rest, '/') || strlen(rest) > NAME_MAX - 8)
        return NULL;
    snprintf(buf, NAME_MAX + 1, "%s", rest);
    return buf;
}

/* The index of `name`, added when new. Under the lock. */
static int name_index(const char *name) {
    for (int i = 0; i < n_names; i++)
        if (strcmp(names[i].name, name) == 0)
            return i;
    if (n_names == MAX_NAMES) {
        errno = ENFILE;
        die("too many tracked names");
    }
    snprintf(names[n_names].name, sizeof names[n_names].name, "%s", name);
    names[n_names].pending = -1;
    return n_names++;
}

static void shadow_path(char *out, const char *name, const char *suffix) {
    snprintf(out, PATH_MAX, "%s/%s%s", shadow, name, suffix);
}

/* A log left by a process killed mid-record (a SIGKILL, not a power cut:
 * the writes it logged are still in the file, and still unsynced) ends in
 * a torn record; it is cut there before this process appends to it. */
static void cut_torn_record(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0)
        die("stat a pending log");
    off_t at = 0;
    while (at + 16 <= st.st_size) {
        uint64_t head[2];
        if (pread(fd, head, sizeof head, at) != (ssize_t)sizeof head)
            die("read a pending log");
        off_t next = at + 16 + (head[1] == TRUNCATE ? 0 : (off_t)head[1]);
        if (next > st.st_size)
            break;
        at = next;
    }
    if (at < st.st_size && real_ftruncate64(fd, at) != 0)
        die("cut a pending log");
}

static int pending_fd(int i) {
    if (names[i].pending < 0) {
        char p[PATH_MAX];
        shadow_path(p, names[i].name, ".pending");
        names[i].pending = real_open(p, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (names[i].pending < 0)
            die(p);
        cut_torn_record(names[i].pending);
    }
    return names[i].pending;
}

static void put_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t n = real_write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die("append to a pending log");
        p += n;
        len -= (size_t)n;
    }
}

/* Appends one record to name i's log. Under the lock. */
static void record(int i, uint64_t offset, uint64_t len, const struct iovec *iov, int iovcnt) {
    int fd = pending_fd(i);
    uint64_t head[2] = {offset, len};
    put_all(fd, head, sizeof head);
    if (len == TRUNCATE)
        return;
    for (int k = 0; k < iovcnt && len; k++) {
        size_t take = iov[k].iov_len < len ? iov[k].iov_len : (size_t)len;
        put_all(fd, iov[k].iov_base, take);
        len -= take;
    }
}

static void get_all(int fd, void *buf, size_t len, off_t at) {
    char *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, at);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            errno = EIO;
        if (n <= 0)
            die("read a pending log (short)");
        p += n;
        at += n;
        len -= (size_t)n;
    }
}

/* Replays name i's log onto its image and empties the log. Under the lock. */
static void make_durable(int i) {
    int log = pending_fd(i);
    struct stat st;
    if (fstat(log, &st) != 0)
        die("stat a pending log");
    if (st.st_size == 0)
        return;
    char p[PATH_MAX];
    shadow_path(p, names[i].name, "");
    int img = real_open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (img < 0)
        die(p);
    static char chunk[1 << 16];
    off_t at = 0;
    while (at < st.st_size) {
        uint64_t head[2];
        get_all(log, head, sizeof head, at);
        at += sizeof head;
        if (head[1] == TRUNCATE) {
            if (real_ftruncate64(img, (off_t)head[0]) != 0)
                die("truncate an image");
            continue;
        }
        uint64_t done = 0;
        while (done < head[1]) {
            size_t take = head[1] - done < sizeof chunk ? (size_t)(head[1] - done) : sizeof chunk;
            get_all(log, chunk, take, at);
            if (real_pwrite64(img, chunk, take, (off_t)(head[0] + done)) != (ssize_t)take)
                die("write an image");
            at += (off_t)take;
            done += take;
        }
    }
    real_close(img);
    if (real_ftruncate64(log, 0) != 0)
        die("empty a pending log");
}

static int tracked_fd(int fd) {
    return fd >= 0 && fd < MAX_FD ? __atomic_load_n(&fd_name[fd], __ATOMIC_ACQUIRE) : 0;
}

static int after_open(int fd, int dirfd, const char *path, int flags) {
    char buf[NAME_MAX + 1];
    const char *name;
    if (fd < 0 || fd >= MAX_FD || !(name = tracked_name(dirfd, path, buf)))
        return fd;
    pthread_mutex_lock(&lock);
    int i = name_index(name);
    if (flags & O_TRUNC)
        record(i, 0, TRUNCATE, NULL, 0);
    __atomic_store_n(&fd_name[fd], i + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    return fd;
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

/* open, open64, openat and openat64 differ only in the directory. */
#define COMMA ,
#define WRAP_OPEN(fn, dirfd_param, dirfd)                                             \
    int fn(dirfd_param const char *path, int flags, ...) {                            \
        init();                                                                       \
        va_list ap;                                                                   \
        va_start(ap, flags);                                                          \
        mode_t mode = mode_arg(flags, ap);                                            \
        va_end(ap);                                                                   \
        return after_open(real_openat(dirfd, path, flags, mode), dirfd, path, flags); \
    }
WRAP_OPEN(open, , AT_FDCWD)
WRAP_OPEN(open64, , AT_FDCWD)
WRAP_OPEN(openat, int at_dir COMMA, at_dir)
WRAP_OPEN(openat64, int at_dir COMMA, at_dir)
int creat(const char *path, mode_t mode) { init(); return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode); }
int creat64(const char *path, mode_t mode) { init(); return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode); }

int close(int fd) { init();
    if (fd >= 0 && fd < MAX_FD)
        __atomic_store_n(&fd_name[fd], 0, __ATOMIC_RELEASE);
    return real_close(fd);
}

/* Records what a write of `n` bytes ending at the descriptor's offset (or
 * at `at`, for positioned writes) put in the file. */
static ssize_t after_write(int fd, ssize_t n, off_t at, const struct iovec *iov, int iovcnt) {
    int t = tracked_fd(fd);
    if (!t || n <= 0)
        return n;
    int saved = errno;
    if (at < 0)
        at = lseek(fd, 0, SEEK_CUR) - n;
    pthread_mutex_lock(&lock);
    record(t - 1, (uint64_t)at, (uint64_t)n, iov, iovcnt);
    pthread_mutex_unlock(&lock);
    errno = saved;
    return n;
}

/* The store has one writing thread: a write and its record are not made
 * atomic together (two threads writing one file at once could be logged
 * in the other order). */
ssize_t write(int fd, const void *buf, size_t len) { init();
    if (!tracked_fd(fd))
        return real_write(fd, buf, len);
    struct iovec v = {(void *)buf, len};
    return after_write(fd, real_write(fd, buf, len), -1, &v, 1);
}
ssize_t writev(int fd, const struct iovec *iov, int iovcnt) { init();
    return after_write(fd, real_writev(fd, iov, iovcnt), -1, iov, iovcnt);
}
ssize_t pwrite(int fd, const void *buf, size_t len, off_t at) { init();
    struct iovec v = {(void *)buf, len};
    return after_write(fd, real_pwrite64(fd, buf, len, at), at, &v, 1);
}
ssize_t pwrite64(int fd, const void *buf, size_t len, off_t at) { init();
    struct iovec v = {(void *)buf, len};
    return after_write(fd, real_pwrite64(fd, buf, len, at), at, &v, 1);
}
ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t at) { init();
    return after_write(fd, real_pwritev64(fd, iov, iovcnt, at), at, iov, iovcnt);
}
ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off_t at) { init();
    return after_write(fd, real_pwritev64(fd, iov, iovcnt, at), at, iov, iovcnt);
}

static int after_truncate(int t, int rc, off_t len) {
    if (t && rc == 0) {
        pthread_mutex_lock(&lock);
        record(t - 1, (uint64_t)len, TRUNCATE, NULL, 0);
        pthread_mutex_unlock(&lock);
    }
    return rc;
}
int ftruncate(int fd, off_t len) { init(); return after_truncate(tracked_fd(fd), real_ftruncate64(fd, len), len); }
int ftruncate64(int fd, off_t len) { init(); return after_truncate(tracked_fd(fd), real_ftruncate64(fd, len), len); }

static int truncate_path(const char *path, off_t len) {
    char buf[NAME_MAX + 1];
    const char *name = tracked_name(AT_FDCWD, path, buf);
    int rc = real_truncate64(path, len);
    if (name && rc == 0) {
        pthread_mutex_lock(&lock);
        record(name_index(name), (uint64_t)len, TRUNCATE, NULL, 0);
        pthread_mutex_unlock(&lock);
    }
    return rc;
}
int truncate(const char *path, off_t len) { init(); return truncate_path(path, len); }
int truncate64(const char *path, off_t len) { init(); return truncate_path(path, len); }

static int after_sync(int fd, int rc) {
    int t = tracked_fd(fd);
    if (t && rc == 0) {
        int saved = errno;
        pthread_mutex_lock(&lock);
        make_durable(t - 1);
        pthread_mutex_unlock(&lock);
        errno = saved;
    }
    return rc;
}
/* POWERCUT_FSYNC_EIO_IF: whether syncs fail now; if so, name t's pending
 * writes are dropped (never to reach the image) and EIO is returned. */
static int sync_failed(int t) {
    if (!t || !fail_sync_if[0] || access(fail_sync_if, F_OK) != 0)
        return 0;
    pthread_mutex_lock(&lock);
    if (real_ftruncate64(pending_fd(t - 1), 0) != 0)
        die("drop a pending log");
    pthread_mutex_unlock(&lock);
    errno = EIO;
    return 1;
}
int fsync(int fd) { init();
    if (sync_failed(tracked_fd(fd)))
        return -1;
    return after_sync(fd, real_fsync(fd));
}
int fdatasync(int fd) { init();
    if (sync_failed(tracked_fd(fd)))
        return -1;
    return after_sync(fd, real_fdatasync(fd));
}

int flock(int fd, int op) { init();
    if (no_flock) {
        errno = ENOLCK;
        return -1;
    }
    return real_flock(fd, op);
}

static void all_durable(void) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_names; i++)
        make_durable(i);
    pthread_mutex_unlock(&lock);
}
void sync(void) { init();
    real_sync();
    all_durable();
}
int syncfs(int fd) { init();
    int rc = real_syncfs(fd);
    if (rc == 0)
        all_durable();
    return rc;
}

/* Name i is gone: its image and log go, and its descriptors are no longer
 * tracked (they write to a file no name reaches). Under the lock. */
static void forget(int i) {
    char p[PATH_MAX];
    shadow_path(p, names[i].name, "");
    real_unlink(p);
    if (names[i].pending >= 0 && real_ftruncate64(names[i].pending, 0) != 0)
        die("empty a pending log");
    for (int fd = 0; fd < MAX_FD; fd++)
        if (fd_name[fd] == i + 1)
            __atomic_store_n(&fd_name[fd], 0, __ATOMIC_RELEASE);
}

static int after_unlink(int dirfd, const char *path, int rc) {
    char buf[NAME_MAX + 1];
    const char *name = tracked_name(dirfd, path, buf);
    if (name && rc == 0) {
        pthread_mutex_lock(&lock);
        forget(name_index(name));
        pthread_mutex_unlock(&lock);
    }
    return rc;
}
int unlink(const char *path) { init(); return after_unlink(AT_FDCWD, path, real_unlink(path)); }
int unlinkat(int dirfd, const char *path, int flags) { init();
    return after_unlink(dirfd, path, real_unlinkat(dirfd, path, flags));
}

/* `from` now has the name `to`: so has its image (an empty file when it
 * was never fsynced: the name is durable, its data is not), its log and
 * its descriptors. Under the lock. */
static void moved(const char *from, const char *to) {
    int f = name_index(from), t = name_index(to);
    forget(t);
    char a[PATH_MAX], b[PATH_MAX];
    shadow_path(a, from, "");
    shadow_path(b, to, "");
    if (real_rename(a, b) != 0) {
        int fd = real_open(b, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            die(b);
        real_close(fd);
    }
    if (names[f].pending >= 0)
        real_close(names[f].pending);
    if (names[t].pending >= 0)
        real_close(names[t].pending);
    names[f].pending = names[t].pending = -1;
    shadow_path(a, from, ".pending");
    shadow_path(b, to, ".pending");
    if (real_rename(a, b) != 0)
        real_unlink(b);
    for (int fd = 0; fd < MAX_FD; fd++)
        if (fd_name[fd] == f + 1)
            __atomic_store_n(&fd_name[fd], t + 1, __ATOMIC_RELEASE);
}

static int after_rename(int olddir, const char *from, int newdir, const char *to, int rc) {
    char fb[NAME_MAX + 1], tb[NAME_MAX + 1];
    const char *f = tracked_name(olddir, from, fb);
    const char *t = tracked_name(newdir, to, tb);
    if (rc != 0 || (!f && !t))
        return rc;
    pthread_mutex_lock(&lock);
    if (f && t)
        moved(f, t);
    else if (f)
        forget(name_index(f));
    else
        /* A file from elsewhere took a tracked name: its data was never
         * fsynced here; the name is durable, empty. */
        moved(t, t);
    pthread_mutex_unlock(&lock);
    return rc;
}
int rename(const char *from, const char *to) { init();
    return after_rename(AT_FDCWD, from, AT_FDCWD, to, real_rename(from, to));
}
int renameat(int olddir, const char *from, int newdir, const char *to) { init();
    return after_rename(olddir, from, newdir, to, real_renameat(olddir, from, newdir, to));
}
int renameat2(int olddir, const char *from, int newdir, const char *to, unsigned flags) { init();
    return after_rename(olddir, from, newdir, to, real_renameat2(olddir, from, newdir, to, flags));
}
