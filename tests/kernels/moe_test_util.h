// Helpers of the MoE tests (CPU reference tests and CPU/CUDA parity tests): a random routed-expert
// case with F32, BF16 or FP8_E4M3 weights (any scale block shape), routings with empty experts,
// a hot expert, skipped ids and odd token counts, and a double-precision reference written here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace sieve::test {

struct MoeShape {
  int64_t T = 5, H = 256, I = 128;
  int E = 8, K = 2;
  DType w = DType::FP8_E4M3;
  DType act = DType::F32;
  int br = 1, bc = 128;  // FP8 scale block shape
  bool pow2_scales = false;  // scales 2^e (MXFP8-like), else arbitrary positive floats
  bool fp8_x = false;        // x given quantized (FP8 + x_scale)
  int skipped = 0;           // ids per 16 that are -1 or >= E (not this rank's experts)
  int hot = -1;              // every token routes to this expert first
  int only = -1;             // every token's every slot is this expert or skipped (K must be 1)
  int empty_every = 0;       // experts e with e % empty_every == 1 get no tokens (0: none)
  int lone = -1;             // this expert gets exactly one pair: token T / 2, its last slot
  bool out_bf16 = false;     // MoeExpertsParams::out_bf16: out BF16 whatever act
  DType out_dtype() const { return out_bf16 ? DType::BF16 : act; }
  std::string describe() const {
    return "T " + std::to_string(T) + " H " + std::to_string(H) + " I " + std::to_string(I) + " E " +
           std::to_string(E) + " K " + std::to_string(K) + " w " + std::string(dtype_name(w)) + " act " +
           std::string(dtype_name(act)) + (w == DType::FP8_E4M3 ? " blocks (" + std::to_string(br) + "," +
                                                                     std::to_string(bc) + ")" : std::string()) +
           (fp8_x ? " fp8 x" : "") + " skipped " + std::to_string(skipped) + " hot " + std::to_string(hot) +
           " only " + std::to_string(only) + " empty_every " + std::to_string(empty_every) + " lone " +
           std::to_string(lone) + (out_bf16 ? " out BF16" : "");
  }
};

// Host data of one case. Weights of FP8 cases hold e4m3 values drawn over the whole finite range
// (|v| <= 448), with multipliers that keep the dequantized values near +-2 / sqrt(cols).
struct MoeCaseData {
  MoeShape s;
  TypedBuffer x;                 // act dtype, or FP8 bytes when s.fp8_x
  std::vector<float> x_scale;    // [T, ceil(H / 128)] when s.fp8_x
  TypedBuffer out0;              // the accumulated-into output before the op
  std::vector<TypedBuffer> gu, dn;
  std::vector<std::vector<float>> gu_scale, dn_scale;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<const void*> gu_ptr, dn_ptr;
  std::vector<const float*> gu_sptr, dn_sptr;
  // FP8 with (1, 128) blocks: the same scales tiled (ops::fp8_scales_moe_tiled,
  // ops::MoeExpertsParams::scale_tiled).
  std::vector<std::vector<float>> gu_scale_tiled, dn_scale_tiled;
  std::vector<const float*> gu_sptr_tiled, dn_sptr_tiled;

  static int64_t blocks(int64_t n, int b) { return (n + b - 1) / b; }

  MoeCaseData(const MoeShape& shape, uint64_t seed) : s(shape) {
    Rng rng(seed);
    const int64_t T = s.T, H = s.H, I = s.I;
    const int E = s.E, K = s.K;
    const bool fp8 = s.w == DType::FP8_E4M3;
    std::vector<float> xv = random_vector(size_t(T * H), rng, -1, 1);
    // A few rows with a wide range of magnitudes, so 1 x 128 groups get different scales.
    for (int64_t t = 0; t < T; t += 3)
      for (int64_t k = 0; k < H; ++k) xv[size_t(t * H + k)] *= std::ldexp(1.0f, int(k / 128 % 5) - 2);
    if (s.fp8_x) {
      const int64_t g = blocks(H, 128);
      x = TypedBuffer(DType::FP8_E4M3, size_t(T * H));
      x_scale.resize(size_t(T * g));
      for (int64_t t = 0; t < T; ++t)
        cpu::quantize_row_fp8(&xv[size_t(t * H)], H, static_cast<uint8_t*>(x.data()) + t * H, &x_scale[size_t(t * g)]);
    } else {
      x = TypedBuffer::from(s.act, xv);
    }
    out0 = TypedBuffer::from(s.out_dtype(), random_vector(size_t(T * H), rng, -2, 2));
    auto matrix = [&](int64_t rows, int64_t cols, std::vector<float>& sc) {
      if (!fp8) {
        const float a = 2.0f / std::sqrt(float(cols));
        return TypedBuffer::from(s.w, random_vector(size_t(rows * cols), rng, -a, a));
      }
      TypedBuffer m(DType::FP8_E4M3, size_t(rows * cols));
      for (size_t i = 0; i < m.count; ++i) m.set(i, rng.uniform(-448.0f, 448.0f));
      // Dequantized values of about +-2 / sqrt(cols): sums of a few units whatever the size.
      const float target = 2.0f / std::sqrt(float(cols)) / 448.0f;
      const int e0 = int(std::lround(std::log2(target)));
      sc.resize(size_t(blocks(rows, s.br) * blocks(cols, s.bc)));
      for (auto& v : sc) v = s.pow2_scales ? std::ldexp(1.0f, e0 + rng.uniform_int(-1, 1)) : target * rng.uniform(0.5f, 1.5f);
      return m;
    };
    gu.resize(size_t(E));
    dn.resize(size_t(E));
    gu_scale.resize(size_t(E));
    dn_scale.resize(size_t(E));
    for (int e = 0; e < E; ++e) {
      gu[size_t(e)] = matrix(2 * I, H, gu_scale[size_t(e)]);
      dn[size_t(e)] = matrix(H, I, dn_scale[size_t(e)]);
      gu_ptr.push_back(gu[size_t(e)].data());
      dn_ptr.push_back(dn[size_t(e)].data());
      gu_sptr.push_back(fp8 ? gu_scale[size_t(e)].data() : nullptr);
      dn_sptr.push_back(fp8 ? dn_scale[size_t(e)].data() : nullptr);
    }
    if (fp8 && s.br == 1 && s.bc == 128) {
      for (int e = 0; e < E; ++e) {
        gu_scale_tiled.push_back(ops::fp8_scales_moe_tiled(gu_scale[size_t(e)].data(), 2 * I, H, true));
        dn_scale_tiled.push_back(ops::fp8_scales_moe_tiled(dn_scale[size_t(e)].data(), H, I, false));
      }
      for (int e = 0; e < E; ++e) {
        gu_sptr_tiled.push_back(gu_scale_tiled[size_t(e)].data());
        dn_sptr_tiled.push_back(dn_scale_tiled[size_t(e)].data());
      }
    }
    // Routing: K distinct experts a token, drawn from those that may take tokens.
    std::vector<int32_t> pool;
    for (int e = 0; e < E; ++e)
      if ((!(s.empty_every > 0 && e % s.empty_every == 1) || e == s.hot) && e != s.lone) pool.push_back(e);
    ids.resize(size_t(T * K));
    weights.resize(size_t(T * K));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> perm = pool;
      for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[size_t(rng.uniform_int(0, int(i)))]);
      if (s.hot >= 0) std::swap(perm[0], *std::find(perm.begin(), perm.end(), s.hot));
      for (int j = 0; j < K; ++j) {
        int32_t id = s.only >= 0 ? s.only : perm[size_t(j) % perm.size()];
        if (s.skipped && rng.uniform_int(0, 15) < s.skipped) id = rng.uniform_int(0, 1) ? -1 : E + j;
        ids[size_t(t * K + j)] = id;
        weights[size_t(t * K + j)] = rng.uniform(0.05f, 1.0f);
      }
    }
    if (s.lone >= 0) ids[size_t((T / 2) * K + K - 1)] = s.lone;
  }

  // Host-pointer parameters (out left null); tiled: the tiled scales (FP8, (1, 128)).
  ops::MoeExpertsParams params(bool tiled = false) const {
    ops::MoeExpertsParams p;
    p.x = x.data();
    p.act_dtype = s.act;
    p.out_bf16 = s.out_bf16;
    p.x_scale = s.fp8_x ? x_scale.data() : nullptr;
    p.num_tokens = s.T;
    p.hidden = s.H;
    p.inter = s.I;
    p.num_experts = s.E;
    p.topk = s.K;
    p.ids = ids.data();
    p.weights = weights.data();
    p.w_gate_up = gu_ptr.data();
    p.w_down = dn_ptr.data();
    p.w_dtype = s.w;
    if (s.w == DType::FP8_E4M3) {
      p.w_gate_up_scale = tiled ? gu_sptr_tiled.data() : gu_sptr.data();
      p.w_down_scale = tiled ? dn_sptr_tiled.data() : dn_sptr.data();
      p.scale_block_rows = s.br;
      p.scale_block_cols = s.bc;
      p.scale_tiled = tiled;
    }
    return p;
  }

  double xval(int64_t t, int64_t k) const {
    const double v = x.get(size_t(t * s.H + k));
    return s.fp8_x ? v * double(x_scale[size_t(t * blocks(s.H, 128) + k / 128)]) : v;
  }

  // Row n of an expert matrix ([rows, cols]) dequantized exactly into out[0 .. cols).
  void weight_row(const std::vector<TypedBuffer>& m, const std::vector<std::vector<float>>& sc, int e, int64_t n,
                  int64_t cols, double* out) const {
    if (s.w != DType::FP8_E4M3) {
      for (int64_t k = 0; k < cols; ++k) out[k] = m[size_t(e)].get(size_t(n * cols + k));
      return;
    }
    static const std::vector<double> lut = [] {
      std::vector<double> v(256);
      for (int i = 0; i < 256; ++i) v[size_t(i)] = fp8e4m3_to_f32(uint8_t(i));
      return v;
    }();
    const auto* q = static_cast<const uint8_t*>(m[size_t(e)].data()) + n * cols;
    const float* srow = &sc[size_t(e)][size_t((n / s.br) * blocks(cols, s.bc))];
    for (int64_t k = 0; k < cols; ++k) out[k] = lut[q[k]] * double(srow[k / s.bc]);
  }

  // out0 + the routed experts in double. `quant`: the activations entering each product go
  // through cpu::quantize_row_fp8 first (x from its fp32 value, the SwiGLU row from its double
  // value rounded to fp32), as the CUDA kernels and the CPU's quantize_act do. `mag`, when set,
  // gets per output element the sum of |weight x expert output| over the token's experts (the
  // scale of the rounding a kernel may add to each term). Expert by expert: each weight row is
  // dequantized once for all the expert's tokens.
  std::vector<double> reference(bool quant, std::vector<double>* mag = nullptr) const {
    const int64_t T = s.T, H = s.H, I = s.I;
    const int K = s.K;
    std::vector<double> ref(size_t(T * H));
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = out0.get(i);
    if (mag) mag->assign(ref.size(), 0.0);
    std::vector<double> xr(size_t(T * H));
    {
      std::vector<float> xf(static_cast<size_t>(H));
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t k = 0; k < H; ++k) xf[size_t(k)] = float(xval(t, k));
        if (quant && !s.fp8_x) qdq(xf);
        for (int64_t k = 0; k < H; ++k) xr[size_t(t * H + k)] = xf[size_t(k)];
      }
    }
    std::vector<double> wrow(static_cast<size_t>(std::max(H, I)));
    std::vector<float> hf(static_cast<size_t>(I));
    for (int e = 0; e < s.E; ++e) {
      std::vector<int64_t> pairs;  // token * K + slot, in token order
      for (int64_t q = 0; q < T * K; ++q)
        if (ids[size_t(q)] == e) pairs.push_back(q);
      if (pairs.empty()) continue;
      const size_t np = pairs.size();
      std::vector<double> gu_out(np * size_t(2 * I));
      for (int64_t n = 0; n < 2 * I; ++n) {
        weight_row(gu, gu_scale, e, n, H, wrow.data());
        for (size_t i = 0; i < np; ++i) {
          const double* x = &xr[size_t((pairs[i] / K) * H)];
          double acc = 0;
          for (int64_t k = 0; k < H; ++k) acc += x[k] * wrow[size_t(k)];
          gu_out[i * size_t(2 * I) + size_t(n)] = acc;
        }
      }
      std::vector<double> act(np * size_t(I));
      for (size_t i = 0; i < np; ++i) {
        for (int64_t u = 0; u < I; ++u) {
          const double g = std::min(gu_out[i * size_t(2 * I) + size_t(u)], 7.0);
          const double up = std::clamp(gu_out[i * size_t(2 * I) + size_t(I + u)], -7.0, 7.0);
          hf[size_t(u)] = float(g / (1.0 + std::exp(-1.702 * g)) * (up + 1.0));
        }
        if (quant) qdq(hf);
        for (int64_t u = 0; u < I; ++u) act[i * size_t(I) + size_t(u)] = hf[size_t(u)];
      }
      for (int64_t d = 0; d < H; ++d) {
        weight_row(dn, dn_scale, e, d, I, wrow.data());
        for (size_t i = 0; i < np; ++i) {
          double y = 0;
          for (int64_t u = 0; u < I; ++u) y += act[i * size_t(I) + size_t(u)] * wrow[size_t(u)];
          const int64_t q = pairs[i], t = q / K;
          ref[size_t(t * H + d)] += double(weights[size_t(q)]) * y;
          if (mag) (*mag)[size_t(t * H + d)] += std::fabs(double(weights[size_t(q)]) * y);
        }
      }
    }
    return ref;
  }

  static void qdq(std::vector<float>& row) {
    const int64_t n = int64_t(row.size()), g = blocks(n, 128);
    std::vector<uint8_t> q(row.size());
    std::vector<float> sc(static_cast<size_t>(g));
    cpu::quantize_row_fp8(row.data(), n, q.data(), sc.data());
    for (int64_t k = 0; k < n; ++k) row[size_t(k)] = fp8e4m3_to_f32(q[size_t(k)]) * sc[size_t(k / 128)];
  }

};

}  // namespace sieve::test
