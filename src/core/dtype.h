// Element types and their exact conversions. bf16 and fp8 e4m3fn (OCP: bias 7, max 448, no
// infinities, S.1111.111 is NaN) round to nearest even; fp8 saturates finite values to +-448.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace sieve {

enum class DType : uint8_t { F32, BF16, F16, FP8_E4M3, U8, I32, I64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: F32, BF16, F16, F8_E4M3, U8, I32, I64
// Parses a safetensors dtype name; throws Error naming `what` for anything else.
DType dtype_from_name(std::string_view name, std::string_view what = "dtype");

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- bf16 ----
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    return uint16_t((u >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ---- f16 (IEEE half) ----
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// ---- fp8 e4m3fn ----
float fp8e4m3_to_f32(uint8_t v);
// Round to nearest even, saturating finite values (and +-inf) to +-448; NaN -> 0x7f/0xff.
uint8_t f32_to_fp8e4m3(float f);
inline float round_fp8e4m3(float f) { return fp8e4m3_to_f32(f32_to_fp8e4m3(f)); }
constexpr float kFp8E4M3Max = 448.0f;

// ---- E8M0 (MX scales): 2^(e-127); 0xff is NaN ----
float e8m0_to_f32(uint8_t e);

// Reads element i of a buffer of type t as f32 (F32, BF16, F16, FP8_E4M3, U8, I32, I64).
float load_as_f32(const void* p, DType t, size_t i);
// Writes v rounded to t at element i (F32, BF16, F16, FP8_E4M3).
void store_from_f32(void* p, DType t, size_t i, float v);

}  // namespace sieve
