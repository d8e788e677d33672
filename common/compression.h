#ifndef PSRT_COMMON_COMPRESSION_H_
#define PSRT_COMMON_COMPRESSION_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "psrt/v1/ps.pb.h"

namespace psrt {

// The wire encoding of float32 values, shared by clients and servers: fp32
// as is; fp16 and bf16 at half the bytes. fp16 covers only |x| < 65504 and
// loses precision below 2^-14, so each encoded block carries a power-of-two
// scale chosen from its largest magnitude: values are multiplied by it
// before conversion and divided by it after (exact, being a power of two).
// bf16 has float32's range and always uses scale 1.

// Bytes per value of `dtype` (0 for an unknown one).
int BytesPerValue(v1::DType dtype);
// "float32", "float16", "bfloat16" or "unspecified".
const char* DTypeName(v1::DType dtype);

// What encoding a block of values did.
struct EncodeInfo {
  float scale = 1;        // 1 unless fp16 needed it
  bool nonfinite = false; // the block held NaN or Inf (sent as is, scale 1)
};

// Writes `n` values of `in` to `out` (resized) in `dtype`.
EncodeInfo EncodeValues(const float* in, int64_t n, v1::DType dtype, std::string* out);
// The same into n * BytesPerValue(dtype) bytes at `out`.
EncodeInfo EncodeValues(const float* in, int64_t n, v1::DType dtype, char* out);

// The scale for fp16 given the block's largest magnitude: 1 when the values
// fit comfortably, else a power of two bringing the largest near 2^14.
float Fp16Scale(float max_abs);

// Decodes `bytes` of `dtype` (with `scale`, 0 meaning 1) into `out`, or,
// with `accumulate`, adds them to it. The caller has checked the size.
void DecodeValues(absl::string_view bytes, v1::DType dtype, float scale, float* out, int64_t n,
                  bool accumulate);

// "compression" values of the distribution option: "none", "fp16", "bf16".
absl::Status ParseCompression(absl::string_view name, v1::DType* dtype);

}  // namespace psrt

#endif  // PSRT_COMMON_COMPRESSION_H_
