/*
 * FI_THREAD_SAFE (what aws-ofi-nccl asks for): several threads post on one
 * endpoint at once and read its CQ at once while another thread sleeps in
 * fi_cq_sread on the peer's CQ. Every message arrives once, intact, on the
 * receive it was tagged for; every send completes once.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "common.h"

#define THREADS 4
#define PER_THREAD 100
#define MSG 512
#define TOTAL (THREADS * PER_THREAD)

static struct side A, B;
static fi_addr_t a2b, b2a;
static uint8_t *sbuf, *rbuf;
static struct req sreq[TOTAL], rreq[TOTAL];
static atomic_int tx_done, tx_errors, post_errors;

static uint32_t seed_of(int i) { return 1000 + (uint32_t)i; }

/* Posts its share of tagged sends, then reads A's CQ (together with the
 * other senders) until every send has completed. */
static void *sender(void *arg)
{
	int t = (int)(intptr_t)arg;
	double end = now_s() + 40;
	for (int k = 0; k < PER_THREAD; k++) {
		int i = t * PER_THREAD + k;
		ssize_t r;
		while ((r = fi_tsend(A.ep, sbuf + (size_t)i * MSG, MSG, NULL, a2b,
				     (uint64_t)i, &sreq[i].ctx)) == -FI_EAGAIN &&
		       now_s() < end) {
			struct fi_cq_tagged_entry e[8];
			ssize_t n = fi_cq_read(A.cq, e, 8);
			if (n > 0)
				atomic_fetch_add(&tx_done, (int)n);
			else if (n == -FI_EAVAIL)
				atomic_fetch_add(&tx_errors, 1);
		}
		if (r) {
			atomic_fetch_add(&post_errors, 1);
			return NULL;
		}
	}
	while (atomic_load(&tx_done) + atomic_load(&tx_errors) < TOTAL && now_s() < end) {
		struct fi_cq_tagged_entry e[8];
		ssize_t n = fi_cq_read(A.cq, e, 8);
		if (n > 0) {
			atomic_fetch_add(&tx_done, (int)n);
		} else if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry ee;
			memset(&ee, 0, sizeof ee);
			if (fi_cq_readerr(A.cq, &ee, 0) > 0)
				atomic_fetch_add(&tx_errors, 1);
		}
	}
	return NULL;
}

static int concurrent_senders(void)
{
	g_threading = FI_THREAD_SAFE;
	if (pair(&A, &B, &a2b, &b2a, BASE_CAPS))
		return CASE_FAIL;
	CHECK(A.info->domain_attr->threading == FI_THREAD_SAFE,
	      "the provider granted threading %d, not FI_THREAD_SAFE",
	      A.info->domain_attr->threading);
	sbuf = malloc((size_t)TOTAL * MSG);
	rbuf = malloc((size_t)TOTAL * MSG);
	for (int i = 0; i < TOTAL; i++)
		fill(sbuf + (size_t)i * MSG, MSG, seed_of(i));
	memset(rbuf, 0, (size_t)TOTAL * MSG);
	for (int i = 0; i < TOTAL; i++)
		POST_OK(fi_trecv(B.ep, rbuf + (size_t)i * MSG, MSG, NULL, FI_ADDR_UNSPEC,
				 (uint64_t)i, 0, &rreq[i].ctx));
	pthread_t th[THREADS];
	for (int t = 0; t < THREADS; t++)
		pthread_create(&th[t], NULL, sender, (void *)(intptr_t)t);
	/* This thread sleeps in fi_cq_sread on B's CQ meanwhile. */
	int got = 0, seen[TOTAL] = {0};
	double end = now_s() + 40;
	while (got < TOTAL && now_s() < end) {
		struct fi_cq_tagged_entry e[16];
		ssize_t n = fi_cq_sread(B.cq, e, 16, NULL, 100);
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry ee;
			memset(&ee, 0, sizeof ee);
			fi_cq_readerr(B.cq, &ee, 0);
			note("receive error %d: %s", ee.err, fi_strerror(ee.err));
			break;
		}
		for (ssize_t k = 0; k < n; k++) {
			int i = (int)((struct req *)e[k].op_context - rreq);
			CHECK(i >= 0 && i < TOTAL, "a completion of an unknown context");
			CHECK(!seen[i], "receive %d completed twice", i);
			CHECK(e[k].tag == (uint64_t)i, "receive %d got tag %" PRIu64, i, e[k].tag);
			seen[i] = 1;
			got++;
		}
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	note("%d of %d messages received, %d sends completed, %d send errors, %d refused posts",
	     got, TOTAL, atomic_load(&tx_done), atomic_load(&tx_errors),
	     atomic_load(&post_errors));
	CHECK(atomic_load(&post_errors) == 0, "sends refused");
	CHECK(got == TOTAL, "messages missing");
	CHECK(atomic_load(&tx_done) == TOTAL && atomic_load(&tx_errors) == 0,
	      "send completions: %d ok, %d errors", atomic_load(&tx_done),
	      atomic_load(&tx_errors));
	for (int i = 0; i < TOTAL; i++) {
		long bad = mismatch(rbuf + (size_t)i * MSG, MSG, seed_of(i));
		CHECK(bad < 0, "message %d: byte %ld differs", i, bad);
	}
	return CASE_PASS;
}

int main(int argc, char **argv)
{
	static const struct test_case cases[] = {
		{"thread_safe_concurrent_senders_and_sread", concurrent_senders, 60},
	};
	return run_cases(argc, argv, "threads", cases, sizeof cases / sizeof cases[0]);
}
