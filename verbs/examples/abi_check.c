/*
 * abi_check: a C program driving two emulated MetaRoCE DPUs through the
 * host library's C API (metaroce_verbs.h over metaroce_abi.h).
 *
 *   abi_check DPU0.shm DPU0_IP:PORT DPU1.shm DPU1_IP:PORT
 *
 * It claims a queue set on each DPU, connects DPU 0 to DPU 1, registers
 * memory on both, creates each device's completion queue and a queue pair
 * per connection, then WRITEs a pattern from 0 to 1 and READs it back into
 * another buffer of 0, SENDs into a posted receive of 1, WRITE_IMMs with an
 * immediate, checks every byte and every completion, tries a few bad
 * requests, posts a batch that stops at a bad request (bad_wr), plays a tenant filling DPU 0's region table from a second
 * queue set (held at its quota while the first is served within 100 ms),
 * sets a quota from the management set (the last), and prints "N passed,
 * M failed". Exit status 0 only if none
 * failed. Built by `cargo xtask test host-abi` with the system C compiler.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "metaroce_verbs.h"

#define LEN 16384

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int passed, failed;

static void check(int ok, const char *what) {
  if (ok) {
    passed++;
    printf("ok   %s\n", what);
  } else {
    failed++;
    printf("FAIL %s\n", what);
  }
}

static int call(int rc, const char *what) {
  if (rc < 0) {
    printf("     %s: %s (%d)\n", what, metaroce_strerror(rc), rc);
  }
  return rc;
}

/* Polls one completion, waiting up to 20 s. */
static int wait_wc(struct metaroce_cq *cq, struct metaroce_wc *wc) {
  struct timespec pause = {0, 50000};
  for (long i = 0; i < 400000; i++) {
    int n = metaroce_poll_cq(cq, 1, wc);
    if (n != 0) {
      return n;
    }
    nanosleep(&pause, NULL);
  }
  return 0;
}

static void fill(unsigned char *buf, size_t len, unsigned seed) {
  for (size_t i = 0; i < len; i++) {
    buf[i] = (unsigned char)(i * 131u + seed * 7u + (i >> 8));
  }
}

static int split_addr(char *text, char **ip, unsigned short *port) {
  char *colon = strrchr(text, ':');
  if (colon == NULL) {
    return -1;
  }
  *colon = '\0';
  *ip = text;
  *port = (unsigned short)atoi(colon + 1);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s DPU0.shm IP0:PORT DPU1.shm IP1:PORT\n", argv[0]);
    return 2;
  }
  char *ip1;
  unsigned short port1;
  if (split_addr(argv[4], &ip1, &port1) != 0) {
    fprintf(stderr, "bad address %s\n", argv[4]);
    return 2;
  }
  struct metaroce_device *a = NULL, *b = NULL;
  check(call(metaroce_open_device(argv[1], &a), "open DPU 0") == 0, "open DPU 0's host interface");
  check(call(metaroce_open_device(argv[3], &b), "open DPU 1") == 0, "open DPU 1's host interface");
  if (a == NULL || b == NULL) {
    printf("%d passed, %d failed\n", passed, failed + 1);
    return 1;
  }
  uint64_t win0, winlen0;
  uint32_t pd0;
  check(metaroce_query_window(a, &win0, &winlen0, &pd0) == 0 && winlen0 >= 4 * LEN,
        "queue set window is large enough");

  /* Memory: 4 buffers on each side, one region each. */
  uint64_t abuf, bbuf;
  uint32_t akey = 0, bkey = 0;
  check(call(metaroce_alloc(a, 4 * LEN, 4096, &abuf), "alloc 0") == 0 &&
            call(metaroce_alloc(b, 4 * LEN, 4096, &bbuf), "alloc 1") == 0,
        "carve buffers out of the windows");
  check(call(metaroce_reg_mr(a, abuf, 4 * LEN, MR_ACCESS_ALL, &akey), "register 0") == 0 &&
            call(metaroce_reg_mr(b, bbuf, 4 * LEN, MR_ACCESS_ALL, &bkey), "register 1") == 0,
        "register a region on each DPU");

  /* Connection: DPU 1 listens, DPU 0 connects, DPU 1 accepts. */
  struct metaroce_conn ca, cb;
  check(call(metaroce_listen(b), "listen") == 0, "DPU 1 listens");
  check(call(metaroce_connect(a, ip1, port1, &ca), "connect") == 0, "DPU 0 connects to DPU 1");
  check(call(metaroce_accept(b, 20000, &cb), "accept") == 0, "DPU 1 accepts");

  /* The work path: each device's completion queue (one per device), a
   * queue pair per connection. */
  struct metaroce_cq *acq = NULL, *bcq = NULL, *again = NULL;
  struct metaroce_qp *qa = NULL, *qb = NULL;
  check(call(metaroce_create_cq(a, &acq), "create cq 0") == 0 &&
            call(metaroce_create_cq(b, &bcq), "create cq 1") == 0,
        "create a completion queue on each device");
  check(metaroce_create_cq(a, &again) == METAROCE_ERR_IN_USE,
        "a second completion queue of one device is refused");
  check(call(metaroce_create_qp(a, ca, &qa), "create qp 0") == 0 &&
            call(metaroce_create_qp(b, cb, &qb), "create qp 1") == 0,
        "create a queue pair on each connection");
  if (acq == NULL || bcq == NULL || qa == NULL || qb == NULL) {
    printf("%d passed, %d failed\n", passed, failed + 1);
    return 1;
  }

  static unsigned char src[LEN], out[LEN], want[LEN];
  struct metaroce_wc wc;

  /* WRITE a[0] -> b[0], then READ b[0] back into a[1]. */
  fill(src, LEN, 1);
  check(metaroce_write(a, abuf, src, LEN) == 0, "write the pattern into DPU 0's buffer");
  struct metaroce_send_wr w = {0};
  w.wr_id = 1;
  w.opcode = MR_OP_WRITE;
  w.local = (struct metaroce_sge){abuf, LEN, akey};
  w.remote_addr = bbuf;
  w.remote_key = bkey;
  check(call(metaroce_post_send(qa, &w, 1, NULL), "post WRITE") == 0, "post WRITE");
  check(wait_wc(acq, &wc) == 1 && wc.wr_id == 1 && wc.status == MR_STATUS_SUCCESS &&
            wc.opcode == MR_OP_WRITE,
        "WRITE completes with success");
  check(metaroce_read(b, bbuf, out, LEN) == 0 && memcmp(out, src, LEN) == 0,
        "WRITE: every byte arrived at DPU 1");
  struct metaroce_send_wr r = {0};
  r.wr_id = 2;
  r.opcode = MR_OP_READ;
  r.local = (struct metaroce_sge){abuf + LEN, LEN, akey};
  r.remote_addr = bbuf;
  r.remote_key = bkey;
  check(call(metaroce_post_send(qa, &r, 1, NULL), "post READ") == 0, "post READ");
  check(wait_wc(acq, &wc) == 1 && wc.wr_id == 2 && wc.status == MR_STATUS_SUCCESS &&
            wc.opcode == MR_OP_READ && wc.byte_len == LEN,
        "READ completes with success");
  memset(out, 0, LEN);
  check(metaroce_read(a, abuf + LEN, out, LEN) == 0 && memcmp(out, src, LEN) == 0,
        "READ: the bytes read back equal the bytes written");

  /* SEND a[2] into a receive posted at b[2]. */
  fill(want, LEN, 3);
  check(metaroce_write(a, abuf + 2 * LEN, want, LEN) == 0, "write the SEND payload");
  struct metaroce_recv_wr rv = {10, {bbuf + 2 * LEN, LEN, bkey}};
  check(call(metaroce_post_recv(qb, &rv, 1, NULL), "post receive") == 0, "DPU 1 posts a receive");
  struct metaroce_send_wr s = {0};
  s.wr_id = 3;
  s.opcode = MR_OP_SEND;
  s.local = (struct metaroce_sge){abuf + 2 * LEN, LEN, akey};
  check(call(metaroce_post_send(qa, &s, 1, NULL), "post SEND") == 0, "post SEND");
  check(wait_wc(acq, &wc) == 1 && wc.wr_id == 3 && wc.status == MR_STATUS_SUCCESS,
        "SEND completes at the sender");
  check(wait_wc(bcq, &wc) == 1 && wc.wr_id == 10 && wc.opcode == MR_OP_RECV &&
            wc.status == MR_STATUS_SUCCESS && wc.byte_len == LEN,
        "SEND completes the receive at DPU 1");
  check(metaroce_read(b, bbuf + 2 * LEN, out, LEN) == 0 && memcmp(out, want, LEN) == 0,
        "SEND: every byte landed in the receive buffer");

  /* WRITE_IMM a[3] -> b[3] with an immediate. */
  fill(want, LEN, 4);
  metaroce_write(a, abuf + 3 * LEN, want, LEN);
  struct metaroce_recv_wr rv2 = {11, {bbuf, 0, bkey}};
  metaroce_post_recv(qb, &rv2, 1, NULL);
  struct metaroce_send_wr wi = {0};
  wi.wr_id = 4;
  wi.opcode = MR_OP_WRITE_IMM;
  wi.imm = 0xC0FFEE;
  wi.local = (struct metaroce_sge){abuf + 3 * LEN, LEN, akey};
  wi.remote_addr = bbuf + 3 * LEN;
  wi.remote_key = bkey;
  check(call(metaroce_post_send(qa, &wi, 1, NULL), "post WRITE_IMM") == 0, "post WRITE_IMM");
  check(wait_wc(acq, &wc) == 1 && wc.wr_id == 4 && wc.status == MR_STATUS_SUCCESS,
        "WRITE_IMM completes at the sender");
  check(wait_wc(bcq, &wc) == 1 && wc.wr_id == 11 && wc.opcode == MR_OP_RECV_WRITE_IMM &&
            wc.has_imm && wc.imm == 0xC0FFEE,
        "WRITE_IMM delivers its immediate at DPU 1");
  check(metaroce_read(b, bbuf + 3 * LEN, out, LEN) == 0 && memcmp(out, want, LEN) == 0,
        "WRITE_IMM: every byte arrived");

  /* Bad requests: an unknown key, a region outside the window. */
  struct metaroce_send_wr bad = w;
  bad.wr_id = 5;
  bad.local.key = 0xdead0000;
  check(call(metaroce_post_send(qa, &bad, 1, NULL), "post bad key") == 0 && wait_wc(acq, &wc) == 1 &&
            wc.wr_id == 5 && wc.status == MR_STATUS_LOCAL_PROTECTION,
        "an unknown local key gets an error completion");
  uint32_t key;
  check(metaroce_reg_mr(a, 0, 4096, MR_ACCESS_ALL, &key) == METAROCE_ERR_REFUSED - MR_STATUS_NOT_PERMITTED,
        "a region outside the queue set's window is refused");
  check(metaroce_post_send(NULL, &w, 1, NULL) == METAROCE_ERR_INVALID_ARGUMENT,
        "a null queue pair is refused");

  /* A batch, one doorbell: a WRITE, a bad opcode, a WRITE. The first is
   * posted, the batch stops at the second (bad_wr = 1) and the third is
   * not posted. */
  struct metaroce_send_wr batch[3] = {w, w, w};
  batch[0].wr_id = 6;
  batch[1].wr_id = 7;
  batch[1].opcode = 0x77;
  batch[2].wr_id = 8;
  uint32_t bad_wr = 99;
  check(metaroce_post_send(qa, batch, 3, &bad_wr) == METAROCE_ERR_INVALID_ARGUMENT && bad_wr == 1,
        "a batch stops at its bad request, bad_wr = its index");
  check(wait_wc(acq, &wc) == 1 && wc.wr_id == 6 && wc.status == MR_STATUS_SUCCESS &&
            metaroce_poll_cq(acq, 1, &wc) == 0,
        "the requests before it complete, none after it");
  batch[1].opcode = MR_OP_WRITE;
  check(call(metaroce_post_send(qa, batch + 1, 2, &bad_wr), "post batch") == 0 && bad_wr == 2,
        "the rest of the batch is posted whole (bad_wr = num_wr)");
  struct metaroce_wc two[2];
  int got = wait_wc(acq, &two[0]);
  if (got == 1) {
    got += wait_wc(acq, &two[1]);
  }
  check(got == 2 && two[0].status == MR_STATUS_SUCCESS && two[1].status == MR_STATUS_SUCCESS &&
            two[0].wr_id + two[1].wr_id == 15,
        "both complete");

  struct mr_set_counters counters;
  check(metaroce_query_counters(a, &counters) == 0 && counters.posted_sends == 8 &&
            counters.transport_bytes_sent >= 3 * LEN,
        "counters: 8 sends posted, the payload sent");
  printf("counters: %llu sends, %llu bytes sent, %llu retransmissions, %llu refused (not permitted)\n",
         (unsigned long long)counters.posted_sends,
         (unsigned long long)counters.transport_bytes_sent,
         (unsigned long long)counters.transport_retransmissions,
         (unsigned long long)counters.refused_not_permitted);

  /* Quotas (spec 6.10): a second tenant on DPU 0 registers regions until
   * refused; it stops at its share of the region table, and the first
   * tenant still registers, each answer within 100 ms. */
  struct metaroce_device *t = NULL;
  check(call(metaroce_open_device(argv[1], &t), "open DPU 0 again") == 0, "a second tenant on DPU 0");
  if (t != NULL) {
    uint64_t tbuf;
    uint32_t tkey;
    int held = 0, refused = 0;
    check(metaroce_alloc(t, 4096, 4096, &tbuf) == 0, "carve the second tenant's buffer");
    for (int i = 0; i < 80; i++) {
      int rc = metaroce_reg_mr(t, tbuf, 4096, MR_ACCESS_ALL, &tkey);
      if (rc == 0) {
        held++;
      } else if (rc == METAROCE_ERR_REFUSED - MR_STATUS_QUOTA_EXCEEDED) {
        refused++;
      } else {
        call(rc, "register (tenant 2)");
      }
    }
    struct mr_set_quota q;
    check(metaroce_query_quota(t, &q) == 0 && q.used.regions == q.limit.regions &&
              (int)q.used.regions == held && (int)q.refused.regions == refused && refused > 0,
          "the second tenant is held at its region quota, refusals counted");
    printf("quota: tenant 2 holds %d regions (limit %llu), %d refused\n", held,
           (unsigned long long)q.limit.regions, refused);
    double slowest = 0;
    for (int i = 0; i < 4; i++) {
      double t0 = now_ms();
      int rc = metaroce_reg_mr(a, abuf, LEN, MR_ACCESS_ALL, &key);
      double took = now_ms() - t0;
      slowest = took > slowest ? took : slowest;
      check(rc == 0 && took <= 100.0, "the first tenant registers within 100 ms meanwhile");
    }
    printf("quota: the first tenant's slowest register took %.2f ms\n", slowest);
    struct mr_set_counters tc;
    check(metaroce_query_counters(t, &tc) == 0 && (int)tc.refused_quota == refused &&
              tc.refused_no_resources == 0,
          "quota refusals in the counters, no table ran full");
    /* Sets 2 and 3: only the last (the management set) sets quotas. */
    struct metaroce_device *s2 = NULL, *mgmt = NULL;
    check(metaroce_open_device(argv[1], &s2) == 0 && metaroce_open_device(argv[1], &mgmt) == 0,
          "open DPU 0's sets 2 and 3");
    uint64_t w3, l3;
    uint32_t pd3;
    if (s2 != NULL && mgmt != NULL && metaroce_query_window(mgmt, &w3, &l3, &pd3) == 0) {
      struct mr_quota_values lim;
      lim.connections = MR_QUOTA_DEFAULT;
      lim.regions = (uint64_t)held + 1;
      lim.region_bytes = MR_QUOTA_DEFAULT;
      lim.work_entries = MR_QUOTA_DEFAULT;
      lim.commands = MR_QUOTA_DEFAULT;
      memset(lim.reserved, 0, sizeof lim.reserved);
      check(metaroce_set_quota(s2, 1, &lim) == METAROCE_ERR_REFUSED - MR_STATUS_NOT_PERMITTED,
            "a tenant's set may not set quotas");
      check(pd3 == 3 && call(metaroce_set_quota(mgmt, 1, &lim), "set quota") == 0,
            "the management set sets tenant 2's quota");
      check(metaroce_reg_mr(t, tbuf, 4096, MR_ACCESS_ALL, &tkey) == 0 &&
                metaroce_reg_mr(t, tbuf, 4096, MR_ACCESS_ALL, &tkey) ==
                    METAROCE_ERR_REFUSED - MR_STATUS_QUOTA_EXCEEDED,
            "tenant 2 gets exactly one region more");
    }
    metaroce_close_device(s2);
    metaroce_close_device(mgmt);
    metaroce_close_device(t);
  }

  check(metaroce_disconnect(a, ca) == 0, "close the connection");
  metaroce_destroy_qp(qa);
  metaroce_destroy_qp(qb);
  metaroce_close_device(a);
  metaroce_close_device(b);
  /* A completion queue may outlive its device (it keeps the mapping). */
  check(metaroce_poll_cq(acq, 1, &wc) >= 0, "poll after the device is closed");
  metaroce_destroy_cq(acq);
  metaroce_destroy_cq(bcq);
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
