/* slowdisk: a FUSE file system with one file, disk.img, that is as slow as a small disk.
 *
 * It serves reads and writes of disk.img from a backing file and makes each request take the
 * time a simple disk model gives it:
 *   - a seek of SEEK_MS when the request starts more than SEEK_KIB away (either way) from where
 *     the previous request ended;
 *   - transfer at MBPS (10^6 bytes per second).
 * The server is single-threaded (run it with -s): requests are served one at a time, in the
 * order the kernel hands them over, so the model is one queue and one head. Put a loop device
 * (losetup --direct-io=on) running BFQ over disk.img and the queue forms in BFQ, for every
 * reader whatever its cgroup. disk.img is opened with direct_io, so the kernel keeps no page
 * cache of it: every request of the loop device reaches this model.
 *
 * How it differs from a real disk: the seek cost is flat (no distance, no rotation), there is no
 * on-drive cache, read-ahead or write-back (a write costs what a read of the same size costs),
 * no command queueing, and a flush costs nothing beyond the backing file's own fdatasync.
 *
 * SIGUSR1 switches the delays off (fast mode, e.g. for mkfs and populating), SIGUSR2 back on.
 * At exit, counters go to stderr.
 *
 *   slowdisk --backing=FILE [--seek-ms=8] [--seek-kib=512] [--mbps=40] [--fast] -f -s MOUNTPOINT
 *
 * Build: gcc -O2 -Wall -o slowdisk slowdisk.c $(pkg-config --cflags --libs fuse3)
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *FILE_NAME = "disk.img";

static struct options {
	const char *backing;
	double seek_ms, mbps;
	int seek_kib, fast;
} opt = { NULL, 8.0, 40.0, 512, 0 };

#define OPT(t, p) { t, offsetof(struct options, p), 1 }
static const struct fuse_opt option_spec[] = {
	OPT("--backing=%s", backing), OPT("--seek-ms=%lf", seek_ms), OPT("--mbps=%lf", mbps),
	OPT("--seek-kib=%d", seek_kib), OPT("--fast", fast), FUSE_OPT_END
};

static int backing_fd = -1;
static volatile sig_atomic_t fast_mode;
static off_t last_end;  /* where the previous request ended: the head */
static struct { unsigned long long reads, writes, seeks, bytes; double modelled_s; } stats;

static void on_signal(int sig) { fast_mode = sig == SIGUSR1; }

/* Serve one request: do it, then sleep until the model says it is done. */
static ssize_t serve(int write, char *buf, size_t size, off_t off)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	int seek = llabs((long long)(off - last_end)) > (long long)opt.seek_kib * 1024;
	double d = (seek ? opt.seek_ms / 1e3 : 0) + size / (opt.mbps * 1e6);
	ssize_t n = write ? pwrite(backing_fd, buf, size, off) : pread(backing_fd, buf, size, off);
	if (n < 0)
		return -errno;
	last_end = off + n;
	if (write) stats.writes++; else stats.reads++;
	stats.seeks += seek;
	stats.bytes += n;
	if (fast_mode)
		return n;
	stats.modelled_s += d;
	long long ns = t.tv_nsec + (long long)(d * 1e9);
	t.tv_sec += ns / 1000000000;
	t.tv_nsec = ns % 1000000000;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
		;
	return n;
}

static int is_file(const char *path) { return strcmp(path + 1, FILE_NAME) == 0; }

static int sd_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	if (strcmp(path, "/") == 0) {
		memset(st, 0, sizeof(*st));
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
		return 0;
	}
	if (!is_file(path))
		return -ENOENT;
	if (fstat(backing_fd, st) < 0)
		return -errno;
	st->st_mode = S_IFREG | 0600;
	st->st_nlink = 1;
	return 0;
}

static int sd_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
		      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	if (strcmp(path, "/") != 0)
		return -ENOENT;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	fill(buf, FILE_NAME, NULL, 0, 0);
	return 0;
}

static int sd_open(const char *path, struct fuse_file_info *fi)
{
	if (!is_file(path))
		return -ENOENT;
	fi->direct_io = 1;  /* no page cache in the kernel: every read comes here */
	return 0;
}

static int sd_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	return serve(0, buf, size, off);
}

static int sd_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	return serve(1, (char *)buf, size, off);
}

static int sd_flush(const char *path, struct fuse_file_info *fi) { return 0; }

static int sd_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	return (datasync ? fdatasync(backing_fd) : fsync(backing_fd)) < 0 ? -errno : 0;
}

static void *sd_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	cfg->attr_timeout = cfg->entry_timeout = 0;
	cfg->use_ino = 0;
	return NULL;
}

static void sd_destroy(void *data)
{
	fprintf(stderr, "slowdisk: %llu reads, %llu writes, %llu seeks, %.1f MB, %.1f s modelled\n",
		stats.reads, stats.writes, stats.seeks, stats.bytes / 1e6, stats.modelled_s);
}

static const struct fuse_operations ops = {
	.init = sd_init, .destroy = sd_destroy, .getattr = sd_getattr, .readdir = sd_readdir,
	.open = sd_open, .read = sd_read, .write = sd_write, .flush = sd_flush, .fsync = sd_fsync,
};

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	if (fuse_opt_parse(&args, &opt, option_spec, NULL) == -1)
		return 1;
	if (!opt.backing || opt.mbps <= 0 || opt.seek_ms < 0 || opt.seek_kib < 0) {
		fprintf(stderr, "usage: %s --backing=FILE [--seek-ms=8] [--seek-kib=512] [--mbps=40] "
			"[--fast] -f -s MOUNTPOINT\n", argv[0]);
		return 1;
	}
	backing_fd = open(opt.backing, O_RDWR);
	if (backing_fd < 0) {
		perror(opt.backing);
		return 1;
	}
	fast_mode = opt.fast;
	struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_RESTART };
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	return fuse_main(args.argc, args.argv, &ops, NULL);
}
