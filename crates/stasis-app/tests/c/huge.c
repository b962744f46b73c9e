/* Huge pages under acck: a sequential write releases runs of >= 512 pages,
 * which are collapsed into 2 MiB pages; after the checkpoint the region is
 * monitored at 4 KiB again (one byte written costs one page copied), and a
 * restart gives back exactly the checkpointed bytes.
 * usage: huge DIR   (run with STASIS_MONITOR=acck STASIS_HUGE=1) */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include "stasis.h"

#define MB (1ul << 20)
#define N (32 * MB)

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    unsigned char *raw = mmap(0, N + 2 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *a = (unsigned char *)(((uintptr_t)raw + 2 * MB - 1) & ~(2 * MB - 1));
    if (stasis_init(argv[1], NULL) || stasis_protect(0, a, N)) { printf("FAIL init: %s\n", stasis_last_error()); return 1; }
    for (size_t i = 0; i < N; i++) a[i] = (unsigned char)(i * 7);
    if (stasis_checkpoint("h", 1)) { printf("FAIL ckpt 1: %s\n", stasis_last_error()); return 1; }
    for (size_t i = 0; i < N; i++) a[i] = (unsigned char)(i * 7 + 1);
    struct stasis_stats s1, s2, s3;
    stasis_stats(&s1);
    if (stasis_checkpoint("h", 2)) { printf("FAIL ckpt 2\n"); return 1; }
    stasis_stats(&s2);
    a[12345] = 99;
    if (stasis_checkpoint("h", 3)) { printf("FAIL ckpt 3\n"); return 1; }
    stasis_stats(&s3);
    unsigned long long one = s3.bytes_copied - s2.bytes_copied;
    memset(a, 0, N);
    if (stasis_restart("h", 2)) { printf("FAIL restart: %s\n", stasis_last_error()); return 1; }
    for (size_t i = 0; i < N; i++)
        if (a[i] != (unsigned char)(i * 7 + 1)) { printf("FAIL byte %zu\n", i); return 1; }
    printf("collapsed=%llu failed=%llu pieces=%llu one_byte_copied=%llu note=%s\n",
           (unsigned long long)s1.huge_collapsed, (unsigned long long)s1.huge_failed,
           (unsigned long long)s1.pieces_released, one, stasis_note());
    stasis_finalize();
    printf("PASS\n");
    return 0;
}
