// horovod_cpp — Apache-2.0
// A small demonstration of the C++ API, run by ./run.sh:  mpirun -np 2 build/examples/demo
//
// Every rank allreduces and broadcasts a few tensors and checks the results against values
// computed independently here; rank 0 prints what happened, including how many collective
// calls 100 small tensors took once fused. Exits non-zero if anything is wrong.

#include <cstdio>
#include <string>
#include <vector>

#include "common/horovod.h"

namespace {

int failures = 0;

void Report(int rank, const std::string& what, bool ok) {
  if (!ok) ++failures;
  if (rank == 0 || !ok)
    std::printf("[rank %d] %-58s %s\n", rank, what.c_str(), ok ? "ok" : "WRONG");
}

bool Check(const hvd::Status& s, int rank, const char* what) {
  if (s.ok()) return true;
  std::fprintf(stderr, "[rank %d] %s failed: %s\n", rank, what, s.ToString().c_str());
  ++failures;
  return false;
}

}  // namespace

int main() {
  hvd::Status status = hvd::Init();
  if (!status.ok()) {
    std::fprintf(stderr, "horovod_cpp: Init failed: %s\n", status.ToString().c_str());
    return 1;
  }
  const int rank = *hvd::Rank();
  const int size = *hvd::Size();
  if (rank == 0) std::printf("horovod_cpp demo: %d ranks\n", size);

  // Sum: rank r contributes r + 1, so every element becomes 1 + 2 + ... + size.
  std::vector<float> sum(1000, static_cast<float>(rank + 1));
  if (Check(hvd::Allreduce(hvd::View(sum.data(), {1000}), hvd::View(sum.data(), {1000}), "sum",
                           {hvd::ReduceOp::kSum}),
            rank, "allreduce")) {
    const float expected = size * (size + 1) / 2.0f;
    Report(rank,
           "allreduce Sum of (rank+1) = " + std::to_string(sum[0]) + ", expected " +
               std::to_string(expected),
           sum[0] == expected && sum[999] == expected);
  }

  // Average of int64 rank*10: (0 + 10 + ... ) / size, truncated toward zero.
  std::vector<int64_t> avg(8, int64_t{10} * rank);
  if (Check(hvd::Allreduce(hvd::View(avg.data(), {8}), hvd::View(avg.data(), {8}), "avg"), rank,
            "allreduce")) {
    const int64_t expected = (int64_t{10} * size * (size - 1) / 2) / size;
    Report(rank,
           "allreduce Average of int64 10*rank = " + std::to_string(avg[0]) + ", expected " +
               std::to_string(expected),
           avg[0] == expected);
  }

  // Broadcast from the last rank.
  const int root = size - 1;
  std::vector<double> b(16, rank == root ? 42.5 : -1.0);
  if (Check(hvd::Broadcast(hvd::View(b.data(), {16}), hvd::View(b.data(), {16}), root, "bcast"),
            rank, "broadcast")) {
    Report(rank, "broadcast from rank " + std::to_string(root) + " = " + std::to_string(b[15]),
           b[0] == 42.5 && b[15] == 42.5);
  }

  // 100 small tensors enqueued asynchronously: the core fuses them into a few collectives.
  const hvd::Stats before = *hvd::GetStats();
  std::vector<std::vector<float>> grads(100, std::vector<float>(64));
  std::vector<hvd::Handle> handles;
  for (int i = 0; i < 100; ++i) {
    for (float& x : grads[i]) x = static_cast<float>(rank + i);
    auto h =
        hvd::EnqueueAllreduce(hvd::View(grads[i].data(), {64}), hvd::View(grads[i].data(), {64}),
                              "grad." + std::to_string(i), {hvd::ReduceOp::kSum});
    if (!h.ok()) {
      Check(h.status(), rank, "enqueue");
      break;
    }
    handles.push_back(*h);
  }
  bool all_ok = handles.size() == 100;
  for (hvd::Handle h : handles) all_ok &= Check(hvd::Wait(h), rank, "wait");
  for (int i = 0; i < 100 && all_ok; ++i) {
    const float expected = static_cast<float>(size * (size - 1) / 2 + size * i);
    all_ok &= grads[i][0] == expected && grads[i][63] == expected;
  }
  const hvd::Stats after = *hvd::GetStats();
  Report(rank,
         "100 async allreduces correct, fused into " +
             std::to_string(after.allreduce_calls - before.allreduce_calls) + " allreduce call(s)",
         all_ok);

  hvd::Shutdown().IgnoreError();
  if (rank == 0)
    std::printf("horovod_cpp demo: %s\n", failures == 0 ? "all checks passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
