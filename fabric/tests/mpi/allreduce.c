/*
 * MPI_Allreduce (MPI_SUM) of 16 MiB of doubles (2 Mi elements), the result
 * checked element by element on every rank against the closed form; small
 * integers so the sum is exact in any order. Repeats R times (argv[1],
 * default 3) and prints the mean time (rank 0): "allreduce 16 MiB: X ms".
 * Ends with "allreduce: N passed, N failed".
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define N (2 * 1024 * 1024)

static double value(long i, int rank, int round)
{
	return (double)((i * 7 + rank * 13 + round * 3) % 1000);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, nranks;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	int rounds = argc > 1 ? atoi(argv[1]) : 3;
	double *in = malloc(N * sizeof(double)), *out = malloc(N * sizeof(double));
	int passed = 0, failed = 0;
	double total = 0;
	for (int r = 0; r < rounds; r++) {
		for (long i = 0; i < N; i++) {
			in[i] = value(i, rank, r);
			out[i] = -1;
		}
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		MPI_Allreduce(in, out, N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		double took = MPI_Wtime() - t0, slowest = 0;
		MPI_Reduce(&took, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		total += slowest;
		long bad = -1;
		for (long i = 0; i < N && bad < 0; i++) {
			double want = 0;
			for (int k = 0; k < nranks; k++)
				want += value(i, k, r);
			if (out[i] != want)
				bad = i;
		}
		if (bad >= 0)
			printf("rank %d round %d: element %ld is %.1f\n", rank, r, bad, out[bad]);
		int mine = bad >= 0, any = 0;
		MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		if (any)
			failed++;
		else
			passed++;
	}
	if (rank == 0) {
		printf("allreduce 16 MiB of doubles over %d ranks: %.2f ms (mean of %d, slowest rank)\n",
		       nranks, total / rounds * 1e3, rounds);
		printf("allreduce: %d passed, %d failed\n", passed, failed);
	}
	free(in);
	free(out);
	MPI_Finalize();
	return failed ? 1 : 0;
}
