// CUDA kernels (kernels/cuda_kernels.h) against the CPU kernels.
//
// Needs a GPU: without one (CI, build machines) each comparison calls
// GTEST_SKIP with the reason, so it is reported as skipped, not passed. Only
// NoDeviceFailsCleanly runs everywhere.

#include "kernels/cuda_kernels.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/compression.h"
#include "kernels/convert.h"
#include "kernels/isa.h"
#include "kernels/optimizer.h"
#include "kernels/optimizer_internal.h"

namespace psrt {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Device memory for the length of one test.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n > 0) {
      EXPECT_EQ(cudaMalloc(&ptr_, n * sizeof(T)), cudaSuccess);
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host)
      : DeviceBuffer(host.size()) {
    if (n_ > 0) {
      EXPECT_EQ(
          cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice),
          cudaSuccess);
    }
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  // Waits for the default stream, then copies back.
  std::vector<T> ToHost() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(
          cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost),
          cudaSuccess);
    }
    return host;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

std::vector<float> TestFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            65504.0f,
                            65520.0f,
                            1e30f,
                            0x1p-24f,
                            0x1p-25f,
                            3 * 0x1p-25f,
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            FromBits(0x7F800001u),
                            FromBits(0xFFA00000u)};
  std::vector<float> out(n);
  for (float& v : out) {
    switch (rng() % 4) {
      case 0:
        v = FromBits(static_cast<uint32_t>(rng()));
        break;
      case 1:
        v = normal(rng) * std::exp2(exponent(rng));
        break;
      case 2:  // fp16 tie
        v = FromBits(
            Bits(HalfToFloat(static_cast<uint16_t>((rng() % 0x7800) + 0x400))) +
            0x1000u);
        break;
      default:
        v = specials[rng() % (sizeof specials / sizeof specials[0])];
    }
  }
  return out;
}

std::vector<uint16_t> TestHalves(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> out(n);
  for (auto& h : out) h = static_cast<uint16_t>(rng());
  return out;
}

// Bit equality; with `nan_any_payload` two NaNs match (the GPU's arithmetic
// returns its canonical NaN).
template <typename T>
void ExpectSameBits(const std::vector<T>& got, const std::vector<T>& want,
                    const std::string& what, bool nan_any_payload) {
  ASSERT_EQ(got.size(), want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t g, w;
    if constexpr (sizeof(T) == 4) {
      if (nan_any_payload && std::isnan(got[i]) && std::isnan(want[i])) {
        continue;
      }
      g = Bits(got[i]);
      w = Bits(want[i]);
    } else {
      g = got[i];
      w = want[i];
      if (nan_any_payload && (g & 0x7FFF) > 0x7C00 && (w & 0x7FFF) > 0x7C00) {
        continue;  // both fp16 NaN
      }
    }
    if (g != w && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << w;
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

const size_t kLengths[] = {1, 7, 31, 1000003};

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) {
      GTEST_SKIP() << "no usable CUDA device (" << CudaUnavailableReason()
                   << "): CUDA vs CPU comparison not run";
    }
  }
};

// Runs everywhere: without a GPU, CudaAvailable() is false and the kernels
// return FAILED_PRECONDITION instead of crashing.
TEST(CudaKernels, NoDeviceFailsCleanly) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_STRNE(CudaUnavailableReason(), "");
  std::printf("[          ] CUDA unavailable: %s\n", CudaUnavailableReason());
  float dummy = 0.0f;
  uint16_t out = 0;
  const absl::Status s = CudaFp32ToFp16(&dummy, &out, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(CudaMaxAbs(&dummy, 1, &dummy, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  OptimizerConfig c;
  EXPECT_EQ(
      CudaApplyUpdate(c, 0.1, 1, &dummy, &dummy, nullptr, 1, nullptr).code(),
      absl::StatusCode::kFailedPrecondition);
  // Nothing to do is not an error.
  EXPECT_TRUE(CudaFp32ToFp16(nullptr, nullptr, 0, nullptr).ok());
}

TEST_F(CudaKernelsTest, ConversionsMatchCpu) {
  for (size_t n : kLengths) {
    const std::vector<float> in = TestFloats(n, 3 + n);
    const DeviceBuffer<float> d_in(in);
    DeviceBuffer<uint16_t> d_out(n);
    std::vector<uint16_t> want(n);
    const std::string at = "n=" + std::to_string(n) + " ";

    ASSERT_TRUE(CudaFp32ToFp16(d_in.get(), d_out.get(), n, nullptr).ok());
    Fp32ToFp16(in.data(), want.data(), n);
    ExpectSameBits(d_out.ToHost(), want, at + "fp32->fp16", false);

    ASSERT_TRUE(CudaFp32ToBf16(d_in.get(), d_out.get(), n, nullptr).ok());
    Fp32ToBf16(in.data(), want.data(), n);
    ExpectSameBits(d_out.ToHost(), want, at + "fp32->bf16", false);

    ASSERT_TRUE(
        CudaFp32ToFp16Scaled(d_in.get(), 0.375f, d_out.get(), n, nullptr).ok());
    Fp32ToFp16Scaled(in.data(), 0.375f, want.data(), n);
    ExpectSameBits(d_out.ToHost(), want, at + "fp32->fp16 scaled", true);

    ASSERT_TRUE(
        CudaFp32ToBf16Scaled(d_in.get(), 0.375f, d_out.get(), n, nullptr).ok());
    Fp32ToBf16Scaled(in.data(), 0.375f, want.data(), n);
    // bf16 NaN: exponent all ones, mantissa non-zero.
    std::vector<uint16_t> got = d_out.ToHost();
    for (size_t i = 0; i < n; ++i) {
      const bool got_nan = (got[i] & 0x7FFF) > 0x7F80;
      const bool want_nan = (want[i] & 0x7FFF) > 0x7F80;
      if (got_nan && want_nan) got[i] = want[i];
    }
    ExpectSameBits(got, want, at + "fp32->bf16 scaled", false);

    const std::vector<uint16_t> halves = TestHalves(n, 9 + n);
    const DeviceBuffer<uint16_t> d_halves(halves);
    DeviceBuffer<float> d_f(n);
    std::vector<float> want_f(n);
    ASSERT_TRUE(CudaFp16ToFp32(d_halves.get(), d_f.get(), n, nullptr).ok());
    Fp16ToFp32(halves.data(), want_f.data(), n);
    ExpectSameBits(d_f.ToHost(), want_f, at + "fp16->fp32", false);
    ASSERT_TRUE(CudaBf16ToFp32(d_halves.get(), d_f.get(), n, nullptr).ok());
    Bf16ToFp32(halves.data(), want_f.data(), n);
    ExpectSameBits(d_f.ToHost(), want_f, at + "bf16->fp32", false);
  }
}

TEST_F(CudaKernelsTest, AllHalvesRoundTrip) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i <= 0xFFFF; ++i) all[i] = static_cast<uint16_t>(i);
  const DeviceBuffer<uint16_t> d_all(all);
  DeviceBuffer<float> d_f(all.size());
  DeviceBuffer<uint16_t> d_back(all.size());
  ASSERT_TRUE(CudaFp16ToFp32(d_all.get(), d_f.get(), all.size(), nullptr).ok());
  ASSERT_TRUE(
      CudaFp32ToFp16(d_f.get(), d_back.get(), all.size(), nullptr).ok());
  std::vector<float> want_f(all.size());
  Fp16ToFp32(all.data(), want_f.data(), all.size());
  ExpectSameBits(d_f.ToHost(), want_f, "fp16->fp32", false);
  const std::vector<uint16_t> back = d_back.ToHost();
  for (uint32_t i = 0; i <= 0xFFFF; ++i) {
    const bool nan = (i & 0x7C00) == 0x7C00 && (i & 0x3FF);
    ASSERT_EQ(back[i], nan ? (i | 0x200) : i) << i;
  }
}

TEST_F(CudaKernelsTest, AccumulateMatchesCpu) {
  for (size_t n : kLengths) {
    const std::vector<uint16_t> in = TestHalves(n, 21 + n);
    const std::vector<float> acc0 = TestFloats(n, 31 + n);
    const DeviceBuffer<uint16_t> d_in(in);
    for (float scale : {1.0f, 0.25f, -3.0f}) {
      const std::string at = "n=" + std::to_string(n) + " ";
      DeviceBuffer<float> d_acc(acc0);
      std::vector<float> want = acc0;
      ASSERT_TRUE(
          CudaAccumulateFp16(d_in.get(), scale, d_acc.get(), n, nullptr).ok());
      AccumulateFp16(in.data(), scale, want.data(), n);
      ExpectSameBits(d_acc.ToHost(), want, at + "accumulate fp16", true);

      DeviceBuffer<float> d_acc2(acc0);
      want = acc0;
      ASSERT_TRUE(
          CudaAccumulateBf16(d_in.get(), scale, d_acc2.get(), n, nullptr).ok());
      AccumulateBf16(in.data(), scale, want.data(), n);
      ExpectSameBits(d_acc2.ToHost(), want, at + "accumulate bf16", true);
    }
  }
}

TEST_F(CudaKernelsTest, MaxAbsMatchesCpu) {
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{7}, size_t{31}, size_t{1000003}}) {
    std::vector<float> x(n);
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> normal(0.0f, 100.0f);
    for (float& v : x) v = normal(rng);
    for (int round = 0; round < 3; ++round) {
      if (n > 0 && round == 1)
        x[n - 1] = -std::numeric_limits<float>::infinity();
      if (n > 0 && round == 2) x[n / 2] = FromBits(0xFFC01234u);
      const DeviceBuffer<float> d_x(x);
      DeviceBuffer<float> d_result(1);
      ASSERT_TRUE(CudaMaxAbs(d_x.get(), n, d_result.get(), nullptr).ok());
      // The same integer max as the CPU: the same bits, NaN included.
      EXPECT_EQ(Bits(d_result.ToHost()[0]), Bits(MaxAbs(x.data(), n)))
          << "n=" << n << " round " << round;
    }
  }
}

TEST_F(CudaKernelsTest, OptimizersMatchCpu) {
  std::vector<OptimizerConfig> configs;
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  configs.push_back(c);
  c.momentum = 0.9;
  c.dampening = 0.3;
  configs.push_back(c);
  c.dampening = 0.0;
  c.nesterov = true;
  c.weight_decay = 0.01;
  configs.push_back(c);
  c = OptimizerConfig();
  c.kind = OptimizerKind::kAdam;
  configs.push_back(c);
  c.weight_decay = 0.1;
  c.beta1 = 0.3;  // torch's other lerp form
  configs.push_back(c);
  c = OptimizerConfig();
  c.kind = OptimizerKind::kAdamW;
  c.weight_decay = 0.1;
  configs.push_back(c);
  c = OptimizerConfig();
  c.kind = OptimizerKind::kAdaGrad;
  c.eps = 1e-10;
  c.lr_decay = 0.1;
  c.initial_accumulator_value = 0.5;
  configs.push_back(c);

  const size_t n = 1000003;
  for (const OptimizerConfig& config : configs) {
    const std::string what = OptimizerName(config.kind);
    const int num_slots = NumSlots(config);
    std::vector<float> param = TestFloats(n, 1);
    for (float& p : param) {
      if (!std::isfinite(p) || std::fabs(p) > 1e6f) p = 0.5f;
    }
    std::vector<std::vector<float>> slots(num_slots, std::vector<float>(n));
    std::vector<float*> slot_ptrs;
    for (auto& s : slots) slot_ptrs.push_back(s.data());
    InitSlots(config, slot_ptrs.data(), n);

    DeviceBuffer<float> d_param(param);
    std::vector<std::unique_ptr<DeviceBuffer<float>>> d_slots;
    std::vector<float*> d_slot_ptrs;
    for (auto& s : slots) {
      d_slots.push_back(std::make_unique<DeviceBuffer<float>>(s));
      d_slot_ptrs.push_back(d_slots.back()->get());
    }
    for (int64_t step = 1; step <= 5; ++step) {
      std::vector<float> grad = TestFloats(n, 50 + step);
      for (float& g : grad) {
        if (std::fabs(g) > 1e6f) g = 1.0f;  // keep most of the run finite
      }
      const DeviceBuffer<float> d_grad(grad);
      const double lr = 0.01 / step;
      ASSERT_TRUE(CudaApplyUpdate(config, lr, step, d_param.get(), d_grad.get(),
                                  d_slot_ptrs.data(), n, nullptr)
                      .ok());
      ApplyUpdate(config, lr, step, param.data(), grad.data(), slot_ptrs.data(),
                  n);
      const std::string at = what + " step " + std::to_string(step) + " ";
      ExpectSameBits(d_param.ToHost(), param, at + "param", true);
      for (int s = 0; s < num_slots; ++s) {
        ExpectSameBits(d_slots[s]->ToHost(), slots[s],
                       at + "slot" + std::to_string(s), true);
      }
      if (HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace psrt

namespace psrt {
namespace {

// A gradient in GPU memory is encoded on the device exactly as the CPU
// encodes it (common/compression.h), scale and all.
TEST(CudaTransferTest, EncodeToHostMatchesTheCpuEncoding) {
  if (!CudaAvailable()) GTEST_SKIP() << "no usable GPU: " << CudaUnavailableReason();
  std::vector<float> host(100003);
  for (size_t i = 0; i < host.size(); ++i) host[i] = std::sin(i * 0.37f) * (i % 11 == 0 ? 3e5f : 1.f);
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, host.size() * 4), cudaSuccess);
  ASSERT_TRUE(CudaCopyToDevice(host.data(), device, host.size() * 4).ok());
  EXPECT_TRUE(IsDevicePointer(device));
  EXPECT_FALSE(IsDevicePointer(host.data()));
  for (v1::DType dtype : {v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    std::string cpu;
    const EncodeInfo want = EncodeValues(host.data(), host.size(), dtype, &cpu);
    std::vector<uint16_t> got(host.size());
    auto enc = CudaEncodeToHost(device, host.size(), dtype == v1::DTYPE_FLOAT16, &Fp16Scale, got.data());
    ASSERT_TRUE(enc.ok()) << enc.status();
    EXPECT_EQ(enc->scale, want.scale);
    EXPECT_EQ(enc->nonfinite, want.nonfinite);
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size()), 0) << "dtype " << dtype;
  }
  cudaFree(device);
}

TEST(CudaTransferTest, WithoutAGpuEveryCallFailsCleanly) {
  if (CudaAvailable()) GTEST_SKIP() << "a GPU is present";
  float x = 1;
  uint16_t y = 0;
  EXPECT_FALSE(IsDevicePointer(&x));
  EXPECT_EQ(CudaCopyToHost(&x, &y, 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaEncodeToHost(&x, 1, true, &Fp16Scale, &y).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace psrt
