/* stasis_checkpoint_begin is copy-on-write: it returns before copying, the
 * program overwrites the whole region at once (from its end, ahead of the
 * background copier), and the version still holds the bytes of the
 * instant the checkpoint began.  usage: cow DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "stasis.h"

#define N (64ul << 20)

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    unsigned char *a = malloc(N);
    for (size_t i = 0; i < N; i++) a[i] = (unsigned char)(i % 251);
    int rc;
    if ((rc = stasis_init(argv[1], NULL)) || (rc = stasis_protect(0, a, N))) { printf("FAIL init %s\n", stasis_last_error()); return 1; }
    if ((rc = stasis_checkpoint_begin("c", 1))) { printf("FAIL begin %s\n", stasis_last_error()); return 1; }
    for (size_t p = N; p >= 4096; p -= 4096) memset(a + p - 4096, 0xEE, 4096);
    if ((rc = stasis_checkpoint_wait())) { printf("FAIL wait %s\n", stasis_last_error()); return 1; }
    struct stasis_stats s;
    stasis_stats(&s);
    if ((rc = stasis_restart("c", 1))) { printf("FAIL restart %s\n", stasis_last_error()); return 1; }
    for (size_t i = 0; i < N; i++)
        if (a[i] != (unsigned char)(i % 251)) { printf("FAIL byte %zu = %d\n", i, a[i]); return 1; }
    stasis_finalize();
    printf("PASS cow_copies=%llu faults=%llu\n", (unsigned long long)s.cow_copies, (unsigned long long)s.faults);
    return 0;
}
