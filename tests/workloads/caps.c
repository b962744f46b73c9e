/*
 * caps.c - capabilities, securebits and the dumpable flag must survive
 * checkpoint/restore (zdtm's caps00, caps01, dumpable01).
 *
 *   caps PIDFILE
 *
 * Set up before "ready" (needs root):
 *   securebits     SECBIT_NO_SETUID_FIXUP (set first, while CAP_SETPCAP is
 *                  effective)
 *   bounding set   CAP_SYS_BOOT (22) and CAP_MKNOD (27) dropped
 *   permitted      those it had (root's, maybe not all) but CAP_DAC_OVERRIDE (1)
 *   effective      permitted minus CAP_CHOWN (0) and CAP_FOWNER (3)
 *   inheritable    CAP_NET_BIND_SERVICE (10) and CAP_NET_RAW (13)
 *   ambient        CAP_NET_BIND_SERVICE (permitted and inheritable)
 *   dumpable       0 (PR_SET_DUMPABLE)
 * Everything set is read back (capget, PR_CAPBSET_READ, PR_CAP_AMBIENT_
 * IS_SET over every capability up to cap_last_cap, PR_GET_SECUREBITS,
 * PR_GET_DUMPABLE) and recorded; after SIGTERM each is read again and
 * compared, and the recorded values are checked against what was asked.
 */
#include "zdtm.h"

#include <sys/prctl.h>
#include <sys/syscall.h>

#define V3 0x20080522
#define SECBIT_NO_SETUID_FIXUP (1 << 2)

struct caphdr {
	uint32_t version;
	int pid;
};

struct capdata {
	uint32_t eff, prm, inh;
};

struct state {
	uint64_t eff, prm, inh, bnd, amb;
	int securebits, dumpable;
};

static int last_cap = 40;

static int get_sets(uint64_t *eff, uint64_t *prm, uint64_t *inh)
{
	struct caphdr h = { V3, 0 };
	struct capdata d[2];

	if (syscall(SYS_capget, &h, d))
		return -1;
	*eff = d[0].eff | (uint64_t)d[1].eff << 32;
	*prm = d[0].prm | (uint64_t)d[1].prm << 32;
	*inh = d[0].inh | (uint64_t)d[1].inh << 32;
	return 0;
}

static int set_sets(uint64_t eff, uint64_t prm, uint64_t inh)
{
	struct caphdr h = { V3, 0 };
	struct capdata d[2] = {
		{ (uint32_t)eff, (uint32_t)prm, (uint32_t)inh },
		{ (uint32_t)(eff >> 32), (uint32_t)(prm >> 32),
		  (uint32_t)(inh >> 32) },
	};

	return syscall(SYS_capset, &h, d) ? -1 : 0;
}

static void read_state(struct state *s)
{
	int c;

	memset(s, 0, sizeof(*s));
	if (get_sets(&s->eff, &s->prm, &s->inh))
		s->eff = s->prm = s->inh = ~0ull;
	for (c = 0; c <= last_cap; c++) {
		if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 1)
			s->bnd |= 1ull << c;
		if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c, 0, 0) == 1)
			s->amb |= 1ull << c;
	}
	s->securebits = prctl(PR_GET_SECUREBITS);
	s->dumpable = prctl(PR_GET_DUMPABLE);
}

static void compare(const char *when, const struct state *got,
		    const struct state *want)
{
	zdtm_check(got->eff == want->eff, "effective",
		   "%s: effective %#llx, expected %#llx", when,
		   (unsigned long long)got->eff, (unsigned long long)want->eff);
	zdtm_check(got->prm == want->prm, "permitted",
		   "%s: permitted %#llx, expected %#llx", when,
		   (unsigned long long)got->prm, (unsigned long long)want->prm);
	zdtm_check(got->inh == want->inh, "inheritable",
		   "%s: inheritable %#llx, expected %#llx", when,
		   (unsigned long long)got->inh, (unsigned long long)want->inh);
	zdtm_check(got->bnd == want->bnd, "bounding",
		   "%s: bounding %#llx, expected %#llx", when,
		   (unsigned long long)got->bnd, (unsigned long long)want->bnd);
	zdtm_check(got->amb == want->amb, "ambient",
		   "%s: ambient %#llx, expected %#llx", when,
		   (unsigned long long)got->amb, (unsigned long long)want->amb);
	zdtm_check(got->securebits == want->securebits, "securebits",
		   "%s: securebits %#x, expected %#x", when, got->securebits,
		   want->securebits);
	zdtm_check(got->dumpable == want->dumpable, "dumpable",
		   "%s: dumpable %d, expected %d", when, got->dumpable,
		   want->dumpable);
}

int main(int argc, char **argv)
{
	struct state asked, before, after;
	uint64_t eff, prm, inh, all, bnd0;
	char buf[32];

	zdtm_init(argc, argv, 0, "");
	if (zdtm_read_text("/proc/sys/kernel/cap_last_cap", buf, sizeof(buf)) > 0)
		last_cap = atoi(buf);
	if (last_cap < 27 || last_cap > 63)
		zdtm_die("cap_last_cap %d", last_cap);
	all = last_cap == 63 ? ~0ull : (1ull << (last_cap + 1)) - 1;
	read_state(&before);
	bnd0 = before.bnd & all;

	if (prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP))
		zdtm_die("PR_SET_SECUREBITS");
	if (prctl(PR_CAPBSET_DROP, 27, 0, 0, 0) ||
	    prctl(PR_CAPBSET_DROP, 22, 0, 0, 0))
		zdtm_die("PR_CAPBSET_DROP");
	if (get_sets(&eff, &prm, &inh))
		zdtm_die("capget");
	if ((prm & 0x250b) != 0x250b) /* 0, 1, 3, 8, 10, 13 */
		zdtm_die("not root with the capabilities used (permitted %#llx)",
			 (unsigned long long)prm);
	prm &= ~(1ull << 1);
	inh = (1ull << 10) | (1ull << 13);
	eff = prm & ~((1ull << 0) | (1ull << 3));
	if (set_sets(eff, prm, inh))
		zdtm_die("capset");
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, 10, 0, 0))
		zdtm_die("PR_CAP_AMBIENT_RAISE");
	if (prctl(PR_SET_DUMPABLE, 0))
		zdtm_die("PR_SET_DUMPABLE");

	memset(&asked, 0, sizeof(asked));
	asked.eff = eff;
	asked.prm = prm;
	asked.inh = inh;
	asked.bnd = bnd0 & ~((1ull << 27) | (1ull << 22));
	asked.amb = 1ull << 10;
	asked.securebits = SECBIT_NO_SETUID_FIXUP;
	asked.dumpable = 0;
	read_state(&before);

	zdtm_ready();

	while (!zdtm_stop)
		zdtm_msleep(100);

	ZDTM_CORRUPT("effective", set_sets(eff & ~(1ull << 5), prm, inh));
	ZDTM_CORRUPT("permitted", set_sets(eff & ~(1ull << 6),
					   prm & ~(1ull << 6), inh));
	ZDTM_CORRUPT("inheritable", set_sets(eff & ~(1ull << 6),
					     prm & ~(1ull << 6),
					     inh & ~(1ull << 13)));
	ZDTM_CORRUPT("bounding", prctl(PR_CAPBSET_DROP, 30, 0, 0, 0));
	ZDTM_CORRUPT("ambient", prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER,
				      10, 0, 0));
	ZDTM_CORRUPT("securebits", prctl(PR_SET_SECUREBITS, 0));
	ZDTM_CORRUPT("dumpable", prctl(PR_SET_DUMPABLE, 1));

	read_state(&after);
	compare("at setup", &before, &asked);
	compare("after SIGTERM", &after, &before);
	zdtm_finish();
}
