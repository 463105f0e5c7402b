/*
 * MPI ping-pong between rank 0 and every other rank (MPI_Send/MPI_Recv),
 * sizes 1 B to 4 MiB, every byte checked on both sides. Prints one line
 * per size (rank 0) and "pingpong: N passed, N failed" at the end (a size
 * with a data error and the sizes after it count as failed); exits
 * non-zero on a data error.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t byte_at(size_t i, int size_index, int round, int from)
{
	uint32_t x = (uint32_t)(i * 2654435761u) ^ (uint32_t)(size_index * 40503u) ^
		     (uint32_t)(round * 977u) ^ (uint32_t)(from * 7919u);
	return (uint8_t)(x ^ (x >> 13) ^ (x >> 24));
}

static void fill(uint8_t *p, size_t n, int si, int round, int from)
{
	for (size_t i = 0; i < n; i++)
		p[i] = byte_at(i, si, round, from);
}

static long check(const uint8_t *p, size_t n, int si, int round, int from)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != byte_at(i, si, round, from))
			return (long)i;
	return -1;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, nranks;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	static const size_t sizes[] = {1, 8, 1024, 4096, 65536, 262144, 1048576, 4194304};
	const int nsizes = sizeof sizes / sizeof sizes[0];
	const int rounds = argc > 1 ? atoi(argv[1]) : 10;
	uint8_t *buf = malloc(sizes[nsizes - 1]);
	int errors = 0, passed = 0;
	for (int si = 0; si < nsizes; si++) {
		size_t n = sizes[si];
		double t0 = MPI_Wtime();
		for (int peer = 1; peer < nranks; peer++) {
			for (int r = 0; r < rounds; r++) {
				if (rank == 0) {
					fill(buf, n, si, r, 0);
					MPI_Send(buf, (int)n, MPI_BYTE, peer, si, MPI_COMM_WORLD);
					memset(buf, 0, n);
					MPI_Recv(buf, (int)n, MPI_BYTE, peer, si, MPI_COMM_WORLD,
						 MPI_STATUS_IGNORE);
					long bad = check(buf, n, si, r, peer);
					if (bad >= 0) {
						printf("rank 0: %zu B from rank %d round %d: byte %ld differs\n",
						       n, peer, r, bad);
						errors++;
					}
				} else if (rank == peer) {
					memset(buf, 0, n);
					MPI_Recv(buf, (int)n, MPI_BYTE, 0, si, MPI_COMM_WORLD,
						 MPI_STATUS_IGNORE);
					long bad = check(buf, n, si, r, 0);
					if (bad >= 0) {
						printf("rank %d: %zu B round %d: byte %ld differs\n",
						       rank, n, r, bad);
						errors++;
					}
					fill(buf, n, si, r, rank);
					MPI_Send(buf, (int)n, MPI_BYTE, 0, si, MPI_COMM_WORLD);
				}
			}
		}
		int all = 0;
		MPI_Allreduce(&errors, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		if (rank == 0) {
			double us = (MPI_Wtime() - t0) / (2.0 * rounds * (nranks - 1)) * 1e6;
			printf("pingpong %8zu B x %d rounds x %d peers: %s, %.1f us one way\n", n,
			       rounds, nranks - 1, all ? "DATA ERROR" : "data ok", us);
		}
		if (all)
			break;
		passed++;
	}
	if (rank == 0)
		printf("pingpong: %d passed, %d failed\n", passed, nsizes - passed);
	free(buf);
	MPI_Finalize();
	return passed == nsizes ? 0 : 1;
}
