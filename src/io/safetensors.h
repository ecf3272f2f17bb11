// safetensors checkpoints: a validating reader over an mmap, a sharded-directory reader (HF's
// model.safetensors.index.json), and atomic writers for single files and shards.
// File layout: 8-byte little-endian header length N, N bytes of JSON header (padded with spaces),
// then the data section; each header entry gives dtype, shape and [begin, end) data offsets.
// Every malformed input raises a myriad::Error naming the file and, where one is involved, the
// tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace myriad::safetensors {

using Metadata = std::map<std::string, std::string>;

// The largest header we accept (the format's own limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string st_dtype;     // as in the file: "F32", "BF16", "BOOL", "F8_E4M3", ...
  DType dtype = DType::U8;  // Myriad's dtype; BOOL reads as u8
  bool supported = true;    // false for valid safetensors dtypes Myriad has no DType for (F8, I8..)
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
  uint64_t nbytes() const { return end - begin; }
};

// A tensor's bytes as stored, for any dtype of the format (F8_E4M3, F8_E5M2, F8_E8M0, I8, U16, ...
// as well as the ones load() converts): quantized checkpoints are read this way. `bytes` points
// into the file's mapping and stays valid while the SafetensorsFile or Checkpoint it came from (or
// a copy of it) lives.
struct RawTensor {
  std::string st_dtype{};  // as in the file
  Shape shape{};
  std::span<const uint8_t> bytes{};
  int64_t numel() const { return shape_numel(shape); }
};

// Bytes per element of a safetensors dtype name ("F8_E4M3" -> 1, "I32" -> 4); 0 for a name the
// format does not have.
size_t st_dtype_size(std::string_view st_dtype);

// One .safetensors file. Copies share the mapping; load() copies out of it.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  // mmaps and validates the file.
  static SafetensorsFile open(const std::string& path);
  // Validates an in-memory image (copied); `name` stands in for the file name in messages.
  static SafetensorsFile from_bytes(std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, TensorInfo>& infos() const { return infos_; }
  const Metadata& metadata() const { return metadata_; }
  // A new contiguous tensor holding a copy of the bytes.
  Tensor load(const std::string& name, Device device = kCPU) const;
  // The raw bytes of a tensor inside the mapping (valid while this object or a copy lives).
  std::span<const uint8_t> raw(const std::string& name) const;
  // The tensor as stored, of any dtype (see RawTensor).
  RawTensor load_raw(const std::string& name) const;

 private:
  struct Buffer;
  void parse();
  std::string path_;
  std::shared_ptr<const Buffer> buf_;
  const uint8_t* data_ = nullptr;  // start of the data section
  uint64_t data_size_ = 0;
  std::map<std::string, TensorInfo> infos_;
  Metadata metadata_;
};

inline SafetensorsFile open(const std::string& path) {
  return SafetensorsFile::open(path);
}

// A checkpoint: a single .safetensors file, an index json, or a directory holding
// model.safetensors or model.safetensors.index.json (the former wins, as in transformers).
// Shards are opened lazily, on the first info()/load() of a tensor they hold. Thread-safe.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return weight_map_.count(name) != 0; }
  TensorInfo info(const std::string& name) const;
  Tensor load(const std::string& name, Device device = kCPU) const;
  // The tensor as stored, of any dtype, without a copy (see RawTensor); opens its shard.
  RawTensor load_raw(const std::string& name) const;
  // The single file's metadata, or the index's "metadata" object (values as JSON text unless
  // they are strings).
  const Metadata& metadata() const { return metadata_; }
  // The file a tensor lives in (relative to the directory).
  const std::string& file_of(const std::string& name) const;
  size_t num_shards_opened() const;

 private:
  const SafetensorsFile& shard_for(const std::string& name) const;
  std::string path_, dir_, index_name_;  // index_name_ empty for a single file
  std::map<std::string, std::string> weight_map_;
  Metadata metadata_;
  struct Shards {
    std::mutex mu;
    std::map<std::string, SafetensorsFile> open;
  };
  std::shared_ptr<Shards> shards_ = std::make_shared<Shards>();
};

// Writes tensors (any device; copied to the host) in sorted name order, atomically: a temp file
// in the same directory, fsync, rename, fsync of the directory.
void save(const std::string& path, const std::map<std::string, Tensor>& tensors,
          const Metadata& metadata = {});
// The serialised file image (what save() writes).
std::vector<uint8_t> serialize(const std::map<std::string, Tensor>& tensors,
                               const Metadata& metadata = {});

// A tensor given as stored bytes, for writing dtypes Myriad has no DType for (F8_E4M3, I8, ...);
// bytes.size() must equal numel * st_dtype_size(st_dtype).
struct RawEntry {
  std::string st_dtype{};
  Shape shape{};
  std::vector<uint8_t> bytes{};
};
// The file image of raw tensors (names sorted, as serialize()), e.g. a quantized checkpoint.
std::vector<uint8_t> serialize_raw(const std::map<std::string, RawEntry>& tensors,
                                   const Metadata& metadata = {});
// Writes serialize_raw()'s image atomically, as save().
void save_raw(const std::string& path, const std::map<std::string, RawEntry>& tensors,
              const Metadata& metadata = {});

// Writes `dir`/model.safetensors when everything fits in max_shard_bytes, otherwise
// `dir`/model-0000i-of-0000n.safetensors (tensors packed in name order; a tensor larger than the
// limit gets a shard of its own) plus model.safetensors.index.json. Stale files of the other
// layout or of an earlier save are removed. Returns the files written (relative to dir).
std::vector<std::string> save_sharded(const std::string& dir,
                                      const std::map<std::string, Tensor>& tensors,
                                      uint64_t max_shard_bytes, const Metadata& metadata = {});

}  // namespace myriad::safetensors
