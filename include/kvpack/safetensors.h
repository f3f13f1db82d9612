// safetensors reader (single file or sharded checkpoint, memory-mapped, fully validated) and writer (deterministic,
// atomic). Format: 8-byte little-endian header length N, N bytes of JSON header, then the data section; the header
// maps tensor name -> {dtype, shape, data_offsets:[begin,end)} (offsets relative to the data section) plus an
// optional "__metadata__" string->string map. See docs/MODEL_FILES.md "## safetensors".
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvpack {

class MappedFile;

enum class StDtype { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL };

// Name as spelled in safetensors headers ("F32", "BF16", "F8_E4M3", ...).
std::string_view st_dtype_name(StDtype);
// Bytes per element (BOOL is one byte).
size_t st_dtype_size(StDtype);
// True for F64/F32/F16/BF16/F8_E4M3/F8_E5M2: the dtypes to_float accepts.
bool st_dtype_is_float(StDtype);

// A view of one tensor's bytes inside a mapped file (or the caller's buffer for from_memory). `data` is not
// necessarily aligned to the element size (the format does not require it): read through memcpy or to_float.
struct StTensor {
  std::string name;
  StDtype dtype;
  std::vector<int64_t> shape;  // [] is a scalar (numel 1); a 0 extent gives an empty tensor
  const uint8_t* data;
  size_t n_bytes;  // == numel() * st_dtype_size(dtype), checked on open
  int64_t numel() const;
};

// One safetensors file. Copies share the mapping; tensor data pointers stay valid while any copy is alive.
class SafetensorsFile {
 public:
  // Maps `path` and validates the whole header; throws kvpack::Error naming the file, tensor/field and the problem.
  static SafetensorsFile open(const std::string& path);
  // Parses a buffer the caller keeps alive for the lifetime of the result (no copy); `name` is used in errors.
  static SafetensorsFile from_memory(const uint8_t* p, size_t n, std::string name);

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // In data-section order (ascending data_offsets).
  const std::vector<StTensor>& tensors() const { return tensors_; }
  const StTensor* find(std::string_view name) const;
  // Throws kvpack::Error naming the file and the tensor when absent.
  const StTensor& tensor(std::string_view name) const;
  size_t header_size() const { return header_size_; }  // N, the JSON header length in bytes

 private:
  static SafetensorsFile parse(const uint8_t* p, size_t n, std::string name, std::shared_ptr<const MappedFile> map);

  std::string path_;
  std::shared_ptr<const MappedFile> map_;  // null for from_memory
  std::map<std::string, std::string> metadata_;
  std::vector<StTensor> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
  size_t header_size_ = 0;
};

// A model checkpoint: a directory (model.safetensors.index.json with its shards, else model.safetensors, else every
// *.safetensors in it), an index file, or a single .safetensors file.
class SafetensorsModel {
 public:
  static SafetensorsModel open(const std::string& path);

  const std::string& path() const { return path_; }
  const StTensor* find(std::string_view name) const;
  const StTensor& tensor(std::string_view name) const;  // throws kvpack::Error naming the checkpoint and tensor
  std::vector<std::string> names() const;                // sorted
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // Index "metadata" entries rendered as strings (e.g. total_size), or the single file's __metadata__.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  std::vector<SafetensorsFile> files_;
  // name -> (index into files_, index into that file's tensors()); indices keep copies of the model valid.
  std::map<std::string, std::pair<size_t, size_t>, std::less<>> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Float dtypes -> fp32. F32/F16/BF16/F8 are exact; F64 rounds to nearest (overflow -> inf). Throws kvpack::Error
// for integer and BOOL tensors. to_float_into writes numel() floats to `out`.
std::vector<float> to_float(const StTensor& t);
void to_float_into(const StTensor& t, float* out);

// Scalar fp8 decoders (exact; exhaustively tested against torch.float8_e4m3fn / torch.float8_e5m2).
// E4M3 is the "fn" variant: bias 7, no infinities, S.1111.111 is NaN. E5M2 is IEEE-like: bias 15, inf and NaN.
float f8_e4m3_to_f32(uint8_t v);
float f8_e5m2_to_f32(uint8_t v);

struct StWriteTensor {
  std::string name;
  StDtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian, numel * st_dtype_size(dtype) bytes
};

// Writes a safetensors file atomically (temp file in the same directory, fsync, rename). Deterministic bytes:
// header keys sorted, compact JSON padded with spaces so the data section starts 8-byte aligned; data laid out by
// element size descending then name, so every tensor is naturally aligned. Any dtype may be written. Throws
// kvpack::Error for empty/duplicate/reserved names, negative extents or a byte count that does not match the shape.
void write_safetensors(const std::string& path, const std::vector<StWriteTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

// Convenience: an F32 StWriteTensor from floats (shape product must equal values.size()).
StWriteTensor st_f32_tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& values);

}  // namespace kvpack
