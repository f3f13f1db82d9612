// GGUF (v2, v3) reader: metadata, tensor infos and zero-copy tensor data over a memory map.
//
// Every count, length, offset and type in the file is bounds-checked against what the file can actually hold, so a
// truncated or corrupt file gives a kvpack::Error naming the file, the key or tensor and what is wrong; allocations
// are capped by the file size (a 1e18-element array in a 1 KB file is an error, not an allocation).
// The format (and what kvpack checks) is described in docs/MODEL_FILES.md.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kvpack/dequant.h"
#include "kvpack/mapped_file.h"
#include "kvpack/model_config.h"

namespace kvpack {

// GGUF metadata value type ids (gguf_type).
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
// "u32", "string", "array", ...
std::string_view gguf_type_name(GgufType t);

// One metadata value. Unsigned integers are held as uint64_t, signed as int64_t, floats as double (f32 values
// widen exactly), arrays as a vector of values that all have type `elem_type` (arrays may nest).
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem_type = GgufType::U8;  // element type; meaningful only when type == ARRAY
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> value;

  bool is_int() const;     // u8..i64 (not bool)
  bool is_float() const;   // f32, f64
  bool is_string() const { return type == GgufType::STRING; }
  bool is_array() const { return type == GgufType::ARRAY; }
  // These return nullopt / nullptr when the value is of another kind (or an integer does not fit int64_t).
  std::optional<int64_t> as_int() const;
  std::optional<double> as_float() const;  // ints convert too
  const std::string* as_string() const;
  const std::vector<GgufValue>* as_array() const;
  // "u32", "array[string]", "array[array[i32]]"...
  std::string type_string() const;
  // Human summary: scalars in full (strings quoted, cut at max_chars), arrays as "array[T] n=49152 [a, b, c, ...]".
  std::string summary(size_t max_items = 4, size_t max_chars = 60) const;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;  // ggml order: dims[0] is contiguous (innermost); 1..4 dims
  uint64_t offset;            // relative to the data section
  int64_t n_elements;
  uint64_t n_bytes;
  const uint8_t* data;        // points into the mapping (or the from_memory buffer)

  int64_t row_length() const { return dims.empty() ? 1 : dims[0]; }
  int64_t n_rows() const { return row_length() > 0 ? n_elements / row_length() : 0; }
  // "[576, 49152]" (ggml order)
  std::string shape_string() const;
};

class GgufFile {
 public:
  static GgufFile open(const std::string& path);  // throws kvpack::Error
  // Parses n bytes at p without copying them; p must outlive the GgufFile. `name` stands for the file in messages.
  static GgufFile from_memory(const uint8_t* p, size_t n, std::string name);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute file offset of the data section
  uint64_t file_size() const { return size_; }

  const GgufValue* find(std::string_view key) const;  // nullptr if absent
  // Typed getters: throw "FILE: metadata key 'K' is missing" / "FILE: metadata key 'K' has type X, expected Y".
  int64_t get_int(std::string_view key) const;
  std::optional<int64_t> get_int_opt(std::string_view key) const;
  double get_float(std::string_view key) const;  // accepts integer values too
  std::optional<double> get_float_opt(std::string_view key) const;
  bool get_bool(std::string_view key, bool dflt) const;  // dflt when absent; throws on another type
  std::string get_string(std::string_view key) const;
  std::optional<std::string> get_string_opt(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;  // accepts integer arrays too
  std::vector<std::string> keys() const;                              // in file order

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  const GgufTensorInfo& tensor(std::string_view name) const;  // throws naming file + tensor

  // Whole tensor to fp32, rows split over threads for large tensors. Throws for types kvpack cannot dequantize.
  std::vector<float> dequantize(const GgufTensorInfo& t) const;
  void dequantize_into(const GgufTensorInfo& t, float* out) const;  // out holds t.n_elements floats
  // Rows [row0, row0 + n_rows) of a tensor viewed as [n_rows(), row_length()] into out (n_rows * row_length floats).
  void dequantize_rows(const GgufTensorInfo& t, int64_t row0, int64_t n_rows, float* out) const;

 private:
  GgufFile() = default;
  void parse();
  const GgufValue& require(std::string_view key) const;
  [[noreturn]] void type_error(std::string_view key, const GgufValue& v, std::string_view expected) const;

  MappedFile map_;  // empty for from_memory
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;          // file order
  std::map<std::string, size_t, std::less<>> kv_index_;       // key -> index in kv_
  std::vector<GgufTensorInfo> tensors_;                        // file order
  std::map<std::string, size_t, std::less<>> tensor_index_;   // name -> index in tensors_
};

// Model shape from `<arch>.*` metadata (llama, qwen2; SmolLM2 is llama). head_dim = embedding_length/head_count
// unless `<arch>.attention.key_length` says otherwise; tied_embeddings = no `output.weight` tensor;
// n_params = sum of tensor element counts; rope scaling from `<arch>.rope.scaling.*` when present.
// Calls kvpack::validate(config, path).
ModelConfig model_config_from_gguf(const GgufFile& f);

}  // namespace kvpack
