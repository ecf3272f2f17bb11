// Small file helpers shared by the checkpoint and config code.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace myriad::io {

// Reads a whole file; throws a myriad::Error naming the file when it is missing, unreadable,
// not a regular file or larger than max_bytes.
std::string read_file(const std::string& path, uint64_t max_bytes = uint64_t(1) << 30);

// Appends bytes to the file being written by write_file_atomic.
using WriteFn = std::function<void(std::span<const uint8_t>)>;

// Writes `path` atomically: `produce` streams the contents into a temporary file in the same
// directory, which is fsynced and renamed over `path`; the directory is fsynced after. On any
// failure the temporary file is removed and a myriad::Error names the file.
void write_file_atomic(const std::string& path, const std::function<void(const WriteFn&)>& produce);
void write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace myriad::io
