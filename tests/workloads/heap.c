/*
 * heap.c - large heap area, many small malloc'd blocks, a sparse mapping and
 * a region whose content is a function of an iteration counter.
 *
 *   heap PIDFILE [SIZE_MIB]      (default 64)
 *
 * State:
 *   big     SIZE_MIB MiB from malloc(), pattern(SEED_BIG) over its offsets.
 *   list    1000 malloc'd nodes (payload sizes 1..2039 bytes) in a linked
 *           list, payload = pattern(SEED_NODE + index); every node was
 *           allocated between two short-lived spacer blocks that were freed,
 *           so the malloc heap is fragmented.
 *   sparse  16 MiB anonymous mmap, only every 7th page written (pattern of
 *           SEED_SPARSE + page); every other page must still read as zero.
 *   chunks  4 MiB = 256 chunks of 16 KiB.  Initially chunk j holds
 *           pattern(SEED_CHUNK, j, 0).  Iteration i (1, 2, ...) rewrites chunk
 *           i % 256 with pattern(SEED_CHUNK, j, i), then sets counter = i.  So
 *           the whole region is a function of the counter.
 */
#include "zdtm.h"

#include <sys/mman.h>

#define SEED_BIG    0x6865617062696700ull
#define SEED_NODE   0x686561706e6f6400ull
#define SEED_SPARSE 0x6865617073707200ull
#define SEED_CHUNK  0x6865617063686b00ull

#define NNODES      1000
#define NCHUNKS     256
#define CHUNK_SIZE  (16 * 1024)
#define SPARSE_SIZE (16 * 1024 * 1024)
#define SPARSE_STEP 7

struct node {
	struct node *next;
	size_t index;
	size_t len;
	uint64_t cookie;
	unsigned char data[];
};

static size_t page_size;

static size_t node_len(size_t i)
{
	return 1 + (i * 37 + (i * i) % 101) % 2039;
}

static uint64_t node_cookie(size_t i)
{
	return zdtm_mix64(0xC00C1Eull + i);
}

static uint64_t chunk_seed(size_t chunk, uint64_t iter)
{
	return SEED_CHUNK ^ zdtm_mix64((iter << 8) | chunk);
}

/* Last iteration <= counter that wrote chunk j (0 = the initial fill). */
static uint64_t chunk_last_iter(size_t j, uint64_t counter)
{
	uint64_t last;

	if (counter < j || (j == 0 && counter < NCHUNKS))
		return 0;
	last = counter - ((counter - j) % NCHUNKS);
	return last;
}

int main(int argc, char **argv)
{
	size_t big_mib = 64, big_size, i;
	unsigned char *big, *sparse, *chunks;
	struct node *head = NULL, **tailp = &head, *n;
	uint64_t counter = 0;

	zdtm_init(argc, argv, 1, "[SIZE_MIB]");
	if (argc > 2) {
		char *end;

		big_mib = strtoul(argv[2], &end, 0);
		if (*end || big_mib == 0 || big_mib > 65536) {
			fprintf(stderr, "bad SIZE_MIB '%s'\n", argv[2]);
			return 2;
		}
	}
	page_size = (size_t)sysconf(_SC_PAGESIZE);
	big_size = big_mib << 20;

	big = malloc(big_size);
	if (!big)
		zdtm_die("malloc(%zu)", big_size);
	zdtm_fill(big, big_size, SEED_BIG);

	for (i = 0; i < NNODES; i++) {
		void *spacer1 = malloc(16 + (i % 200));
		size_t len = node_len(i);
		void *spacer2;

		n = malloc(sizeof(*n) + len);
		spacer2 = malloc(32 + (i % 300));
		if (!n || !spacer1 || !spacer2)
			zdtm_die("malloc node %zu", i);
		n->next = NULL;
		n->index = i;
		n->len = len;
		n->cookie = node_cookie(i);
		zdtm_fill(n->data, len, SEED_NODE + i);
		*tailp = n;
		tailp = &n->next;
		free(spacer1);
		free(spacer2);
	}

	sparse = mmap(NULL, SPARSE_SIZE, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (sparse == MAP_FAILED)
		zdtm_die("mmap sparse");
	for (i = 0; i < SPARSE_SIZE / page_size; i += SPARSE_STEP)
		zdtm_fill(sparse + i * page_size, page_size, SEED_SPARSE + i);

	chunks = mmap(NULL, (size_t)NCHUNKS * CHUNK_SIZE, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (chunks == MAP_FAILED)
		zdtm_die("mmap chunks");
	for (i = 0; i < NCHUNKS; i++)
		zdtm_fill(chunks + i * CHUNK_SIZE, CHUNK_SIZE, chunk_seed(i, 0));

	zdtm_ready();

	while (!zdtm_stop) {
		uint64_t next = counter + 1;
		size_t j = next % NCHUNKS;

		zdtm_fill(chunks + j * CHUNK_SIZE, CHUNK_SIZE,
			  chunk_seed(j, next));
		counter = next;
		zdtm_usleep(1000);
	}

	/* ---------------- verification ---------------- */
	{
		size_t nodes = 0;

		ZDTM_CORRUPT("big", big[big_size / 3] ^= 0x40);
		ZDTM_CORRUPT("list-data", head->next->next->data[0] ^= 1);
		ZDTM_CORRUPT("list-header",
			      head->next->next->next->cookie ^= 1);
		ZDTM_CORRUPT("sparse-data", sparse[SPARSE_STEP * page_size] ^= 1);
		ZDTM_CORRUPT("sparse-zero", sparse[3 * page_size + 5] = 1);
		ZDTM_CORRUPT("chunks", chunks[(counter % NCHUNKS) * CHUNK_SIZE
					      + 100] ^= 0x80);

		zdtm_verify_pattern("big", "big area", big, big_size, SEED_BIG);

		for (n = head; n && nodes <= NNODES; n = n->next, nodes++) {
			char what[64];

			if (!zdtm_check(n->index == nodes && n->len ==
					node_len(nodes) && n->cookie ==
					node_cookie(nodes), "list-header",
					"node #%zu: index %zu len %zu cookie "
					"%#llx (expected %zu %zu %#llx)",
					nodes, n->index, n->len,
					(unsigned long long)n->cookie, nodes,
					node_len(nodes),
					(unsigned long long)node_cookie(nodes)))
				break;
			snprintf(what, sizeof(what), "node #%zu payload",
				 nodes);
			zdtm_verify_pattern("list-data", what, n->data, n->len,
					    SEED_NODE + nodes);
		}
		zdtm_check(nodes == NNODES, "list-header",
			   "list has %zu nodes, expected %d", nodes, NNODES);

		for (i = 0; i < SPARSE_SIZE / page_size; i++) {
			char what[64];

			if (i % SPARSE_STEP == 0) {
				snprintf(what, sizeof(what),
					 "sparse page %zu", i);
				zdtm_verify_pattern("sparse-data", what,
						    sparse + i * page_size,
						    page_size, SEED_SPARSE + i);
			} else {
				size_t k;

				for (k = 0; k < page_size; k++)
					if (sparse[i * page_size + k])
						break;
				zdtm_check(k == page_size, "sparse-zero",
					   "untouched sparse page %zu has "
					   "non-zero byte 0x%02x at %zu", i,
					   sparse[i * page_size + k], k);
			}
		}

		for (i = 0; i < NCHUNKS; i++) {
			char what[96];
			uint64_t it = chunk_last_iter(i, counter);

			snprintf(what, sizeof(what),
				 "chunk %zu (counter %llu, last written at "
				 "iteration %llu)", i,
				 (unsigned long long)counter,
				 (unsigned long long)it);
			zdtm_verify_pattern("chunks", what,
					    chunks + i * CHUNK_SIZE, CHUNK_SIZE,
					    chunk_seed(i, it));
		}
	}
	zdtm_finish();
}
