#include "common/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/convert.h"

namespace psrt {

const char* DTypeName(v1::DType d) {
  switch (d) {
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_FLOAT16:
      return "float16";
    case v1::DTYPE_BFLOAT16:
      return "bfloat16";
    default:
      return "unspecified";
  }
}

int BytesPerValue(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return 4;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16: return 2;
    default: return 0;
  }
}

float Fp16Scale(float max_abs) {
  // Keep the largest value within [2^13, 2^15): far from fp16's 65504 and
  // its subnormals, so sums of a few such blocks stay finite too.
  if (!(max_abs > 0) || !std::isfinite(max_abs)) return 1;
  if (max_abs < 32768.f && max_abs >= 0x1p-10f) return 1;
  const int e = std::ilogb(max_abs);  // max_abs in [2^e, 2^(e+1))
  return std::ldexp(1.f, std::clamp(13 - e, -126, 127));  // a finite float
}

EncodeInfo EncodeValues(const float* in, int64_t n, v1::DType dtype, std::string* out) {
  out->resize(n * BytesPerValue(dtype));
  return EncodeValues(in, n, dtype, out->data());
}

EncodeInfo EncodeValues(const float* in, int64_t n, v1::DType dtype, char* out) {
  EncodeInfo info;
  switch (dtype) {
    case v1::DTYPE_FLOAT16: {
      const float max_abs = MaxAbs(in, n);
      info.nonfinite = !std::isfinite(max_abs);
      info.scale = Fp16Scale(max_abs);
      auto* dst = reinterpret_cast<uint16_t*>(out);
      if (info.scale == 1) {
        Fp32ToFp16(in, dst, n);
      } else {
        Fp32ToFp16Scaled(in, info.scale, dst, n);
      }
      break;
    }
    case v1::DTYPE_BFLOAT16:
      info.nonfinite = !AllFinite(in, n);
      Fp32ToBf16(in, reinterpret_cast<uint16_t*>(out), n);
      break;
    default:
      std::memcpy(out, in, n * 4);
      break;
  }
  return info;
}

void DecodeValues(absl::string_view bytes, v1::DType dtype, float scale, float* out, int64_t n,
                  bool accumulate) {
  const float inverse = scale == 0 || scale == 1 ? 1.f : 1.f / scale;
  const auto* src16 = reinterpret_cast<const uint16_t*>(bytes.data());
  if (dtype == v1::DTYPE_FLOAT32) {
    const char* src = bytes.data();  // at any byte of a received slice
    if (!accumulate) {
      std::memcpy(out, src, n * 4);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, src + 4 * i, 4);
        out[i] += v;
      }
    }
    return;
  }
  if (!accumulate && inverse == 1) {
    (dtype == v1::DTYPE_FLOAT16 ? Fp16ToFp32 : Bf16ToFp32)(src16, out, n);
    return;
  }
  if (!accumulate) std::fill(out, out + n, 0.f);
  (dtype == v1::DTYPE_FLOAT16 ? AccumulateFp16 : AccumulateBf16)(src16, inverse, out, n);
}

absl::Status ParseCompression(absl::string_view name, v1::DType* dtype) {
  if (name == "none") {
    *dtype = v1::DTYPE_FLOAT32;
  } else if (name == "fp16") {
    *dtype = v1::DTYPE_FLOAT16;
  } else if (name == "bf16") {
    *dtype = v1::DTYPE_BFLOAT16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown compression '", name, "'; accepted: none, fp16, bf16"));
  }
  return absl::OkStatus();
}

}  // namespace psrt
