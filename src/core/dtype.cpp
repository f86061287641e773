#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace sieve {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::FP8_E4M3: return 1;
    case DType::U8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::FP8_E4M3: return "F8_E4M3";
    case DType::U8: return "U8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

DType dtype_from_name(std::string_view n, std::string_view what) {
  if (n == "F32") return DType::F32;
  if (n == "BF16") return DType::BF16;
  if (n == "F16") return DType::F16;
  if (n == "F8_E4M3") return DType::FP8_E4M3;
  // BOOL (one byte per flag) reads as U8: EAGLE3 drafts carry their t2d map as BOOL.
  if (n == "U8" || n == "BOOL") return DType::U8;
  if (n == "I32") return DType::I32;
  if (n == "I64") return DType::I64;
  throw Error(std::string(what) + ": unsupported dtype \"" + std::string(n) +
              "\" (expected one of F32, BF16, F16, F8_E4M3, U8, BOOL, I32, I64)");
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0) {
    if (man == 0) return f32_from_bits(sign);
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520 -> inf
  if (a < 0x38800000u) {                       // subnormal or zero in f16
    float af = f32_from_bits(a);
    float scaled = af * 16777216.0f;  // 2^24: units of the smallest subnormal
    float r = std::nearbyint(scaled);  // default rounding mode: nearest even
    return sign | uint16_t(r);
  }
  uint32_t rounding = 0xfffu + ((a >> 13) & 1u);
  a += rounding;
  return sign | uint16_t(((a >> 23) - 112) << 10 | ((a >> 13) & 0x3ffu));
}

float fp8e4m3_to_f32(uint8_t v) {
  uint32_t sign = v & 0x80u;
  uint32_t exp = (v >> 3) & 0xf;
  uint32_t man = v & 0x7;
  float r;
  if (exp == 0xf && man == 0x7) return std::nanf("");
  if (exp == 0) {
    r = std::ldexp(float(man), -9);
  } else {
    r = std::ldexp(float(8 + man), int(exp) - 10);
  }
  return sign ? -r : r;
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return std::signbit(f) ? 0xff : 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= kFp8E4M3Max) return sign | 0x7e;  // saturate (inf too)
  // Smallest normal is 2^-6; subnormals are multiples of 2^-9.
  if (a < 0.015625f) {
    float q = std::nearbyint(a * 512.0f);  // nearest even
    return sign | uint8_t(q);              // q == 8 gives the smallest normal, 0x08
  }
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;    // a in [2^exp, 2^(exp+1))
  float mant = std::ldexp(a, -exp) - 1.0f;  // [0,1)
  float q = std::nearbyint(mant * 8.0f);    // 0..8
  int biased = exp + 7;
  if (q == 8.0f) {
    q = 0;
    biased += 1;
  }
  if (biased > 15 || (biased == 15 && q > 6)) return sign | 0x7e;
  return sign | uint8_t(biased << 3) | uint8_t(q);
}

float e8m0_to_f32(uint8_t e) {
  if (e == 0xff) return std::nanf("");
  return std::ldexp(1.0f, int(e) - 127);
}

float load_as_f32(const void* p, DType t, size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::FP8_E4M3: return fp8e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::U8: return float(static_cast<const uint8_t*>(p)[i]);
    case DType::I32: return float(static_cast<const int32_t*>(p)[i]);
    case DType::I64: return float(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

void store_from_f32(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; return;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); return;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); return;
    case DType::FP8_E4M3: static_cast<uint8_t*>(p)[i] = f32_to_fp8e4m3(v); return;
    default: SIEVE_CHECK(false, "store_from_f32: unsupported dtype " + std::string(dtype_name(t)));
  }
}

}  // namespace sieve
