/* MPI check for tests/integration/devices.bats: every rank contributes rank+1; the allreduce must
 * give size*(size+1)/2 on every rank. Each rank prints its host so the test can see the spread. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 0, len = 0;
    char host[MPI_MAX_PROCESSOR_NAME];
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &len);
    long mine = rank + 1, sum = 0, want = (long)size * (size + 1) / 2;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s: sum %ld %s\n", rank, size, host, sum, sum == want ? "ok" : "WRONG");
    MPI_Finalize();
    return sum == want ? 0 : 1;
}
