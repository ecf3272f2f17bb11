// A TensorBoard event-file writer with no dependencies: TFRecord framing (u64 length, masked
// crc32c of the length, data, masked crc32c of the data) around hand-encoded Event protobufs
// (wall_time = 1 double, step = 2 int64, file_version = 3 string, summary = 5 Summary{value = 1
// Value{tag = 1 string, simple_value = 2 float, histo = 5 HistogramProto}}). The first record is
// file_version "brain.Event:2". Files are named events.out.tfevents.<seconds>.<host>.
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace myriad::train {

uint32_t crc32c(std::span<const uint8_t> data, uint32_t crc = 0);
uint32_t masked_crc32c(std::span<const uint8_t> data);

class EventWriter {
 public:
  explicit EventWriter(const std::string& dir);  // creates dir
  void scalar(const std::string& tag, int64_t step, double value);
  void scalars(int64_t step, const std::map<std::string, double>& values);  // one Event
  // A histogram of `values` with `buckets` uniform buckets between their min and max.
  void histogram(const std::string& tag, int64_t step, std::span<const double> values,
                 int buckets = 30);
  void flush() { out_.flush(); }
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  std::ofstream out_;
};

}  // namespace myriad::train
