/*
 * RMA through the provider: fi_write, fi_writedata (remote CQ data seen at
 * the target), fi_read, each with a data check on fi_mr_reg'd buffers
 * addressed by fi_mr_key and the region's virtual address (FI_MR_VIRT_ADDR,
 * offset 0 otherwise); and what must fail: a bad remote key, a length past
 * the region, a key of another domain, a key of a closed region, a null
 * buffer. A failed RMA must end in an error completion (fi_cq_readerr, err
 * nonzero, fi_cq_strerror printable) and write nothing to the target.
 */
#include "common.h"

#define KiB 1024
#define MiB (1024 * 1024)

static struct side A, B;
static fi_addr_t a2b, b2a;

static int setup(void)
{
	return pair(&A, &B, &a2b, &b2a, BASE_CAPS);
}

/* A writes `len` bytes at `off` into B's region and checks B's bytes, and
 * that the bytes around the target range stay untouched. */
static int write_and_check(size_t region_len, size_t off, size_t len,
			   uint32_t seed)
{
	if (setup())
		return CASE_FAIL;
	struct region src, dst;
	if (reg(&A, &src, len, ALL_ACCESS) || reg(&B, &dst, region_len, ALL_ACCESS))
		return CASE_FAIL;
	memset(dst.buf, 0xEE, region_len);
	fill(src.buf, len, seed);
	struct req w = {.what = "fi_write"};
	POST_OK(fi_write(A.ep, src.buf, len, src.desc, a2b, dst.addr + off,
			 dst.key, &w.ctx));
	struct comp c;
	EXPECT_OK(&A, &w, 30, &c);
	/* The initiator's completion may come before the target's memory is
	 * visible to another thread: wait (driving progress) up to 5 s. */
	double end = now_s() + 5;
	while (mismatch(dst.buf + off, len, seed) >= 0 && now_s() < end)
		progress_all();
	long bad = mismatch(dst.buf + off, len, seed);
	CHECK(bad < 0, "target byte %ld of %zu differs", bad, len);
	CHECK(not_all(dst.buf, off, 0xEE) < 0, "bytes before the range changed");
	CHECK(not_all(dst.buf + off + len, region_len - off - len, 0xEE) < 0,
	      "bytes after the range changed");
	note("wrote %zu B at offset %zu of a %zu B region, data checked", len,
	     off, region_len);
	return CASE_PASS;
}

static int write_small(void) { return write_and_check(4 * KiB, 0, 8, 1); }
static int write_64k(void) { return write_and_check(64 * KiB, 0, 64 * KiB, 2); }
static int write_1m(void) { return write_and_check(MiB, 0, MiB, 3); }
static int write_offset(void)
{
	return write_and_check(16 * KiB, 1000, 3000, 4);
}

static int writedata(void)
{
	if (setup())
		return CASE_FAIL;
	struct region src, dst;
	size_t len = 4 * KiB;
	if (reg(&A, &src, len, ALL_ACCESS) || reg(&B, &dst, len, ALL_ACCESS))
		return CASE_FAIL;
	fill(src.buf, len, 5);
	const uint64_t imm = 0xC0FFEE42u;
	struct req w = {.what = "fi_writedata"};
	POST_OK(fi_writedata(A.ep, src.buf, len, src.desc, imm, a2b, dst.addr,
			     dst.key, &w.ctx));
	struct comp c;
	EXPECT_OK(&A, &w, 30, &c);
	struct comp t;
	CHECK(wait_flag(&B, FI_REMOTE_CQ_DATA, 10, &t),
	      "no completion with FI_REMOTE_CQ_DATA at the target within 10 s");
	CHECK(!t.is_err, "target completion is an error: %d %s", t.err,
	      t.errstr);
	CHECK(t.data == imm, "remote CQ data 0x%" PRIx64 ", expected 0x%" PRIx64,
	      t.data, imm);
	note("target completion flags 0x%" PRIx64 " data 0x%" PRIx64 " len %zu",
	     t.flags, t.data, t.len);
	long bad = mismatch(dst.buf, len, 5);
	CHECK(bad < 0, "target byte %ld differs", bad);
	/* A second one with another value: completions are not merged. */
	struct req w2 = {.what = "fi_writedata #2"};
	POST_OK(fi_writedata(A.ep, src.buf, 64, src.desc, 7, a2b, dst.addr,
			     dst.key, &w2.ctx));
	EXPECT_OK(&A, &w2, 30, &c);
	CHECK(wait_flag(&B, FI_REMOTE_CQ_DATA, 10, &t),
	      "no second FI_REMOTE_CQ_DATA completion");
	CHECK(t.data == 7, "second remote CQ data %" PRIu64 ", expected 7",
	      t.data);
	return CASE_PASS;
}

static int read_and_check(size_t len, uint32_t seed)
{
	if (setup())
		return CASE_FAIL;
	struct region dst, src;
	if (reg(&A, &dst, len, ALL_ACCESS) || reg(&B, &src, len, ALL_ACCESS))
		return CASE_FAIL;
	fill(src.buf, len, seed);
	memset(dst.buf, 0, len);
	struct req r = {.what = "fi_read"};
	POST_OK(fi_read(A.ep, dst.buf, len, dst.desc, a2b,
			src.addr, src.key, &r.ctx));
	struct comp c;
	EXPECT_OK(&A, &r, 30, &c);
	long bad = mismatch(dst.buf, len, seed);
	CHECK(bad < 0, "byte %ld of %zu read differs", bad, len);
	note("read %zu B, data checked", len);
	return CASE_PASS;
}

static int read_small(void) { return read_and_check(8, 6); }
static int read_64k(void) { return read_and_check(64 * KiB, 7); }
static int read_1m(void) { return read_and_check(MiB, 8); }

/* An RMA that must fail: an error completion at the initiator (or an
 * immediate error return) and no change of the target region. */
static int expect_rma_error(int is_read, void *lbuf, size_t len, void *desc,
			    uint64_t raddr, uint64_t key, struct region *target,
			    const char *what)
{
	struct req r = {.what = what};
	/* FI_DELIVERY_COMPLETE: the completion waits for the target's
	 * verdict (with transmit-complete semantics a provider may complete
	 * a write before the target has checked its key). */
	struct iovec iov = {.iov_base = lbuf, .iov_len = len};
	struct fi_rma_iov rma = {.addr = raddr, .len = len, .key = key};
	struct fi_msg_rma msg = {.msg_iov = &iov,
				 .desc = &desc,
				 .iov_count = 1,
				 .addr = a2b,
				 .rma_iov = &rma,
				 .rma_iov_count = 1,
				 .context = &r.ctx};
	ssize_t ret;
	if (is_read)
		ret = POST(fi_readmsg(A.ep, &msg, FI_COMPLETION));
	else
		ret = POST(fi_writemsg(A.ep, &msg,
				       FI_COMPLETION | FI_DELIVERY_COMPLETE));
	if (ret < 0) {
		note("%s: refused when posted: %zd (%s)", what, ret,
		     fi_strerror((int)-ret));
	} else {
		struct comp c;
		CHECK(wait_comp(&A, &r.ctx, 20, &c),
		      "%s: no completion within 20 s", what);
		CHECK(c.is_err, "%s: completed successfully", what);
		CHECK(c.err != 0, "%s: error completion with err 0", what);
		CHECK(c.errstr[0] != 0, "%s: fi_cq_strerror gave nothing", what);
		note("%s: error completion err %d (%s), prov_errno %d, "
		     "fi_cq_strerror: %s",
		     what, c.err, fi_strerror(c.err), c.prov_errno, c.errstr);
	}
	if (target) {
		spin(0.2);
		CHECK(not_all(target->buf, target->len, 0xEE) < 0,
		      "%s: the target region was modified", what);
	}
	return CASE_PASS;
}

static int bad_key(void)
{
	if (setup())
		return CASE_FAIL;
	struct region src, dst;
	if (reg(&A, &src, 4 * KiB, ALL_ACCESS) || reg(&B, &dst, 4 * KiB, ALL_ACCESS))
		return CASE_FAIL;
	memset(dst.buf, 0xEE, dst.len);
	fill(src.buf, 4 * KiB, 9);
	uint64_t bad = dst.key ^ 0x5a5a5aull; /* low bits: within a 4-byte key */
	if (bad == dst.key)
		bad = dst.key + 1;
	int r = expect_rma_error(0, src.buf, 64, src.desc, dst.addr, bad, &dst,
				 "fi_write with a bad key");
	if (r)
		return r;
	return expect_rma_error(1, src.buf, 64, src.desc, dst.addr, bad, NULL,
				"fi_read with a bad key");
}

/* After a bad-key error the same endpoint still reaches the same peer (an
 * RDM endpoint has no connection for the application to re-establish).
 * The tcp provider drops its connection instead: checked for metaroce. */
static int usable_after_bad_key(void)
{
	if (!g_is_metaroce) {
		note("contract of the metaroce provider only (tcp;ofi_rxm "
		     "tears its connection down)");
		return CASE_SKIP;
	}
	if (setup())
		return CASE_FAIL;
	struct region src, dst;
	if (reg(&A, &src, 4 * KiB, ALL_ACCESS) || reg(&B, &dst, 4 * KiB, ALL_ACCESS))
		return CASE_FAIL;
	memset(dst.buf, 0xEE, dst.len);
	fill(src.buf, 4 * KiB, 9);
	int r = expect_rma_error(0, src.buf, 64, src.desc, dst.addr,
				 dst.key + 0x5a5a, &dst, "fi_write with a bad key");
	if (r)
		return r;
	struct req w = {.what = "fi_write after the error"};
	POST_OK(fi_write(A.ep, src.buf, 64, src.desc, a2b, dst.addr, dst.key,
			 &w.ctx));
	struct comp c;
	EXPECT_OK(&A, &w, 30, &c);
	double end = now_s() + 5;
	while (mismatch(dst.buf, 64, 9) >= 0 && now_s() < end)
		progress_all();
	CHECK(mismatch(dst.buf, 64, 9) < 0, "the good write after the error "
					    "did not land");
	return CASE_PASS;
}

static int past_region(void)
{
	if (setup())
		return CASE_FAIL;
	struct region src, dst;
	if (reg(&A, &src, 16 * KiB, ALL_ACCESS) || reg(&B, &dst, 4 * KiB, ALL_ACCESS))
		return CASE_FAIL;
	memset(dst.buf, 0xEE, dst.len);
	int r = expect_rma_error(0, src.buf, 8 * KiB, src.desc, dst.addr,
				 dst.key, &dst, "fi_write of 8 KiB into 4 KiB");
	if (r)
		return r;
	r = expect_rma_error(0, src.buf, 16, src.desc, dst.addr + 4 * KiB - 8,
			     dst.key, &dst, "fi_write of 16 B at the last 8 B");
	if (r)
		return r;
	return expect_rma_error(1, src.buf, 8 * KiB, src.desc, dst.addr,
				dst.key, NULL, "fi_read of 8 KiB from 4 KiB");
}

/* A key of A's own domain used as a remote key at B. */
static int foreign_key(void)
{
	if (setup())
		return CASE_FAIL;
	struct region src, dst, mine;
	if (reg(&A, &src, 4 * KiB, ALL_ACCESS) || reg(&B, &dst, 4 * KiB, ALL_ACCESS) ||
	    reg(&A, &mine, 4 * KiB, ALL_ACCESS))
		return CASE_FAIL;
	memset(dst.buf, 0xEE, dst.len);
	if (mine.key == dst.key) {
		note("A's key equals B's region key (%" PRIu64
		     "): not a foreign key here",
		     mine.key);
		return CASE_SKIP;
	}
	return expect_rma_error(0, src.buf, 64, src.desc, (uint64_t)(uintptr_t)mine.buf,
				mine.key, &dst, "fi_write with A's own key");
}

static int closed_region(void)
{
	if (setup())
		return CASE_FAIL;
	struct region src, dst;
	if (reg(&A, &src, 4 * KiB, ALL_ACCESS) || reg(&B, &dst, 4 * KiB, ALL_ACCESS))
		return CASE_FAIL;
	uint64_t key = dst.key, addr = dst.addr;
	CALL(fi_close(&dst.mr->fid));
	memset(dst.buf, 0xEE, dst.len);
	return expect_rma_error(0, src.buf, 64, src.desc, addr, key, &dst,
				"fi_write to a closed region's key");
}

/* Regions registered with fi_mr_regv and fi_mr_regattr (one iov each)
 * take a write and a read like fi_mr_reg's. */
static int regv_regattr(void)
{
	if (setup())
		return CASE_FAIL;
	struct region src;
	size_t len = 8 * KiB;
	if (reg(&A, &src, len, ALL_ACCESS))
		return CASE_FAIL;
	uint8_t *bufs[2];
	struct fid_mr *mrs[2] = {NULL, NULL};
	for (int k = 0; k < 2; k++) {
		bufs[k] = aligned_alloc(4096, len);
		memset(bufs[k], 0xEE, len);
		struct iovec iov = {.iov_base = bufs[k], .iov_len = len};
		if (k == 0) {
			CALL(fi_mr_regv(B.domain, &iov, 1, ALL_ACCESS, 0, 0x7000, 0, &mrs[k],
					NULL));
		} else {
			struct fi_mr_attr attr = {.mr_iov = &iov,
						  .iov_count = 1,
						  .access = ALL_ACCESS,
						  .requested_key = 0x7001};
			CALL(fi_mr_regattr(B.domain, &attr, 0, &mrs[k]));
		}
		if (B.info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
			CALL(fi_mr_bind(mrs[k], &B.ep->fid, 0));
			CALL(fi_mr_enable(mrs[k]));
		}
		uint64_t addr = (B.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR)
					? (uint64_t)(uintptr_t)bufs[k]
					: 0;
		fill(src.buf, len, 90 + k);
		struct req w = {.what = k ? "fi_write into a regattr region"
					  : "fi_write into a regv region"};
		POST_OK(fi_write(A.ep, src.buf, len, src.desc, a2b, addr, fi_mr_key(mrs[k]),
				 &w.ctx));
		struct comp c;
		EXPECT_OK(&A, &w, 30, &c);
		double end = now_s() + 5;
		while (mismatch(bufs[k], len, 90 + k) >= 0 && now_s() < end)
			progress_all();
		CHECK(mismatch(bufs[k], len, 90 + k) < 0, "%s: data differs", w.what);
		memset(src.buf, 0, len);
		struct req rd = {.what = "fi_read back"};
		POST_OK(fi_read(A.ep, src.buf, len, src.desc, a2b, addr, fi_mr_key(mrs[k]),
				&rd.ctx));
		EXPECT_OK(&A, &rd, 30, &c);
		CHECK(mismatch(src.buf, len, 90 + k) < 0, "%s: read back differs", w.what);
	}
	return CASE_PASS;
}

static int null_buffer(void)
{
	if (!g_is_metaroce) {
		note("contract of the metaroce provider only");
		return CASE_SKIP;
	}
	if (setup())
		return CASE_FAIL;
	struct fid_mr *mr = NULL;
	int r = fi_mr_reg(A.domain, NULL, 4096, ALL_ACCESS, 0, 0, 0, &mr, NULL);
	CHECK(r < 0, "fi_mr_reg(NULL, 4096) = %d", r);
	note("fi_mr_reg(NULL, 4096) = %d (%s)", r, fi_strerror(-r));
	return CASE_PASS;
}

int main(int argc, char **argv)
{
	static const struct test_case cases[] = {
		{"rma_write_8B", write_small, 60},
		{"rma_write_64KiB", write_64k, 60},
		{"rma_write_1MiB", write_1m, 60},
		{"rma_write_offset_guard_bytes", write_offset, 60},
		{"rma_writedata_remote_cq_data", writedata, 60},
		{"rma_read_8B", read_small, 60},
		{"rma_read_64KiB", read_64k, 60},
		{"rma_read_1MiB", read_1m, 60},
		{"rma_bad_key_error_completion", bad_key, 90},
		{"rma_endpoint_usable_after_bad_key", usable_after_bad_key, 90},
		{"rma_past_region_error_completion", past_region, 90},
		{"rma_key_of_another_domain", foreign_key, 60},
		{"rma_key_of_closed_region", closed_region, 60},
		{"mr_regv_and_regattr_regions", regv_regattr, 60},
		{"mr_reg_null_buffer", null_buffer, 30},
	};
	return run_cases(argc, argv, "rma", cases,
			 sizeof cases / sizeof cases[0]);
}
