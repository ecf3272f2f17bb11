// Training checkpoints (TRAINING.md §4 "Loss spikes" rollback; pretraining issue item 6).
// Layout of `dir`:
//   step-000000123/model.safetensors        HF names; with config.json, Decoder::load reads it
//   step-000000123/train_state.safetensors  "optimizer/<name>" and "balancer/<name>" tensors
//   step-000000123/optimizer-00001-of-00004.safetensors  data-parallel (ZeRO-1) saves: each
//                                           rank's "optimizer/<name>" tensors, written by it
//   step-000000123/config.json              when extra["config"] is given
//   step-000000123/state.json               step, RNG, data cursor, recipe, extra, the size and
//                                           CRC-32 of every other file, and its own checksum
//   latest                                  the name of the newest complete step dir
// A save is written into step-….tmp-<pid>-<n>/ (every file fsynced), renamed into place (the
// commit point), the parent fsynced, `latest` replaced atomically, and only then are old step
// dirs pruned (renamed to ….trash-… first, so a crash never leaves a half-deleted step dir).
// Any failure (ENOSPC, EFBIG, ...) removes the temp dir and leaves earlier checkpoints and
// `latest` untouched. Leftover temp/trash dirs of a crashed writer are ignored by readers and
// removed by the next save. One writer per directory; readers (e.g. an eval process) may share it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/comm.h"

namespace myriad::train {

struct TrainState {
  int64_t step = 0;
  std::map<std::string, Tensor> model;      // HF checkpoint names
  std::map<std::string, Tensor> optimizer;  // moments etc., any names
  std::map<std::string, Tensor> balancer;   // e.g. expert bias state
  uint64_t rng_seed = 0, rng_offset = 0;
  std::string data_cursor;  // opaque JSON text
  std::string recipe;       // opaque TOML text
  nlohmann::json extra;     // extra["config"] (object or JSON text) is also written as config.json
};

class CheckpointManager {
 public:
  static constexpr int kFormatVersion = 1;

  // Creates `dir` if needed.
  explicit CheckpointManager(std::string dir, int keep_last = 3);

  const std::string& dir() const { return dir_; }
  // Removes debris (temp/trash dirs) of a crashed writer, writes the step dir for s.step
  // (replacing one of the same step), points `latest` at it and prunes to the newest keep_last
  // dirs up to this step. Returns the step dir's path. Tensors may live
  // on any device; they are copied to the host.
  std::string save(const TrainState& s);
  // Data-parallel save (ZeRO-1): every rank of comm calls it for the same step. Rank 0's `s`
  // holds everything but the sharded optimizer state; each rank writes its `part` (the moments
  // of the parameters it owns) as optimizer-<rank>-of-<ranks>.safetensors into the one temp
  // dir and sums it there; rank 0 lists every part in state.json and commits as save() does.
  // A failure on any rank leaves earlier checkpoints untouched and raises on every rank.
  // load() merges the parts, so a checkpoint resumes at any rank count.
  std::string save(const TrainState& s, dist::Comm& comm,
                   const std::map<std::string, Tensor>& part);
  // The checkpoint `latest` names (or the newest step dir when there is no `latest`); nullopt
  // when the directory holds none. A corrupt one raises an error naming the file and the
  // mismatch; with fall_back, the error is reported on stderr and older step dirs are tried.
  std::optional<TrainState> load_latest(bool fall_back = false);
  // Loads and verifies one step dir (a path, or a name inside dir()). Tensors come back on the
  // host, bit-exact.
  TrainState load(const std::string& step_dir) const;
  // Complete step dirs (full paths), oldest first.
  std::vector<std::string> list() const;
  // The step dir name for a step: "step-000000123".
  static std::string step_name(int64_t step);

 private:
  void remove_debris() const;
  void write_step(const std::filesystem::path& tmp, const TrainState& s,
                  const std::map<std::string, std::pair<uint64_t, uint32_t>>& parts);
  void point_latest(int64_t step);
  void prune(int64_t saved_step) const;
  std::string dir_;
  int keep_last_;
};

}  // namespace myriad::train
