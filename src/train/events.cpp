#include "train/events.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace myriad::train {
namespace {

constexpr std::array<uint32_t, 256> kCrcTable = [] {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int b = 0; b < 8; ++b) c = (c >> 1) ^ (c & 1 ? 0x82F63B78u : 0u);  // Castagnoli, reflected
    t[i] = c;
  }
  return t;
}();

// Protobuf wire encoding, just what Event needs.
void varint(std::string& s, uint64_t v) {
  for (; v >= 0x80; v >>= 7) s.push_back(static_cast<char>((v & 0x7F) | 0x80));
  s.push_back(static_cast<char>(v));
}
void key(std::string& s, int field, int wire) {
  varint(s, (uint64_t(field) << 3) | wire);
}
template <class T>
void fixed(std::string& s, T v) {  // little-endian, as the host
  static_assert(std::endian::native == std::endian::little);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s.append(b, sizeof(T));
}
void bytes(std::string& s, int field, const std::string& v) {
  key(s, field, 2);
  varint(s, v.size());
  s += v;
}
void f64(std::string& s, int field, double v) {
  key(s, field, 1);
  fixed(s, v);
}

std::string event_head(int64_t step) {
  std::string e;
  f64(e, 1,
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

std::string simple_value(const std::string& tag, double v) {
  std::string val;
  bytes(val, 1, tag);
  key(val, 2, 5);
  fixed(val, static_cast<float>(v));
  return val;
}

}  // namespace

uint32_t crc32c(std::span<const uint8_t> data, uint32_t crc) {
  crc = ~crc;
  for (uint8_t b : data) crc = kCrcTable[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::span<const uint8_t> data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

EventWriter::EventWriter(const std::string& dir) {
  std::filesystem::create_directories(dir);
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(secs) + "." + std::string(host)))
              .string();
  out_.open(path_, std::ios::binary | std::ios::app);
  MYRIAD_CHECK(out_.good(), "events: cannot open ", path_);
  std::string e = event_head(0);
  bytes(e, 3, "brain.Event:2");
  record(e);
  flush();
}

void EventWriter::record(const std::string& event) {
  std::string head;
  fixed(head, static_cast<uint64_t>(event.size()));
  auto span = [](const std::string& s) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  std::string rec = head;
  fixed(rec, masked_crc32c(span(head)));
  rec += event;
  fixed(rec, masked_crc32c(span(event)));
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  MYRIAD_CHECK(out_.good(), "events: write to ", path_, " failed");
}

void EventWriter::scalars(int64_t step, const std::map<std::string, double>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) bytes(summary, 1, simple_value(tag, v));
  std::string e = event_head(step);
  bytes(e, 5, summary);
  record(e);
}

void EventWriter::scalar(const std::string& tag, int64_t step, double value) {
  scalars(step, {{tag, value}});
}

void EventWriter::histogram(const std::string& tag, int64_t step, std::span<const double> values,
                            int buckets) {
  MYRIAD_CHECK(!values.empty() && buckets >= 1, "events: histogram ", tag, " needs values");
  const auto [mn, mx] = std::minmax_element(values.begin(), values.end());
  double sum = 0, sq = 0;
  for (double v : values) sum += v, sq += v * v;
  const double width = (*mx - *mn) / buckets;
  std::vector<double> counts(buckets, 0.0);
  for (double v : values)
    counts[width > 0 ? std::min<int>(buckets - 1, static_cast<int>((v - *mn) / width)) : 0] += 1;
  std::string h, limits, cs;
  f64(h, 1, *mn);
  f64(h, 2, *mx);
  f64(h, 3, static_cast<double>(values.size()));
  f64(h, 4, sum);
  f64(h, 5, sq);
  for (int b = 0; b < buckets; ++b) {  // right edges; the last one is the max
    fixed(limits, b + 1 == buckets ? *mx : *mn + width * (b + 1));
    fixed(cs, counts[b]);
  }
  bytes(h, 6, limits);  // packed repeated double
  bytes(h, 7, cs);
  std::string val;
  bytes(val, 1, tag);
  bytes(val, 5, h);
  std::string summary;
  bytes(summary, 1, val);
  std::string e = event_head(step);
  bytes(e, 5, summary);
  record(e);
}

}  // namespace myriad::train
