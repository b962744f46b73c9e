/*
 * unlinked_link.c - an open file removed under its name but still linked
 * under another in the same directory (zdtm's unlink_fstat03): the fd
 * must come back on that same file, not on a copy.
 *
 *   unlinked_link PIDFILE
 *
 * Set up before "ready" (in the starting cwd): unlinked_link.file opened
 * O_RDWR, hard-linked as unlinked_link.file.link, unlinked; then 1000
 * pattern bytes written through the fd and its offset set to 300.
 * After SIGTERM (tags in brackets):
 *   [same]    the fd is the file at the link's absolute path (same device
 *             and inode), with one link;
 *   [content] its size is 1000, its bytes are the pattern, its offset 300;
 *   [shared]  the link reads the same bytes (nothing is written: the file
 *             is shared by every restore of the image).
 */
#include "zdtm.h"

#include <fcntl.h>
#include <sys/stat.h>

#define SEED_L 0x6c696e6b00ull
#define LEN 1000
#define POS 300

int main(int argc, char **argv)
{
	char link_abs[PATH_MAX], buf[LEN];
	struct stat a, b;
	int fd, lf;
	off_t pos;

	zdtm_init(argc, argv, 0, "");
	unlink("unlinked_link.file");
	unlink("unlinked_link.file.link");
	fd = open("unlinked_link.file", O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || link("unlinked_link.file", "unlinked_link.file.link") ||
	    unlink("unlinked_link.file"))
		zdtm_die("file and link");
	if (!realpath("unlinked_link.file.link", link_abs))
		zdtm_die("realpath");
	zdtm_fill(buf, LEN, SEED_L);
	if (write(fd, buf, LEN) != LEN || lseek(fd, POS, SEEK_SET) != POS)
		zdtm_die("write");

	zdtm_ready();
	while (!zdtm_stop)
		zdtm_msleep(50);

	ZDTM_CORRUPT("same", {
		unlink(link_abs);
		close(open(link_abs, O_CREAT | O_WRONLY, 0600));
	});
	ZDTM_CORRUPT("content", ftruncate(fd, 10));
	if (zdtm_check(fstat(fd, &a) == 0 && stat(link_abs, &b) == 0, "same", "stat: %s",
		       strerror(errno))) {
		zdtm_check(a.st_dev == b.st_dev && a.st_ino == b.st_ino, "same",
			   "fd is %lu, the link %lu", (unsigned long)a.st_ino,
			   (unsigned long)b.st_ino);
		zdtm_check(a.st_nlink == 1, "same", "%lu links", (unsigned long)a.st_nlink);
		zdtm_check(a.st_size == LEN, "content", "size %lld", (long long)a.st_size);
	}
	pos = lseek(fd, 0, SEEK_CUR);
	zdtm_check(pos == POS, "content", "offset %lld", (long long)pos);
	memset(buf, 0, sizeof(buf));
	if (zdtm_check(pread(fd, buf, LEN, 0) == LEN, "content", "short read"))
		zdtm_verify_pattern("content", "file", buf, LEN, SEED_L);
	lf = open(link_abs, O_RDONLY);
	memset(buf, 0, sizeof(buf));
	if (zdtm_check(lf >= 0 && pread(lf, buf, LEN, 0) == LEN, "shared",
		       "reading the link: %s", strerror(errno)))
		zdtm_verify_pattern("shared", "the link", buf, LEN, SEED_L);
	if (lf >= 0)
		close(lf);
	zdtm_finish();
	return 0;
}
