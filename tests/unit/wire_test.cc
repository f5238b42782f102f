// horovod_cpp — Apache-2.0
#include "common/protocol/wire.h"

#include <gtest/gtest.h>

#include <random>

#include "common/protocol/message.h"

namespace hvd {
namespace {

RequestList SampleRequests() {
  RequestList list;
  list.shutdown = true;
  list.shutdown_host = "hvd-h2";
  Request a;
  a.request_rank = 3;
  a.type = OpType::kAllreduce;
  a.dtype = DataType::kBFloat16;
  a.reduce_op = ReduceOp::kMax;
  a.device = 1;
  a.process_set_id = 2;
  a.group_size = 7;
  a.group_name = "grp";
  a.prescale_factor = 0.125;
  a.postscale_factor = 3.5;
  a.tensor_name = "grad/\"odd\" name\n\xc3\xa9";
  a.shape = {128, 64, 0};
  a.call_site = "/home/u/train.py:42";
  Request b;
  b.type = OpType::kAlltoall;
  b.root_rank = 1;
  b.tensor_name = "";
  b.splits = {1, 2, 3};
  list.requests = {a, b};
  return list;
}

ResponseList SampleResponses() {
  ResponseList list;
  list.shutdown = true;
  list.shutdown_after_stall = true;
  list.shutdown_reason = "shutdown requested by rank 1";
  Response r;
  r.type = OpType::kBroadcast;
  r.dtype = DataType::kFloat64;
  r.root_rank = 2;
  r.last_joined_rank = 1;
  r.tensor_names = {"a", "b", "c"};
  r.tensor_sizes = {1, 2, 3};
  r.rank_sizes = {4, 5, 6, 7};
  r.group_size = 3;
  Response e;
  e.type = OpType::kError;
  e.error_message = "allreduce 'x': mismatched shapes";
  e.tensor_names = {"x"};
  list.responses = {r, e};
  return list;
}

TEST(Wire, RoundTripsEveryField) {
  RequestList req = SampleRequests();
  std::vector<uint8_t> bytes = SerializeRequestList(req);
  Result<RequestList> back = ParseRequestList(bytes.data(), bytes.size());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, req);

  ResponseList resp = SampleResponses();
  bytes = SerializeResponseList(resp);
  Result<ResponseList> back2 = ParseResponseList(bytes.data(), bytes.size());
  ASSERT_TRUE(back2.ok()) << back2.status().ToString();
  EXPECT_EQ(*back2, resp);
}

TEST(Wire, EmptyListsRoundTrip) {
  std::vector<uint8_t> bytes = SerializeRequestList({});
  ASSERT_TRUE(ParseRequestList(bytes.data(), bytes.size()).ok());
  bytes = SerializeResponseList({});
  ASSERT_TRUE(ParseResponseList(bytes.data(), bytes.size()).ok());
}

TEST(Wire, EveryTruncationIsAnError) {
  const std::vector<uint8_t> bytes = SerializeRequestList(SampleRequests());
  for (size_t len = 0; len < bytes.size(); ++len) {
    // A copy of exactly `len` bytes, so any over-read would leave the allocation (ASan).
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + len);
    Result<RequestList> r = ParseRequestList(cut.data(), cut.size());
    EXPECT_FALSE(r.ok()) << "accepted a message cut to " << len << " bytes";
  }
}

TEST(Wire, EverySingleByteCorruptionIsAnError) {
  const std::vector<uint8_t> bytes = SerializeResponseList(SampleResponses());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xFF}) {
      std::vector<uint8_t> bad = bytes;
      bad[i] ^= flip;
      EXPECT_FALSE(ParseResponseList(bad.data(), bad.size()).ok())
          << "accepted a flip of byte " << i << " by " << int(flip);
    }
  }
}

TEST(Wire, WrongKindVersionAndMagicAreNamed) {
  std::vector<uint8_t> bytes = SerializeRequestList(SampleRequests());
  Result<ResponseList> wrong_kind = ParseResponseList(bytes.data(), bytes.size());
  EXPECT_NE(wrong_kind.status().message().find("kind 1, expected 2"), std::string::npos);

  std::vector<uint8_t> v1 = bytes;
  v1[4] = 1;  // version 1: before requests carried their call site
  EXPECT_NE(
      ParseRequestList(v1.data(), v1.size()).status().message().find("unsupported wire version 1"),
      std::string::npos);

  std::vector<uint8_t> magic = bytes;
  magic[0] = 'X';
  EXPECT_NE(ParseRequestList(magic.data(), magic.size()).status().message().find("bad magic"),
            std::string::npos);

  std::vector<uint8_t> extra = bytes;
  extra.push_back(0);
  EXPECT_FALSE(ParseRequestList(extra.data(), extra.size()).ok());
  EXPECT_FALSE(ParseRequestList(nullptr, 10).ok());
  EXPECT_FALSE(ParseRequestList(nullptr, 0).ok());
}

// A well-framed payload (valid checksum) that lies about its contents must still be rejected
// before anything large is allocated.
std::vector<uint8_t> FrameRequestPayload(const std::vector<uint8_t>& payload) {
  wire::Writer w;
  for (char c : {'H', 'V', 'D', 'W'}) w.U8(static_cast<uint8_t>(c));
  w.U16(kWireVersion);
  w.U16(1);
  w.U32(static_cast<uint32_t>(payload.size()));
  w.U32(wire::Crc32(payload.data(), payload.size()));
  std::vector<uint8_t> out = w.bytes();
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

TEST(Wire, HostileCountsWithValidChecksumAreRejected) {
  {
    wire::Writer p;
    p.U8(0);
    p.U32(0xFFFFFFFFu);  // four billion requests in a few bytes
    auto msg = FrameRequestPayload(p.bytes());
    Result<RequestList> r = ParseRequestList(msg.data(), msg.size());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("announces 4294967295 items"), std::string::npos);
  }
  {
    // One request whose name claims 3 GB.
    wire::Writer p;
    p.U8(0);
    p.U32(1);
    p.I32(0);
    for (int i = 0; i < 4; ++i) p.U8(0);
    for (int i = 0; i < 4; ++i) p.I32(0);
    p.F64(1);
    p.F64(1);
    p.U32(0);            // group name
    p.U32(3000000000u);  // tensor name
    auto msg = FrameRequestPayload(p.bytes());
    EXPECT_FALSE(ParseRequestList(msg.data(), msg.size()).ok());
  }
  {
    // An enum value out of range.
    wire::Writer p;
    p.U8(0);
    p.U32(1);
    p.I32(0);
    p.U8(200);  // op type
    for (int i = 0; i < 3; ++i) p.U8(0);
    for (int i = 0; i < 4; ++i) p.I32(0);
    p.F64(1);
    p.F64(1);
    p.U32(0);
    p.U32(0);
    p.U32(0);
    p.U32(0);
    p.U32(0);  // call site
    auto msg = FrameRequestPayload(p.bytes());
    Result<RequestList> r = ParseRequestList(msg.data(), msg.size());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("op type 200"), std::string::npos);
  }
}

TEST(Wire, RandomGarbageNeverCrashes) {
  std::mt19937 rng(1234);
  const std::vector<uint8_t> good = SerializeRequestList(SampleRequests());
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> buf;
    if (iter % 2) {
      buf.resize(rng() % 200);
      for (auto& b : buf) b = static_cast<uint8_t>(rng());
    } else {  // mutate a valid message in a few places (checksum then fails)
      buf = good;
      for (int k = 0; k < 3; ++k) buf[rng() % buf.size()] = static_cast<uint8_t>(rng());
    }
    (void)ParseRequestList(buf.data(), buf.size());
    (void)ParseResponseList(buf.data(), buf.size());
  }
}

TEST(Wire, Crc32MatchesTheStandardCheckValue) {
  const char* text = "123456789";
  EXPECT_EQ(wire::Crc32(reinterpret_cast<const uint8_t*>(text), 9), 0xCBF43926u);
}

}  // namespace
}  // namespace hvd
