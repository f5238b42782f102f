// horovod_cpp — Apache-2.0
// Timeline: JSON formatting and escaping, the bounded ring under a stalled writer, sessions.
#include "timeline/timeline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "timeline/trace_json.h"

namespace hvd {
namespace timeline {
namespace {

std::string Json(const std::string& s) {
  std::string out;
  AppendJsonString(&out, s);
  return out;
}

TEST(TraceJson, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(Json("grad.w"), "\"grad.w\"");
  EXPECT_EQ(Json("a\"b"), "\"a\\\"b\"");
  EXPECT_EQ(Json("C:\\path\\x"), "\"C:\\\\path\\\\x\"");
  // 13 bytes: the literal's terminating NUL is part of the name too.
  EXPECT_EQ(Json(std::string("tab\there\nnl\x01", 13)),
            "\"tab\\u0009here\\u000anl\\u0001\\u0000\"");
  EXPECT_EQ(Json(""), "\"\"");
}

TEST(TraceJson, KeepsUnicodeAndReplacesInvalidUtf8) {
  EXPECT_EQ(Json("poids.\xc3\xa9t\xc3\xa9"), "\"poids.\xc3\xa9t\xc3\xa9\"");    // é
  EXPECT_EQ(Json("\xe6\xa2\xaf\xe5\xba\xa6"), "\"\xe6\xa2\xaf\xe5\xba\xa6\"");  // 梯度
  EXPECT_EQ(Json("\xf0\x9f\x94\xa5"), "\"\xf0\x9f\x94\xa5\"");                  // 4-byte emoji
  EXPECT_EQ(Json("bad\xff"), "\"bad\xef\xbf\xbd\"");                            // stray byte
  EXPECT_EQ(Json("cut\xc3"), "\"cut\xef\xbf\xbd\"");            // truncated sequence
  EXPECT_EQ(Json("\xc0\xaf"), "\"\xef\xbf\xbd\xef\xbf\xbd\"");  // overlong '/'
  EXPECT_EQ(Json("\xed\xa0\x80"), "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");  // surrogate
}

TEST(TraceJson, EventShapes) {
  std::string s;
  AppendBegin(&s, 3, "MPI_ALLREDUCE", 120);
  EXPECT_EQ(s, R"({"name":"MPI_ALLREDUCE","ph":"B","ts":120,"pid":3,"tid":0})");
  s.clear();
  AppendEnd(&s, 3, 150);
  EXPECT_EQ(s, R"({"ph":"E","ts":150,"pid":3,"tid":0})");
  s.clear();
  AppendInstant(&s, 3, "2", 130, false);
  EXPECT_EQ(s, R"({"name":"2","ph":"i","ts":130,"pid":3,"tid":0,"s":"p"})");
  s.clear();
  AppendTensorMetadata(&s, 7, "a\"b");
  EXPECT_EQ(s,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":7,\"args\":{\"name\":\"a\\\"b\"}},\n"
            "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":7,\"args\":{\"sort_index\":7}}");
  s.clear();
  AppendStartMetadata(&s, 1700000000000000);
  EXPECT_NE(s.find("\"start_time_since_epoch_in_micros\":1700000000000000"), std::string::npos);
  s.clear();
  AppendCounter(&s, 90, "adaptive", {{"batch_size", 128}, {"lr_factor", 1.5}, {"noise", NAN}});
  EXPECT_EQ(s, R"({"name":"adaptive","ph":"C","ts":90,"pid":0,"args":{"batch_size":128,)"
               R"("lr_factor":1.5,"noise":null}})");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

std::string TempPath(const char* tag) {
  return "/tmp/hvd_timeline_test_" + std::to_string(getpid()) + "_" + tag + ".json";
}

TEST(Timeline, AStalledWriterDropsAndCountsInsteadOfBlocking) {
  Timeline t(/*capacity=*/16);
  const std::string path = TempPath("drop");
  std::string error;
  ASSERT_TRUE(t.Start(path, false, &error)) << error;
  t.PauseWriterForTest(true);
  const int32_t row = t.Row("tensor");
  for (int i = 0; i < 100; ++i) t.Begin(row, "ALLREDUCE");  // returns at once
  EXPECT_EQ(t.dropped_total(), 84u);                        // 16 fit in the ring
  EXPECT_EQ(t.Stop(), 84u);
  const std::string text = ReadFile(path);
  EXPECT_EQ(text.substr(0, 2), "[\n");
  EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
  EXPECT_EQ(Count(text, "\"name\":\"ALLREDUCE\""), 16u);
  EXPECT_NE(text.find("\"dropped_events\""), std::string::npos);
  EXPECT_NE(text.find("\"dropped\":84"), std::string::npos);
  std::remove(path.c_str());
}

TEST(Timeline, CountersFromAnyThreadLandInTheirSession) {
  Timeline t;
  t.Counter("adaptive", {{"batch_size", 1}});  // not recording: dropped
  const std::string path = TempPath("counter");
  std::string error;
  ASSERT_TRUE(t.Start(path, false, &error)) << error;
  std::thread other([&] { t.Counter("adaptive", {{"batch_size", 64}, {"accumulation", 2}}); });
  other.join();
  t.Counter("adaptive", {{"batch_size", 128}, {"accumulation", 0}});
  EXPECT_EQ(t.Stop(), 0u);
  t.Counter("adaptive", {{"batch_size", 3}});  // stopped: dropped
  const std::string text = ReadFile(path);
  EXPECT_EQ(Count(text, "\"ph\":\"C\""), 2u) << text;
  EXPECT_NE(text.find("\"batch_size\":64,\"accumulation\":2"), std::string::npos) << text;
  EXPECT_NE(text.find("\"batch_size\":128,\"accumulation\":0"), std::string::npos) << text;
  EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
  std::remove(path.c_str());
}

TEST(Timeline, SessionsDoNotLeakIntoEachOtherAndBadPathsAreErrors) {
  Timeline t;
  std::string error;
  EXPECT_FALSE(t.Start("/nonexistent-dir/x/t.json", false, &error));
  EXPECT_EQ(error,
            "cannot open timeline file '/nonexistent-dir/x/t.json': No such file or directory");
  EXPECT_FALSE(t.enabled());
  t.Begin(t.Row("ignored"), "ALLREDUCE");  // not recording: nothing happens
  const std::string a = TempPath("a"), b = TempPath("b");
  ASSERT_TRUE(t.Start(a, /*mark_cycles=*/true, &error));
  t.Begin(t.Row("first"), "ALLREDUCE");
  t.End(t.Row("first"));
  t.MarkCycleStart();
  ASSERT_TRUE(t.Start(b, false, &error));  // switches files
  const std::vector<int32_t> rows = {t.Row("second"), t.Row("third")};
  t.Begin(rows, "BROADCAST");
  t.RankReady(rows[0], 1);
  t.MarkCycleStart();  // not marked in this session
  t.End(rows);
  EXPECT_EQ(t.Stop(), 0u);
  EXPECT_EQ(t.Stop(), 0u);  // idempotent
  const std::string ta = ReadFile(a), tb = ReadFile(b);
  EXPECT_NE(ta.find("\"name\":\"first\""), std::string::npos);
  EXPECT_EQ(ta.find("\"name\":\"second\""), std::string::npos);
  EXPECT_EQ(Count(ta, "CYCLE_START"), 1u);
  EXPECT_EQ(ta.substr(ta.size() - 3), "\n]\n");
  EXPECT_EQ(tb.find("\"name\":\"first\""), std::string::npos);
  EXPECT_EQ(Count(tb, "\"name\":\"BROADCAST\""), 2u);
  EXPECT_EQ(Count(tb, R"("name":"1","ph":"i")"), 1u);
  EXPECT_EQ(Count(tb, "CYCLE_START"), 0u);
  std::remove(a.c_str());
  std::remove(b.c_str());
}

// A negotiation can be under way when the timeline stops or switches files (another rank's
// request for the next tensor reaches the coordinator first): every file's spans still nest.
TEST(Timeline, SpansOpenAtStopAreClosedAndEndsOfEarlierFilesLeftOut) {
  Timeline t;
  std::string error;
  const std::string a = TempPath("open_a"), b = TempPath("open_b");
  ASSERT_TRUE(t.Start(a, false, &error)) << error;
  const int32_t carried = t.Row("carried"), open = t.Row("open");
  t.Begin(carried, "NEGOTIATE_ALLREDUCE");
  ASSERT_TRUE(t.Start(b, false, &error)) << error;
  t.End(carried);  // its begin is in a
  t.Begin(open, "NEGOTIATE_ALLREDUCE");
  t.Begin(open, "QUEUE");
  t.End(open);  // QUEUE ends; the negotiation is still open at Stop
  EXPECT_EQ(t.Stop(), 0u);
  const std::string ta = ReadFile(a), tb = ReadFile(b);
  EXPECT_EQ(Count(ta, R"("ph":"B")"), 1u) << ta;
  EXPECT_EQ(Count(ta, R"("ph":"E")"), 1u) << ta;  // closed when a was finished
  EXPECT_EQ(tb.find("\"name\":\"carried\""), std::string::npos) << tb;
  EXPECT_EQ(Count(tb, R"("ph":"B")"), 2u) << tb;
  EXPECT_EQ(Count(tb, R"("ph":"E")"), 2u) << tb;
  std::remove(a.c_str());
  std::remove(b.c_str());
}

}  // namespace
}  // namespace timeline
}  // namespace hvd
