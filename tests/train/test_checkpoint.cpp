// Training checkpoints: bit-exact round trips, Decoder::load of a step dir, pruning, refusal of
// truncated and bit-flipped files, crash debris, a full disk (RLIMIT_FSIZE in a child), SIGKILL
// at random points of a save loop, and StopSignal.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "io/file.h"
#include "model/config.h"
#include "model/decoder.h"
#include "train/checkpoint.h"
#include "train/signals.h"

namespace myriad::train {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path d = fs::path(::testing::TempDir()) / "myriad_test_ckpt" /
               (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return {};
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Distinct, non-trivial bytes in every tensor (including NaN payloads and -0 for f32).
Tensor patterned(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  std::mt19937 g(seed);
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(g());
  return t;
}

TrainState sample_state(int64_t step, int64_t model_elems = 1000) {
  TrainState s;
  s.step = step;
  const auto u = static_cast<uint32_t>(step);
  s.model["model.embed_tokens.weight"] = patterned({model_elems / 10, 10}, DType::F32, u);
  s.model["model.norm.weight"] = patterned({10}, DType::BF16, u + 1);
  s.model["model.layers.0.mlp.gate.e_score_correction_bias"] = patterned({4}, DType::F32, u + 2);
  s.optimizer["adam.m.model.norm.weight"] = patterned({10}, DType::F32, u + 3);
  s.optimizer["adam.v.model.norm.weight"] = patterned({10}, DType::F32, u + 4);
  s.optimizer["muon.step"] = Tensor::from_ints(std::vector<int64_t>{step}, {1});
  s.optimizer["empty"] = Tensor::empty({0, 3}, DType::F32);
  s.balancer["layer0.load_ema"] = patterned({4}, DType::F64, u + 5);
  s.rng_seed = 0xfedcba9876543210ull;  // above INT64_MAX
  s.rng_offset = 12345 + static_cast<uint64_t>(step);
  s.data_cursor = R"({"shard": 3, "offset": 98765, "name": "wörds\"\n"})";
  s.recipe = "[train]\nlr = 1.1e-3\nname = \"tiny\" # comment\n";
  s.extra = {{"loss_ema", 2.718281828459045}, {"skips", 2}, {"tags", {"a", "b"}}};
  return s;
}

void expect_same_tensors(const std::map<std::string, Tensor>& a,
                         const std::map<std::string, Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    ASSERT_NE(it, b.end()) << what << ": " << name;
    const Tensor& u = it->second;
    EXPECT_EQ(t.dtype(), u.dtype()) << name;
    EXPECT_EQ(t.shape(), u.shape()) << name;
    ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(t.data_ptr(), u.data_ptr(), t.nbytes()), 0) << name;
    }
  }
}

void expect_same(const TrainState& a, const TrainState& b) {
  EXPECT_EQ(a.step, b.step);
  expect_same_tensors(a.model, b.model, "model");
  expect_same_tensors(a.optimizer, b.optimizer, "optimizer");
  expect_same_tensors(a.balancer, b.balancer, "balancer");
  EXPECT_EQ(a.rng_seed, b.rng_seed);
  EXPECT_EQ(a.rng_offset, b.rng_offset);
  EXPECT_EQ(a.data_cursor, b.data_cursor);
  EXPECT_EQ(a.recipe, b.recipe);
  EXPECT_EQ(a.extra, b.extra);
}

std::string latest_of(const fs::path& d) {
  return io::read_file((d / "latest").string());
}

std::vector<std::string> names_in(const fs::path& d) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Checkpoint, RoundTripIsBitExact) {
  fs::path d = temp_dir() / "ckpt";
  CheckpointManager m(d.string());
  EXPECT_FALSE(m.load_latest().has_value());
  EXPECT_TRUE(m.list().empty());

  TrainState s = sample_state(123);
  std::string p = m.save(s);
  EXPECT_EQ(p, (d / "step-000000123").string());
  EXPECT_EQ(latest_of(d), "step-000000123\n");
  EXPECT_EQ(names_in(p), (std::vector<std::string>{"model.safetensors", "state.json",
                                                   "train_state.safetensors"}));
  EXPECT_EQ(m.list(), std::vector<std::string>{p});

  auto back = m.load_latest();
  ASSERT_TRUE(back.has_value());
  expect_same(s, *back);
  expect_same(s, m.load("step-000000123"));  // a name inside dir() works too
  expect_same(s, CheckpointManager(d.string()).load(p));
}

TEST(Checkpoint, StepDirLoadsAsAModel) {
  fs::path d = temp_dir();
  const model::ModelConfig c = model::tiny();
  model::Decoder dec = model::Decoder::random(c, 7);
  TrainState s;
  s.step = 10;
  s.model = dec.weights().tensors();
  s.extra["config"] = nlohmann::json::parse(c.to_json());
  CheckpointManager m(d.string());
  std::string p = m.save(s);
  ASSERT_TRUE(fs::exists(fs::path(p) / "config.json"));
  model::Decoder back = model::Decoder::load(p);
  expect_same_tensors(dec.weights().tensors(), back.weights().tensors(), "decoder");
  expect_same(s, m.load(p));

  // The config may also come as JSON text, written verbatim.
  s.step = 11;
  s.extra["config"] = c.to_json();
  p = m.save(s);
  EXPECT_EQ(io::read_file((fs::path(p) / "config.json").string()), c.to_json());
  EXPECT_EQ(model::Decoder::load(p).config().to_json(), c.to_json());
}

TEST(Checkpoint, KeepsTheLastN) {
  fs::path d = temp_dir();
  CheckpointManager m(d.string(), 2);
  for (int64_t step : {1, 2, 3, 4, 5}) m.save(sample_state(step));
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"latest", "step-000000004", "step-000000005"}));
  EXPECT_EQ(latest_of(d), "step-000000005\n");
  expect_same(sample_state(5), *m.load_latest());

  // Re-saving a step replaces it (an atomic exchange), without touching the others.
  TrainState s = sample_state(5);
  s.recipe = "replaced";
  s.model.erase("model.norm.weight");
  m.save(s);
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"latest", "step-000000004", "step-000000005"}));
  expect_same(s, *m.load_latest());

  // After a rollback to step 4, step 5 belongs to an abandoned timeline: not counted, not deleted.
  m.save(sample_state(4));
  EXPECT_EQ(latest_of(d), "step-000000004\n");
  EXPECT_EQ(m.list().size(), 2u);
  expect_same(sample_state(4), *m.load_latest());

  EXPECT_TRUE(has(error_of([&] { CheckpointManager(d.string(), 0); }), "keep_last"));
}

// Damages `file` in a fresh copy of a good checkpoint and returns the load error.
enum class Damage { Truncate, FlipByte };
std::string damaged_load_error(const fs::path& good, const fs::path& work, const std::string& file,
                               Damage how) {
  fs::remove_all(work);
  fs::create_directories(work);
  fs::copy(good, work / good.filename(), fs::copy_options::recursive);
  fs::path f = work / good.filename() / file;
  const auto n = fs::file_size(f);
  if (how == Damage::Truncate) {
    fs::resize_file(f, n / 2);
  } else {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(n / 2));
    char b = 0;
    io.read(&b, 1);
    b = static_cast<char>(b ^ 0x01);  // a single bit
    io.seekp(static_cast<std::streamoff>(n / 2));
    io.write(&b, 1);
  }
  return error_of([&] { CheckpointManager(work.string()).load(good.filename().string()); });
}

TEST(Checkpoint, RefusesTruncatedAndBitFlippedFiles) {
  fs::path d = temp_dir();
  TrainState s = sample_state(7, 100000);
  s.extra["config"] = nlohmann::json::parse(model::tiny().to_json());
  const fs::path good = CheckpointManager((d / "good").string()).save(s);
  int refused = 0;
  for (const std::string file :
       {"model.safetensors", "train_state.safetensors", "config.json", "state.json"}) {
    std::string e = damaged_load_error(good, d / "work", file, Damage::Truncate);
    EXPECT_TRUE(has(e, file) && has(e, "step-000000007")) << e;
    EXPECT_TRUE(has(e, file == "state.json" ? "(truncated or corrupt)" : "truncated")) << e;
    refused += !e.empty();

    e = damaged_load_error(good, d / "work", file, Damage::FlipByte);
    EXPECT_TRUE(has(e, file) && has(e, "corrupt")) << e;
    if (file != "state.json") {
      EXPECT_TRUE(has(e, "content checksum mismatch (crc32 ")) << e;
    }
    refused += !e.empty();
  }
  EXPECT_EQ(refused, 8);

  // A file missing altogether, and trailing bytes.
  fs::remove(d / "work" / "step-000000007" / "config.json");
  fs::copy_file(good / "state.json", d / "work" / "step-000000007" / "state.json",
                fs::copy_options::overwrite_existing);
  EXPECT_TRUE(has(error_of([&] { CheckpointManager((d / "work").string()).load_latest(); }),
                  "config.json is missing"));
  { std::ofstream(good / "model.safetensors", std::ios::app) << "x"; }
  EXPECT_TRUE(has(error_of([&] { CheckpointManager((d / "good").string()).load(good); }),
                  "model.safetensors has "));
}

TEST(Checkpoint, CorruptNewestFallsBackOnlyWhenAsked) {
  fs::path d = temp_dir();
  CheckpointManager m(d.string());
  m.save(sample_state(1));
  std::string p2 = m.save(sample_state(2));
  fs::resize_file(fs::path(p2) / "train_state.safetensors", 10);
  std::string e = error_of([&] { m.load_latest(); });
  EXPECT_TRUE(has(e, "train_state.safetensors is truncated") && has(e, "newest")) << e;
  auto back = m.load_latest(/*fall_back=*/true);
  ASSERT_TRUE(back.has_value());
  expect_same(sample_state(1), *back);

  // A garbage pointer is refused too.
  io::write_file_atomic((d / "latest").string(), "../../etc\n");
  EXPECT_TRUE(has(error_of([&] { m.load_latest(true); }), "not a step directory"));
  // With no pointer (a crash before the first one), the newest step dir is used.
  fs::remove(d / "latest");
  EXPECT_TRUE(has(error_of([&] { m.load_latest(); }), "truncated"));
  expect_same(sample_state(1), *m.load_latest(true));
}

TEST(Checkpoint, CrashDebrisIsIgnoredAndCleaned) {
  fs::path d = temp_dir();
  CheckpointManager(d.string()).save(sample_state(3));
  // What a writer killed mid-save leaves: a temp step dir, a half-pruned dir, a pointer temp.
  fs::create_directories(d / "step-000000009.tmp-4242-0");
  { std::ofstream(d / "step-000000009.tmp-4242-0" / "model.safetensors") << "partial"; }
  fs::create_directories(d / "step-000000001.trash-4242-1");
  { std::ofstream(d / "latest.tmp.4242.7") << "step-0000"; }
  fs::create_directories(d / "unrelated");  // not ours: left alone

  const auto debris = names_in(d);
  CheckpointManager probe(d.string());  // a reader: ignores the debris and leaves it alone
  EXPECT_EQ(probe.list(), std::vector<std::string>{(d / "step-000000003").string()});
  expect_same(sample_state(3), *probe.load_latest());
  EXPECT_EQ(names_in(d), debris);
  probe.save(sample_state(4));  // the writer cleans it
  EXPECT_EQ(names_in(d),
            (std::vector<std::string>{"latest", "step-000000003", "step-000000004", "unrelated"}));
}

// Runs f in a forked child; returns its exit status (f's return value, or 100 + signal).
template <class F>
int in_child(F&& f) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 99;
    try {
      rc = f();
    } catch (...) {
    }
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

TEST(Checkpoint, FullDiskLeavesThePreviousCheckpoint) {
  fs::path d = temp_dir();
  CheckpointManager m(d.string(), 1);
  const TrainState prev = sample_state(1);
  m.save(prev);
  const auto before = names_in(d);

  // RLIMIT_FSIZE makes writes past 256 KiB fail with EFBIG, as a full disk fails with ENOSPC;
  // once in the model file, once in the train-state file (after the model was written).
  for (int where = 0; where < 2; ++where) {
    fs::path msg = d.parent_path() / "child_error.txt";
    int rc = in_child([&] {
      std::signal(SIGXFSZ, SIG_IGN);
      struct rlimit r {};
      r.rlim_cur = r.rlim_max = 256 << 10;
      if (::setrlimit(RLIMIT_FSIZE, &r) != 0) return 2;
      TrainState big = sample_state(2, where == 0 ? 400000 : 1000);
      if (where == 1) big.optimizer["adam.m.big"] = patterned({400000}, DType::F32, 9);
      try {
        m.save(big);
      } catch (const Error& e) {
        std::ofstream(msg) << e.what();
        return 0;
      }
      return 1;  // should not succeed
    });
    ASSERT_EQ(rc, 0) << "child exit " << rc;
    std::string e = io::read_file(msg.string());
    EXPECT_TRUE(has(e, "saving step 2") && has(e, "File too large") && has(e, "untouched")) << e;
    EXPECT_TRUE(has(e, where == 0 ? "model.safetensors" : "train_state.safetensors")) << e;
    EXPECT_EQ(names_in(d), before);  // no temp dir left, step 1 and `latest` unchanged
    EXPECT_EQ(latest_of(d), "step-000000001\n");
    expect_same(prev, *CheckpointManager(d.string()).load_latest());
  }
}

// Writes `text` to a /proc file (uid_map etc.).
bool write_proc(const char* path, const std::string& text) {
  int fd = ::open(path, O_WRONLY);
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

bool same_bytes(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [n, t] : a) {
    auto it = b.find(n);
    if (it == b.end() || it->second.shape() != t.shape() || it->second.dtype() != t.dtype() ||
        std::memcmp(it->second.data_ptr(), t.data_ptr(), t.nbytes()) != 0)
      return false;
  }
  return true;
}

// A real ENOSPC: a 1.5 MiB tmpfs mounted in a private user + mount namespace (skipped where the
// sandbox forbids that).
TEST(Checkpoint, FullTmpfsLeavesThePreviousCheckpoint) {
  const fs::path disk = temp_dir() / "disk";
  fs::create_directories(disk);
  const TrainState prev = sample_state(1, 100000), big = sample_state(2, 300000),
                   small = sample_state(3, 1000);
  const fs::path msg = disk.parent_path() / "child_error.txt";
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  int rc = in_child([&] {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return 77;
    if (!write_proc("/proc/self/setgroups", "deny") ||
        !write_proc("/proc/self/uid_map", cat("0 ", uid, " 1")) ||
        !write_proc("/proc/self/gid_map", cat("0 ", gid, " 1")))
      return 77;
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 77;
    if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=1536k") != 0) return 77;
    CheckpointManager m(disk.string(), 2);
    m.save(prev);  // 400 KB: fits
    try {
      m.save(big);  // 1.2 MB more: does not
      return 1;
    } catch (const Error& e) {
      std::ofstream(msg) << e.what();
    }
    if (io::read_file((disk / "latest").string()) != "step-000000001\n") return 2;
    if (m.list() != std::vector<std::string>{(disk / "step-000000001").string()}) return 3;
    for (const auto& e : fs::directory_iterator(disk))
      if (has(e.path().filename().string(), ".tmp")) return 4;  // the temp dir is gone
    auto back = m.load_latest();
    if (!back || !same_bytes(back->model, prev.model) || back->recipe != prev.recipe) return 5;
    m.save(small);  // the space came back
    return m.load_latest()->step == 3 ? 0 : 6;
  });
  if (rc == 77) GTEST_SKIP() << "no user namespaces / tmpfs mounts here";
  ASSERT_EQ(rc, 0) << "child check " << rc << " failed";
  const std::string e = io::read_file(msg.string());
  EXPECT_TRUE(has(e, "No space left on device") && has(e, "untouched")) << e;
}

TEST(Checkpoint, SurvivesSigkillAtRandomPoints) {
  fs::path d = temp_dir();
  // The child's tensors are made here: after fork it only writes bytes and files.
  TrainState s = sample_state(0, 200000);
  // Each save stamps its step into rng_offset and model.norm.weight, so mixed files would show.
  auto stamp = [&](int64_t step) {
    s.step = step;
    s.rng_offset = static_cast<uint64_t>(step);
    std::fill_n(s.model["model.norm.weight"].data<uint16_t>(), 10, uint16_t(step));
  };
  stamp(0);
  CheckpointManager(d.string(), 2).save(s);
  std::mt19937 rng(1234);
  int kills = 0, debris_seen = 0;
  int64_t last_step = 0;
  for (int round = 0; round < 10; ++round) {
    const int64_t first = last_step + 1;
    pid_t pid = ::fork();
    if (pid == 0) {
      try {
        CheckpointManager m(d.string(), 2);
        for (int64_t step = first;; ++step) {
          stamp(step);
          m.save(s);
        }
      } catch (...) {
      }
      ::_exit(1);
    }
    ::usleep(std::uniform_int_distribution<int>(1000, 250000)(rng));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the save loop stopped by itself";
    ++kills;
    for (const auto& f : names_in(d)) debris_seen += has(f, ".tmp") || has(f, ".trash-");

    // Every complete step dir verifies, and the newest is consistent with its step.
    CheckpointManager m(d.string(), 2);
    for (const auto& p : m.list()) EXPECT_NO_THROW(m.load(p)) << p;
    auto back = m.load_latest();
    ASSERT_TRUE(back.has_value());
    EXPECT_GE(back->step, last_step);
    EXPECT_EQ(back->rng_offset, static_cast<uint64_t>(back->step));
    EXPECT_EQ(back->model.at("model.norm.weight").data<uint16_t>()[9], uint16_t(back->step));
    EXPECT_EQ(back->recipe, s.recipe);
    last_step = back->step;
  }
  std::cout << "[ sigkill ] " << kills << " kills, debris left by " << debris_seen
            << ", reached step " << last_step << "\n";
}

TEST(StopSignal, SetsOnSigtermAndSigintAndRestores) {
  struct sigaction before {};
  ::sigaction(SIGTERM, nullptr, &before);
  {
    StopSignal stop;
    EXPECT_FALSE(stop.requested());
    EXPECT_TRUE(has(error_of([] { StopSignal again; }), "already active"));
    std::raise(SIGTERM);
    EXPECT_TRUE(stop.requested());
    EXPECT_EQ(stop.signal_number(), SIGTERM);
    stop.clear();
    EXPECT_FALSE(stop.requested());
    std::raise(SIGINT);
    EXPECT_EQ(stop.signal_number(), SIGINT);
  }
  struct sigaction after {};
  ::sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
  {
    StopSignal fresh;  // a new one may be installed, and starts cleared
    EXPECT_FALSE(fresh.requested());
  }

  // A second signal while a stop is pending kills the process (a forced stop).
  int rc = in_child([] {
    StopSignal stop;
    std::raise(SIGTERM);
    std::raise(SIGTERM);
    return 0;
  });
  EXPECT_EQ(rc, 100 + SIGTERM);
}

}  // namespace
}  // namespace myriad::train
