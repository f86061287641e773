// setmaxnreg (sm_90a): a warpgroup that needs few registers gives them to the warpgroups that
// need many (every warp of the warpgroup executes the same call).
#pragma once

namespace sieve::cuda {

template <int N>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace sieve::cuda
