#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace myriad::io {
namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() {
    int f = fd;
    fd = -1;
    return f;
  }
};

std::string errno_text() {
  return std::strerror(errno);
}

void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    MYRIAD_CHECK(w > 0, path, ": write failed: ", errno_text());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

std::string read_file(const std::string& path, uint64_t max_bytes) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  MYRIAD_CHECK(f.fd >= 0, path, ": cannot open: ", errno_text());
  struct stat st {};
  MYRIAD_CHECK(::fstat(f.fd, &st) == 0, path, ": cannot stat: ", errno_text());
  MYRIAD_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  MYRIAD_CHECK(static_cast<uint64_t>(st.st_size) <= max_bytes, path, ": file is ", st.st_size,
               " bytes, more than the limit of ", max_bytes);
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = ::read(f.fd, out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    MYRIAD_CHECK(r >= 0, path, ": read failed: ", errno_text());
    if (r == 0) break;  // the file shrank meanwhile
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

void write_file_atomic(const std::string& path,
                       const std::function<void(const WriteFn&)>& produce) {
  namespace fs = std::filesystem;
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      cat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1, std::memory_order_relaxed));
  try {
    Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    MYRIAD_CHECK(f.fd >= 0, path, ": cannot create temporary file ", tmp, ": ", errno_text());
    produce([&](std::span<const uint8_t> b) { write_all(f.fd, b.data(), b.size(), path); });
    MYRIAD_CHECK(::fsync(f.fd) == 0, path, ": fsync failed: ", errno_text());
    MYRIAD_CHECK(::close(f.release()) == 0, path, ": close failed: ", errno_text());
    MYRIAD_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, path, ": rename from ", tmp,
                 " failed: ", errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable.
  fs::path dir = fs::path(path).parent_path();
  Fd d{::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0) ::fsync(d.fd);
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  write_file_atomic(path, [&](const WriteFn& w) {
    w({reinterpret_cast<const uint8_t*>(contents.data()), contents.size()});
  });
}

}  // namespace myriad::io
