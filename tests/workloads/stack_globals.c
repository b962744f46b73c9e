/*
 * stack_globals.c - initialized globals (.data), zero globals (.bss), const
 * data (.rodata), thread-local storage (.tdata/.tbss, reached through the FS
 * base) and a deep recursion whose frames keep known local arrays.
 *
 *   stack_globals PIDFILE
 *
 * The main loop runs at the bottom of a 200-deep recursion (each frame holds a
 * 4 KiB local array, so ~800 KiB of stack is in use).  On SIGTERM the loop
 * ends, the globals are checked, then every frame checks its locals while
 * the recursion unwinds.
 */
#include "zdtm.h"

#define DEPTH       200
#define LOCAL_WORDS 512 /* 4 KiB per frame */
#define HOT_WORDS   256
#define BSS_SIZE    (1 << 20)
#define BSS_ZERO    (256 * 1024)
#define SEED_BSS    0x737462737300ull
#define SEED_TBSS   0x7374746273730000ull

/* Known values that are NOT computed by the same code that writes them: the
 * initializers are compile-time constants, the checks recompute V(i). */
#define V(i) ((uint64_t)(i) * 0x9E3779B97F4A7C15ull + 0x0123456789ABCDEFull)
#define R4(b)  V(b), V(b + 1), V(b + 2), V(b + 3)
#define R16(b) R4(b), R4(b + 4), R4(b + 8), R4(b + 12)
#define R64(b) R16(b), R16(b + 16), R16(b + 32), R16(b + 48)

#define DATA_STR "Stasis .data string: restore me byte for byte!"
#define DATA_INT 0x12345678
#define DATA_DBL 3.25

/* non-static so the compiler cannot treat them as constants */
uint64_t g_data_arr[64] = { R64(0) };
char g_data_str[64] = DATA_STR;
int g_data_int = DATA_INT;
double g_data_dbl = DATA_DBL;
uint64_t g_data_counter = 1000; /* .data, advanced by the loop */
const uint64_t g_rodata[64] = { R64(64) };

uint8_t g_bss[BSS_SIZE];       /* filled at start */
uint8_t g_bss_zero[BSS_ZERO];  /* never written */
uint64_t g_bss_counter;        /* advanced by the loop */

__thread uint64_t t_data[16] = { R16(128) };
__thread uint8_t t_bss[4096];
__thread uint64_t t_counter;

static uint64_t *frame_locals[DEPTH];
static uint64_t loop_iters;

static uint64_t frame_word(int depth, int k)
{
	return zdtm_mix64(((uint64_t)depth << 32) | (uint64_t)k) ^ 0x57ACull;
}

__attribute__((noinline)) static void fill_locals(uint64_t *p, int depth)
{
	int k;

	for (k = 0; k < LOCAL_WORDS; k++)
		p[k] = frame_word(depth, k);
}

__attribute__((noinline)) static void check_locals(const uint64_t *p,
						   int depth)
{
	int k;

	for (k = 0; k < LOCAL_WORDS; k++) {
		if (p[k] != frame_word(depth, k)) {
			zdtm_fail("stack",
				  "frame %d local[%d] = %#llx, expected %#llx",
				  depth, k, (unsigned long long)p[k],
				  (unsigned long long)frame_word(depth, k));
			return;
		}
	}
}

static uint64_t hot_word(uint64_t iter, int k)
{
	return zdtm_mix64(iter * 4096 + (uint64_t)k) ^ 0x407ull;
}

static void check_globals(void)
{
	const volatile uint64_t *vro = g_rodata;
	volatile uint64_t *vdata = g_data_arr;
	int i;
	size_t k;

	for (i = 0; i < 64; i++) {
		zdtm_check(vdata[i] == V(i), "data",
			   "g_data_arr[%d] = %#llx, expected %#llx", i,
			   (unsigned long long)vdata[i],
			   (unsigned long long)V(i));
		zdtm_check(vro[i] == V(i + 64), "rodata",
			   "g_rodata[%d] = %#llx, expected %#llx", i,
			   (unsigned long long)vro[i],
			   (unsigned long long)V(i + 64));
	}
	zdtm_verify_mem("data", "g_data_str", g_data_str, DATA_STR,
			sizeof(DATA_STR));
	zdtm_check(*(volatile int *)&g_data_int == DATA_INT, "data",
		   "g_data_int = %#x", g_data_int);
	zdtm_check(*(volatile double *)&g_data_dbl == DATA_DBL, "data",
		   "g_data_dbl = %g", g_data_dbl);

	zdtm_verify_pattern("bss", "g_bss", g_bss, BSS_SIZE, SEED_BSS);
	for (k = 0; k < BSS_ZERO; k++)
		if (g_bss_zero[k])
			break;
	zdtm_check(k == BSS_ZERO, "bss-zero",
		   "g_bss_zero[%zu] = 0x%02x, expected all zero", k,
		   k < BSS_ZERO ? g_bss_zero[k] : 0);

	for (i = 0; i < 16; i++)
		zdtm_check(t_data[i] == V(i + 128), "tls",
			   "t_data[%d] = %#llx, expected %#llx", i,
			   (unsigned long long)t_data[i],
			   (unsigned long long)V(i + 128));
	zdtm_verify_pattern("tls", "t_bss", t_bss, sizeof(t_bss), SEED_TBSS);

	zdtm_check(g_data_counter == 1000 + loop_iters &&
		   g_bss_counter == loop_iters && t_counter == loop_iters,
		   "counters",
		   "loop ran %llu times but g_data_counter=%llu (expected "
		   "%llu) g_bss_counter=%llu t_counter=%llu",
		   (unsigned long long)loop_iters,
		   (unsigned long long)g_data_counter,
		   (unsigned long long)(1000 + loop_iters),
		   (unsigned long long)g_bss_counter,
		   (unsigned long long)t_counter);
}

/* The bottom of the recursion: the main loop. */
__attribute__((noinline)) static uint64_t bottom_loop(void)
{
	uint64_t hot[HOT_WORDS];
	uint64_t iter = 0;
	int k;

	for (k = 0; k < HOT_WORDS; k++)
		hot[k] = hot_word(0, k);

	zdtm_ready();

	while (!zdtm_stop) {
		iter++;
		hot[iter % HOT_WORDS] = hot_word(iter, (int)(iter % HOT_WORDS));
		g_data_counter++;
		g_bss_counter++;
		t_counter++;
		zdtm_usleep(1000);
	}
	loop_iters = iter;

	ZDTM_CORRUPT("data", g_data_arr[5] ^= 1);
	ZDTM_CORRUPT("bss", g_bss[BSS_SIZE / 2 + 3] ^= 4);
	ZDTM_CORRUPT("bss-zero", g_bss_zero[777] = 1);
	ZDTM_CORRUPT("tls", t_bss[100] ^= 1);
	ZDTM_CORRUPT("counters", t_counter++);
	ZDTM_CORRUPT("stack", frame_locals[DEPTH / 2][3] ^= 1);
	ZDTM_CORRUPT("stack-hot", hot[(iter + 7) % HOT_WORDS] ^= 1);

	check_globals();

	for (k = 0; k < HOT_WORDS; k++) {
		/* last iteration <= iter that wrote hot[k] (0 = init) */
		uint64_t last = 0;

		if (iter >= (uint64_t)(k ? k : HOT_WORDS))
			last = iter - ((iter - (uint64_t)k) % HOT_WORDS);
		zdtm_check(hot[k] == hot_word(last, k), "stack-hot",
			   "bottom frame hot[%d] = %#llx, expected %#llx "
			   "(iteration %llu)", k, (unsigned long long)hot[k],
			   (unsigned long long)hot_word(last, k),
			   (unsigned long long)last);
	}
	return iter;
}

__attribute__((noinline)) static uint64_t recurse(int depth,
						  uint64_t parent_cookie)
{
	uint64_t loc[LOCAL_WORDS];
	volatile uint64_t cookie = zdtm_mix64((uint64_t)depth ^ parent_cookie);
	uint64_t expect_cookie = zdtm_mix64((uint64_t)depth ^ parent_cookie);
	uint64_t r;

	fill_locals(loc, depth);
	frame_locals[depth] = loc;
	if (depth + 1 < DEPTH)
		r = recurse(depth + 1, cookie);
	else
		r = bottom_loop();

	check_locals(loc, depth);
	zdtm_check(cookie == expect_cookie, "stack",
		   "frame %d cookie %#llx, expected %#llx", depth,
		   (unsigned long long)cookie,
		   (unsigned long long)expect_cookie);
	zdtm_check(frame_locals[depth] == loc, "stack",
		   "frame %d local array moved from %p to %p", depth,
		   (void *)frame_locals[depth], (void *)loc);
	return r + 1;
}

int main(int argc, char **argv)
{
	uint64_t r;

	zdtm_init(argc, argv, 0, "");
	zdtm_fill(g_bss, BSS_SIZE, SEED_BSS);
	zdtm_fill(t_bss, sizeof(t_bss), SEED_TBSS);

	r = recurse(0, 0x5EEDull);

	zdtm_check(r == loop_iters + DEPTH, "stack",
		   "recursion returned %llu, expected %llu",
		   (unsigned long long)r,
		   (unsigned long long)(loop_iters + DEPTH));
	zdtm_finish();
}
