// Read-only memory map of a whole file (model and calibration files are mapped, never copied).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvpack {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws kvpack::Error naming the path when the file cannot be opened or mapped. Empty files map to size 0.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvpack
