// `sieve bench kernels`: times the sm_90a kernels at one TP4 rank of MiniMax-M3 (16 q heads,
// 1 kv head, 1 index head of dim 128, head dim 128, top-16 blocks, init 0, local 1) against the
// floors measured on the device: bytes that must move / device-to-device copy bandwidth, or
// FLOPs / bf16 matrix rate (cuBLAS). Only built with CUDA.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace sieve::kernels_bench {

struct Env {
  std::string gpu;
  int sms = 0;
  double l2_mb = 0;
  double copy_gbps = 0;    // bytes read + written per second / 1e9
  double bf16_tflops = 0;  // measured matrix rate
  std::string matrix_source;  // "cublas" or "assumed"
};

struct Row {
  std::string kernel;  // e.g. "decode indexer"
  std::string shape;   // e.g. "b32 ctx9216"
  std::string dtype;   // cache dtype
  std::string mode;    // "fused", "baseline (3 kernels)", "graph", ...
  double us = 0;       // median
  double floor_us = 0;
  std::string floor_kind;  // "bytes" or "flops"
  double target_us = 0;    // 0 = no target
  std::string target_note;
  int runs = 0, input_sets = 0;
};

struct Options {
  int iters = 100;
  std::string filter;  // substring of a case's "phase shape dtype" ("decode b32 ctx9216 fp8"); empty = all
  std::string rows;    // substring of the kernel name (the table's first column); empty = all
};

// The kernel name of the empty kernel's rows (the timing floor), which every --filter keeps.
constexpr const char* kEmptyKernel = "empty kernel (timing floor)";

Env measure_env();
// Runs every case; calls on_row for each result as it is measured.
void run_all(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row);
// The "fp8 linear" rows (bench_linear.cu); run_all calls it last.
void run_linear_rows(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row);
// The "decode chain" rows (decode_chain.cu): one decode layer's small-kernel chain from CUDA
// graphs, with and without programmatic dependent launch; run_all calls it after the decode cases.
void run_chain_rows(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row);
// The "sample" rows (bench_sample.cu), on `stream` (a cudaStream_t).
void run_sample_rows(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row,
                     struct CUstream_st* stream);

}  // namespace sieve::kernels_bench
