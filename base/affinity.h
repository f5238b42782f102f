// horovod_cpp — Apache-2.0
#pragma once
// CPU affinity of the calling thread (Linux; elsewhere every call is a no-op that says so).

#include <string>
#include <vector>

#include "base/status.h"

namespace hvd {

// The CPUs the calling thread may run on (empty when unknown).
std::vector<int> ThreadCpus();
// The CPUs online on this machine.
int OnlineCpus();
// Restricts the calling thread to `cpus`.
Status SetThreadCpus(const std::vector<int>& cpus);
// "0-3,6" style text of `cpus`, for logs.
std::string CpusToString(const std::vector<int>& cpus);

}  // namespace hvd
