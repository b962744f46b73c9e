/*
 * fpu.c - register state across checkpoint/restore.
 *
 *   fpu PIDFILE
 *
 * One inline asm block:
 *   - loads 16 distinct known 256-bit values into ymm0..ymm15, known 64-bit
 *     values into rax, rbx, rcx, rdx, r8..r15, and MXCSR = 0xFF80 (round
 *     toward zero + flush-to-zero, all exceptions masked; default is 0x1F80);
 *   - spins ("pause"; compare the SIGTERM flag in memory; loop) until the
 *     SIGTERM handler sets the flag.  The loop touches no vector register and
 *     makes no syscall, so the values above are live only in the registers
 *     for the whole time the process may be checkpointed/restored.  (The
 *     SIGTERM handler itself is harmless: the kernel saves and restores the
 *     full xstate in the signal frame.)
 *   - still in the same asm block: stores MXCSR, ymm0..15 and the GPRs to
 *     memory, converts 2.75 and -2.75 with vcvtsd2si (uses the current
 *     rounding mode: toward zero gives 2 / -2, the default would give 3 /
 *     -3), then restores the default MXCSR.
 * C code then compares everything with the expected values.
 *
 * The process spins at 100% CPU while waiting.  Requires AVX2.
 */
#include "zdtm.h"

#include <stddef.h>

#define SEED_YMM 0x66707579000000ull
#define SEED_GPR 0x66707567000000ull
#define MXCSR_TEST    0xFF80u /* FZ | RC=toward zero | all masks */
#define MXCSR_DEFAULT 0x1F80u

static const char *const gpr_names[12] = {
	"rax", "rbx", "rcx", "rdx", "r8",  "r9",
	"r10", "r11", "r12", "r13", "r14", "r15",
};

struct regs {
	uint8_t ymm[16][32];  /*   0 */
	uint64_t gpr[12];     /* 512 */
	uint32_t mxcsr;       /* 608 */
	uint32_t mxcsr_dflt;  /* 612 */
	double pos;           /* 616 */
	double neg;           /* 624 */
	int64_t cvt_pos;      /* 632 */
	int64_t cvt_neg;      /* 640 */
};

_Static_assert(offsetof(struct regs, gpr) == 512, "layout");
_Static_assert(offsetof(struct regs, mxcsr) == 608, "layout");
_Static_assert(offsetof(struct regs, mxcsr_dflt) == 612, "layout");
_Static_assert(offsetof(struct regs, pos) == 616, "layout");
_Static_assert(offsetof(struct regs, neg) == 624, "layout");
_Static_assert(offsetof(struct regs, cvt_pos) == 632, "layout");
_Static_assert(offsetof(struct regs, cvt_neg) == 640, "layout");

#ifdef SELFTEST_CORRUPT
/* Break live registers right after the wait loop. */
#define CORRUPT_ASM                                                            \
	"vpblendd $1, %%ymm0, %%ymm11, %%ymm11\n\t" /* low dword of ymm11 */   \
	"vinserti128 $1, %%xmm0, %%ymm9, %%ymm9\n\t" /* upper half ymm9 */     \
	"xorq $1, %%r12\n\t"                                                   \
	"ldmxcsr 612(%%rsi)\n\t" /* default MXCSR: also breaks rounding */
#else
#define CORRUPT_ASM ""
#endif

static struct regs in, out;

static void run(void)
{
	asm volatile(
		"vmovdqu   0(%%rsi), %%ymm0\n\t"
		"vmovdqu  32(%%rsi), %%ymm1\n\t"
		"vmovdqu  64(%%rsi), %%ymm2\n\t"
		"vmovdqu  96(%%rsi), %%ymm3\n\t"
		"vmovdqu 128(%%rsi), %%ymm4\n\t"
		"vmovdqu 160(%%rsi), %%ymm5\n\t"
		"vmovdqu 192(%%rsi), %%ymm6\n\t"
		"vmovdqu 224(%%rsi), %%ymm7\n\t"
		"vmovdqu 256(%%rsi), %%ymm8\n\t"
		"vmovdqu 288(%%rsi), %%ymm9\n\t"
		"vmovdqu 320(%%rsi), %%ymm10\n\t"
		"vmovdqu 352(%%rsi), %%ymm11\n\t"
		"vmovdqu 384(%%rsi), %%ymm12\n\t"
		"vmovdqu 416(%%rsi), %%ymm13\n\t"
		"vmovdqu 448(%%rsi), %%ymm14\n\t"
		"vmovdqu 480(%%rsi), %%ymm15\n\t"
		"movq 512(%%rsi), %%rax\n\t"
		"movq 520(%%rsi), %%rbx\n\t"
		"movq 528(%%rsi), %%rcx\n\t"
		"movq 536(%%rsi), %%rdx\n\t"
		"movq 544(%%rsi), %%r8\n\t"
		"movq 552(%%rsi), %%r9\n\t"
		"movq 560(%%rsi), %%r10\n\t"
		"movq 568(%%rsi), %%r11\n\t"
		"movq 576(%%rsi), %%r12\n\t"
		"movq 584(%%rsi), %%r13\n\t"
		"movq 592(%%rsi), %%r14\n\t"
		"movq 600(%%rsi), %%r15\n\t"
		"ldmxcsr 608(%%rsi)\n\t"
		"1:\n\t"
		"pause\n\t"
		"cmpl $0, %[flag]\n\t"
		"je 1b\n\t"
		CORRUPT_ASM
		"stmxcsr 608(%%rdi)\n\t"
		"vmovdqu %%ymm0,    0(%%rdi)\n\t"
		"vmovdqu %%ymm1,   32(%%rdi)\n\t"
		"vmovdqu %%ymm2,   64(%%rdi)\n\t"
		"vmovdqu %%ymm3,   96(%%rdi)\n\t"
		"vmovdqu %%ymm4,  128(%%rdi)\n\t"
		"vmovdqu %%ymm5,  160(%%rdi)\n\t"
		"vmovdqu %%ymm6,  192(%%rdi)\n\t"
		"vmovdqu %%ymm7,  224(%%rdi)\n\t"
		"vmovdqu %%ymm8,  256(%%rdi)\n\t"
		"vmovdqu %%ymm9,  288(%%rdi)\n\t"
		"vmovdqu %%ymm10, 320(%%rdi)\n\t"
		"vmovdqu %%ymm11, 352(%%rdi)\n\t"
		"vmovdqu %%ymm12, 384(%%rdi)\n\t"
		"vmovdqu %%ymm13, 416(%%rdi)\n\t"
		"vmovdqu %%ymm14, 448(%%rdi)\n\t"
		"vmovdqu %%ymm15, 480(%%rdi)\n\t"
		"movq %%rax, 512(%%rdi)\n\t"
		"movq %%rbx, 520(%%rdi)\n\t"
		"movq %%rcx, 528(%%rdi)\n\t"
		"movq %%rdx, 536(%%rdi)\n\t"
		"movq %%r8,  544(%%rdi)\n\t"
		"movq %%r9,  552(%%rdi)\n\t"
		"movq %%r10, 560(%%rdi)\n\t"
		"movq %%r11, 568(%%rdi)\n\t"
		"movq %%r12, 576(%%rdi)\n\t"
		"movq %%r13, 584(%%rdi)\n\t"
		"movq %%r14, 592(%%rdi)\n\t"
		"movq %%r15, 600(%%rdi)\n\t"
		"vcvtsd2si 616(%%rsi), %%rax\n\t"
		"movq %%rax, 632(%%rdi)\n\t"
		"vcvtsd2si 624(%%rsi), %%rax\n\t"
		"movq %%rax, 640(%%rdi)\n\t"
		"ldmxcsr 612(%%rsi)\n\t"
		"vzeroupper\n\t"
		:
		: "S"(&in), "D"(&out), [flag] "m"(zdtm_stop)
		: "rax", "rbx", "rcx", "rdx", "r8", "r9", "r10", "r11", "r12",
		  "r13", "r14", "r15",
		  "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6",
		  "ymm7", "ymm8", "ymm9", "ymm10", "ymm11", "ymm12", "ymm13",
		  "ymm14", "ymm15", "memory", "cc");
}

int main(int argc, char **argv)
{
	int i, k;

	zdtm_init(argc, argv, 0, "");
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx2"))
		zdtm_die("CPU lacks AVX2");

	for (i = 0; i < 16; i++)
		zdtm_fill(in.ymm[i], 32, SEED_YMM + (uint64_t)i);
	for (i = 0; i < 12; i++)
		in.gpr[i] = zdtm_mix64(SEED_GPR + (uint64_t)i);
	in.mxcsr = MXCSR_TEST;
	in.mxcsr_dflt = MXCSR_DEFAULT;
	in.pos = 2.75;
	in.neg = -2.75;
	memset(&out, 0xEE, sizeof(out));

	ZDTM_CORRUPT("ymm-low", (void)0);
	ZDTM_CORRUPT("ymm-high", (void)0);
	ZDTM_CORRUPT("gpr", (void)0);
	ZDTM_CORRUPT("mxcsr", (void)0);
	ZDTM_CORRUPT("rounding", (void)0);

	zdtm_ready();
	run();

	for (i = 0; i < 16; i++) {
		for (k = 0; k < 32; k++) {
			uint8_t e = zdtm_pat_byte(SEED_YMM + (uint64_t)i,
						  (uint64_t)k);

			if (out.ymm[i][k] != e) {
				zdtm_fail(k < 16 ? "ymm-low" : "ymm-high",
					  "ymm%d byte %d (%s half) = 0x%02x, "
					  "expected 0x%02x", i, k,
					  k < 16 ? "xmm/low" : "upper",
					  out.ymm[i][k], e);
				if (k >= 16)
					break;
				k = 15; /* report the upper half separately */
			}
		}
	}
	for (i = 0; i < 12; i++) {
		uint64_t e = zdtm_mix64(SEED_GPR + (uint64_t)i);

		zdtm_check(out.gpr[i] == e, "gpr", "%s = %#llx, expected %#llx",
			   gpr_names[i], (unsigned long long)out.gpr[i],
			   (unsigned long long)e);
	}
	zdtm_check(out.mxcsr == MXCSR_TEST, "mxcsr",
		   "MXCSR = %#x, expected %#x", out.mxcsr, MXCSR_TEST);
	zdtm_check(out.cvt_pos == 2 && out.cvt_neg == -2, "rounding",
		   "vcvtsd2si(2.75, -2.75) = %lld, %lld; expected 2, -2 "
		   "(round toward zero)", (long long)out.cvt_pos,
		   (long long)out.cvt_neg);
	zdtm_finish();
}
