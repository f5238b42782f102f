// horovod_cpp — Apache-2.0
#include "common/config/config.h"

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace hvd {
namespace {

Result<Config> Parse(const std::map<std::string, std::string>& env) {
  return Config::FromEnv([&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) return std::nullopt;
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

TEST(Config, DefaultsMatchHorovod) {
  Result<Config> c = Parse({});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->fusion_threshold_bytes, 128 * 1024 * 1024);
  EXPECT_EQ(c->collective_chunk_bytes, 1024 * 1024);  // ours: measured, see docs/performance.md
  EXPECT_EQ(c->cycle_time_ms, 1.0);
  EXPECT_EQ(c->cache_capacity, 1024);
  EXPECT_EQ(c->log_level, LogLevel::kWarning);
  EXPECT_EQ(c->stall_check_time_seconds, 60.0);
  EXPECT_EQ(c->stall_shutdown_time_seconds, 0.0);
  EXPECT_EQ(c->deadlock_grace_seconds, 5.0);
  EXPECT_EQ(c->timeline_path, "");
  EXPECT_FALSE(c->timeline_mark_cycles);
}

TEST(Config, ParsesEveryKnob) {
  Result<Config> c = Parse({{"HOROVOD_FUSION_THRESHOLD", "0"},
                            {"HOROVOD_COLLECTIVE_CHUNK_BYTES", "1048576"},
                            {"HOROVOD_CYCLE_TIME", "0.25"},
                            {"HOROVOD_CACHE_CAPACITY", " 16 "},
                            {"HOROVOD_LOG_LEVEL", "DEBUG"},
                            {"HOROVOD_STALL_CHECK_TIME_SECONDS", "5"},
                            {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "10"},
                            {"HOROVOD_TIMELINE", "/tmp/t.json"},
                            {"HOROVOD_TIMELINE_MARK_CYCLES", "true"},
                            {"HOROVOD_THREAD_AFFINITY", " 0, 3,1 "}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->fusion_threshold_bytes, 0);
  EXPECT_EQ(c->collective_chunk_bytes, 1048576);
  EXPECT_EQ(c->cycle_time_ms, 0.25);
  EXPECT_EQ(c->cache_capacity, 16);
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
  EXPECT_EQ(c->stall_check_time_seconds, 5.0);
  EXPECT_EQ(c->stall_shutdown_time_seconds, 10.0);
  EXPECT_EQ(c->timeline_path, "/tmp/t.json");
  EXPECT_TRUE(c->timeline_mark_cycles);
  EXPECT_EQ(c->thread_affinity, "0, 3,1");
  EXPECT_TRUE(c->warnings.empty());
}

TEST(Config, EmptyValueKeepsTheDefault) {
  Result<Config> c = Parse({{"HOROVOD_CYCLE_TIME", ""}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cycle_time_ms, 1.0);
}

struct BadValue {
  const char* name;
  const char* value;
  const char* expected_message;
};

TEST(Config, MalformedValuesFailNamingVariableAndValue) {
  const BadValue cases[] = {
      {"HOROVOD_FUSION_THRESHOLD", "abc",
       "HOROVOD_FUSION_THRESHOLD='abc' is not valid: expected an integer (bytes) in [0, "
       "1099511627776]"},
      {"HOROVOD_FUSION_THRESHOLD", "64MB", "HOROVOD_FUSION_THRESHOLD='64MB' is not valid"},
      {"HOROVOD_FUSION_THRESHOLD", "-1", "HOROVOD_FUSION_THRESHOLD='-1' is not valid"},
      {"HOROVOD_FUSION_THRESHOLD", "1e3", "HOROVOD_FUSION_THRESHOLD='1e3' is not valid"},
      {"HOROVOD_FUSION_THRESHOLD", "99999999999999999999999",
       "HOROVOD_FUSION_THRESHOLD='99999999999999999999999' is not valid"},
      {"HOROVOD_CYCLE_TIME", "-0.5",
       "HOROVOD_CYCLE_TIME='-0.5' is not valid: expected a number (milliseconds) in [0, 60000]"},
      {"HOROVOD_CYCLE_TIME", "nan", "HOROVOD_CYCLE_TIME='nan' is not valid"},
      {"HOROVOD_CYCLE_TIME", "5ms", "HOROVOD_CYCLE_TIME='5ms' is not valid"},
      {"HOROVOD_CACHE_CAPACITY", "1.5", "HOROVOD_CACHE_CAPACITY='1.5' is not valid"},
      {"HOROVOD_LOG_LEVEL", "loud",
       "HOROVOD_LOG_LEVEL='loud' is not valid: expected one of trace, debug, info, warning, "
       "error, fatal"},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "-1",
       "HOROVOD_STALL_CHECK_TIME_SECONDS='-1' is not valid"},
      {"HOROVOD_TIMELINE_MARK_CYCLES", "maybe",
       "HOROVOD_TIMELINE_MARK_CYCLES='maybe' is not valid: expected one of 1, 0, true, false"},
      {"HOROVOD_THREAD_AFFINITY", "0,,1", "HOROVOD_THREAD_AFFINITY='0,,1' is not valid"},
      {"HOROVOD_THREAD_AFFINITY", "0,", "HOROVOD_THREAD_AFFINITY='0,' is not valid"},
      {"HOROVOD_THREAD_AFFINITY", "cpu0", "HOROVOD_THREAD_AFFINITY='cpu0' is not valid"},
  };
  for (const BadValue& bad : cases) {
    Result<Config> c = Parse({{bad.name, bad.value}});
    ASSERT_FALSE(c.ok()) << bad.name << "=" << bad.value << " was accepted";
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(bad.expected_message), std::string::npos)
        << "got: " << c.status().message();
  }
}

TEST(Config, ShutdownShorterThanCheckIsIgnoredWithAWarning) {
  Result<Config> c = Parse(
      {{"HOROVOD_STALL_CHECK_TIME_SECONDS", "30"}, {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "10"}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->stall_shutdown_time_seconds, 0.0);
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_NE(c->warnings[0].find("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=10 is less than"),
            std::string::npos);
}

TEST(Config, KnobTableDescribesEveryKnobOnce) {
  const std::vector<KnobSpec>& table = KnobTable();
  std::vector<std::string> names;
  for (const KnobSpec& k : table) names.push_back(k.name);
  const std::vector<std::string> expected = {"HOROVOD_FUSION_THRESHOLD",
                                             "HOROVOD_COLLECTIVE_CHUNK_BYTES",
                                             "HOROVOD_CYCLE_TIME",
                                             "HOROVOD_CACHE_CAPACITY",
                                             "HOROVOD_LOG_LEVEL",
                                             "HOROVOD_STALL_CHECK_TIME_SECONDS",
                                             "HOROVOD_COLLECTIVE_TIMEOUT_SECONDS",
                                             "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
                                             "HOROVOD_DEADLOCK_GRACE_SECONDS",
                                             "HOROVOD_TIMELINE",
                                             "HOROVOD_TIMELINE_MARK_CYCLES",
                                             "HOROVOD_DYNAMIC_PROCESS_SETS",
                                             "HOROVOD_HIERARCHICAL_ALLREDUCE",
                                             "HOROVOD_HIERARCHICAL_ALLGATHER",
                                             "HOROVOD_STALL_CHECK_DISABLE",
                                             "HOROVOD_THREAD_AFFINITY",
                                             "HOROVOD_CCL_WORKER_COUNT",
                                             "HOROVOD_CCL_WORKER_AFFINITY",
                                             "HOROVOD_AUTOTUNE",
                                             "HOROVOD_AUTOTUNE_LOG",
                                             "HOROVOD_AUTOTUNE_COMPARE",
                                             "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
                                             "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
                                             "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
                                             "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"};
  EXPECT_EQ(names, expected);
  const std::string text = KnobsMarkdown();
  for (const std::string& n : expected) EXPECT_NE(text.find(n), std::string::npos) << n;
}

TEST(Config, AutotuneKnobsAndWhatTheEnvironmentSet) {
  Result<Config> c = Parse({{"HOROVOD_AUTOTUNE", "1"},
                            {"HOROVOD_AUTOTUNE_LOG", "/tmp/at.csv"},
                            {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "5"},
                            {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.25"},
                            {"HOROVOD_FUSION_THRESHOLD", "1048576"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->autotune);
  EXPECT_EQ(c->autotune_log, "/tmp/at.csv");
  EXPECT_EQ(c->autotune_steps_per_sample, 5);
  EXPECT_EQ(c->autotune_warmup_samples, 3);          // Horovod's defaults
  EXPECT_EQ(c->autotune_bayes_opt_max_samples, 20);
  EXPECT_EQ(c->autotune_gaussian_process_noise, 0.25);
  EXPECT_TRUE(c->SetInEnv("HOROVOD_FUSION_THRESHOLD"));  // the autotuner leaves it alone
  EXPECT_FALSE(c->SetInEnv("HOROVOD_CYCLE_TIME"));
  Result<Config> bad = Parse({{"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "0"}});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"), std::string::npos);
  bad = Parse({{"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "lots"}});
  EXPECT_FALSE(bad.ok());
}

TEST(Config, StallCheckDisableTurnsTheInspectorOff) {
  Result<Config> c = Parse({{"HOROVOD_STALL_CHECK_DISABLE", "1"},
                            {"HOROVOD_STALL_CHECK_TIME_SECONDS", "5"},
                            {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "10"}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->stall_check_time_seconds, 0.0);
  EXPECT_EQ(c->stall_shutdown_time_seconds, 0.0);
  EXPECT_TRUE(c->warnings.empty());
  c = Parse({{"HOROVOD_STALL_CHECK_DISABLE", "0"}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->stall_check_time_seconds, 60.0);
  EXPECT_EQ(Parse({{"HOROVOD_STALL_CHECK_DISABLE", "maybe"}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(Config, EveryHorovodVariableNotReadGetsOneWarning) {
  const std::vector<std::string> w = UnknownSettingWarnings(
      {"PATH", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHHOLD", "HOROVOD_CYCLE_TIMES",
       "HOROVOD_AUTOTUNE", "HOROVOD_BATCH_D2D_MEMCOPIES", "HOROVOD_WITH_PYTORCH",
       "HOROVOD_ELASTIC", "HOROVOD_ZEBRA", "HOROVOD_HIERARCHICAL_ALLREDUSE",
       "HOROVOD_CYCLE_TIMES", "HOROVOD_AUTOTUNE_LOGG"});
  ASSERT_EQ(w.size(), 7u) << ::testing::PrintToString(w);  // sorted by name, once each
  EXPECT_EQ(w[0], "HOROVOD_AUTOTUNE_LOGG is not a horovod_cpp setting; did you mean "
                  "HOROVOD_AUTOTUNE_LOG?");
  EXPECT_EQ(w[1], "HOROVOD_BATCH_D2D_MEMCOPIES is a Horovod setting that horovod_cpp does "
                  "not implement: the setting is ignored");
  EXPECT_EQ(w[2], "HOROVOD_CYCLE_TIMES is not a horovod_cpp setting; did you mean "
                  "HOROVOD_CYCLE_TIME?");
  EXPECT_EQ(w[3], "HOROVOD_FUSION_THRESHHOLD is not a horovod_cpp setting; did you mean "
                  "HOROVOD_FUSION_THRESHOLD?");
  EXPECT_EQ(w[4], "HOROVOD_HIERARCHICAL_ALLREDUSE is not a horovod_cpp setting; did you mean "
                  "HOROVOD_HIERARCHICAL_ALLREDUCE?");
  EXPECT_NE(w[5].find("HOROVOD_WITH_PYTORCH is a Horovod build setting"), std::string::npos);
  EXPECT_EQ(w[6], "HOROVOD_ZEBRA is not a horovod_cpp setting; docs/config.md lists the "
                  "settings");
  // Read by the backend factory, the Gloo backend and the elastic layer, not the knob table.
  EXPECT_TRUE(UnknownSettingWarnings({"HOROVOD_CACHE_CAPACITY", "HOME", "HOROVOD_CONTROLLER",
                                      "HOROVOD_CPU_OPERATIONS", "HOROVOD_RANK",
                                      "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                                      "HOROVOD_ELASTIC_WORKER_ID"})
                  .empty());
}

// Every HOROVOD_* name that the Python package reads or that its launchers set for the workers
// is known to the core: a worker never warns about a variable its own launcher exported.
TEST(Config, NoWarningForTheVariablesThePythonPackageUses) {
  std::set<std::string> names;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(HVD_SOURCE_DIR "/horovod_cpp")) {
    if (entry.path().extension() != ".py") continue;
    const std::string text = ReadFile(entry.path()).value_or("");
    // "HOROVOD_..." string literals. (Not std::regex: GCC 12 warns inside it under ASan.)
    for (size_t at = text.find("\"HOROVOD_"); at != std::string::npos;
         at = text.find("\"HOROVOD_", at + 1)) {
      size_t end = at + 1;
      while (end < text.size() && (std::isupper(static_cast<unsigned char>(text[end])) ||
                                   std::isdigit(static_cast<unsigned char>(text[end])) ||
                                   text[end] == '_')) {
        ++end;
      }
      if (end < text.size() && text[end] == '"' && text[end - 1] != '_') {
        names.insert(text.substr(at + 1, end - at - 1));
      }
    }
  }
  ASSERT_GT(names.size(), 10u) << "no HOROVOD_ names found under horovod_cpp/";
  EXPECT_EQ(names.count("HOROVOD_ELASTIC_WORKER_START"), 1u);
  EXPECT_EQ(UnknownSettingWarnings({names.begin(), names.end()}), std::vector<std::string>{});
}

// docs/config.md's table is generated from common/config/knobs.def. To refresh it after changing a
// knob: HVD_UPDATE_DOCS=1 build/tests/unit_tests --gtest_filter=Config.DocsTableIsGenerated
TEST(Config, DocsTableIsGenerated) {
  const std::string path = HVD_SOURCE_DIR "/docs/config.md";
  const std::string begin = "<!-- knobs: generated from common/config/knobs.def -->\n";
  const std::string end = "<!-- knobs: end -->\n";
  const std::optional<std::string> read = ReadFile(path);
  ASSERT_TRUE(read) << path << " not found";
  const std::string& text = *read;
  const size_t b = text.find(begin), e = text.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/config.md lost its marker line: " << begin;
  ASSERT_NE(e, std::string::npos) << "docs/config.md lost its marker line: " << end;
  const std::string current = text.substr(b + begin.size(), e - b - begin.size());
  const std::string generated = KnobsMarkdown();
  if (current != generated && std::getenv("HVD_UPDATE_DOCS") != nullptr) {
    std::ofstream(path) << text.substr(0, b + begin.size()) << generated << text.substr(e);
    return;
  }
  EXPECT_EQ(current, generated)
      << "docs/config.md is stale; regenerate it with HVD_UPDATE_DOCS=1 "
         "build/tests/unit_tests --gtest_filter=Config.DocsTableIsGenerated";
  for (const KnobSpec& k : KnobTable()) {
    EXPECT_NE(current.find(std::string("`") + k.name + "`"), std::string::npos) << k.name;
  }
}

TEST(Config, AgreementAdoptsRank0sValuesOfTheAgreedKnobsOnly) {
  Result<Config> rank0 = Parse({{"HOROVOD_FUSION_THRESHOLD", "1000"},
                                {"HOROVOD_CYCLE_TIME", "2.5"},
                                {"HOROVOD_DEADLOCK_GRACE_SECONDS", "7"},
                                {"HOROVOD_LOG_LEVEL", "debug"}});
  Result<Config> mine = Parse({{"HOROVOD_FUSION_THRESHOLD", "64"},
                               {"HOROVOD_CACHE_CAPACITY", "3"},
                               {"HOROVOD_LOG_LEVEL", "error"},
                               {"HOROVOD_TIMELINE", "/tmp/mine.json"}});
  ASSERT_TRUE(rank0.ok() && mine.ok());
  std::vector<uint8_t> sent;
  ASSERT_TRUE(rank0->AgreeWithRank0([&](std::vector<uint8_t>* bytes) {
                     sent = *bytes;  // rank 0 keeps its own bytes
                     return Status::OK();
                   }).ok());
  ASSERT_TRUE(mine->AgreeWithRank0([&](std::vector<uint8_t>* bytes) {
                    *bytes = sent;  // what the broadcast delivers
                    return Status::OK();
                  }).ok());
  EXPECT_EQ(mine->fusion_threshold_bytes, 1000);
  EXPECT_EQ(mine->cycle_time_ms, 2.5);
  EXPECT_EQ(mine->cache_capacity, 1024);  // rank 0's default
  EXPECT_EQ(mine->deadlock_grace_seconds, 7.0);
  EXPECT_EQ(mine->log_level, LogLevel::kError);          // each rank its own
  EXPECT_EQ(mine->timeline_path, "/tmp/mine.json");      // each rank its own
  // A truncated broadcast is an error naming the knob, not garbage.
  Result<Config> other = Parse({});
  ASSERT_TRUE(other.ok());
  Status cut = other->AgreeWithRank0([&](std::vector<uint8_t>* bytes) {
    *bytes = std::vector<uint8_t>(sent.begin(), sent.begin() + 12);
    return Status::OK();
  });
  EXPECT_FALSE(cut.ok());
  EXPECT_NE(cut.message().find("HOROVOD_"), std::string::npos) << cut.message();
}

}  // namespace
}  // namespace hvd
