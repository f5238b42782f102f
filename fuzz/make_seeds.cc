// horovod_cpp — Apache-2.0
// Writes the seed corpus for wire_fuzz (real messages, as ranks send them) into fuzz/corpus/
// wire. Built with the fuzzers; run by scripts/fuzz.sh --seeds when the wire format changes.
//   build-fuzz/make_seeds fuzz/corpus/wire

#include <cstdio>
#include <string>
#include <vector>

#include "common/protocol/message.h"

namespace {

void Write(const std::string& dir, const std::string& name, uint8_t parser,
           const std::vector<uint8_t>& bytes) {
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fputc(parser, f);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  using namespace hvd;  // NOLINT

  RequestList empty;
  Write(dir, "requests_empty", 0, SerializeRequestList(empty));
  RequestList mixed;
  Request a;
  a.request_rank = 1;
  a.tensor_name = "allreduce.layer1.weight";
  a.shape = {64, 3, 7, 7};
  a.prescale_factor = 0.5;
  a.call_site = "/home/user/train.py:42";
  mixed.requests.push_back(a);
  Request b = a;
  b.type = OpType::kBroadcast;
  b.root_rank = 0;
  b.dtype = DataType::kFloat16;
  b.tensor_name = "broadcast.bias";
  b.shape = {10};
  mixed.requests.push_back(b);
  Request c = a;
  c.type = OpType::kAlltoall;
  c.dtype = DataType::kInt64;
  c.splits = {1, 2, 0, 5};
  c.shape = {8, 4};
  c.process_set_id = 2;
  c.group_size = 3;
  c.group_name = "grouped.alltoall";
  mixed.requests.push_back(c);
  Write(dir, "requests_mixed", 0, SerializeRequestList(mixed));
  RequestList shutdown;
  shutdown.shutdown = true;
  shutdown.shutdown_host = "hvd-h2";
  Write(dir, "requests_shutdown", 0, SerializeRequestList(shutdown));

  ResponseList responses;
  Response r;
  r.tensor_names = {"allreduce.a", "allreduce.b"};
  r.tensor_sizes = {100, 7};
  responses.responses.push_back(r);
  Response g;
  g.type = OpType::kAllgather;
  g.dtype = DataType::kBFloat16;
  g.tensor_names = {"allgather.x"};
  g.tensor_sizes = {3};
  g.rank_sizes = {1, 0, 4};
  responses.responses.push_back(g);
  Response e;
  e.type = OpType::kError;
  e.tensor_names = {"allreduce.mm"};
  e.error_message = "mismatched shapes: rank 0 sent [1], rank 1 sent [2]";
  responses.responses.push_back(e);
  Write(dir, "responses_mixed", 1, SerializeResponseList(responses));
  ResponseList stop;
  stop.shutdown = true;
  stop.shutdown_after_stall = true;
  stop.shutdown_reason = "stalled: tensor 'x' waited more than 3 s for rank 2";
  Write(dir, "responses_shutdown", 1, SerializeResponseList(stop));
  return 0;
}
