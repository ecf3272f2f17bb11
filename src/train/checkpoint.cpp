#include "train/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/file.h"
#include "io/safetensors.h"

namespace myriad::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "myriad-train-checkpoint";
constexpr const char* kModel = "model.safetensors";
constexpr const char* kTrain = "train_state.safetensors";
constexpr const char* kConfig = "config.json";
constexpr const char* kState = "state.json";
constexpr const char* kLatest = "latest";
constexpr const char* kOptPrefix = "optimizer/";
constexpr const char* kBalPrefix = "balancer/";

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

uint32_t crc_of(std::string_view s) {
  uLong c = crc32(0L, Z_NULL, 0);
  for (size_t i = 0; i < s.size(); i += 1u << 30) {
    size_t n = std::min<size_t>(s.size() - i, 1u << 30);
    c = crc32(c, reinterpret_cast<const Bytef*>(s.data() + i), static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(c);
}

struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

// Streams the file (1 MiB at a time) through CRC-32.
FileSum sum_file(const fs::path& p) {
  std::FILE* f = std::fopen(p.c_str(), "rb");
  MYRIAD_CHECK(f, p.string(), ": cannot open: ", std::strerror(errno));
  std::vector<unsigned char> buf(1 << 20);
  FileSum s;
  uLong c = crc32(0L, Z_NULL, 0);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    c = crc32(c, buf.data(), static_cast<uInt>(n));
    s.bytes += n;
  }
  bool bad = std::ferror(f);
  std::fclose(f);
  MYRIAD_CHECK(!bad, p.string(), ": read failed");
  s.crc = static_cast<uint32_t>(c);
  return s;
}

void fsync_dir(const fs::path& d) {
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MYRIAD_CHECK(fd >= 0, d.string(), ": cannot open directory: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  MYRIAD_CHECK(rc == 0, d.string(), ": fsync failed: ", std::strerror(err));
}

// "step-<digits>" -> the step; anything else (temp and trash dirs included) -> nullopt.
std::optional<int64_t> parse_step(const std::string& name) {
  if (name.size() < 6 || name.size() > 24 || name.rfind("step-", 0) != 0) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::string unique_suffix() {
  static std::atomic<uint64_t> counter{0};
  return cat(::getpid(), "-", counter.fetch_add(1));
}

// Renames a dir out of the step namespace first so a crash never leaves a half-deleted step dir.
void remove_dir(const fs::path& d) {
  fs::path trash = d;
  trash += ".trash-" + unique_suffix();
  std::error_code ec;
  fs::rename(d, trash, ec);
  fs::remove_all(ec ? d : trash, ec);
}

// Atomically puts `tmp` at `final`: a plain rename, or an exchange when `final` already exists
// (a re-save of the same step), after which the old contents sit at `tmp` and are removed.
void commit_dir(const fs::path& tmp, const fs::path& final) {
  if (::rename(tmp.c_str(), final.c_str()) == 0) return;
  int err = errno;
  MYRIAD_CHECK(err == ENOTEMPTY || err == EEXIST, final.string(), ": rename from ", tmp.string(),
               " failed: ", std::strerror(err));
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final.c_str(), RENAME_EXCHANGE) != 0) {
    // No exchange on this filesystem: move the old one aside (a short window without it).
    fs::path old = final;
    old += ".trash-" + unique_suffix();
    MYRIAD_CHECK(::rename(final.c_str(), old.c_str()) == 0, final.string(),
                 ": cannot move the old step dir aside: ", std::strerror(errno));
    MYRIAD_CHECK(::rename(tmp.c_str(), final.c_str()) == 0, final.string(), ": rename from ",
                 tmp.string(), " failed: ", std::strerror(errno));
    fs::rename(old, tmp);
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

bool plain_name(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos;
}

}  // namespace

std::string CheckpointManager::step_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%09lld", static_cast<long long>(step));
  return b;
}

CheckpointManager::CheckpointManager(std::string dir, int keep_last)
    : dir_(std::move(dir)), keep_last_(keep_last) {
  MYRIAD_CHECK(!dir_.empty(), "CheckpointManager: empty directory name");
  MYRIAD_CHECK(keep_last >= 1, "CheckpointManager: keep_last must be at least 1, got ", keep_last);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  MYRIAD_CHECK(fs::is_directory(dir_), dir_,
               ": cannot create checkpoint directory: ", ec.message());
}

void CheckpointManager::remove_debris() const {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::string f = e.path().filename().string();
    bool step_debris = f.rfind("step-", 0) == 0 && (f.find(".tmp-") != std::string::npos ||
                                                    f.find(".trash-") != std::string::npos);
    bool latest_debris = f.rfind(std::string(kLatest) + ".tmp.", 0) == 0;  // write_file_atomic's
    if (step_debris || latest_debris) fs::remove_all(e.path(), ec);
  }
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    auto step = parse_step(e.path().filename().string());
    if (step && e.is_directory(ec)) found.emplace_back(*step, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

namespace {
// A data-parallel rank's share of the optimizer state.
std::string part_name(int rank, int ranks) {
  char b[64];
  std::snprintf(b, sizeof b, "optimizer-%05d-of-%05d.safetensors", rank, ranks);
  return b;
}
bool is_part(const std::string& f) {
  return f.rfind("optimizer-", 0) == 0 && f.size() > 12 &&
         f.compare(f.size() - 12, 12, ".safetensors") == 0;
}
}  // namespace

// Writes everything but the parts into `tmp`, lists the parts (already written there) in
// state.json, and commits the step dir.
void CheckpointManager::write_step(
    const fs::path& tmp, const TrainState& s,
    const std::map<std::string, std::pair<uint64_t, uint32_t>>& parts) {
  const fs::path dir(dir_), final = dir / step_name(s.step);
  // Each writer fsyncs its file and the temp dir.
  safetensors::save((tmp / kModel).string(), s.model, {{"format", "pt"}});
  std::map<std::string, Tensor> ts;
  for (const auto& [k, t] : s.optimizer) ts.emplace(kOptPrefix + k, t);
  for (const auto& [k, t] : s.balancer) ts.emplace(kBalPrefix + k, t);
  safetensors::save((tmp / kTrain).string(), ts, {{"format", kFormat}});
  std::vector<std::string> names = {kModel, kTrain};
  if (s.extra.is_object() && s.extra.contains("config")) {
    const auto& c = s.extra["config"];
    io::write_file_atomic((tmp / kConfig).string(),
                          c.is_string() ? c.get<std::string>() : c.dump(2) + "\n");
    names.push_back(kConfig);
  }
  nlohmann::json files = nlohmann::json::object();
  for (const auto& f : names) {
    FileSum sum = sum_file(tmp / f);
    files[f] = {{"bytes", sum.bytes}, {"crc32", hex32(sum.crc)}};
  }
  for (const auto& [f, sum] : parts)
    files[f] = {{"bytes", sum.first}, {"crc32", hex32(sum.second)}};
  // Only strings and integers, so the checksum over the re-dumped JSON is exact on reload.
  nlohmann::json st = {{"format", kFormat},
                       {"version", kFormatVersion},
                       {"files", files},
                       {"state",
                        {{"step", s.step},
                         {"rng_seed", s.rng_seed},
                         {"rng_offset", s.rng_offset},
                         {"data_cursor", s.data_cursor},
                         {"recipe", s.recipe},
                         {"extra", s.extra.dump()}}}};
  st["checksum"] = "crc32:" + hex32(crc_of(st.dump()));
  io::write_file_atomic((tmp / kState).string(), st.dump(2) + "\n");
  fsync_dir(tmp);
  commit_dir(tmp, final);
  fsync_dir(dir);
}

void CheckpointManager::point_latest(int64_t step) {
  try {
    io::write_file_atomic((fs::path(dir_) / kLatest).string(), step_name(step) + "\n");
  } catch (const std::exception& e) {
    throw Error(cat("checkpoint: step ", step, " was written to ",
                    (fs::path(dir_) / step_name(step)).string(), " but updating '", kLatest,
                    "' failed: ", e.what()));
  }
  prune(step);
}

std::string CheckpointManager::save(const TrainState& s) {
  MYRIAD_CHECK(s.step >= 0, "checkpoint save: negative step ", s.step);
  remove_debris();  // only the writer cleans: a reader must not delete a live save's temp dir
  const fs::path dir(dir_), final = dir / step_name(s.step);
  fs::path tmp = final;
  tmp += ".tmp-" + unique_suffix();
  try {
    std::error_code ec;
    MYRIAD_CHECK(fs::create_directory(tmp, ec), tmp.string(),
                 ": cannot create directory: ", ec.message());
    write_step(tmp, s, {});
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw Error(cat("checkpoint: saving step ", s.step, " to ", dir_, " failed: ", e.what(),
                    " (earlier checkpoints and '", kLatest, "' are untouched)"));
  }
  point_latest(s.step);
  return final.string();
}

std::string CheckpointManager::save(const TrainState& s, dist::Comm& comm,
                                    const std::map<std::string, Tensor>& part) {
  const int rank = comm.rank(), ranks = comm.size();
  const fs::path dir(dir_), final = dir / step_name(s.step);
  // Rank 0 makes the temp dir and names it to the others; an empty name means it failed.
  char name[4096] = {};
  std::string why;
  if (rank == 0) {
    try {
      MYRIAD_CHECK(s.step >= 0, "checkpoint save: negative step ", s.step);
      remove_debris();
      fs::path tmp = final;
      tmp += ".tmp-" + unique_suffix();
      std::error_code ec;
      MYRIAD_CHECK(fs::create_directory(tmp, ec), tmp.string(),
                   ": cannot create directory: ", ec.message());
      MYRIAD_CHECK(tmp.string().size() < sizeof name, tmp.string(), ": path too long");
      std::strncpy(name, tmp.c_str(), sizeof name - 1);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  comm.broadcast("checkpoint_dir", name, sizeof name, 0);
  const fs::path tmp = name;
  auto fail = [&](const std::string& what) {
    if (rank == 0 && !tmp.empty()) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    throw Error(cat("checkpoint: saving step ", s.step, " to ", dir_, " failed: ", what,
                    " (earlier checkpoints and '", kLatest, "' are untouched)"));
  };
  if (tmp.empty()) fail(rank == 0 ? why : "rank 0 could not create the step dir");
  // Every rank writes and sums its part where it is written.
  struct Sum {
    int64_t ok = 0;
    uint64_t bytes = 0;
    uint32_t crc = 0;
  } mine;
  try {
    std::map<std::string, Tensor> ts;
    for (const auto& [k, t] : part) ts.emplace(kOptPrefix + k, t);
    const fs::path f = tmp / part_name(rank, ranks);
    safetensors::save(f.string(), ts, {{"format", kFormat}});
    const FileSum fsum = sum_file(f);
    mine = {1, fsum.bytes, fsum.crc};
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint: rank %d: %s\n", rank, e.what());
  }
  std::vector<Sum> sums(static_cast<size_t>(ranks));
  comm.all_gather("checkpoint_parts", &mine, sums.data(),
                  std::vector<size_t>(static_cast<size_t>(ranks), sizeof(Sum)));
  for (int r = 0; r < ranks; ++r)
    if (!sums[static_cast<size_t>(r)].ok) fail(cat("rank ", r, " could not write its part"));
  int64_t ok = 1;
  if (rank == 0) {
    std::map<std::string, std::pair<uint64_t, uint32_t>> parts;
    for (int r = 0; r < ranks; ++r)
      parts[part_name(r, ranks)] = {sums[static_cast<size_t>(r)].bytes,
                                    sums[static_cast<size_t>(r)].crc};
    try {
      write_step(tmp, s, parts);
    } catch (const std::exception& e) {
      why = e.what();
      ok = 0;
    }
  }
  comm.broadcast("checkpoint_commit", &ok, sizeof ok, 0);
  if (!ok) fail(rank == 0 ? why : "rank 0 could not commit the step dir");
  if (rank == 0) point_latest(s.step);
  return final.string();
}

void CheckpointManager::prune(int64_t saved_step) const {
  // Newer dirs belong to an abandoned timeline (a rollback or --resume of an older step); they are
  // left alone rather than deleted.
  std::vector<std::string> older;
  for (const auto& p : list())
    if (*parse_step(fs::path(p).filename().string()) <= saved_step) older.push_back(p);
  if (older.size() <= static_cast<size_t>(keep_last_)) return;
  for (size_t i = 0; i + keep_last_ < older.size(); ++i) remove_dir(older[i]);
  fsync_dir(dir_);
}

TrainState CheckpointManager::load(const std::string& step_dir) const {
  fs::path p(step_dir);
  std::error_code ec;
  if (!fs::exists(p, ec) && plain_name(step_dir)) p = fs::path(dir_) / step_dir;
  MYRIAD_CHECK(fs::is_directory(p, ec), "checkpoint ", p.string(), ": not a directory");
  const std::string where = "checkpoint " + p.string();

  // state.json: parse, then verify its own checksum before trusting anything in it.
  const fs::path sp = p / kState;
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(io::read_file(sp.string(), uint64_t(1) << 30));
  } catch (const nlohmann::json::parse_error& e) {  // e.what() quotes the text: keep it short
    throw Error(cat(where, ": ", kState, " is not valid JSON near byte ", e.byte,
                    " (truncated or corrupt)"));
  }
  MYRIAD_CHECK(st.is_object() && st.contains("checksum") && st["checksum"].is_string(), where, ": ",
               kState, " has no checksum (corrupt, or not a Myriad training checkpoint)");
  const std::string recorded = st["checksum"].get<std::string>();
  st.erase("checksum");
  const std::string actual = "crc32:" + hex32(crc_of(st.dump()));
  MYRIAD_CHECK(recorded == actual, where, ": ", kState, " content checksum mismatch (records ",
               recorded, ", contents hash to ", actual, "): the file is corrupt");
  MYRIAD_CHECK(st.value("format", "") == kFormat, where, ": ", kState, " has format '",
               st.value("format", ""), "', expected '", kFormat, "'");
  const int version = st.value("version", 0);
  MYRIAD_CHECK(version >= 1 && version <= kFormatVersion, where, ": ", kState,
               " has format version ", version, "; this build reads 1..", kFormatVersion);

  TrainState s;
  try {
    // Every listed file: size first (truncation), then content.
    const auto& files = st.at("files");
    for (const char* req : {kModel, kTrain})
      MYRIAD_CHECK(files.contains(req), where, ": ", kState, " lists no ", req);
    for (const auto& [f, info] : files.items()) {
      MYRIAD_CHECK(plain_name(f), where, ": ", kState, " lists a bad file name '", f, "'");
      const fs::path fp = p / f;
      MYRIAD_CHECK(fs::is_regular_file(fp, ec), where, ": ", f, " is missing");
      const uint64_t want = info.at("bytes").get<uint64_t>(), have = fs::file_size(fp, ec);
      MYRIAD_CHECK(have >= want, where, ": ", f, " is truncated: ", have, " bytes, expected ",
                   want);
      MYRIAD_CHECK(have == want, where, ": ", f, " has ", have, " bytes, expected ", want);
      const std::string crc = hex32(sum_file(fp).crc), want_crc = info.at("crc32");
      MYRIAD_CHECK(crc == want_crc, where, ": ", f, " content checksum mismatch (crc32 ", crc,
                   ", expected ", want_crc, "): the file is corrupt");
    }
    const auto& js = st.at("state");
    s.step = js.at("step").get<int64_t>();
    s.rng_seed = js.at("rng_seed").get<uint64_t>();
    s.rng_offset = js.at("rng_offset").get<uint64_t>();
    s.data_cursor = js.at("data_cursor").get<std::string>();
    s.recipe = js.at("recipe").get<std::string>();
    s.extra = nlohmann::json::parse(js.at("extra").get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat(where, ": ", kState, " is malformed: ", e.what()));
  }
  if (auto dir_step = parse_step(p.filename().string()))
    MYRIAD_CHECK(*dir_step == s.step, where, ": ", kState, " records step ", s.step);

  auto m = safetensors::SafetensorsFile::open((p / kModel).string());
  for (const auto& n : m.names()) s.model.emplace(n, m.load(n));
  const std::string opt = kOptPrefix, bal = kBalPrefix;
  // train_state.safetensors, then the data-parallel ranks' optimizer parts (any number: the
  // state is keyed by parameter name, so it loads at any rank count).
  std::vector<std::string> sources = {kTrain};
  for (const auto& [f, info] : st.at("files").items())
    if (is_part(f)) sources.push_back(f);
  for (const std::string& src : sources) {
    auto t = safetensors::SafetensorsFile::open((p / src).string());
    for (const auto& n : t.names()) {
      if (n.rfind(opt, 0) == 0) {
        MYRIAD_CHECK(s.optimizer.emplace(n.substr(opt.size()), t.load(n)).second, where, ": ", src,
                     " repeats the optimizer tensor '", n, "'");
      } else if (n.rfind(bal, 0) == 0 && src == kTrain) {
        s.balancer.emplace(n.substr(bal.size()), t.load(n));
      } else {
        throw Error(cat(where, ": ", src, " holds an unexpected tensor '", n, "'"));
      }
    }
  }
  return s;
}

std::optional<TrainState> CheckpointManager::load_latest(bool fall_back) {
  const std::vector<std::string> dirs = list();
  const fs::path lp = fs::path(dir_) / kLatest;
  std::error_code ec;
  std::string target;
  if (fs::exists(lp, ec)) {
    target = io::read_file(lp.string(), 4096);
    while (!target.empty() && (target.back() == '\n' || target.back() == ' ')) target.pop_back();
    MYRIAD_CHECK(parse_step(target), lp.string(), ": names '", target,
                 "', which is not a step directory (corrupt pointer)");
  } else if (!dirs.empty()) {
    target = fs::path(dirs.back()).filename().string();  // crashed before the first pointer
  } else {
    return std::nullopt;
  }
  const int64_t newest = *parse_step(target);
  std::vector<std::string> candidates = {(fs::path(dir_) / target).string()};
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
    if (*parse_step(fs::path(*it).filename().string()) < newest) candidates.push_back(*it);

  std::string errors;
  for (size_t i = 0; i < candidates.size(); ++i) {
    try {
      return load(candidates[i]);
    } catch (const Error& e) {
      if (!fall_back)
        throw Error(cat(e.what(), " [the newest checkpoint is unusable; load_latest(true) would ",
                        "fall back to an older one]"));
      std::fprintf(stderr, "warning: %s; trying an older checkpoint\n", e.what());
      errors += cat("\n  ", e.what());
    }
  }
  throw Error(cat("checkpoint ", dir_, ": no loadable checkpoint:", errors));
}

}  // namespace myriad::train
