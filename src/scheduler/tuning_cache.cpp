// The tuning cache file (docs/scheduler.md, "The tuning cache"):
//
//   {"format": "deepfuse-tuning-cache", "schema": 1,
//    "entries": {"<TuningKey::text()>": {"key": {...}, "plan": {...}}, ...}}
//
// Reading never throws: a cache is an optimisation, and a bad one must cost a notice, not a run.
// Writing takes an exclusive flock on a sidecar "<path>.lock" (left in place: removing it would let
// a writer lock a file another has just unlinked), re-reads the file under the lock so entries
// other tuners saved meanwhile are kept, writes a temporary file in the same folder and renames it
// over the old one, so a reader sees the old file or the new one, never half of one.
#include "scheduler/tuning_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <variant>

#include "deepfuse/error.hpp"
#include "scheduler/plan_json.hpp"

namespace deepfuse::scheduler {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kFormat = "deepfuse-tuning-cache";

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

struct ReadResult {
  bool missing = false;
  std::string text;
  std::string error;  // non-empty: could not read
};

ReadResult read_whole(const fs::path& path) {
  ReadResult result;
  Fd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.fd < 0) {
    if (errno == ENOENT) result.missing = true;
    else result.error = std::strerror(errno);
    return result;
  }
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(file.fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      result.error = std::strerror(errno);  // e.g. a folder at the path: EISDIR
      return result;
    }
    result.text.append(buffer, static_cast<size_t>(n));
  }
  return result;
}

// What a cache file's text holds: its entries, or why it cannot be used.
struct Entries {
  json entries;
};
struct Unusable {
  std::string reason;  // "corrupt JSON at byte N", "... (stale)", "... (foreign)"
  bool stale = false;  // ours, of another schema: a writer may replace it
};

std::variant<Entries, Unusable> parse_cache(const std::string& text) {
  json document;
  try {
    document = json::parse(text);
  } catch (const json::parse_error& e) {
    return Unusable{"corrupt JSON at byte " + std::to_string(e.byte)};
  }
  if (!document.is_object() || document.value("format", json()) != kFormat)
    return Unusable{"not a deepfuse tuning cache (foreign)"};
  const json schema = document.value("schema", json());
  if (!schema.is_number_integer() || schema.get<long long>() != kTuningCacheSchema)
    return Unusable{"written by schema " + schema.dump() + ", this build reads " + std::to_string(kTuningCacheSchema) +
                        " (stale)",
                    true};
  const json entries = document.value("entries", json());
  if (!entries.is_object()) return Unusable{"its entries are not a JSON object (corrupt)"};
  return Entries{entries};
}

json key_json(const TuningKey& key) {
  return {{"gpu", key.gpu},       {"sms", key.sms},           {"memory_bytes", key.memory_bytes},
          {"driver", key.driver}, {"runtime", key.runtime},   {"deepfuse", key.deepfuse},
          {"model", key.model}};
}

[[noreturn]] void fail_write(const fs::path& path, const std::string& why) {
  throw Error("cannot write tuning cache " + path.string() + ": " + why);
}

// Writes `text` to a fresh file next to `path` and renames it over `path`.
void replace_atomically(const fs::path& path, const std::string& text) {
  static std::atomic<unsigned> counter{0};
  fs::path temporary = path;
  temporary += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  {
    Fd file(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (file.fd < 0) fail_write(path, "cannot create " + temporary.string() + " (" + std::strerror(errno) + ")");
    size_t written = 0;
    while (written < text.size()) {
      const ssize_t n = ::write(file.fd, text.data() + written, text.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const std::string why = std::strerror(errno);
        ::unlink(temporary.c_str());
        fail_write(path, "writing " + temporary.string() + " failed (" + why + ")");
      }
      written += static_cast<size_t>(n);
    }
    if (::fsync(file.fd) != 0) {
      const std::string why = std::strerror(errno);
      ::unlink(temporary.c_str());
      fail_write(path, "fsync of " + temporary.string() + " failed (" + why + ")");
    }
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    ::unlink(temporary.c_str());
    fail_write(path, "rename failed (" + error.message() + ")");
  }
}

}  // namespace

std::string TuningKey::text() const {
  return "gpu=" + gpu + "|sms=" + std::to_string(sms) + "|memory=" + std::to_string(memory_bytes) +
         "|driver=" + std::to_string(driver) + "|runtime=" + std::to_string(runtime) + "|deepfuse=" + deepfuse +
         "|model=" + model;
}

CacheLookup load_tuned_plan(const fs::path& path, const TuningKey& key) {
  const std::string ignoring = "ignoring tuning cache " + path.string() + ": ";
  const ReadResult file = read_whole(path);
  if (file.missing) return {};
  if (!file.error.empty()) return {std::nullopt, ignoring + "cannot read it (" + file.error + ")"};
  const auto parsed = parse_cache(file.text);
  if (const auto* unusable = std::get_if<Unusable>(&parsed)) return {std::nullopt, ignoring + unusable->reason};
  const json& entries = std::get<Entries>(parsed).entries;
  const auto entry = entries.find(key.text());
  if (entry == entries.end()) return {};
  try {
    DF_CHECK(entry->is_object() && entry->contains("plan"), "the entry has no plan");
    return {plan_from_json_value(entry->at("plan")), ""};
  } catch (const std::exception& e) {  // deepfuse::Error, or nlohmann's on a wrong type
    return {std::nullopt, ignoring + "its entry for this GPU and model does not parse (" + e.what() + ")"};
  }
}

void save_tuned_plan(const fs::path& path, const TuningKey& key, const DecodePlan& plan) {
  std::error_code error;
  if (const fs::path parent = path.parent_path(); !parent.empty()) {
    fs::create_directories(parent, error);
    if (error) fail_write(path, "cannot create its folder (" + error.message() + ")");
  }
  fs::path lock_path = path;
  lock_path += ".lock";
  Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (lock.fd < 0) fail_write(path, "cannot open its lock file (" + std::string(std::strerror(errno)) + ")");
  while (::flock(lock.fd, LOCK_EX) != 0)
    if (errno != EINTR) fail_write(path, "cannot lock it (" + std::string(std::strerror(errno)) + ")");

  // Under the lock: what other writers saved since this tuner started is in the file now.
  json entries = json::object();
  const ReadResult file = read_whole(path);
  if (!file.error.empty()) fail_write(path, "cannot read it (" + file.error + ")");
  if (!file.missing) {
    const auto parsed = parse_cache(file.text);
    if (const auto* unusable = std::get_if<Unusable>(&parsed)) {
      // A stale cache is ours and replaced whole; anything else may be someone's file.
      if (!unusable->stale) fail_write(path, unusable->reason + "; not overwriting it");
    } else {
      entries = std::get<Entries>(parsed).entries;
    }
  }
  entries[key.text()] = {{"key", key_json(key)}, {"plan", plan_json(plan)}};
  const json document = {{"format", kFormat}, {"schema", kTuningCacheSchema}, {"entries", entries}};
  replace_atomically(path, document.dump(2) + "\n");
}

}  // namespace deepfuse::scheduler
