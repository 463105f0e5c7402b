/*
 * MPI point-to-point semantics the ofi MTL maps onto tagged messages:
 * wildcard receives (MPI_ANY_SOURCE, MPI_ANY_TAG), probe before receive
 * (MPI_Probe / MPI_Iprobe: FI_PEEK), matched probe (MPI_Mprobe / MPI_Mrecv:
 * FI_PEEK | FI_CLAIM), synchronous send (MPI_Ssend), cancel of a posted
 * receive (MPI_Cancel: fi_cancel), the non-overtaking order of messages
 * with the same tag (small and large, so eager and rendezvous), and
 * unexpected messages of every size. Every rank talks to every other rank.
 * Ends with "semantics: N passed, N failed".
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static void check(int ok, int rank, const char *what)
{
	if (ok) {
		passed++;
	} else {
		failed++;
		fprintf(stderr, "rank %d: FAILED: %s\n", rank, what);
	}
}

static void fill(unsigned char *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 131 + seed * 7 + 1);
}

static int same(const unsigned char *p, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)(i * 131 + seed * 7 + 1))
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, n;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	const size_t sizes[] = {0, 1, 100, 4096, 16384, 16385, 65536, 1 << 20};
	const int nsizes = sizeof(sizes) / sizeof(sizes[0]);
	size_t max = 1 << 20;
	unsigned char *buf = malloc(max), *big = malloc(max);

	/* 1. Non-overtaking: every size, same tag, to every peer, received
	 * after a barrier (all unexpected), in order. */
	for (int peer = 0; peer < n; peer++) {
		if (peer == rank)
			continue;
		MPI_Request *reqs = malloc(sizeof(MPI_Request) * nsizes);
		unsigned char **src = malloc(sizeof(unsigned char *) * nsizes);
		for (int s = 0; s < nsizes; s++) {
			src[s] = malloc(sizes[s] + 1);
			fill(src[s], sizes[s], s + rank);
			MPI_Isend(src[s], (int)sizes[s], MPI_BYTE, peer, 7, MPI_COMM_WORLD, &reqs[s]);
		}
		MPI_Status st;
		for (int s = 0; s < nsizes; s++) {
			memset(big, 0, max);
			MPI_Recv(big, (int)max, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &st);
			int count;
			MPI_Get_count(&st, MPI_BYTE, &count);
			check((size_t)count == sizes[s] && same(big, sizes[s], s + peer), rank,
			      "messages with one tag arrive in order, intact");
		}
		MPI_Waitall(nsizes, reqs, MPI_STATUSES_IGNORE);
		for (int s = 0; s < nsizes; s++)
			free(src[s]);
		free(src);
		free(reqs);
	}
	MPI_Barrier(MPI_COMM_WORLD);

	/* 2. Wildcards and probe: each rank sends one message with tag =
	 * sender's rank to rank 0; rank 0 probes with ANY_SOURCE/ANY_TAG,
	 * allocates what the probe says, receives from the probed source. */
	if (rank != 0) {
		size_t len = sizes[rank % nsizes] + (size_t)rank;
		if (len > max)
			len = max;
		fill(buf, len, 100 + rank);
		MPI_Send(buf, (int)len, MPI_BYTE, 0, rank, MPI_COMM_WORLD);
	} else {
		for (int k = 1; k < n; k++) {
			MPI_Status st;
			MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
			int count;
			MPI_Get_count(&st, MPI_BYTE, &count);
			check(st.MPI_TAG == st.MPI_SOURCE, rank, "probe reports tag and source");
			unsigned char *p = malloc((size_t)count + 1);
			MPI_Recv(p, count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &st);
			check(same(p, (size_t)count, 100 + st.MPI_SOURCE), rank,
			      "message found by probe is intact");
			free(p);
		}
	}
	MPI_Barrier(MPI_COMM_WORLD);

	/* 3. Matched probe: rank 1 sends two messages with different tags;
	 * rank 0 mprobes the second tag first and mrecvs it, then the first. */
	if (n >= 2) {
		if (rank == 1) {
			fill(buf, 5000, 21);
			MPI_Send(buf, 5000, MPI_BYTE, 0, 21, MPI_COMM_WORLD);
			fill(big, 200000, 22);
			MPI_Send(big, 200000, MPI_BYTE, 0, 22, MPI_COMM_WORLD);
		} else if (rank == 0) {
			MPI_Message m;
			MPI_Status st;
			int flag = 0;
			while (!flag)
				MPI_Improbe(1, 22, MPI_COMM_WORLD, &flag, &m, &st);
			int count;
			MPI_Get_count(&st, MPI_BYTE, &count);
			check(count == 200000, rank, "improbe reports the length");
			memset(big, 0, max);
			MPI_Mrecv(big, count, MPI_BYTE, &m, &st);
			check(same(big, 200000, 22), rank, "mrecv receives the claimed message");
			MPI_Mprobe(1, 21, MPI_COMM_WORLD, &m, &st);
			MPI_Mrecv(buf, 5000, MPI_BYTE, &m, &st);
			check(same(buf, 5000, 21), rank, "mprobe then mrecv");
		}
	}
	MPI_Barrier(MPI_COMM_WORLD);

	/* 4. Synchronous send and cancel: rank 0 posts a receive it cancels,
	 * then Ssends to the last rank, which receives it with ANY_TAG. */
	if (rank == 0) {
		MPI_Request r;
		MPI_Status st;
		int cancelled = 0;
		MPI_Irecv(buf, 10, MPI_BYTE, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &r);
		MPI_Cancel(&r);
		MPI_Wait(&r, &st);
		MPI_Test_cancelled(&st, &cancelled);
		check(cancelled, rank, "a posted receive is cancelled");
		fill(buf, 3000, 33);
		MPI_Ssend(buf, 3000, MPI_BYTE, n - 1, 33, MPI_COMM_WORLD);
		check(1, rank, "ssend returns once received");
	} else if (rank == n - 1) {
		MPI_Status st;
		memset(buf, 0, 3000);
		MPI_Recv(buf, 3000, MPI_BYTE, 0, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
		check(st.MPI_TAG == 33 && same(buf, 3000, 33), rank, "ssend's message with ANY_TAG");
	}
	MPI_Barrier(MPI_COMM_WORLD);

	int totals[2] = {passed, failed}, all[2];
	MPI_Reduce(totals, all, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0)
		printf("semantics: %d passed, %d failed\n", all[0], all[1]);
	free(buf);
	free(big);
	MPI_Finalize();
	return failed ? 1 : 0;
}
