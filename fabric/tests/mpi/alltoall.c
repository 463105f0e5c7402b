/*
 * MPI_Alltoall of COUNT ints per pair (argv[1], default 16384 = 64 KiB per
 * pair) and a small one (1 int): every received element names its sender,
 * its receiver and its index, checked on every rank. Ends with
 * "alltoall: N passed, N failed".
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int value(int from, int to, int i)
{
	return from * 1000003 + to * 7919 + i;
}

static int run(int count, int rank, int nranks)
{
	int *send = malloc((size_t)count * nranks * sizeof(int));
	int *recv = malloc((size_t)count * nranks * sizeof(int));
	for (int to = 0; to < nranks; to++)
		for (int i = 0; i < count; i++) {
			send[to * count + i] = value(rank, to, i);
			recv[to * count + i] = -1;
		}
	MPI_Alltoall(send, count, MPI_INT, recv, count, MPI_INT, MPI_COMM_WORLD);
	int bad = 0;
	for (int from = 0; from < nranks && !bad; from++)
		for (int i = 0; i < count; i++)
			if (recv[from * count + i] != value(from, rank, i)) {
				printf("rank %d: element %d from rank %d is %d\n", rank, i, from,
				       recv[from * count + i]);
				bad = 1;
				break;
			}
	int any = 0;
	MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	free(send);
	free(recv);
	return any == 0;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, nranks;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	int count = argc > 1 ? atoi(argv[1]) : 16384;
	int counts[] = {1, 256, count};
	int passed = 0, failed = 0;
	for (int k = 0; k < 3; k++) {
		int ok = run(counts[k], rank, nranks);
		if (rank == 0)
			printf("alltoall %d ints per pair over %d ranks: %s\n", counts[k], nranks,
			       ok ? "data ok" : "DATA ERROR");
		if (ok)
			passed++;
		else
			failed++;
	}
	if (rank == 0)
		printf("alltoall: %d passed, %d failed\n", passed, failed);
	MPI_Finalize();
	return failed ? 1 : 0;
}
