// The tuning cache: round trips, every kind of bad file read as a notice (never an exception),
// writers racing on one path, unwritable paths, and the plan's strict JSON form.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "model/model_test_util.hpp"
#include "scheduler/builtin_plans.hpp"
#include "scheduler/scheduler_test_util.hpp"
#include "scheduler/tuning_cache.hpp"

namespace deepfuse {
namespace {

using namespace scheduler;
using testing::expect_error;
using testing::ScratchDir;
using testing::write_file;

TuningKey key(const std::string& model = "h4096-i14336-q32-kv8-d128-l32-v128256") {
  return {"NVIDIA H100 80GB HBM3", 132, size_t{85} << 30, 13000, 13000, "0.1.0", model};
}

DecodePlan tuned_plan() {
  DecodePlan plan = builtin_plan(testing::model_shapes()[0].shape, testing::h100(), testing::buckets());
  plan.buckets[4].mlp = MlpChoice::fused;
  plan.buckets[0].attention = {.splits = 12, .warps = 4, .merge = kernels::SplitMerge::workspace, .short_context = false};
  plan.source = "tuned 2026-11-27T21:40:00Z (NVIDIA H100 80GB HBM3)";
  return plan;
}

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(TuningCache, RoundTrip) {
  ScratchDir dir;
  const auto path = dir.path() / "nested" / "tuning.json";  // parent folders are created
  save_tuned_plan(path, key(), tuned_plan());
  CacheLookup found = load_tuned_plan(path, key());
  EXPECT_EQ(found.notice, "");
  ASSERT_TRUE(found.plan);
  EXPECT_EQ(*found.plan, tuned_plan());
  // Another key: no plan, no notice. Saving it keeps the first.
  EXPECT_FALSE(load_tuned_plan(path, key("other")).plan);
  EXPECT_EQ(load_tuned_plan(path, key("other")).notice, "");
  DecodePlan other = tuned_plan();
  other.source = "tuned later";
  save_tuned_plan(path, key("other"), other);
  EXPECT_EQ(*load_tuned_plan(path, key()).plan, tuned_plan());
  EXPECT_EQ(*load_tuned_plan(path, key("other")).plan, other);
  // Replacing an entry.
  save_tuned_plan(path, key(), other);
  EXPECT_EQ(*load_tuned_plan(path, key()).plan, other);
  const auto document = nlohmann::json::parse(read(path));
  EXPECT_EQ(document["format"], "deepfuse-tuning-cache");
  EXPECT_EQ(document["schema"], kTuningCacheSchema);
  EXPECT_EQ(document["entries"].size(), 2u);
  EXPECT_EQ(document["entries"][key().text()]["key"]["gpu"], "NVIDIA H100 80GB HBM3");
}

TEST(TuningCache, KeyTextCoversEveryField) {
  const std::string base = key().text();
  std::vector<TuningKey> changed(7, key());
  changed[0].gpu = "NVIDIA H200";
  changed[1].sms = 114;
  changed[2].memory_bytes = size_t{141} << 30;
  changed[3].driver = 12080;
  changed[4].runtime = 12080;
  changed[5].deepfuse = "0.2.0";
  changed[6].model = "h2048";
  for (const TuningKey& k : changed) EXPECT_NE(k.text(), base);
}

TEST(TuningCache, MissingFileIsSilent) {
  ScratchDir dir;
  const CacheLookup found = load_tuned_plan(dir.path() / "none.json", key());
  EXPECT_FALSE(found.plan);
  EXPECT_EQ(found.notice, "");
}

TEST(TuningCache, BadFilesGiveOneNoticeAndNoPlan) {
  ScratchDir dir;
  const auto path = dir.path() / "tuning.json";
  const std::string ignoring = "ignoring tuning cache " + path.string() + ": ";
  auto notice_for = [&](const std::string& content) {
    write_file(path, content);
    const CacheLookup found = load_tuned_plan(path, key());
    EXPECT_FALSE(found.plan) << content;
    EXPECT_EQ(found.notice.find('\n'), std::string::npos);
    return found.notice;
  };
  EXPECT_EQ(notice_for("{\"format\": \"deepfuse-tuning-cache\", \"sch"), ignoring + "corrupt JSON at byte 41");
  EXPECT_EQ(notice_for(""), ignoring + "corrupt JSON at byte 1");
  EXPECT_EQ(notice_for("{\"hello\": 1}"), ignoring + "not a deepfuse tuning cache (foreign)");
  EXPECT_EQ(notice_for("[1, 2]"), ignoring + "not a deepfuse tuning cache (foreign)");
  EXPECT_EQ(notice_for(R"({"format": "deepfuse-tuning-cache", "schema": 0, "entries": {}})"),
            ignoring + "written by schema 0, this build reads 1 (stale)");
  EXPECT_EQ(notice_for(R"({"format": "deepfuse-tuning-cache", "schema": 1, "entries": []})"),
            ignoring + "its entries are not a JSON object (corrupt)");
}

TEST(TuningCache, SchemaBumpMakesAFileStale) {
  ScratchDir dir;
  const auto path = dir.path() / "tuning.json";
  save_tuned_plan(path, key(), tuned_plan());
  auto document = nlohmann::json::parse(read(path));
  document["schema"] = kTuningCacheSchema + 1;  // a newer build wrote it
  write_file(path, document.dump());
  const CacheLookup found = load_tuned_plan(path, key());
  EXPECT_FALSE(found.plan);
  EXPECT_EQ(found.notice, "ignoring tuning cache " + path.string() + ": written by schema " +
                              std::to_string(kTuningCacheSchema + 1) + ", this build reads " +
                              std::to_string(kTuningCacheSchema) + " (stale)");
  // A tuner replaces a stale file with one this build reads.
  save_tuned_plan(path, key(), tuned_plan());
  EXPECT_EQ(*load_tuned_plan(path, key()).plan, tuned_plan());
}

TEST(TuningCache, UnreadableFileGivesANotice) {
  ScratchDir dir;
  const auto folder = dir.path() / "tuning.json";
  std::filesystem::create_directories(folder);  // unreadable as a file, even for root
  CacheLookup found = load_tuned_plan(folder, key());
  EXPECT_FALSE(found.plan);
  EXPECT_EQ(found.notice.rfind("ignoring tuning cache " + folder.string() + ": cannot read it (", 0), 0u)
      << found.notice;
  if (::geteuid() != 0) {  // permissions do not bind root
    const auto path = dir.path() / "locked.json";
    save_tuned_plan(path, key(), tuned_plan());
    std::filesystem::permissions(path, std::filesystem::perms::none);
    found = load_tuned_plan(path, key());
    EXPECT_FALSE(found.plan);
    EXPECT_NE(found.notice.find("cannot read it (Permission denied)"), std::string::npos) << found.notice;
  }
}

TEST(TuningCache, AnEntryThatDoesNotParseGivesANotice) {
  ScratchDir dir;
  const auto path = dir.path() / "tuning.json";
  save_tuned_plan(path, key(), tuned_plan());
  auto document = nlohmann::json::parse(read(path));
  document["entries"][key().text()]["plan"]["buckets"][0]["mlp"] = "turbo";
  write_file(path, document.dump());
  const CacheLookup found = load_tuned_plan(path, key());
  EXPECT_FALSE(found.plan);
  EXPECT_NE(found.notice.find("does not parse (decode plan JSON: unknown mlp 'turbo' (fused, unfused, fused_batched, fused_wgmma))"),
            std::string::npos)
      << found.notice;
}

TEST(TuningCache, UnwritablePathThrowsNamingIt) {
  ScratchDir dir;
  write_file(dir.path() / "file", "not a folder");
  const auto path = dir.path() / "file" / "tuning.json";
  expect_error([&] { save_tuned_plan(path, key(), tuned_plan()); }, {"cannot write tuning cache " + path.string()});
  if (::geteuid() != 0) {
    const auto readonly = dir.path() / "readonly";
    std::filesystem::create_directories(readonly);
    std::filesystem::permissions(readonly, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    expect_error([&] { save_tuned_plan(readonly / "tuning.json", key(), tuned_plan()); },
                 {(readonly / "tuning.json").string(), "Permission denied"});
  }
}

TEST(TuningCache, NeverOverwritesAFileThatIsNotOneOfItsOwn) {
  ScratchDir dir;
  const auto path = dir.path() / "notes.json";
  write_file(path, "{\"my\": \"notes\"}");
  expect_error([&] { save_tuned_plan(path, key(), tuned_plan()); },
               {path.string(), "not a deepfuse tuning cache (foreign)", "not overwriting it"});
  write_file(path, "plain text");
  expect_error([&] { save_tuned_plan(path, key(), tuned_plan()); }, {path.string(), "corrupt JSON", "not overwriting"});
  EXPECT_EQ(read(path), "plain text");
}

// A one-bucket plan keeps the racing writers' file small: the test is about the lock, not size.
DecodePlan small_plan() {
  const std::vector<int> one{1};
  return builtin_plan(testing::model_shapes()[0].shape, testing::h100(), one);
}

// Every writer's entries survive, and the file parses, whichever order the writers interleave in.
void expect_all_entries(const std::filesystem::path& path, int writers, int per_writer) {
  const auto document = nlohmann::json::parse(read(path));  // throws if torn
  EXPECT_EQ(document["entries"].size(), static_cast<size_t>(writers * per_writer));
  for (int w = 0; w < writers; ++w)
    for (int i = 0; i < per_writer; ++i) {
      const CacheLookup found = load_tuned_plan(path, key("writer" + std::to_string(w) + "-" + std::to_string(i + 1)));
      EXPECT_TRUE(found.plan) << w << " " << i;
    }
  for (const auto& entry : std::filesystem::directory_iterator(path.parent_path()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

TEST(TuningCache, TwoThreadsWritingAtOnceLoseNothing) {
  ScratchDir dir;
  const auto path = dir.path() / "tuning.json";
  auto writer = [&](int w) {
    for (int i = 0; i < 50; ++i) save_tuned_plan(path, key("writer" + std::to_string(w) + "-" + std::to_string(i + 1)), small_plan());
  };
  std::thread first(writer, 0), second(writer, 1);
  first.join();
  second.join();
  expect_all_entries(path, 2, 50);
}

TEST(TuningCache, TwoProcessesWritingAtOnceLoseNothing) {
  ScratchDir dir;
  const auto path = dir.path() / "tuning.json";
  std::vector<pid_t> children;
  for (int w = 0; w < 2; ++w) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int status = 0;
      try {
        for (int i = 0; i < 50; ++i) save_tuned_plan(path, key("writer" + std::to_string(w) + "-" + std::to_string(i + 1)), small_plan());
      } catch (...) {
        status = 1;
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  expect_all_entries(path, 2, 50);
}

TEST(PlanJson, RoundTripAndStrictReading) {
  EXPECT_EQ(plan_from_json(plan_to_json(tuned_plan())), tuned_plan());
  auto with = [](auto change) {
    auto j = nlohmann::json::parse(plan_to_json(tuned_plan()));
    change(j);
    return j.dump();
  };
  expect_error([&] { plan_from_json(with([](auto& j) { j["buckets"][0]["front"] = "half"; })); },
               {"unknown front 'half' (fused, unfused)"});
  expect_error([&] { plan_from_json(with([](auto& j) { j["buckets"][0]["attention"]["merge"] = "l2"; })); },
               {"unknown attention.merge 'l2'"});
  expect_error([&] { plan_from_json(with([](auto& j) { j["prefill_mlp"] = 3; })); }, {"prefill_mlp is not a string"});
  expect_error([&] { plan_from_json(with([](auto& j) { j["buckets"][1].erase("o_proj"); })); }, {"has no 'o_proj'"});
  expect_error([&] { plan_from_json(with([](auto& j) { j["buckets"][1]["lm_head"] = "x"; })); },
               {"unknown key 'lm_head'"});
  expect_error([&] { plan_from_json(with([](auto& j) { j["buckets"][0]["batch"] = "one"; })); },
               {"batch is not an integer"});
  expect_error([] { plan_from_json("{\"source\": "); }, {"corrupt at byte"});
}

// A tensor-parallel rank's plan carries its rank count and each bucket's all-reduce; one GPU's
// JSON has neither key (plans saved before them read back unchanged).
TEST(PlanJson, TensorParallelFields) {
  DecodePlan plan = tuned_plan();
  EXPECT_EQ(plan_to_json(plan).find("all_reduce"), std::string::npos);
  plan.tensor_parallel = 4;
  plan.buckets[0].all_reduce = AllReduceChoice::one_shot;
  plan.buckets[1].all_reduce = AllReduceChoice::one_shot_lines;
  plan.buckets[2].all_reduce = AllReduceChoice::one_shot_flag;
  const std::string text = plan_to_json(plan);
  EXPECT_NE(text.find("\"all_reduce\": \"one_shot\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"all_reduce\": \"one_shot_lines\""), std::string::npos) << text;
  EXPECT_EQ(plan_from_json(text), plan);
  EXPECT_NE(describe(plan).find("all_reduce"), std::string::npos);
  auto j = nlohmann::json::parse(text);
  j["buckets"][0]["all_reduce"] = "ring";
  expect_error([&] { plan_from_json(j.dump()); }, {"unknown all_reduce 'ring'"});
}

}  // namespace
}  // namespace deepfuse
