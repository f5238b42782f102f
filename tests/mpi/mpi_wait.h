// horovod_cpp — Apache-2.0
#pragma once
// The tests' own MPI_COMM_WORLD synchronisation (cross-checks, "everyone is here" barriers, the
// exit code every rank agrees on) as non-blocking calls polled with 1 ms sleeps. Open MPI's
// blocking calls spin (sched_yield under mpi_yield_when_idle); with more ranks than cores (4
// ranks on 2 cores across the test bed), ranks spinning while a slower rank finishes its tests
// kept other processes off the CPU for seconds (the test bed's sshd then dropped a host's ssh
// session: "ORTE has lost communication with a remote daemon"; docs/reliability.md). These
// waits are outside what the tests measure, so sleeping costs nothing that matters.

#include <mpi.h>

#include <chrono>
#include <thread>

namespace hvd {
namespace test {

inline int WaitSleeping(MPI_Request* request) {
  int done = 0;
  for (;;) {
    const int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

inline int SleepingBarrier(MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Request request;
  const int rc = MPI_Ibarrier(comm, &request);
  return rc == MPI_SUCCESS ? WaitSleeping(&request) : rc;
}

inline int SleepingAllreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op,
                             MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Request request;
  const int rc = MPI_Iallreduce(send, recv, count, type, op, comm, &request);
  return rc == MPI_SUCCESS ? WaitSleeping(&request) : rc;
}

inline int SleepingAllgather(const void* send, int send_count, MPI_Datatype send_type, void* recv,
                             int recv_count, MPI_Datatype recv_type,
                             MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Request request;
  const int rc =
      MPI_Iallgather(send, send_count, send_type, recv, recv_count, recv_type, comm, &request);
  return rc == MPI_SUCCESS ? WaitSleeping(&request) : rc;
}

}  // namespace test
}  // namespace hvd
