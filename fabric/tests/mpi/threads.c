/*
 * MPI_THREAD_MULTIPLE over the provider (FI_THREAD_SAFE): four threads per
 * rank exchange messages with the same thread of the partner rank at
 * once (tag = thread), small (eager) and large (rendezvous) ones, 50
 * rounds each, every byte checked. Run with an even number of ranks.
 * Ends with "threads: N passed, N failed".
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 4
#define ROUNDS 50

static int rank, errors;

static unsigned char expected(size_t i, int thread, int round, int who)
{
	return (unsigned char)(i + (size_t)thread * 3 + (size_t)round + (size_t)who);
}

static void *worker(void *arg)
{
	int t = (int)(long)arg;
	int peer = rank ^ 1;
	size_t len = (t % 2) ? 300000 : 1000;
	unsigned char *s = malloc(len), *r = malloc(len);
	for (int round = 0; round < ROUNDS; round++) {
		for (size_t i = 0; i < len; i++)
			s[i] = expected(i, t, round, rank);
		MPI_Request q[2];
		MPI_Irecv(r, (int)len, MPI_BYTE, peer, t, MPI_COMM_WORLD, &q[0]);
		MPI_Isend(s, (int)len, MPI_BYTE, peer, t, MPI_COMM_WORLD, &q[1]);
		MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
		for (size_t i = 0; i < len; i++) {
			if (r[i] != expected(i, t, round, peer)) {
				__sync_fetch_and_add(&errors, 1);
				break;
			}
		}
	}
	free(s);
	free(r);
	return NULL;
}

int main(int argc, char **argv)
{
	int provided, n;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	if (provided != MPI_THREAD_MULTIPLE || n % 2 != 0) {
		if (rank == 0)
			printf("threads: 0 passed, 1 failed (thread level %d, %d ranks)\n", provided, n);
		MPI_Finalize();
		return 1;
	}
	pthread_t th[THREADS];
	for (long t = 0; t < THREADS; t++)
		pthread_create(&th[t], NULL, worker, (void *)t);
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	int all;
	MPI_Reduce(&errors, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0)
		printf("threads: %d passed, %d failed\n", n * THREADS * ROUNDS - all, all);
	MPI_Finalize();
	return all != 0;
}
