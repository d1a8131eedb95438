// SPDX-License-Identifier: GPL-2.0
/*
 * cosched-tools: the measuring programs the experiments run inside the test guest.
 * Built static (scripts/setup.sh) so it needs nothing from the guest image.
 *
 *   cosched-tools launch N CMD [ARGS...]
 *       Starts CMD N times, one after the other. Each time prints "launch <i> <us> <cpu_us>": the
 *       time from fork() to the moment CMD writes a line "ready" on its standard output (seed
 *       000's start-up time: "from when an application is launched to when it is ready"), and the
 *       CPU time CMD used until it exited (user + system, from wait4).
 *   cosched-tools primes LIMIT
 *       Counts the primes below LIMIT by trial division (as in the FEAS paper, sec. 4.5) and prints
 *       "primes <count> <us>".
 *   cosched-tools pingpong N
 *       Two processes pass one byte back and forth over two pipes N times (2N context switches)
 *       and print "pingpong <N> <us>".
 *   cosched-tools seqread FILE SECONDS
 *       A sequential reader: reads FILE from start to end in 1 MiB blocks with O_DIRECT (the page
 *       cache never serves it), again and again, for SECONDS, in one process (one I/O context,
 *       so the disk scheduler sees one long-running reader, not a new one per pass), and prints
 *       "seqread <bytes> <us>".
 *   cosched-tools randread FILE SECONDS
 *       A random reader: 4-64 KiB O_DIRECT reads at random 4 KiB-aligned offsets of FILE, for
 *       SECONDS, in one process; prints "randread <bytes> <us>".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void die(const char *what)
{
	fprintf(stderr, "cosched-tools: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* Time from fork to "ready" on the child's stdout; -1 if it exited without saying it. */
static int64_t launch_once(char **argv, int64_t *cpu_us)
{
	struct rusage ru;
	int fd[2];
	char buf[4096];
	size_t have = 0;
	int64_t ready_us = -1;
	uint64_t t0;
	pid_t pid;
	int status;

	if (pipe(fd))
		die("pipe");
	t0 = now_us();
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		dup2(fd[1], 1);
		close(fd[0]);
		close(fd[1]);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(fd[1]);
	for (;;) {
		ssize_t n = read(fd[0], buf + have, sizeof(buf) - 1 - have);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += n;
		buf[have] = 0;
		if (ready_us < 0 && (strstr(buf, "ready\n") == buf || strstr(buf, "\nready\n"))) {
			ready_us = now_us() - t0;
		}
		if (have > sizeof(buf) / 2) /* keep the tail only */
			have = 0;
	}
	close(fd[0]);
	while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR)
		;
	*cpu_us = (int64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 + ru.ru_utime.tv_usec +
		  ru.ru_stime.tv_usec;
	return ready_us;
}

static int cmd_launch(int argc, char **argv)
{
	int n, i;

	if (argc < 4) {
		fprintf(stderr, "usage: cosched-tools launch N CMD [ARGS...]\n");
		return 2;
	}
	n = atoi(argv[2]);
	for (i = 1; i <= n; i++) {
		int64_t cpu_us = 0;
		int64_t us = launch_once(argv + 3, &cpu_us);

		if (us < 0) {
			fprintf(stderr, "cosched-tools: %s did not print \"ready\"\n", argv[3]);
			return 1;
		}
		printf("launch %d %lld %lld\n", i, (long long)us, (long long)cpu_us);
		fflush(stdout);
	}
	return 0;
}

static int cmd_primes(int argc, char **argv)
{
	long limit, n, d, count = 0;
	uint64_t t0;

	if (argc != 3) {
		fprintf(stderr, "usage: cosched-tools primes LIMIT\n");
		return 2;
	}
	limit = atol(argv[2]);
	t0 = now_us();
	for (n = 2; n < limit; n++) {
		for (d = 2; d * d <= n; d++)
			if (n % d == 0)
				break;
		if (d * d > n)
			count++;
	}
	printf("primes %ld %llu\n", count, (unsigned long long)(now_us() - t0));
	return 0;
}

static int cmd_pingpong(int argc, char **argv)
{
	int ab[2], ba[2];
	long n, i;
	char c = 'x';
	uint64_t t0;
	pid_t pid;

	if (argc != 3) {
		fprintf(stderr, "usage: cosched-tools pingpong N\n");
		return 2;
	}
	n = atol(argv[2]);
	if (pipe(ab) || pipe(ba))
		die("pipe");
	t0 = now_us();
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		for (i = 0; i < n; i++) {
			if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1)
				_exit(1);
		}
		_exit(0);
	}
	for (i = 0; i < n; i++) {
		if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1)
			die("pingpong");
	}
	waitpid(pid, NULL, 0);
	printf("pingpong %ld %llu\n", n, (unsigned long long)(now_us() - t0));
	return 0;
}

static int cmd_seqread(int argc, char **argv)
{
	const size_t block = 1 << 20;
	uint64_t t0, until, total = 0;
	void *buf;
	ssize_t n;
	int fd;

	if (argc != 4) {
		fprintf(stderr, "usage: cosched-tools seqread FILE SECONDS\n");
		return 2;
	}
	fd = open(argv[2], O_RDONLY | O_DIRECT);
	if (fd < 0)
		die(argv[2]);
	if (posix_memalign(&buf, 4096, block))
		die("posix_memalign");
	t0 = now_us();
	until = t0 + (uint64_t)(atof(argv[3]) * 1e6);
	while (now_us() < until) {
		n = read(fd, buf, block);
		if (n < 0)
			die("read");
		if (n == 0) {
			if (lseek(fd, 0, SEEK_SET) < 0)
				die("lseek");
			continue;
		}
		total += n;
	}
	printf("seqread %llu %llu\n", (unsigned long long)total, (unsigned long long)(now_us() - t0));
	return 0;
}

static int cmd_randread(int argc, char **argv)
{
	const size_t max = 64 << 10;
	uint64_t t0, until, total = 0, seed;
	off_t size;
	void *buf;
	ssize_t n;
	int fd;

	if (argc != 4) {
		fprintf(stderr, "usage: cosched-tools randread FILE SECONDS\n");
		return 2;
	}
	fd = open(argv[2], O_RDONLY | O_DIRECT);
	if (fd < 0)
		die(argv[2]);
	size = lseek(fd, 0, SEEK_END);
	if (size < (off_t)max)
		die("randread: file smaller than 64 KiB");
	if (posix_memalign(&buf, 4096, max))
		die("posix_memalign");
	t0 = now_us();
	seed = t0 | 1;
	until = t0 + (uint64_t)(atof(argv[3]) * 1e6);
	while (now_us() < until) {
		/* xorshift64: no libc state, so one reader's sequence is its own */
		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		size_t len = (1 + seed % 16) << 12;
		off_t off = (off_t)((seed >> 8) % (uint64_t)((size - max) >> 12)) << 12;
		n = pread(fd, buf, len, off);
		if (n < 0)
			die("pread");
		total += n;
	}
	printf("randread %llu %llu\n", (unsigned long long)total, (unsigned long long)(now_us() - t0));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "launch"))
		return cmd_launch(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "primes"))
		return cmd_primes(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "pingpong"))
		return cmd_pingpong(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "seqread"))
		return cmd_seqread(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "randread"))
		return cmd_randread(argc, argv);
	fprintf(stderr, "usage: cosched-tools launch N CMD [ARGS...] | primes LIMIT | pingpong N | seqread FILE SECONDS | randread FILE SECONDS\n");
	return 2;
}
