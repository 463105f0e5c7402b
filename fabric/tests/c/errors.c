/*
 * Objects and error paths of the provider: fi_cq_sread with a timeout and
 * woken by a completion, fi_cq_readerr on an empty CQ, AV lookup and
 * straddr, a send to an AV entry never inserted, closing endpoints with
 * operations outstanding, an unreachable peer (its endpoint closed: the
 * operations end in error completions, not a hang), calls after fi_close,
 * and atomics/counters answering -FI_ENOSYS/-FI_EOPNOTSUPP. Each case runs
 * in its own process: a crash is that case's failure.
 */
#include "common.h"

static struct side A, B, C;
static fi_addr_t a2b, b2a;

static int setup(void)
{
	return pair(&A, &B, &a2b, &b2a, BASE_CAPS);
}

static int sread_timeout(void)
{
	if (open_side(&A, "A", BASE_CAPS))
		return CASE_FAIL;
	struct fi_cq_tagged_entry e;
	double t0 = now_s();
	ssize_t r = fi_cq_sread(A.cq, &e, 1, NULL, 500);
	double took = now_s() - t0;
	note("fi_cq_sread(timeout 500 ms) on an idle CQ = %zd (%s) after %.3f s", r,
	     r < 0 ? fi_strerror((int)-r) : "-", took);
	CHECK(r == -FI_EAGAIN || (!g_is_metaroce && r == -FI_ETIMEDOUT),
	      "expected -FI_EAGAIN, got %zd", r);
	/* It waited (a lower bound only: a loaded machine only adds). */
	CHECK(took >= 0.25, "returned after %.3f s, before its 500 ms timeout", took);
	return CASE_PASS;
}

static int sread_wakes(void)
{
	if (setup())
		return CASE_FAIL;
	struct region s, r;
	if (reg(&A, &s, 128, ALL_ACCESS) || reg(&B, &r, 128, ALL_ACCESS))
		return CASE_FAIL;
	fill(s.buf, 128, 71);
	struct req rr = {.what = "fi_recv"}, sr = {.what = "fi_send"};
	POST_OK(fi_recv(B.ep, r.buf, 128, r.desc, FI_ADDR_UNSPEC, &rr.ctx));
	POST_OK(fi_send(A.ep, s.buf, 128, s.desc, a2b, &sr.ctx));
	double end = now_s() + 20;
	int got = 0;
	while (!got && now_s() < end) {
		drain_side(&A);
		struct fi_cq_tagged_entry e;
		ssize_t n = fi_cq_sread(B.cq, &e, 1, NULL, 50);
		if (n == 1) {
			CHECK(e.op_context == &rr.ctx, "unexpected context");
			got = 1;
		} else {
			CHECK(n == -FI_EAGAIN || n == -FI_ETIMEDOUT,
			      "fi_cq_sread = %zd (%s)", n, fi_strerror((int)-n));
		}
	}
	CHECK(got, "fi_cq_sread never returned the receive completion");
	CHECK(mismatch(r.buf, 128, 71) < 0, "payload differs");
	struct comp c;
	EXPECT_OK(&A, &sr, 10, &c);
	return CASE_PASS;
}

static int readerr_empty(void)
{
	if (open_side(&A, "A", BASE_CAPS))
		return CASE_FAIL;
	struct fi_cq_err_entry ee;
	memset(&ee, 0, sizeof ee);
	ssize_t r = fi_cq_readerr(A.cq, &ee, 0);
	CHECK(r == -FI_EAGAIN, "fi_cq_readerr on an empty CQ = %zd", r);
	struct fi_cq_tagged_entry e;
	r = fi_cq_read(A.cq, &e, 1);
	CHECK(r == -FI_EAGAIN, "fi_cq_read on an empty CQ = %zd", r);
	return CASE_PASS;
}

static int av_lookup(void)
{
	if (setup())
		return CASE_FAIL;
	char buf[128];
	size_t len = sizeof buf;
	CALL(fi_av_lookup(A.av, a2b, buf, &len));
	CHECK(len == B.namelen, "lookup length %zu, name length %zu", len, B.namelen);
	CHECK(memcmp(buf, B.name, len) == 0, "lookup differs from B's fi_getname");
	char str[128];
	size_t slen = sizeof str;
	const char *p = fi_av_straddr(A.av, B.name, str, &slen);
	CHECK(p && p[0], "fi_av_straddr gave nothing");
	note("B's address: %s (%zu B name)", p, B.namelen);
	return CASE_PASS;
}

/* A send to fi_addr 5 of a table holding one entry: an error (returned or
 * as an error completion), no crash, no hang. */
static int av_never_inserted(void)
{
	if (!g_is_metaroce) {
		note("contract of the metaroce provider only (tcp;ofi_rxm crashes)");
		return CASE_SKIP;
	}
	if (setup())
		return CASE_FAIL;
	uint8_t buf[64] = {0};
	struct req sr = {.what = "fi_send to fi_addr 5"};
	ssize_t r = fi_send(A.ep, buf, sizeof buf, NULL, (fi_addr_t)5, &sr.ctx);
	if (r < 0) {
		note("fi_send to an AV entry never inserted = %zd (%s)", r,
		     fi_strerror((int)-r));
		return CASE_PASS;
	}
	struct comp c;
	CHECK(wait_comp(&A, &sr.ctx, 20, &c),
	      "fi_send to an AV entry never inserted returned 0 and never completed");
	CHECK(c.is_err, "fi_send to an AV entry never inserted completed successfully");
	note("error completion %d (%s): %s", c.err, fi_strerror(c.err), c.errstr);
	return CASE_PASS;
}

/* Receives, rendezvous-sized sends, writes and reads outstanding when the
 * endpoints are closed: every close returns, nothing crashes. */
static int close_outstanding(void)
{
	if (setup())
		return CASE_FAIL;
	size_t big = 1 << 20;
	struct region s, r, rr[4], dst;
	if (reg(&A, &s, big, ALL_ACCESS) || reg(&B, &r, big, ALL_ACCESS) ||
	    reg(&B, &dst, big, ALL_ACCESS))
		return CASE_FAIL;
	struct req q[16];
	int nq = 0;
	struct req *p;
	/* POST evaluates its call again on -FI_EAGAIN: no side effects in it. */
#define NEXT(text) (p = &q[nq++], p->what = (text))
	for (int i = 0; i < 4; i++) {
		if (reg(&B, &rr[i], 4096, ALL_ACCESS))
			return CASE_FAIL;
		NEXT("fi_trecv");
		POST_OK(fi_trecv(B.ep, rr[i].buf, 4096, rr[i].desc, FI_ADDR_UNSPEC,
				 1000 + i, 0, &p->ctx));
	}
	NEXT("fi_recv");
	POST_OK(fi_recv(A.ep, s.buf, 4096, s.desc, FI_ADDR_UNSPEC, &p->ctx));
	NEXT("fi_tsend 1 MiB, never received");
	POST_OK(fi_tsend(A.ep, s.buf, big, s.desc, a2b, 77, &p->ctx));
	NEXT("fi_tsend 64 B, never received");
	POST_OK(fi_tsend(A.ep, s.buf, 64, s.desc, a2b, 78, &p->ctx));
	NEXT("fi_write 1 MiB");
	POST_OK(fi_write(A.ep, s.buf, big, s.desc, a2b, dst.addr, dst.key, &p->ctx));
	NEXT("fi_read 1 MiB");
	POST_OK(fi_read(A.ep, s.buf, big, s.desc, a2b, dst.addr, dst.key, &p->ctx));
#undef NEXT
	int ra = fi_close(&A.ep->fid);
	note("fi_close(A's endpoint, %d operations outstanding) = %d", nq, ra);
	A.ep = NULL;
	/* Reading the CQ after the close (canceled operations may show up):
	 * tcp;ofi_rxm crashes here (SIGSEGV in fi_cq_read), so for metaroce. */
	if (g_is_metaroce) {
		drain_side(&A);
		spin(0.2);
	}
	int rb = fi_close(&B.ep->fid);
	note("fi_close(B's endpoint, 4 receives posted) = %d", rb);
	B.ep = NULL;
	if (g_is_metaroce)
		drain_side(&B);
	note("completions after the closes: A %d, B %d", A.nstash, B.nstash);
	for (int i = 0; i < A.nstash; i++)
		if (A.stash[i].is_err)
			note("  A: err %d (%s)", A.stash[i].err, A.stash[i].errstr);
	close_side(&A);
	close_side(&B);
	note("every object closed");
	return CASE_PASS;
}

/* C's endpoint is opened, named and closed: nothing listens at its
 * address. A send and a write to it end in error completions. */
static int unreachable(void)
{
	if (open_side(&A, "A", BASE_CAPS) || open_side(&C, "C", BASE_CAPS))
		return CASE_FAIL;
	g_nsides = 1; /* only A is driven from now on */
	close_side(&C);
	fi_addr_t a2c = insert_peer(&A, &C);
	CHECK(a2c != FI_ADDR_NOTAVAIL, "AV insert of the closed endpoint's name");
	struct region s;
	if (reg(&A, &s, 4096, ALL_ACCESS))
		return CASE_FAIL;
	struct req sr = {.what = "fi_send to a closed endpoint"};
	struct req tr = {.what = "fi_tsend to a closed endpoint"};
	struct req wr = {.what = "fi_write to a closed endpoint"};
	struct req *reqs[] = {&sr, &tr, &wr};
	ssize_t ret[3];
	double t0 = now_s();
	ret[0] = POST(fi_send(A.ep, s.buf, 64, s.desc, a2c, &sr.ctx));
	/* A provider that only ever answers -FI_EAGAIN leaves the application
	 * retrying forever: tried once for 10 s (POST), not for every op. */
	ret[1] = ret[0] == -FI_EAGAIN ? -FI_EAGAIN
				      : POST(fi_tsend(A.ep, s.buf, 4096, s.desc, a2c, 5, &tr.ctx));
	ret[2] = ret[0] == -FI_EAGAIN
			 ? -FI_EAGAIN
			 : POST(fi_write(A.ep, s.buf, 64, s.desc, a2c, 0x10000, 1, &wr.ctx));
	for (int i = 0; i < 3; i++) {
		if (ret[i] < 0) {
			note("%s: refused when posted: %zd (%s) after %.1f s", reqs[i]->what,
			     ret[i], fi_strerror((int)-ret[i]), now_s() - t0);
			STRICT(ret[i] != -FI_EAGAIN,
			       "%s: still -FI_EAGAIN after 10 s of retries", reqs[i]->what);
			continue;
		}
		struct comp c;
		CHECK(wait_comp(&A, &reqs[i]->ctx, 30, &c),
		      "%s: no completion within 30 s", reqs[i]->what);
		CHECK(c.is_err, "%s: completed successfully", reqs[i]->what);
		CHECK(c.err != 0, "%s: error completion with err 0", reqs[i]->what);
		note("%s: error completion after %.1f s: err %d (%s), prov_errno %d, "
		     "fi_cq_strerror: %s",
		     reqs[i]->what, now_s() - t0, c.err, fi_strerror(c.err),
		     c.prov_errno, c.errstr);
	}
	return CASE_PASS;
}

/* Calls on a closed endpoint answer an error (the metaroce provider's
 * promise; libfabric's own providers free the object). */
static int after_close(void)
{
	if (!g_is_metaroce) {
		note("contract of the metaroce provider only (others free the object)");
		return CASE_SKIP;
	}
	if (setup())
		return CASE_FAIL;
	uint8_t buf[64] = {0};
	struct fid_ep *ep = A.ep;
	CALL(fi_close(&ep->fid));
	A.ep = NULL;
	ssize_t r = fi_send(ep, buf, 64, NULL, a2b, NULL);
	note("fi_send on a closed endpoint = %zd (%s)", r, fi_strerror((int)-r));
	CHECK(r < 0, "fi_send on a closed endpoint returned %zd", r);
	r = fi_tsend(ep, buf, 64, NULL, a2b, 1, NULL);
	CHECK(r < 0, "fi_tsend on a closed endpoint returned %zd", r);
	r = fi_recv(ep, buf, 64, NULL, FI_ADDR_UNSPEC, NULL);
	CHECK(r < 0, "fi_recv on a closed endpoint returned %zd", r);
	int c = fi_close(&ep->fid);
	note("fi_close again = %d (%s)", c, fi_strerror(-c));
	CHECK(c < 0, "a second fi_close of the endpoint returned %d", c);
	struct fid_cq *cq = B.cq;
	CALL(fi_close(&B.ep->fid));
	B.ep = NULL;
	CALL(fi_close(&cq->fid));
	B.cq = NULL;
	B.closed = 1;
	struct fi_cq_tagged_entry e;
	r = fi_cq_read(cq, &e, 1);
	note("fi_cq_read on a closed CQ = %zd (%s)", r, fi_strerror((int)-r));
	CHECK(r < 0 && r != -FI_EAGAIN, "fi_cq_read on a closed CQ returned %zd", r);
	return CASE_PASS;
}

static int is_unsupported(long r)
{
	return r == -FI_ENOSYS || r == -FI_EOPNOTSUPP;
}

static int atomics_counters(void)
{
	if (setup())
		return CASE_FAIL;
	struct fi_info *hints = fi_allocinfo();
	hints->caps = FI_ATOMIC;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup(g_prov);
	struct fi_info *info = NULL;
	int r = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL,
			   0, hints, &info);
	fi_freeinfo(hints);
	note("fi_getinfo(caps FI_ATOMIC) = %d (%s)", r, fi_strerror(-r));
	if (r == 0 && !g_is_metaroce) {
		note("provider %s has atomics: nothing to refuse", g_prov);
		return CASE_SKIP;
	}
	CHECK(r == -FI_ENODATA, "a provider without atomics matched FI_ATOMIC hints");
	CHECK(A.domain->ops->cntr_open != NULL, "domain ops cntr_open is NULL "
						 "(fi_cntr_open would crash)");
	struct fi_cntr_attr cattr = {.events = FI_CNTR_EVENTS_COMP};
	struct fid_cntr *cntr = NULL;
	r = fi_cntr_open(A.domain, &cattr, &cntr, NULL);
	note("fi_cntr_open = %d (%s)", r, fi_strerror(-r));
	CHECK(is_unsupported(r), "fi_cntr_open = %d", r);

	struct fi_atomic_attr aattr;
	r = fi_query_atomic(A.domain, FI_UINT64, FI_SUM, &aattr, 0);
	note("fi_query_atomic = %d (%s)", r, fi_strerror(-r));
	CHECK(is_unsupported(r), "fi_query_atomic = %d", r);

	CHECK(A.ep->atomic != NULL, "ep->atomic is NULL (fi_atomic would crash)");
	uint64_t v = 1;
	ssize_t s = fi_atomic(A.ep, &v, 1, NULL, a2b, 0, 1, FI_UINT64, FI_SUM, NULL);
	note("fi_atomic = %zd (%s)", s, fi_strerror((int)-s));
	CHECK(is_unsupported(s), "fi_atomic = %zd", s);
	s = fi_atomicvalid(A.ep, FI_UINT64, FI_SUM, (size_t *)&v);
	note("fi_atomicvalid = %zd", s);
	CHECK(is_unsupported(s), "fi_atomicvalid = %zd", s);
	return CASE_PASS;
}

int main(int argc, char **argv)
{
	static const struct test_case cases[] = {
		{"cq_sread_timeout", sread_timeout, 30},
		{"cq_sread_woken_by_completion", sread_wakes, 40},
		{"cq_readerr_empty", readerr_empty, 30},
		{"av_lookup_straddr", av_lookup, 30},
		{"av_entry_never_inserted", av_never_inserted, 40},
		{"close_with_operations_outstanding", close_outstanding, 60},
		{"unreachable_peer_error_completion", unreachable, 110},
		{"calls_after_fi_close", after_close, 30},
		{"atomics_and_counters_unsupported", atomics_counters, 30},
	};
	return run_cases(argc, argv, "errors", cases,
			 sizeof cases / sizeof cases[0]);
}
