/*
 * tmpfs_write.c - physical-limit baseline for bench/dump_restore.py.
 *
 *   tmpfs_write PATH SIZE_MIB
 *
 * Fills a SIZE_MIB MiB malloc()ed buffer (untimed), then times, with
 * CLOCK_MONOTONIC:
 *   write_s       open(PATH, O_CREAT|O_TRUNC) + write() in 8 MiB chunks +
 *                 fsync() + close()          memory -> tmpfs (what a dump does)
 *   read_s        read() the file back into the same, already faulted-in
 *                 buffer in 8 MiB chunks     tmpfs -> memory
 *   read_fresh_s  read() the file into a freshly mmap()ed buffer, so every
 *                 page is also faulted in and zeroed on the way, as it is
 *                 for a restored process     tmpfs -> new memory
 * and prints one "key value" line for each.  PATH is removed at the end.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHUNK ((size_t)8 << 20)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void read_all(const char *path, unsigned char *buf, size_t size)
{
	size_t done = 0;
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		die("tmpfs_write: open for read");
	while (done < size) {
		size_t n = size - done < CHUNK ? size - done : CHUNK;
		ssize_t r = read(fd, buf + done, n);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("tmpfs_write: read");
		}
		if (r == 0) {
			fprintf(stderr, "tmpfs_write: short file\n");
			exit(1);
		}
		done += (size_t)r;
	}
	close(fd);
}

int main(int argc, char **argv)
{
	unsigned char *buf, *fresh;
	unsigned long mib;
	uint64_t *w;
	size_t size, done, i;
	double t0, t_write, t_read, t_fresh;
	char *end;
	int fd;

	if (argc != 3) {
		fprintf(stderr, "usage: %s PATH SIZE_MIB\n", argv[0]);
		return 2;
	}
	errno = 0;
	mib = strtoul(argv[2], &end, 10);
	if (errno || *end || mib == 0) {
		fprintf(stderr, "tmpfs_write: bad SIZE_MIB '%s'\n", argv[2]);
		return 2;
	}
	size = (size_t)mib << 20;

	buf = malloc(size);
	if (!buf)
		die("tmpfs_write: malloc");
	w = (uint64_t *)buf;
	for (i = 0; i < size / sizeof(uint64_t); i++)
		w[i] = (i * 0x9e3779b97f4a7c15ull) ^ (i >> 7);

	/* memory -> tmpfs */
	t0 = now();
	fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		die("tmpfs_write: open for write");
	for (done = 0; done < size;) {
		size_t n = size - done < CHUNK ? size - done : CHUNK;
		ssize_t r = write(fd, buf + done, n);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("tmpfs_write: write");
		}
		done += (size_t)r;
	}
	if (fsync(fd))
		die("tmpfs_write: fsync");
	if (close(fd))
		die("tmpfs_write: close");
	t_write = now() - t0;

	/* tmpfs -> memory (already faulted in) */
	memset(buf, 0, size);
	t0 = now();
	read_all(argv[1], buf, size);
	t_read = now() - t0;
	for (i = 0; i < size / sizeof(uint64_t); i++) {
		if (w[i] != ((i * 0x9e3779b97f4a7c15ull) ^ (i >> 7))) {
			fprintf(stderr, "tmpfs_write: read back wrong data at word %zu\n", i);
			return 1;
		}
	}
	free(buf);

	/* tmpfs -> new memory (page faults included) */
	fresh = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (fresh == MAP_FAILED)
		die("tmpfs_write: mmap");
	t0 = now();
	read_all(argv[1], fresh, size);
	t_fresh = now() - t0;

	if (unlink(argv[1]))
		die("tmpfs_write: unlink");
	printf("write_s %.6f\nread_s %.6f\nread_fresh_s %.6f\n", t_write, t_read, t_fresh);
	return 0;
}
