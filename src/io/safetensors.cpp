#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/file.h"

namespace myriad::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian");

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct DTypeEntry {
  const char* name;
  DType dtype;
  size_t size;
  bool supported;
};
// Every dtype of the format with a whole-byte size; the unsupported ones can be listed and
// validated but not loaded.
constexpr DTypeEntry kDTypes[] = {
    {"F64", DType::F64, 8, true},     {"F32", DType::F32, 4, true},
    {"F16", DType::F16, 2, true},     {"BF16", DType::BF16, 2, true},
    {"I64", DType::I64, 8, true},     {"I32", DType::I32, 4, true},
    {"U8", DType::U8, 1, true},       {"BOOL", DType::U8, 1, true},
    {"I16", DType::U8, 2, false},     {"I8", DType::U8, 1, false},
    {"U16", DType::U8, 2, false},     {"U32", DType::U8, 4, false},
    {"U64", DType::U8, 8, false},     {"F8_E4M3", DType::U8, 1, false},
    {"F8_E5M2", DType::U8, 1, false}, {"F8_E8M0", DType::U8, 1, false},
};

const char* st_name(DType t) {
  switch (t) {
    case DType::F64:
      return "F64";
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::I64:
      return "I64";
    case DType::I32:
      return "I32";
    case DType::U8:
      return "U8";
  }
  return "?";
}

// JSON nested deeper than this is rejected while parsing, so neither the parser's callers nor
// dump() recurse without bound on hostile input.
constexpr int kMaxJsonDepth = 64;

json parse_json(std::string_view text, const std::string& what) {
  auto depth_guard = [&](int depth, json::parse_event_t, json&) {
    MYRIAD_CHECK(depth <= kMaxJsonDepth, what, " nests deeper than ", kMaxJsonDepth, " levels");
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), depth_guard);
  } catch (const json::exception& e) {
    throw Error(cat(what, " is not valid JSON: ", e.what()));
  }
}

// Reads a non-negative integer that fits in int64 (JSON "1.0" is not an integer).
bool as_count(const json& v, int64_t& out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    out = v.get<int64_t>();
    return true;
  }
  return false;
}

std::string short_dump(const json& v) {
  if (v.is_structured()) return v.is_array() ? "an array" : "an object";
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

}  // namespace

// The file image: an mmap of a file, or an owned copy.
struct SafetensorsFile::Buffer {
  const uint8_t* data = nullptr;
  size_t size = 0;
  void* map = nullptr;
  std::vector<uint8_t> owned;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (map) ::munmap(map, size);
  }
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MYRIAD_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  int rc = ::fstat(fd, &st);
  auto buf = std::make_shared<Buffer>();
  std::string err;
  if (rc != 0)
    err = cat("cannot stat: ", std::strerror(errno));
  else if (!S_ISREG(st.st_mode))
    err = "not a regular file";
  else if (st.st_size > 0) {
    void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED)
      err = cat("mmap failed: ", std::strerror(errno));
    else {
      buf->map = m;
      buf->data = static_cast<const uint8_t*>(m);
      buf->size = static_cast<size_t>(st.st_size);
    }
  }
  ::close(fd);
  MYRIAD_CHECK(err.empty(), path, ": ", err);
  SafetensorsFile f;
  f.path_ = path;
  f.buf_ = std::move(buf);
  f.parse();
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::span<const uint8_t> bytes,
                                            const std::string& name) {
  auto buf = std::make_shared<Buffer>();
  buf->owned.assign(bytes.begin(), bytes.end());
  buf->data = buf->owned.data();
  buf->size = buf->owned.size();
  SafetensorsFile f;
  f.path_ = name;
  f.buf_ = std::move(buf);
  f.parse();
  return f;
}

void SafetensorsFile::parse() {
  const std::string& file = path_;
  const uint64_t size = buf_->size;
  MYRIAD_CHECK(size >= 8, file, ": file is ", size,
               " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, buf_->data, 8);
  MYRIAD_CHECK(n <= kMaxHeaderBytes, file, ": header length ", n, " exceeds the limit of ",
               kMaxHeaderBytes, " bytes");
  MYRIAD_CHECK(n <= size - 8, file, ": header length ", n, " runs past the end of the ", size,
               "-byte file");
  std::string_view text(reinterpret_cast<const char*>(buf_->data) + 8, n);
  MYRIAD_CHECK(!text.empty() && text[0] == '{', file, ": header does not start with '{'");
  json header = parse_json(text, cat(file, ": header"));
  MYRIAD_CHECK(header.is_object(), file, ": header is not a JSON object");
  data_ = buf_->data + 8 + n;
  data_size_ = size - 8 - n;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      MYRIAD_CHECK(entry.is_object(), file, ": __metadata__ is ", short_dump(entry),
                   ", not an object of strings");
      for (const auto& [k, v] : entry.items()) {
        MYRIAD_CHECK(v.is_string(), file, ": __metadata__ value for '", k, "' is ", short_dump(v),
                     ", not a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = cat(file, ": tensor '", name, "'");
    MYRIAD_CHECK(entry.is_object(), where, " entry is ", short_dump(entry), ", not an object");
    TensorInfo info;
    // dtype
    auto it = entry.find("dtype");
    MYRIAD_CHECK(it != entry.end() && it->is_string(), where, " has a missing or non-string dtype");
    info.st_dtype = it->get<std::string>();
    const DTypeEntry* dt = nullptr;
    for (const auto& d : kDTypes)
      if (info.st_dtype == d.name) dt = &d;
    MYRIAD_CHECK(dt, where, " has unknown dtype '", info.st_dtype, "'");
    info.dtype = dt->dtype;
    info.supported = dt->supported;
    // shape, with an overflow-checked byte count
    it = entry.find("shape");
    MYRIAD_CHECK(it != entry.end() && it->is_array(), where, " has a missing or non-array shape");
    // `span` (zero dims counted as 1) bounds every stride a tensor of this shape would get.
    int64_t nbytes = static_cast<int64_t>(dt->size), span = nbytes;
    bool overflow = false;
    for (const auto& d : *it) {
      int64_t v = 0;
      MYRIAD_CHECK(as_count(d, v), where, " shape entry ", short_dump(d), " is not an integer");
      MYRIAD_CHECK(v >= 0, where, " has negative dimension ", v, " in its shape");
      MYRIAD_CHECK(info.shape.size() < 64, where, " shape has more than 64 dimensions");
      info.shape.push_back(v);
      overflow = overflow || __builtin_mul_overflow(nbytes, v, &nbytes) ||
                 __builtin_mul_overflow(span, std::max<int64_t>(v, 1), &span);
    }
    MYRIAD_CHECK(!overflow, where, " shape ", shape_str(info.shape), " of ", info.st_dtype,
                 " overflows 64 bits");
    // data_offsets
    it = entry.find("data_offsets");
    MYRIAD_CHECK(it != entry.end() && it->is_array() && it->size() == 2, where,
                 " data_offsets must be an array of two integers");
    int64_t b = 0, e = 0;
    MYRIAD_CHECK(as_count((*it)[0], b) && as_count((*it)[1], e) && b >= 0 && e >= 0, where,
                 " data_offsets ", short_dump(*it), " are not two non-negative integers");
    info.begin = static_cast<uint64_t>(b);
    info.end = static_cast<uint64_t>(e);
    MYRIAD_CHECK(info.begin <= info.end, where, " data_offsets [", b, ", ", e,
                 "] end before they begin");
    MYRIAD_CHECK(info.end <= data_size_, where, " data_offsets [", b, ", ", e, "] lie outside the ",
                 data_size_, "-byte data section");
    MYRIAD_CHECK(info.nbytes() == static_cast<uint64_t>(nbytes), where, " shape ",
                 shape_str(info.shape), " of ", info.st_dtype, " needs ", nbytes,
                 " bytes but data_offsets [", b, ", ", e, "] span ", info.nbytes());
    infos_.emplace(name, std::move(info));
  }

  // No two non-empty tensors may share bytes.
  std::vector<std::pair<const std::string*, const TensorInfo*>> by_offset;
  for (const auto& [name, info] : infos_)
    if (info.nbytes() > 0) by_offset.emplace_back(&name, &info);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& [pn, p] = by_offset[i - 1];
    const auto& [cn, c] = by_offset[i];
    MYRIAD_CHECK(c->begin >= p->end, file, ": tensors '", *pn, "' [", p->begin, ", ", p->end,
                 "] and '", *cn, "' [", c->begin, ", ", c->end, "] overlap");
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(infos_.size());
  for (const auto& kv : infos_) out.push_back(kv.first);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  MYRIAD_CHECK(it != infos_.end(), path_, ": no tensor '", name, "'");
  return it->second;
}

std::span<const uint8_t> SafetensorsFile::raw(const std::string& name) const {
  const TensorInfo& i = info(name);
  return {data_ + i.begin, i.nbytes()};
}

RawTensor SafetensorsFile::load_raw(const std::string& name) const {
  const TensorInfo& i = info(name);
  return {.st_dtype = i.st_dtype, .shape = i.shape, .bytes = {data_ + i.begin, i.nbytes()}};
}

size_t st_dtype_size(std::string_view st_dtype) {
  for (const auto& d : kDTypes)
    if (st_dtype == d.name) return d.size;
  return 0;
}

Tensor SafetensorsFile::load(const std::string& name, Device device) const {
  const TensorInfo& i = info(name);
  MYRIAD_CHECK(i.supported, path_, ": tensor '", name, "' has dtype ", i.st_dtype,
               ", which Myriad cannot load");
  Tensor t = Tensor::empty(i.shape, i.dtype, kCPU);
  if (i.nbytes() > 0) std::memcpy(t.data_ptr(), data_ + i.begin, i.nbytes());
  return device.is_cpu() ? t : t.to(device);
}

// ---- Checkpoint ----

namespace {

constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";

// model-NNNNN-of-NNNNN.safetensors, the names save_sharded writes.
bool is_shard_name(const std::string& f) {
  const std::string pat = "model-#####-of-#####.safetensors";
  if (f.size() != pat.size()) return false;
  for (size_t i = 0; i < f.size(); ++i)
    if (pat[i] == '#' ? !std::isdigit(static_cast<unsigned char>(f[i])) : f[i] != pat[i])
      return false;
  return true;
}

// A shard name from an index must stay inside the checkpoint directory.
bool safe_relative(const std::string& f) {
  if (f.empty() || f.front() == '/') return false;
  for (const auto& part : fs::path(f))
    if (part == "..") return false;
  return true;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  std::string index, single;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    c.dir_ = path;
    if (fs::exists(fs::path(path) / kSingleName, ec))
      single = (fs::path(path) / kSingleName).string();
    else if (fs::exists(fs::path(path) / kIndexName, ec))
      index = (fs::path(path) / kIndexName).string();
    else
      throw Error(cat(path, ": directory has neither ", kSingleName, " nor ", kIndexName));
  } else {
    c.dir_ = fs::path(path).parent_path().string();
    (path.ends_with(".json") ? index : single) = path;
  }

  if (!single.empty()) {
    SafetensorsFile f = SafetensorsFile::open(single);
    std::string fname = fs::path(single).filename().string();
    for (const auto& n : f.names()) c.weight_map_[n] = fname;
    c.metadata_ = f.metadata();
    c.shards_->open.emplace(fname, std::move(f));
    return c;
  }

  c.index_name_ = fs::path(index).filename().string();
  json j = parse_json(io::read_file(index, kMaxHeaderBytes), index);
  MYRIAD_CHECK(j.is_object(), index, ": not a JSON object");
  auto wm = j.find("weight_map");
  MYRIAD_CHECK(wm != j.end() && wm->is_object(), index, ": missing or non-object weight_map");
  for (const auto& [name, file] : wm->items()) {
    MYRIAD_CHECK(file.is_string(), index, ": weight_map entry for '", name, "' is ",
                 short_dump(file), ", not a file name");
    std::string f = file.get<std::string>();
    MYRIAD_CHECK(safe_relative(f), index, ": weight_map entry for '", name, "' names '", f,
                 "', which is not a file inside the checkpoint directory");
    c.weight_map_[name] = std::move(f);
  }
  if (auto md = j.find("metadata"); md != j.end() && !md->is_null()) {
    MYRIAD_CHECK(md->is_object(), index, ": metadata is ", short_dump(*md), ", not an object");
    for (const auto& [k, v] : md->items())
      c.metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(weight_map_.size());
  for (const auto& kv : weight_map_) out.push_back(kv.first);
  return out;
}

const std::string& Checkpoint::file_of(const std::string& name) const {
  auto it = weight_map_.find(name);
  MYRIAD_CHECK(it != weight_map_.end(), path_, ": checkpoint has no tensor '", name, "'");
  return it->second;
}

const SafetensorsFile& Checkpoint::shard_for(const std::string& name) const {
  const std::string& file = file_of(name);
  std::lock_guard<std::mutex> lock(shards_->mu);
  auto it = shards_->open.find(file);
  if (it == shards_->open.end()) {
    fs::path p = fs::path(dir_) / file;
    std::error_code ec;
    MYRIAD_CHECK(fs::exists(p, ec), index_name_, " in ", dir_, " maps '", name, "' to shard '",
                 file, "', which does not exist");
    it = shards_->open.emplace(file, SafetensorsFile::open(p.string())).first;
  }
  MYRIAD_CHECK(it->second.contains(name), index_name_, " in ", dir_, " maps '", name,
               "' to shard '", file, "', which has no tensor '", name, "'");
  return it->second;
}

TensorInfo Checkpoint::info(const std::string& name) const {
  return shard_for(name).info(name);
}

Tensor Checkpoint::load(const std::string& name, Device device) const {
  return shard_for(name).load(name, device);
}

RawTensor Checkpoint::load_raw(const std::string& name) const {
  return shard_for(name).load_raw(name);
}

size_t Checkpoint::num_shards_opened() const {
  std::lock_guard<std::mutex> lock(shards_->mu);
  return shards_->open.size();
}

// ---- Writers ----

namespace {

// One header entry: what a tensor of either writer contributes.
struct HeaderEntry {
  std::string dtype{};
  Shape shape{};
  uint64_t nbytes = 0;
};

// The header text, padded with spaces to a multiple of 8 bytes; offsets follow name order.
std::string header_text(const std::map<std::string, HeaderEntry>& entries,
                        const Metadata& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& [name, e] : entries) {  // std::map: sorted by name
    MYRIAD_CHECK(name != "__metadata__", "safetensors save: '__metadata__' is not a tensor name");
    h[name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + e.nbytes}}};
    off += e.nbytes;
  }
  std::string s;
  try {
    s = h.dump();
  } catch (const nlohmann::json::exception& e) {  // names must be valid UTF-8
    throw Error(cat("safetensors save: cannot write the header: ", e.what()));
  }
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

std::string header_for(const std::map<std::string, Tensor>& tensors, const Metadata& metadata) {
  std::map<std::string, HeaderEntry> entries;
  for (const auto& [name, t] : tensors) {
    MYRIAD_CHECK(t.defined(), "safetensors save: tensor '", name, "' is undefined");
    MYRIAD_CHECK(!t.is_released(), "safetensors save: tensor '", name, "' was released");
    entries[name] = {.dtype = st_name(t.dtype()), .shape = t.shape(), .nbytes = t.nbytes()};
  }
  return header_text(entries, metadata);
}

std::string header_for_raw(const std::map<std::string, RawEntry>& tensors,
                           const Metadata& metadata) {
  std::map<std::string, HeaderEntry> entries;
  for (const auto& [name, t] : tensors) {
    const size_t size = st_dtype_size(t.st_dtype);
    MYRIAD_CHECK(size > 0, "safetensors save: tensor '", name, "' has unknown dtype '", t.st_dtype,
                 "'");
    for (int64_t d : t.shape)
      MYRIAD_CHECK(d >= 0, "safetensors save: tensor '", name, "' has shape ", shape_str(t.shape));
    const uint64_t want = static_cast<uint64_t>(shape_numel(t.shape)) * size;
    MYRIAD_CHECK(t.bytes.size() == want, "safetensors save: tensor '", name, "' of shape ",
                 shape_str(t.shape), " and dtype ", t.st_dtype, " needs ", want, " bytes, given ",
                 t.bytes.size());
    entries[name] = {.dtype = t.st_dtype, .shape = t.shape, .nbytes = want};
  }
  return header_text(entries, metadata);
}

void emit_raw(const std::string& header, const std::map<std::string, RawEntry>& tensors,
              const io::WriteFn& w) {
  uint64_t n = header.size();
  uint8_t len[8];
  std::memcpy(len, &n, 8);
  w({len, 8});
  w({reinterpret_cast<const uint8_t*>(header.data()), header.size()});
  for (const auto& kv : tensors)
    if (!kv.second.bytes.empty()) w({kv.second.bytes.data(), kv.second.bytes.size()});
}

// Streams the file image; each tensor is copied to the host only while it is written.
void emit(const std::string& header, const std::map<std::string, Tensor>& tensors,
          const io::WriteFn& w) {
  uint64_t n = header.size();
  uint8_t len[8];
  std::memcpy(len, &n, 8);
  w({len, 8});
  w({reinterpret_cast<const uint8_t*>(header.data()), header.size()});
  for (const auto& kv : tensors) {
    Tensor h = kv.second.to(kCPU).contiguous();
    if (h.nbytes() > 0) w({static_cast<const uint8_t*>(h.data_ptr()), h.nbytes()});
  }
}

}  // namespace

std::vector<uint8_t> serialize(const std::map<std::string, Tensor>& tensors,
                               const Metadata& metadata) {
  std::string header = header_for(tensors, metadata);
  size_t total = 8 + header.size();
  for (const auto& kv : tensors) total += kv.second.nbytes();
  std::vector<uint8_t> out(total);
  size_t pos = 0;
  emit(header, tensors, [&](std::span<const uint8_t> b) {
    std::memcpy(out.data() + pos, b.data(), b.size());
    pos += b.size();
  });
  return out;
}

std::vector<uint8_t> serialize_raw(const std::map<std::string, RawEntry>& tensors,
                                   const Metadata& metadata) {
  std::vector<uint8_t> out;
  emit_raw(header_for_raw(tensors, metadata), tensors,
           [&](std::span<const uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); });
  return out;
}

void save_raw(const std::string& path, const std::map<std::string, RawEntry>& tensors,
              const Metadata& metadata) {
  std::string header = header_for_raw(tensors, metadata);
  io::write_file_atomic(path, [&](const io::WriteFn& w) { emit_raw(header, tensors, w); });
}

void save(const std::string& path, const std::map<std::string, Tensor>& tensors,
          const Metadata& metadata) {
  std::string header = header_for(tensors, metadata);  // validates before any file is made
  io::write_file_atomic(path, [&](const io::WriteFn& w) { emit(header, tensors, w); });
}

std::vector<std::string> save_sharded(const std::string& dir,
                                      const std::map<std::string, Tensor>& tensors,
                                      uint64_t max_shard_bytes, const Metadata& metadata) {
  MYRIAD_CHECK(max_shard_bytes > 0, "save_sharded: max_shard_bytes must be positive");
  std::error_code ec;
  fs::create_directories(dir, ec);
  MYRIAD_CHECK(fs::is_directory(dir), dir, ": cannot create checkpoint directory: ", ec.message());
  // Greedy packing in name order.
  std::vector<std::map<std::string, Tensor>> shards;
  uint64_t used = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    MYRIAD_CHECK(t.defined(), "save_sharded: tensor '", name, "' is undefined");
    uint64_t n = t.nbytes();
    if (shards.empty() || (used + n > max_shard_bytes && used > 0)) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().emplace(name, t);
    used += n;
    total += n;
  }
  if (shards.empty()) shards.emplace_back();

  std::vector<std::string> written;
  const fs::path d(dir);
  if (shards.size() == 1) {
    save((d / kSingleName).string(), shards[0], metadata);
    written.push_back(kSingleName);
  } else {
    nlohmann::ordered_json index;
    index["metadata"] = nlohmann::ordered_json::object();
    index["metadata"]["total_size"] = total;
    for (const auto& [k, v] : metadata) index["metadata"][k] = v;
    index["weight_map"] = nlohmann::ordered_json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      char fname[64];
      std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      save((d / fname).string(), shards[i], metadata);
      written.push_back(fname);
      for (const auto& kv : shards[i]) index["weight_map"][kv.first] = fname;
    }
    io::write_file_atomic((d / kIndexName).string(), index.dump(2) + "\n");
    written.push_back(kIndexName);
  }
  // Remove what an earlier save of the other layout or size left behind, so readers never mix.
  for (const auto& e : fs::directory_iterator(d, ec)) {
    std::string f = e.path().filename().string();
    bool ours = f == kSingleName || f == kIndexName || is_shard_name(f);
    if (ours && std::find(written.begin(), written.end(), f) == written.end())
      fs::remove(e.path(), ec);
  }
  return written;
}

}  // namespace myriad::safetensors
