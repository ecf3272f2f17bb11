// bf16 tile products on Intel AMX (AMX-TILE + AMX-BF16: Sapphire Rapids and later), for the CPU
// kernels whose small products (attention's 64 x 64 tiles) oneDNN's primitives cannot take.
// TDPBF16PS multiplies a 16 x 32 bf16 tile by a 32 x 16 one into 16 x 16 f32 sums: 16x the
// products per instruction of an AVX-512 FMA, at bf16's input precision (f32 accumulation).
//
// Operands: A is bf16 rows, row-major (lda elements apart); B is "VNNI pairs": B[k, n] at
// b[(k / 2) ldb + 2 n + k % 2], so a row of b holds two consecutive k of every column (ldb >= 2N);
// C is f32 rows. M and N are multiples of 16 and K of 32: callers pad with zeros.
#pragma once
#include <cstdint>

namespace myriad::cpu {

// Whether the CPU has AMX-TILE and AMX-BF16 (CPUID.(EAX=7,ECX=0):EDX bits 24 and 22) and the
// kernel grants this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA; Linux >= 5.16). Asked once; the permission covers every thread.
bool amx_bf16_hardware();
// Whether the kernels take their AMX paths: amx_bf16_hardware() and MYRIAD_AMX=0 not set.
bool amx_bf16();
// Tests: true forces the AMX paths off, false restores the default (nothing forces them on).
void force_amx_off(bool off);

// Loads the tile configuration on the calling thread for amx_gemm (and releases the tiles when it
// goes). Every amx_gemm call runs inside one; nothing else may use the tiles meanwhile.
class AmxTiles {
 public:
  AmxTiles();
  ~AmxTiles();
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
};

// C[M x N] (+= when acc) A[M x K] B[K x N] with the layouts above.
void amx_gemm(int64_t M, int64_t N, int64_t K, const uint16_t* a, int64_t lda, const uint16_t* b,
              int64_t ldb, float* c, int64_t ldc, bool acc);

// ---- packing (zero padding up to the padded sizes) ----
// dst[m, k] (row-major, ldd) = bf16 of src[m lds + k] for m < M, k < K; zero up to Mp x Kp.
void pack_rows(const float* src, int64_t lds, int64_t M, int64_t K, uint16_t* dst, int64_t ldd,
               int64_t Mp, int64_t Kp);
// The same from the transpose: dst[m, k] = bf16 of src[k lds + m]. M, K <= 64, and src is
// readable over rows and columns rounded up to 16.
void pack_rows_t(const float* src, int64_t lds, int64_t M, int64_t K, uint16_t* dst, int64_t ldd,
                 int64_t Mp, int64_t Kp);
// Bf16 rows copied: dst[m, k] = rows[m][k] for m < M, k < K; zero up to Mp x Kp.
void pack_rows(const uint16_t* const* rows, int64_t M, int64_t K, uint16_t* dst, int64_t ldd,
               int64_t Mp, int64_t Kp);
// VNNI pairs of B[k, n] = rows[k][n] (k < K, n < N; the rows of B are the given bf16 rows); zero
// up to Kp x Np. ldb = 2 Np.
void pack_pairs(const uint16_t* const* rows, int64_t K, int64_t N, uint16_t* dst, int64_t Kp,
                int64_t Np);
// VNNI pairs of B[k, n] = rows[n][k] (B is the transpose of the given bf16 rows); zero up to
// Kp x Np. ldb = 2 Np.
void pack_pairs_t(const uint16_t* const* rows, int64_t K, int64_t N, uint16_t* dst, int64_t Kp,
                  int64_t Np);

}  // namespace myriad::cpu
