#include "parallel/nccl_group.h"

#include <atomic>
#include <cstring>
#include <thread>

#include "core/error.h"

#ifdef SIEVE_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace sieve::parallel {

#ifdef SIEVE_HAVE_NCCL
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    case DType::FP8_E4M3: return ncclUint8;  // gathers move bytes; sums of fp8 are refused below
    default: throw Error("NCCL: dtype " + std::string(dtype_name(t)) + " is not supported");
  }
}

class NcclRank final : public ops::Collective {
 public:
  NcclRank(ncclComm_t comm, int rank, int size, int device) : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~NcclRank() override {
    // A group whose peers are gone cannot finalize collectively: abort is the local teardown.
    if (ncclComm_t c = comm_.exchange(nullptr)) ncclCommAbort(c);
  }
  // ncclCommAbort ends the collectives this rank has enqueued (their kernels return), so the
  // stream no longer waits for a peer that failed; later collectives find no communicator.
  void abort(const std::string&) override {
    if (ncclComm_t c = comm_.exchange(nullptr)) ncclCommAbort(c);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(void* data, DType dtype, int64_t count, const ops::Stream& s) override {
    if (dtype != DType::F32 && dtype != DType::BF16)
      throw Error("all_reduce: dtype " + std::string(dtype_name(dtype)) + " is not supported (F32 or BF16)");
    check(ncclAllReduce(data, data, size_t(count), nccl_type(dtype), ncclSum, comm(),
                        static_cast<cudaStream_t>(s.cuda_stream)),
          "ncclAllReduce");
  }

  void all_gather(const void* in, void* out, DType dtype, int64_t count, const ops::Stream& s) override {
    check(ncclAllGather(in, out, size_t(count), nccl_type(dtype), comm(), static_cast<cudaStream_t>(s.cuda_stream)),
          "ncclAllGather");
  }

 private:
  // A non-blocking communicator may return ncclInProgress; its enqueue completes on its own, so
  // wait for that (never for the collective itself, which runs on the stream).
  ncclComm_t comm() const {
    ncclComm_t c = comm_.load();
    if (!c) throw Error("tensor-parallel rank " + std::to_string(rank_) + ": the group was aborted (a rank failed)");
    return c;
  }
  void check(ncclResult_t r, const char* what) {
    while (r == ncclInProgress) {
      std::this_thread::yield();
      ncclComm_t c = comm_.load();
      if (!c) break;
      ncclCommGetAsyncError(c, &r);
    }
    if (r != ncclSuccess)
      throw Error(std::string("tensor-parallel rank ") + std::to_string(rank_) + ": " + what +
                  " failed: " + ncclGetErrorString(r));
  }

  std::atomic<ncclComm_t> comm_{nullptr};
  int rank_, size_, device_;
};

}  // namespace

bool have_nccl() { return true; }

std::string nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) throw Error(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

std::unique_ptr<ops::Collective> nccl_collective(const std::string& unique_id, int rank, int size, int device,
                                                 std::chrono::milliseconds timeout) {
  if (unique_id.size() != sizeof(ncclUniqueId))
    throw Error("NCCL unique id of " + std::to_string(unique_id.size()) + " bytes (expected " +
                std::to_string(sizeof(ncclUniqueId)) + ")");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || device >= devices)
    throw Error("tensor-parallel rank " + std::to_string(rank) + " needs CUDA device " + std::to_string(device) +
                ", but this machine has " + std::to_string(devices));
  if (cudaSetDevice(device) != cudaSuccess)
    throw Error("tensor-parallel rank " + std::to_string(rank) + ": cannot use CUDA device " + std::to_string(device));
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;  // so that a peer that never joins ends in a timeout, not a hang
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &cfg);
  const auto deadline = Clock::now() + timeout;
  while (r == ncclInProgress) {
    if (Clock::now() > deadline) {
      if (comm) ncclCommAbort(comm);
      throw Error("tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(size) +
                  ": the NCCL group did not form within " + std::to_string(timeout.count() / 1000) +
                  " s (a peer never joined)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclCommGetAsyncError(comm, &r);
  }
  if (r != ncclSuccess) {
    if (comm) ncclCommAbort(comm);
    throw Error("tensor-parallel rank " + std::to_string(rank) + ": NCCL initialisation failed: " +
                ncclGetErrorString(r));
  }
  return std::make_unique<NcclRank>(comm, rank, size, device);
}

#else

bool have_nccl() { return false; }
std::string nccl_unique_id() { throw Error("this build has no NCCL (tensor parallelism on GPUs needs it)"); }
std::unique_ptr<ops::Collective> nccl_collective(const std::string&, int, int, int, std::chrono::milliseconds) {
  throw Error("this build has no NCCL (tensor parallelism on GPUs needs it)");
}

#endif

}  // namespace sieve::parallel
