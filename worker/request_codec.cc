#include "worker/request_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/row_optimizer.h"
#ifdef PSRT_HAVE_CUDA
#include "kernels/cuda_kernels.h"
#endif

namespace psrt {

absl::StatusOr<std::vector<Shard>> SplitTensors(
    const std::vector<TensorRef>& tensors,
    const std::function<absl::StatusOr<Variable>(const std::string&)>& find,
    const std::vector<int64_t>& limits, bool with_grad, bool with_out, bool exact) {
  std::vector<Shard> shards;
  std::map<int, size_t> open;  // server -> index of its request being filled
  for (const TensorRef& t : tensors) {
    absl::StatusOr<Variable> var = find(t.name);
    if (!var.ok()) return var.status();
    // A push without a gradient buffer says the tensor has no gradient
    // this step (Encode).
    if (with_out && t.out == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has no buffer"));
    }
    for (const Partition& p : var->parts) {
      Shard& shard = BatchFor(&shards, &open, p.server, p.num_elements * 4, limits.at(p.server));
      shard.items.push_back(
          {t.name, p, t.grad, t.out, var->push_dtype, exact ? v1::DTYPE_FLOAT32 : var->pull_dtype});
    }
  }
  return shards;
}

absl::StatusOr<EncodeInfo> EncodeGradient(const float* grad, int64_t n, v1::DType dtype,
                                          char* out) {
#ifdef PSRT_HAVE_CUDA
  if (IsDevicePointer(grad)) {
    if (dtype == v1::DTYPE_FLOAT32) {
      if (absl::Status s = CudaCopyToHost(grad, out, n * 4); !s.ok()) return s;
      return EncodeInfo{};
    }
    absl::StatusOr<CudaEncoded> e = CudaEncodeToHost(grad, n, dtype == v1::DTYPE_FLOAT16,
                                                     &Fp16Scale, reinterpret_cast<uint16_t*>(out));
    if (!e.ok()) return e.status();
    return EncodeInfo{e->scale, e->nonfinite};
  }
#endif
  return EncodeValues(grad, n, dtype, out);
}

bool SendInPlace(const float* grad, v1::DType dtype) {
#ifdef PSRT_HAVE_CUDA
  if (IsDevicePointer(grad)) return false;
#endif
  return dtype == v1::DTYPE_FLOAT32;
}

absl::Status DecodeWeights(const WireKey& kd, float* out, int64_t n) {
#ifdef PSRT_HAVE_CUDA
  if (IsDevicePointer(out)) {
    thread_local std::vector<float> host;  // reused: no allocation per pull
    host.resize(n);
    DecodePayload(kd.data, kd.dtype, kd.scale, host.data(), false);
    return CudaCopyToDevice(host.data(), out, n * 4);
  }
#endif
  (void)n;
  DecodePayload(kd.data, kd.dtype, kd.scale, out, false);
  return absl::OkStatus();
}

absl::Status WireDType(Compression c, const std::string& job_default, v1::DType* dtype) {
  switch (c) {
    case Compression::kNone:
      *dtype = v1::DTYPE_FLOAT32;
      return absl::OkStatus();
    case Compression::kFp16:
      *dtype = v1::DTYPE_FLOAT16;
      return absl::OkStatus();
    case Compression::kBf16:
      *dtype = v1::DTYPE_BFLOAT16;
      return absl::OkStatus();
    default:
      return ParseCompression(job_default.empty() ? "none" : job_default, dtype);
  }
}

std::vector<std::shared_ptr<RowSet>> SplitRows(const int64_t* ids, const int64_t* which, int64_t n,
                                               const float* grads, int64_t dim, int servers) {
  std::vector<std::shared_ptr<RowSet>> sets(servers);
  for (auto& set : sets) set = std::make_shared<RowSet>();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = which == nullptr ? k : which[k];
    RowSet& set = *sets[RowShard(ids[i], servers)];
    set.ids.push_back(ids[i]);
    set.at.push_back(i);
    if (grads != nullptr) set.grads.insert(set.grads.end(), grads + i * dim, grads + (i + 1) * dim);
  }
  return sets;
}

void ScatterRows(const WireKey& kd, const RowSet& rows, int64_t dim, float* out) {
  const int64_t row_bytes = dim * 4;
  if (kd.dtype == v1::DTYPE_FLOAT32) {
    int64_t at = 0;  // bytes placed so far
    for (absl::string_view piece : kd.data.pieces()) {
      while (!piece.empty()) {
        const int64_t r = at / row_bytes, offset = at % row_bytes;
        const int64_t take =
            std::min<int64_t>(static_cast<int64_t>(piece.size()), row_bytes - offset);
        std::memcpy(reinterpret_cast<char*>(out + rows.at[r] * dim) + offset, piece.data(), take);
        piece.remove_prefix(take);
        at += take;
      }
    }
    return;
  }
  thread_local std::vector<float> decoded;
  decoded.resize(rows.at.size() * dim);
  DecodePayload(kd.data, kd.dtype, kd.scale, decoded.data(), false);
  for (size_t r = 0; r < rows.at.size(); ++r) {
    std::memcpy(out + rows.at[r] * dim, decoded.data() + r * dim, row_bytes);
  }
}

}  // namespace psrt
