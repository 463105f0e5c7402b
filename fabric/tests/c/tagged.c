/*
 * Messages and tagged messages through the provider: fi_send/fi_recv,
 * fi_senddata (remote CQ data), fi_inject; tagged send/recv with the tag
 * checked, unexpected messages (sent before the receive is posted: eager
 * small and rendezvous-sized 1 MiB), tag matching with a non-matching
 * message in between, FI_DIRECTED_RECV (a receive for one source does not
 * take another source's message) and truncation (FI_ETRUNC through
 * fi_cq_readerr with olen). Every received byte is checked.
 */
#include "common.h"

#define KiB 1024
#define MiB (1024 * 1024)

static struct side A, B, C;
static fi_addr_t a2b, b2a;

static int setup(void)
{
	return pair(&A, &B, &a2b, &b2a, BASE_CAPS | FI_DIRECTED_RECV);
}

static int msg_send_recv(size_t len, uint32_t seed)
{
	if (setup())
		return CASE_FAIL;
	struct region s, r;
	if (reg(&A, &s, len, ALL_ACCESS) || reg(&B, &r, len, ALL_ACCESS))
		return CASE_FAIL;
	fill(s.buf, len, seed);
	struct req rr = {.what = "fi_recv"}, sr = {.what = "fi_send"};
	POST_OK(fi_recv(B.ep, r.buf, len, r.desc, FI_ADDR_UNSPEC, &rr.ctx));
	POST_OK(fi_send(A.ep, s.buf, len, s.desc, a2b, &sr.ctx));
	struct comp c;
	EXPECT_OK(&A, &sr, 30, &c);
	EXPECT_OK(&B, &rr, 30, &c);
	CHECK(c.len == len, "received len %zu, expected %zu", c.len, len);
	CHECK(c.flags & FI_RECV, "receive completion without FI_RECV (0x%" PRIx64 ")",
	      c.flags);
	long bad = mismatch(r.buf, len, seed);
	CHECK(bad < 0, "received byte %ld of %zu differs", bad, len);
	return CASE_PASS;
}

static int msg_4k(void) { return msg_send_recv(4 * KiB, 11); }
static int msg_1m(void) { return msg_send_recv(MiB, 12); }

static int senddata(void)
{
	if (setup())
		return CASE_FAIL;
	struct region s, r;
	if (reg(&A, &s, 256, ALL_ACCESS) || reg(&B, &r, 256, ALL_ACCESS))
		return CASE_FAIL;
	fill(s.buf, 256, 13);
	struct req rr = {.what = "fi_recv"}, sr = {.what = "fi_senddata"};
	POST_OK(fi_recv(B.ep, r.buf, 256, r.desc, FI_ADDR_UNSPEC, &rr.ctx));
	POST_OK(fi_senddata(A.ep, s.buf, 256, s.desc, 0xABCD1234, a2b, &sr.ctx));
	struct comp c;
	EXPECT_OK(&A, &sr, 30, &c);
	EXPECT_OK(&B, &rr, 30, &c);
	CHECK(c.flags & FI_REMOTE_CQ_DATA, "no FI_REMOTE_CQ_DATA (flags 0x%" PRIx64 ")",
	      c.flags);
	CHECK(c.data == 0xABCD1234, "data 0x%" PRIx64, c.data);
	CHECK(mismatch(r.buf, 256, 13) < 0, "payload differs");
	return CASE_PASS;
}

static int inject(void)
{
	if (setup())
		return CASE_FAIL;
	size_t max = A.info->tx_attr->inject_size;
	size_t len = max < 64 ? max : 64;
	CHECK(len > 0, "inject_size is 0");
	uint8_t buf[64];
	struct region r;
	if (reg(&B, &r, 64, ALL_ACCESS))
		return CASE_FAIL;
	fill(buf, len, 14);
	struct req rr = {.what = "fi_recv"};
	POST_OK(fi_recv(B.ep, r.buf, 64, r.desc, FI_ADDR_UNSPEC, &rr.ctx));
	POST_OK(fi_inject(A.ep, buf, len, a2b));
	memset(buf, 0, sizeof buf); /* the buffer is free after fi_inject */
	struct comp c;
	EXPECT_OK(&B, &rr, 30, &c);
	CHECK(c.len == len, "len %zu", c.len);
	CHECK(mismatch(r.buf, len, 14) < 0, "payload differs");
	note("fi_inject of %zu B (inject_size %zu)", len, max);
	return CASE_PASS;
}

/* A tagged message; `unexpected` sends it (and drives progress for a
 * while) before the receive is posted. */
static int tagged(size_t len, int unexpected, uint32_t seed)
{
	if (setup())
		return CASE_FAIL;
	struct region s, r;
	if (reg(&A, &s, len, ALL_ACCESS) || reg(&B, &r, len, ALL_ACCESS))
		return CASE_FAIL;
	fill(s.buf, len, seed);
	const uint64_t tag = 0x1234567890ull;
	struct req rr = {.what = "fi_trecv"}, sr = {.what = "fi_tsend"};
	if (!unexpected)
		POST_OK(fi_trecv(B.ep, r.buf, len, r.desc, FI_ADDR_UNSPEC, tag,
				 0, &rr.ctx));
	POST_OK(fi_tsend(A.ep, s.buf, len, s.desc, a2b, tag, &sr.ctx));
	if (unexpected) {
		spin(0.3);
		POST_OK(fi_trecv(B.ep, r.buf, len, r.desc, FI_ADDR_UNSPEC, tag,
				 0, &rr.ctx));
	}
	struct comp c;
	EXPECT_OK(&A, &sr, 30, &c);
	EXPECT_OK(&B, &rr, 30, &c);
	CHECK(c.tag == tag, "tag 0x%" PRIx64, c.tag);
	CHECK(c.len == len, "len %zu, expected %zu", c.len, len);
	CHECK(c.flags & FI_TAGGED, "no FI_TAGGED in flags 0x%" PRIx64, c.flags);
	long bad = mismatch(r.buf, len, seed);
	CHECK(bad < 0, "received byte %ld of %zu differs", bad, len);
	return CASE_PASS;
}

static int tagged_8(void) { return tagged(8, 0, 21); }
static int tagged_64k(void) { return tagged(64 * KiB, 0, 22); }
static int tagged_1m(void) { return tagged(MiB, 0, 23); }
static int unexpected_small(void) { return tagged(100, 1, 24); }
static int unexpected_large(void) { return tagged(MiB, 1, 25); }
static int unexpected_200k(void) { return tagged(200 * KiB, 1, 26); }

/* Several unexpected messages of mixed sizes, then receives posted in
 * reverse tag order: each gets its own message. */
static int unexpected_many(void)
{
	if (setup())
		return CASE_FAIL;
	enum { N = 6 };
	static const size_t lens[N] = {1, 100, 4 * KiB, 70 * KiB, 300 * KiB, 8};
	struct region s[N], r[N];
	struct req sr[N], rr[N];
	for (int i = 0; i < N; i++) {
		if (reg(&A, &s[i], lens[i], ALL_ACCESS) ||
		    reg(&B, &r[i], lens[i], ALL_ACCESS))
			return CASE_FAIL;
		fill(s[i].buf, lens[i], 30 + i);
		sr[i].what = "fi_tsend";
		rr[i].what = "fi_trecv";
		POST_OK(fi_tsend(A.ep, s[i].buf, lens[i], s[i].desc, a2b, 100 + i,
				 &sr[i].ctx));
	}
	spin(0.3);
	for (int i = N - 1; i >= 0; i--)
		POST_OK(fi_trecv(B.ep, r[i].buf, lens[i], r[i].desc,
				 FI_ADDR_UNSPEC, 100 + i, 0, &rr[i].ctx));
	struct comp c;
	for (int i = 0; i < N; i++) {
		EXPECT_OK(&A, &sr[i], 30, &c);
		EXPECT_OK(&B, &rr[i], 30, &c);
		CHECK(c.tag == (uint64_t)(100 + i), "recv %d got tag %" PRIu64, i,
		      c.tag);
		long bad = mismatch(r[i].buf, lens[i], 30 + i);
		CHECK(bad < 0, "message %d (%zu B): byte %ld differs", i, lens[i],
		      bad);
	}
	return CASE_PASS;
}

/* A receive for tag 1 is not taken by a message of tag 2; the ignore mask
 * lets a receive take any tag of a group. */
static int tag_matching(void)
{
	if (setup())
		return CASE_FAIL;
	struct region s1, s2, s3, r1, r2, r3;
	if (reg(&A, &s1, 512, ALL_ACCESS) || reg(&A, &s2, 512, ALL_ACCESS) ||
	    reg(&A, &s3, 512, ALL_ACCESS) || reg(&B, &r1, 512, ALL_ACCESS) ||
	    reg(&B, &r2, 512, ALL_ACCESS) || reg(&B, &r3, 512, ALL_ACCESS))
		return CASE_FAIL;
	fill(s1.buf, 512, 41);
	fill(s2.buf, 512, 42);
	fill(s3.buf, 512, 43);
	struct req rr1 = {.what = "fi_trecv tag 1"}, rr2 = {.what = "fi_trecv tag 2"},
		   rr3 = {.what = "fi_trecv 0x7700 ignore 0xff"};
	struct req sr1 = {.what = "fi_tsend tag 1"}, sr2 = {.what = "fi_tsend tag 2"},
		   sr3 = {.what = "fi_tsend tag 0x7742"};
	POST_OK(fi_trecv(B.ep, r1.buf, 512, r1.desc, FI_ADDR_UNSPEC, 1, 0, &rr1.ctx));
	POST_OK(fi_tsend(A.ep, s2.buf, 512, s2.desc, a2b, 2, &sr2.ctx));
	spin(0.2);
	struct comp c;
	CHECK(!take(&B, &rr1.ctx, &c), "the receive for tag 1 took a tag 2 message");
	POST_OK(fi_tsend(A.ep, s1.buf, 512, s1.desc, a2b, 1, &sr1.ctx));
	EXPECT_OK(&B, &rr1, 30, &c);
	CHECK(c.tag == 1 && mismatch(r1.buf, 512, 41) < 0, "tag 1 receive got tag %" PRIu64, c.tag);
	POST_OK(fi_trecv(B.ep, r2.buf, 512, r2.desc, FI_ADDR_UNSPEC, 2, 0, &rr2.ctx));
	EXPECT_OK(&B, &rr2, 30, &c);
	CHECK(c.tag == 2 && mismatch(r2.buf, 512, 42) < 0, "tag 2 receive got tag %" PRIu64, c.tag);
	POST_OK(fi_trecv(B.ep, r3.buf, 512, r3.desc, FI_ADDR_UNSPEC, 0x7700, 0xff, &rr3.ctx));
	POST_OK(fi_tsend(A.ep, s3.buf, 512, s3.desc, a2b, 0x7742, &sr3.ctx));
	EXPECT_OK(&B, &rr3, 30, &c);
	CHECK(c.tag == 0x7742, "masked receive got tag 0x%" PRIx64, c.tag);
	CHECK(mismatch(r3.buf, 512, 43) < 0, "masked receive payload differs");
	EXPECT_OK(&A, &sr1, 30, &c);
	EXPECT_OK(&A, &sr2, 30, &c);
	EXPECT_OK(&A, &sr3, 30, &c);
	return CASE_PASS;
}

/* Three sides: B and C both send tag 7 to A. A's receive directed at C
 * takes C's message although B's came first; then one directed at B. */
static int directed(int unexpected)
{
	if (setup())
		return CASE_FAIL;
	if (open_side(&C, "C", BASE_CAPS | FI_DIRECTED_RECV))
		return CASE_FAIL;
	fi_addr_t a2c = insert_peer(&A, &C);
	fi_addr_t c2a = insert_peer(&C, &A);
	CHECK(a2c != FI_ADDR_NOTAVAIL && c2a != FI_ADDR_NOTAVAIL, "AV insert");
	if (!(A.info->caps & FI_DIRECTED_RECV)) {
		note("the provider did not grant FI_DIRECTED_RECV");
		return CASE_FAIL;
	}
	size_t len = 2 * KiB;
	struct region sb, sc, rb, rc;
	if (reg(&B, &sb, len, ALL_ACCESS) || reg(&C, &sc, len, ALL_ACCESS) ||
	    reg(&A, &rb, len, ALL_ACCESS) || reg(&A, &rc, len, ALL_ACCESS))
		return CASE_FAIL;
	fill(sb.buf, len, 51);
	fill(sc.buf, len, 52);
	struct req rrc = {.what = "fi_trecv from C"}, rrb = {.what = "fi_trecv from B"};
	struct req srb = {.what = "fi_tsend B"}, src = {.what = "fi_tsend C"};
	struct comp c;
	if (unexpected) {
		POST_OK(fi_tsend(B.ep, sb.buf, len, sb.desc, b2a, 7, &srb.ctx));
		spin(0.2);
		POST_OK(fi_tsend(C.ep, sc.buf, len, sc.desc, c2a, 7, &src.ctx));
		spin(0.3);
		POST_OK(fi_trecv(A.ep, rc.buf, len, rc.desc, a2c, 7, 0, &rrc.ctx));
		EXPECT_OK(&A, &rrc, 30, &c);
	} else {
		POST_OK(fi_trecv(A.ep, rc.buf, len, rc.desc, a2c, 7, 0, &rrc.ctx));
		POST_OK(fi_tsend(B.ep, sb.buf, len, sb.desc, b2a, 7, &srb.ctx));
		spin(0.3);
		CHECK(!take(&A, &rrc.ctx, &c),
		      "the receive directed at C completed with B's message");
		POST_OK(fi_tsend(C.ep, sc.buf, len, sc.desc, c2a, 7, &src.ctx));
		EXPECT_OK(&A, &rrc, 30, &c);
	}
	CHECK(mismatch(rc.buf, len, 52) < 0,
	      "the receive directed at C holds other data (B's: %s)",
	      mismatch(rc.buf, len, 51) < 0 ? "yes" : "no");
	POST_OK(fi_trecv(A.ep, rb.buf, len, rb.desc, a2b, 7, 0, &rrb.ctx));
	EXPECT_OK(&A, &rrb, 30, &c);
	CHECK(mismatch(rb.buf, len, 51) < 0, "the receive directed at B holds other data");
	EXPECT_OK(&B, &srb, 30, &c);
	EXPECT_OK(&C, &src, 30, &c);
	return CASE_PASS;
}

static int directed_posted(void) { return directed(0); }
static int directed_unexpected(void) { return directed(1); }

/* A 4 KiB message into a 1 KiB receive: FI_ETRUNC with olen 3 KiB, the
 * first 1 KiB delivered, nothing past the buffer written. */
static int truncation(int is_tagged, int unexpected)
{
	if (setup())
		return CASE_FAIL;
	struct region s, r;
	if (reg(&A, &s, 4 * KiB, ALL_ACCESS) || reg(&B, &r, 4 * KiB, ALL_ACCESS))
		return CASE_FAIL;
	fill(s.buf, 4 * KiB, 61);
	memset(r.buf, 0xEE, 4 * KiB);
	struct req rr = {.what = "receive of 1 KiB"}, sr = {.what = "send of 4 KiB"};
	if (!unexpected) {
		if (is_tagged)
			POST_OK(fi_trecv(B.ep, r.buf, KiB, r.desc, FI_ADDR_UNSPEC, 9, 0, &rr.ctx));
		else
			POST_OK(fi_recv(B.ep, r.buf, KiB, r.desc, FI_ADDR_UNSPEC, &rr.ctx));
	}
	if (is_tagged)
		POST_OK(fi_tsend(A.ep, s.buf, 4 * KiB, s.desc, a2b, 9, &sr.ctx));
	else
		POST_OK(fi_send(A.ep, s.buf, 4 * KiB, s.desc, a2b, &sr.ctx));
	if (unexpected) {
		spin(0.3);
		POST_OK(fi_trecv(B.ep, r.buf, KiB, r.desc, FI_ADDR_UNSPEC, 9, 0, &rr.ctx));
	}
	struct comp c;
	CHECK(wait_comp(&B, &rr.ctx, 30, &c), "no receive completion within 30 s");
	CHECK(c.is_err, "the truncated receive completed without error (len %zu)", c.len);
	note("receiver: err %d (%s), olen %zu, len %zu, fi_cq_strerror: %s", c.err,
	     fi_strerror(c.err), c.olen, c.len, c.errstr);
	CHECK(c.err == FI_ETRUNC, "err %d, expected FI_ETRUNC (%d)", c.err, FI_ETRUNC);
	STRICT(c.olen == 3 * KiB, "olen %zu, expected 3072", c.olen);
	STRICT(mismatch(r.buf, KiB, 61) < 0, "the first 1 KiB was not delivered");
	CHECK(not_all(r.buf + KiB, 3 * KiB, 0xEE) < 0, "bytes past the receive buffer written");
	/* The sender's side may report success or the truncation. */
	struct comp sc;
	CHECK(wait_comp(&A, &sr.ctx, 30, &sc), "no send completion within 30 s");
	note("sender: %s", sc.is_err ? sc.errstr : "success");
	return CASE_PASS;
}

static int trunc_tagged(void) { return truncation(1, 0); }
static int trunc_msg(void) { return truncation(0, 0); }
static int trunc_unexpected(void) { return truncation(1, 1); }

/* fi_cq_readfrom names the sender: B's completion of A's message carries
 * the fi_addr B has for A (FI_SOURCE), entry 1 of B's AV (C is entry 0). */
static int readfrom(void)
{
	uint64_t caps = BASE_CAPS | FI_SOURCE;
	if (open_side(&A, "A", caps) || open_side(&B, "B", caps) || open_side(&C, "C", caps))
		return CASE_FAIL;
	fi_addr_t b2c = insert_peer(&B, &C);
	b2a = insert_peer(&B, &A);
	a2b = insert_peer(&A, &B);
	CHECK(b2c != FI_ADDR_NOTAVAIL && b2a != FI_ADDR_NOTAVAIL && a2b != FI_ADDR_NOTAVAIL,
	      "AV insert");
	CHECK(b2a != b2c, "B's AV gave A and C the same fi_addr");
	if (!(B.info->caps & FI_SOURCE)) {
		STRICT(0, "the provider did not grant FI_SOURCE");
		return CASE_SKIP;
	}
	struct region s, r;
	if (reg(&A, &s, 64, ALL_ACCESS) || reg(&B, &r, 64, ALL_ACCESS))
		return CASE_FAIL;
	fill(s.buf, 64, 81);
	struct req rr = {.what = "fi_trecv"}, sr = {.what = "fi_tsend"};
	POST_OK(fi_trecv(B.ep, r.buf, 64, r.desc, FI_ADDR_UNSPEC, 3, 0, &rr.ctx));
	POST_OK(fi_tsend(A.ep, s.buf, 64, s.desc, a2b, 3, &sr.ctx));
	double end = now_s() + 30;
	fi_addr_t src = FI_ADDR_NOTAVAIL;
	int got = 0;
	while (!got && now_s() < end) {
		drain_side(&A);
		struct fi_cq_tagged_entry e;
		ssize_t n = fi_cq_readfrom(B.cq, &e, 1, &src);
		if (n == 1) {
			CHECK(e.op_context == &rr.ctx, "a completion of another context");
			got = 1;
		} else {
			CHECK(n == -FI_EAGAIN, "fi_cq_readfrom = %zd (%s)", n,
			      fi_strerror((int)-n));
		}
	}
	CHECK(got, "no receive completion within 30 s");
	note("fi_cq_readfrom: src_addr %" PRIu64 ", B's fi_addr for A %" PRIu64, src, b2a);
	CHECK(src == b2a, "src_addr %" PRIu64 ", expected %" PRIu64, src, b2a);
	CHECK(mismatch(r.buf, 64, 81) < 0, "payload differs");
	return CASE_PASS;
}

int main(int argc, char **argv)
{
	static const struct test_case cases[] = {
		{"msg_send_recv_4KiB", msg_4k, 60},
		{"msg_send_recv_1MiB", msg_1m, 60},
		{"msg_senddata_remote_cq_data", senddata, 60},
		{"msg_inject", inject, 60},
		{"tagged_8B", tagged_8, 60},
		{"tagged_64KiB", tagged_64k, 60},
		{"tagged_1MiB", tagged_1m, 60},
		{"tagged_unexpected_eager_100B", unexpected_small, 60},
		{"tagged_unexpected_200KiB", unexpected_200k, 60},
		{"tagged_unexpected_rendezvous_1MiB", unexpected_large, 60},
		{"tagged_unexpected_mixed_reverse_order", unexpected_many, 90},
		{"tagged_matching_and_ignore_mask", tag_matching, 60},
		{"directed_recv_posted", directed_posted, 60},
		{"directed_recv_unexpected", directed_unexpected, 60},
		{"truncation_tagged_FI_ETRUNC", trunc_tagged, 60},
		{"truncation_msg_FI_ETRUNC", trunc_msg, 60},
		{"truncation_unexpected_FI_ETRUNC", trunc_unexpected, 60},
		{"cq_readfrom_source_address", readfrom, 60},
	};
	return run_cases(argc, argv, "tagged", cases,
			 sizeof cases / sizeof cases[0]);
}
