// AMX-BF16 tile products and their operand packing (see amx.h).
#include "backend/cpu/amx.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define MYRIAD_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#endif

namespace myriad::cpu {

bool amx_bf16_hardware() {
  static const bool usable = [] {
#if defined(__linux__) && defined(__x86_64__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if (!(edx & (1u << 22)) || !(edx & (1u << 24))) return false;  // AMX-BF16, AMX-TILE
    // The tile data state is off for a process until it asks (Linux >= 5.16); the permission
    // covers every thread of the process.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return usable;
}

namespace {
std::atomic<bool> forced_off{false};

bool env_off() {
  static const bool off = [] {
    const char* env = std::getenv("MYRIAD_AMX");
    return env && std::string(env) == "0";
  }();
  return off;
}

// Palette 1, tiles 0-7 all 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

#if defined(__x86_64__)
// Tiles 0-3 hold C block (i, j) at 2 i + j, 4-5 the A rows, 6-7 the B columns.
template <int MB, int NB>
MYRIAD_AMX_TARGET void block(int64_t K, const uint16_t* a, int64_t lda, const uint16_t* b,
                             int64_t ldb, float* c, int64_t ldc, bool acc) {
  const int64_t sa = lda * 2, sb = ldb * 2, sc = ldc * 4;
  float* c10 = c + 16 * ldc;
  if (acc) {
    _tile_loadd(0, c, sc);
    if constexpr (NB > 1) _tile_loadd(1, c + 16, sc);
    if constexpr (MB > 1) _tile_loadd(2, c10, sc);
    if constexpr (MB > 1 && NB > 1) _tile_loadd(3, c10 + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (NB > 1) _tile_zero(1);
    if constexpr (MB > 1) _tile_zero(2);
    if constexpr (MB > 1 && NB > 1) _tile_zero(3);
  }
  for (int64_t k = 0; k < K; k += 32) {
    const uint16_t* bk = b + k / 2 * ldb;
    _tile_loadd(4, a + k, sa);
    _tile_loadd(6, bk, sb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB > 1) {
      _tile_loadd(7, bk + 32, sb);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MB > 1) {
      _tile_loadd(5, a + 16 * lda + k, sa);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NB > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, sc);
  if constexpr (NB > 1) _tile_stored(1, c + 16, sc);
  if constexpr (MB > 1) _tile_stored(2, c10, sc);
  if constexpr (MB > 1 && NB > 1) _tile_stored(3, c10 + 16, sc);
}
#endif
}  // namespace

bool amx_bf16() {
  return !forced_off.load(std::memory_order_relaxed) && !env_off() && amx_bf16_hardware();
}
void force_amx_off(bool off) {
  forced_off.store(off, std::memory_order_relaxed);
}

#if defined(__x86_64__)
namespace {
MYRIAD_AMX_TARGET void load_config() {
  static const TileConfig cfg;
  _tile_loadconfig(&cfg);
}
MYRIAD_AMX_TARGET void release_tiles() {
  _tile_release();
}
}  // namespace
AmxTiles::AmxTiles() {
  load_config();
}
AmxTiles::~AmxTiles() {
  release_tiles();
}

void amx_gemm(int64_t M, int64_t N, int64_t K, const uint16_t* a, int64_t lda, const uint16_t* b,
              int64_t ldb, float* c, int64_t ldc, bool acc) {
  MYRIAD_CHECK(M % 16 == 0 && N % 16 == 0 && K % 32 == 0,
               "amx_gemm: M, N must be multiples of 16 and K of 32, got ", M, ", ", N, ", ", K);
  for (int64_t i = 0; i < M; i += 32) {
    const bool two_rows = i + 32 <= M;
    for (int64_t j = 0; j < N; j += 32) {
      const uint16_t* bj = b + 2 * j;
      float* cij = c + i * ldc + j;
      const uint16_t* ai = a + i * lda;
      if (j + 32 <= N) {
        if (two_rows)
          block<2, 2>(K, ai, lda, bj, ldb, cij, ldc, acc);
        else
          block<1, 2>(K, ai, lda, bj, ldb, cij, ldc, acc);
      } else if (two_rows) {
        block<2, 1>(K, ai, lda, bj, ldb, cij, ldc, acc);
      } else {
        block<1, 1>(K, ai, lda, bj, ldb, cij, ldc, acc);
      }
    }
  }
}
#else
AmxTiles::AmxTiles() {}
AmxTiles::~AmxTiles() {}
void amx_gemm(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*,
              int64_t, bool) {
  MYRIAD_CHECK(false, "amx_gemm: no AMX on this CPU");
}
#endif

// ---- packing ----

void pack_rows(const float* src, int64_t lds, int64_t M, int64_t K, uint16_t* dst, int64_t ldd,
               int64_t Mp, int64_t Kp) {
  for (int64_t m = 0; m < Mp; ++m) {
    uint16_t* d = dst + m * ldd;
    const int64_t k0 = m < M ? K : 0;
    if (m < M) f32_row_to_bf16(src + m * lds, d, K);
    std::memset(d + k0, 0, (Kp - k0) * 2);
  }
}

void pack_rows_t(const float* src, int64_t lds, int64_t M, int64_t K, uint16_t* dst, int64_t ldd,
                 int64_t Mp, int64_t Kp) {
  MYRIAD_CHECK(M <= 64 && K <= 64, "pack_rows_t: at most 64 x 64, got ", M, " x ", K);
  const int64_t m16 = (M + 15) / 16 * 16, k16 = (K + 15) / 16 * 16;
  alignas(64) float t[64 * 64];
  transpose(src, k16, m16, lds, t, 64);
  pack_rows(t, 64, M, K, dst, ldd, Mp, Kp);
}

void pack_rows(const uint16_t* const* rows, int64_t M, int64_t K, uint16_t* dst, int64_t ldd,
               int64_t Mp, int64_t Kp) {
  for (int64_t m = 0; m < Mp; ++m) {
    uint16_t* d = dst + m * ldd;
    const int64_t k0 = m < M ? K : 0;
    if (m < M) std::memcpy(d, rows[m], K * 2);
    std::memset(d + k0, 0, (Kp - k0) * 2);
  }
}

MYRIAD_CPU_CLONES void pack_pairs(const uint16_t* const* rows, int64_t K, int64_t N, uint16_t* dst,
                                  int64_t Kp, int64_t Np) {
  for (int64_t p = 0; p < Kp / 2; ++p) {
    uint32_t* d = reinterpret_cast<uint32_t*>(dst + p * 2 * Np);
    const uint16_t* lo = 2 * p < K ? rows[2 * p] : nullptr;
    const uint16_t* hi = 2 * p + 1 < K ? rows[2 * p + 1] : nullptr;
    if (lo && hi)
      for (int64_t n = 0; n < N; ++n) d[n] = lo[n] | static_cast<uint32_t>(hi[n]) << 16;
    else if (lo)
      for (int64_t n = 0; n < N; ++n) d[n] = lo[n];
    else
      for (int64_t n = 0; n < N; ++n) d[n] = 0;
    for (int64_t n = N; n < Np; ++n) d[n] = 0;
  }
}

// The pairs of row n are its 32-bit words: B's pair rows are the transpose of the rows' words, done
// as an f32 transpose (moves only, so every bit pattern survives).
void pack_pairs_t(const uint16_t* const* rows, int64_t K, int64_t N, uint16_t* dst, int64_t Kp,
                  int64_t Np) {
  const int64_t P = Kp / 2, n16 = (N + 15) / 16 * 16;  // P is a multiple of 16 (Kp of 32)
  std::vector<uint32_t> w(n16 * P, 0);                 // [n, pair]
  for (int64_t n = 0; n < N; ++n) std::memcpy(w.data() + n * P, rows[n], K * 2);
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  transpose(reinterpret_cast<const float*>(w.data()), n16, P, P, reinterpret_cast<float*>(d), Np);
  if (n16 < Np)
    for (int64_t p = 0; p < P; ++p) std::memset(d + p * Np + n16, 0, (Np - n16) * 4);
}

}  // namespace myriad::cpu
