/*
 * Shared helpers of the C tests of the libfabric provider.
 *
 * Each test program is a list of cases. Every case runs in its own forked
 * child process with a deadline (the parent kills it past that), so a crash
 * or a hang in one case is reported as that case's failure and the rest
 * still run. A child opens its own endpoints: "sides", each a complete
 * fabric/domain/AV/CQ/endpoint set on loopback, so two or three sides in
 * one process talk to each other through the provider as two processes
 * would. Names are exchanged with fi_getname and fi_av_insert directly.
 *
 * Usage of every program: PROGRAM [PROVIDER [CASE]] (default metaroce, every
 * case; the metaroce provider needs FI_PROVIDER_PATH, FI_METAROCE_ADDR and
 * FI_METAROCE_PORT_RANGE, as `cargo xtask test fabric` sets them). The last
 * line of its output is "N passed, N failed, N skipped"; the exit status
 * is non-zero when a case failed. Contract checks that only the metaroce
 * provider promises (null buffers, use after fi_close, no
 * atomics) are skipped, not passed, for other providers.
 */
#ifndef METAROCE_FABRIC_TEST_COMMON_H
#define METAROCE_FABRIC_TEST_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

/* Each program uses a subset of these helpers. */
#pragma GCC diagnostic ignored "-Wunused-function"

#define CASE_PASS 0
#define CASE_FAIL 1
#define CASE_SKIP 77

/* The provider under test (argv[1]) and whether it is ours. */
static const char *g_prov = "metaroce";
static int g_is_metaroce = 1;
/* The threading model asked for (threads.c asks for FI_THREAD_SAFE). */
static enum fi_threading g_threading = FI_THREAD_DOMAIN;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A check inside a case: prints what failed and returns CASE_FAIL. */
#define CHECK(cond, ...)                                                  \
	do {                                                              \
		if (!(cond)) {                                            \
			printf("    check failed at %s:%d: %s: ", __FILE__, \
			       __LINE__, #cond);                          \
			printf(__VA_ARGS__);                              \
			printf("\n");                                     \
			fflush(stdout);                                   \
			return CASE_FAIL;                                 \
		}                                                         \
	} while (0)

/* A check the metaroce provider promises beyond what libfabric's own
 * providers do: a failure for metaroce, a note for the others. */
#define STRICT(cond, ...)                                                 \
	do {                                                              \
		if (!(cond) && !g_is_metaroce) {                          \
			printf("    not checked for %s: %s: ", g_prov,    \
			       #cond);                                    \
			printf(__VA_ARGS__);                              \
			printf("\n");                                     \
		} else                                                    \
			CHECK(cond, __VA_ARGS__);                         \
	} while (0)

/* A libfabric call that must succeed (return >= 0). */
#define CALL(expr)                                                        \
	do {                                                              \
		long _r = (long)(expr);                                   \
		if (_r < 0) {                                             \
			printf("    %s:%d: %s returned %ld (%s)\n",      \
			       __FILE__, __LINE__, #expr, _r,             \
			       fi_strerror((int)-_r));                    \
			fflush(stdout);                                   \
			return CASE_FAIL;                                 \
		}                                                         \
	} while (0)

static void note(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("    ");
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
	va_end(ap);
}

/* ---- completions ------------------------------------------------------ */

/* One completion read from a CQ: a success entry or an error entry. */
struct comp {
	int is_err;
	void *op_context;
	uint64_t flags;
	size_t len;
	uint64_t data;
	uint64_t tag;
	fi_addr_t src;
	int err;
	int prov_errno;
	size_t olen;
	char errstr[160];
};

#define MAX_STASH 256
#define MAX_SIDES 3

struct side {
	const char *label;
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
	char name[128];
	size_t namelen;
	int closed; /* ep and cq closed by the case itself */
	struct comp stash[MAX_STASH];
	int nstash;
};

static struct side *g_sides[MAX_SIDES];
static int g_nsides;

/* A request's context: FI_CONTEXT asks for a struct fi_context per op. */
struct req {
	struct fi_context2 ctx;
	const char *what;
};

/* Reads everything available on one side's CQ into its stash. */
static void drain_side(struct side *s)
{
	if (s->closed || !s->cq)
		return;
	for (;;) {
		struct fi_cq_tagged_entry e[8];
		ssize_t n = fi_cq_read(s->cq, e, 8);
		if (n > 0) {
			for (ssize_t i = 0; i < n && s->nstash < MAX_STASH; i++) {
				struct comp *c = &s->stash[s->nstash++];
				memset(c, 0, sizeof *c);
				c->op_context = e[i].op_context;
				c->flags = e[i].flags;
				c->len = e[i].len;
				c->data = e[i].data;
				c->tag = e[i].tag;
				c->src = FI_ADDR_NOTAVAIL;
			}
			continue;
		}
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry ee;
			memset(&ee, 0, sizeof ee);
			ssize_t r = fi_cq_readerr(s->cq, &ee, 0);
			if (r < 0)
				return;
			if (s->nstash < MAX_STASH) {
				struct comp *c = &s->stash[s->nstash++];
				memset(c, 0, sizeof *c);
				c->is_err = 1;
				c->op_context = ee.op_context;
				c->flags = ee.flags;
				c->len = ee.len;
				c->data = ee.data;
				c->tag = ee.tag;
				c->err = ee.err;
				c->prov_errno = ee.prov_errno;
				c->olen = ee.olen;
				const char *str = fi_cq_strerror(
					s->cq, ee.prov_errno, ee.err_data, c->errstr,
					sizeof c->errstr);
				if (str && str != c->errstr)
					snprintf(c->errstr, sizeof c->errstr, "%s",
						 str);
				if (!str)
					snprintf(c->errstr, sizeof c->errstr,
						 "(fi_cq_strerror returned NULL)");
			}
			continue;
		}
		return;
	}
}

/* Drives every side once (manual-progress providers need it). */
static void progress_all(void)
{
	for (int i = 0; i < g_nsides; i++)
		drain_side(g_sides[i]);
}

/* Takes the stashed completion of `ctx` from side `s`. */
static int take(struct side *s, void *ctx, struct comp *out)
{
	for (int i = 0; i < s->nstash; i++) {
		if (s->stash[i].op_context == ctx) {
			*out = s->stash[i];
			memmove(&s->stash[i], &s->stash[i + 1],
				(s->nstash - i - 1) * sizeof(struct comp));
			s->nstash--;
			return 1;
		}
	}
	return 0;
}

/* Takes any stashed completion carrying `flag` (remote CQ data events). */
static int take_flag(struct side *s, uint64_t flag, struct comp *out)
{
	for (int i = 0; i < s->nstash; i++) {
		if (s->stash[i].flags & flag) {
			*out = s->stash[i];
			memmove(&s->stash[i], &s->stash[i + 1],
				(s->nstash - i - 1) * sizeof(struct comp));
			s->nstash--;
			return 1;
		}
	}
	return 0;
}

/* Waits up to `secs` for the completion of `ctx` on side `s`, driving all
 * sides meanwhile. Returns 1 with *out filled, 0 on timeout. */
static int wait_comp(struct side *s, void *ctx, double secs, struct comp *out)
{
	double end = now_s() + secs;
	for (;;) {
		progress_all();
		if (take(s, ctx, out))
			return 1;
		if (now_s() > end)
			return 0;
		usleep(50);
	}
}

static int wait_flag(struct side *s, uint64_t flag, double secs,
		     struct comp *out)
{
	double end = now_s() + secs;
	for (;;) {
		progress_all();
		if (take_flag(s, flag, out))
			return 1;
		if (now_s() > end)
			return 0;
		usleep(50);
	}
}

/* Drives every side for `secs` (lets unexpected messages arrive). */
static void spin(double secs)
{
	double end = now_s() + secs;
	while (now_s() < end) {
		progress_all();
		usleep(100);
	}
}

/* A successful completion of `ctx` within `secs`, or a failed case. */
#define EXPECT_OK(s, r, secs, out)                                         \
	do {                                                               \
		if (!wait_comp((s), &(r)->ctx, (secs), (out))) {           \
			note("%s: no completion of `%s` within %.0f s", \
			     (s)->label, (r)->what, (double)(secs));      \
			return CASE_FAIL;                                  \
		}                                                          \
		if ((out)->is_err) {                                       \
			note("%s: `%s` completed with error %d (%s), "  \
			     "prov_errno %d: %s",                          \
			     (s)->label, (r)->what, (out)->err,            \
			     fi_strerror((out)->err), (out)->prov_errno,   \
			     (out)->errstr);                               \
			return CASE_FAIL;                                  \
		}                                                          \
	} while (0)

/* ---- sides ------------------------------------------------------------ */

/* fi_getinfo for the provider under test on loopback. Tries the loopback
 * address as source first (what the tcp provider needs to stay on lo),
 * then no node (the metaroce provider takes FI_METAROCE_ADDR). */
static struct fi_info *get_info(uint64_t caps, uint64_t mr_local)
{
	struct fi_info *hints = fi_allocinfo();
	struct fi_info *info = NULL;
	if (!hints)
		return NULL;
	hints->caps = caps;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->ep_attr->type = FI_EP_RDM;
	hints->addr_format = FI_SOCKADDR_IN;
	hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY | mr_local;
	hints->domain_attr->threading = g_threading;
	hints->fabric_attr->prov_name = strdup(g_prov);
	int r = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION),
			   "127.0.0.1", NULL, FI_SOURCE, hints, &info);
	if (r) {
		info = NULL;
		r = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION),
			       NULL, NULL, 0, hints, &info);
	}
	if (r) {
		note("fi_getinfo(prov %s, caps 0x%" PRIx64 ") = %d (%s)",
		     g_prov, caps, r, fi_strerror(-r));
		info = NULL;
	}
	fi_freeinfo(hints);
	return info;
}

/* The capabilities every case asks for. */
#define BASE_CAPS                                                      \
	(FI_MSG | FI_TAGGED | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | \
	 FI_REMOTE_WRITE | FI_SEND | FI_RECV)

/* Opens one side: fabric, domain, AV, one CQ for both directions, an
 * enabled endpoint and its name. Returns 0, or -1 after printing why. */
static int open_side(struct side *s, const char *label, uint64_t caps)
{
	memset(s, 0, sizeof *s);
	s->label = label;
	s->info = get_info(caps, FI_MR_LOCAL);
	if (!s->info)
		s->info = get_info(caps, 0);
	if (!s->info)
		return -1;
#define OPEN(expr)                                                         \
	do {                                                               \
		int _r = (expr);                                           \
		if (_r) {                                                  \
			note("%s: %s = %d (%s)", label, #expr, _r,         \
			     fi_strerror(-_r));                            \
			return -1;                                         \
		}                                                          \
	} while (0)
	OPEN(fi_fabric(s->info->fabric_attr, &s->fabric, NULL));
	OPEN(fi_domain(s->fabric, s->info, &s->domain, NULL));
	struct fi_av_attr av_attr = {.type = FI_AV_TABLE, .count = 16};
	OPEN(fi_av_open(s->domain, &av_attr, &s->av, NULL));
	struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED,
				     .size = 1024,
				     .wait_obj = FI_WAIT_UNSPEC};
	OPEN(fi_cq_open(s->domain, &cq_attr, &s->cq, NULL));
	OPEN(fi_endpoint(s->domain, s->info, &s->ep, NULL));
	OPEN(fi_ep_bind(s->ep, &s->av->fid, 0));
	OPEN(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
	OPEN(fi_enable(s->ep));
	s->namelen = sizeof s->name;
	OPEN(fi_getname(&s->ep->fid, s->name, &s->namelen));
#undef OPEN
	if (g_nsides < MAX_SIDES)
		g_sides[g_nsides++] = s;
	return 0;
}

/* Inserts `peer`'s name into `s`'s AV; returns the fi_addr or
 * FI_ADDR_NOTAVAIL after printing why. */
static fi_addr_t insert_peer(struct side *s, struct side *peer)
{
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	int n = fi_av_insert(s->av, peer->name, 1, &a, 0, NULL);
	if (n != 1) {
		note("%s: fi_av_insert(%s) = %d", s->label, peer->label, n);
		return FI_ADDR_NOTAVAIL;
	}
	return a;
}

/* Opens sides a and b and inserts each into the other's AV. */
static int pair(struct side *a, struct side *b, fi_addr_t *a_to_b,
		fi_addr_t *b_to_a, uint64_t caps)
{
	if (open_side(a, "A", caps) || open_side(b, "B", caps))
		return -1;
	*a_to_b = insert_peer(a, b);
	*b_to_a = insert_peer(b, a);
	if (*a_to_b == FI_ADDR_NOTAVAIL || *b_to_a == FI_ADDR_NOTAVAIL)
		return -1;
	return 0;
}

/* Closes what is still open of a side, endpoint first. */
static void close_side(struct side *s)
{
	if (!s->closed) {
		if (s->ep)
			fi_close(&s->ep->fid);
		if (s->av)
			fi_close(&s->av->fid);
		if (s->cq)
			fi_close(&s->cq->fid);
	}
	if (s->domain)
		fi_close(&s->domain->fid);
	if (s->fabric)
		fi_close(&s->fabric->fid);
	if (s->info)
		fi_freeinfo(s->info);
	s->closed = 1;
	s->ep = NULL;
	s->cq = NULL;
}

/* A registered buffer. */
struct region {
	uint8_t *buf;
	size_t len;
	struct fid_mr *mr;
	uint64_t key;
	uint64_t addr; /* what a peer puts in its RMA: VA or offset */
	void *desc;
};

static int reg(struct side *s, struct region *r, size_t len, uint64_t access)
{
	memset(r, 0, sizeof *r);
	r->len = len;
	r->buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
	if (!r->buf)
		return -1;
	memset(r->buf, 0, len);
	/* Distinct requested keys: used by providers without FI_MR_PROV_KEY. */
	static uint64_t next_key = 0x1000;
	int ret = fi_mr_reg(s->domain, r->buf, len, access, 0, next_key++, 0,
			    &r->mr, NULL);
	if (ret) {
		note("%s: fi_mr_reg(%zu) = %d (%s)", s->label, len, ret,
		     fi_strerror(-ret));
		return -1;
	}
	if (s->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
		ret = fi_mr_bind(r->mr, &s->ep->fid, 0);
		if (!ret)
			ret = fi_mr_enable(r->mr);
		if (ret) {
			note("%s: fi_mr_bind/enable = %d", s->label, ret);
			return -1;
		}
	}
	r->key = fi_mr_key(r->mr);
	r->desc = fi_mr_desc(r->mr);
	r->addr = (s->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR)
			  ? (uint64_t)(uintptr_t)r->buf
			  : 0;
	return 0;
}

#define ALL_ACCESS                                                 \
	(FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | \
	 FI_REMOTE_WRITE)

/* Deterministic test data: byte i of stream `seed`. */
static void fill(uint8_t *p, size_t len, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 12345;
	for (size_t i = 0; i < len; i++) {
		x = x * 1103515245u + 12345;
		p[i] = (uint8_t)(x >> 16);
	}
}

/* Index of the first byte of p that differs from stream `seed`, or -1. */
static long mismatch(const uint8_t *p, size_t len, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 12345;
	for (size_t i = 0; i < len; i++) {
		x = x * 1103515245u + 12345;
		if (p[i] != (uint8_t)(x >> 16))
			return (long)i;
	}
	return -1;
}

/* Index of the first byte of p that is not `v`, or -1. */
static long not_all(const uint8_t *p, size_t len, uint8_t v)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != v)
			return (long)i;
	return -1;
}

/* Retries an op while it answers -FI_EAGAIN, driving progress. */
#define POST(expr)                                                         \
	({                                                                 \
		ssize_t _r;                                                \
		double _end = now_s() + 10;                                \
		while ((_r = (expr)) == -FI_EAGAIN && now_s() < _end)      \
			progress_all();                                    \
		_r;                                                        \
	})

#define POST_OK(expr)                                                      \
	do {                                                               \
		ssize_t _p = POST(expr);                                   \
		if (_p < 0) {                                              \
			note("%s = %zd (%s)", #expr, _p,                   \
			     fi_strerror((int)-_p));                       \
			return CASE_FAIL;                                  \
		}                                                          \
	} while (0)

/* ---- the runner ------------------------------------------------------- */

struct test_case {
	const char *name;
	int (*fn)(void);
	int timeout_s;
};

static int run_cases(int argc, char **argv, const char *program,
		     const struct test_case *cases, size_t ncases)
{
	if (argc > 1)
		g_prov = argv[1];
	g_is_metaroce = strcmp(g_prov, "metaroce") == 0;
	const char *only = argc > 2 ? argv[2] : NULL;
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("%s: provider %s\n", program, g_prov);
	int passed = 0, failed = 0, skipped = 0;
	for (size_t i = 0; i < ncases; i++) {
		const struct test_case *c = &cases[i];
		if (only && strcmp(only, c->name) != 0)
			continue;
		fflush(stdout);
		double t0 = now_s();
		pid_t pid = fork();
		if (pid < 0) {
			perror("fork");
			return 2;
		}
		if (pid == 0) {
			alarm(c->timeout_s + 5); /* backstop */
			int r = c->fn();
			fflush(stdout);
			/* The case's objects are closed or deliberately left;
			 * _exit skips atexit handlers of the provider. */
			_exit(r);
		}
		int status = 0;
		int timed_out = 0;
		for (;;) {
			pid_t w = waitpid(pid, &status, WNOHANG);
			if (w == pid)
				break;
			if (now_s() - t0 > c->timeout_s) {
				kill(pid, SIGKILL);
				waitpid(pid, &status, 0);
				timed_out = 1;
				break;
			}
			usleep(10000);
		}
		double took = now_s() - t0;
		if (timed_out) {
			printf("FAIL %s: no result within %d s (killed)\n",
			       c->name, c->timeout_s);
			failed++;
		} else if (WIFSIGNALED(status)) {
			printf("FAIL %s: crashed with signal %d (%s)\n", c->name,
			       WTERMSIG(status), strsignal(WTERMSIG(status)));
			failed++;
		} else if (WEXITSTATUS(status) == CASE_PASS) {
			printf("ok   %s (%.2f s)\n", c->name, took);
			passed++;
		} else if (WEXITSTATUS(status) == CASE_SKIP) {
			printf("skip %s\n", c->name);
			skipped++;
		} else {
			printf("FAIL %s (%.2f s)\n", c->name, took);
			failed++;
		}
	}
	printf("%s: %d passed, %d failed, %d skipped\n", program, passed,
	       failed, skipped);
	return failed ? 1 : 0;
}

#endif
