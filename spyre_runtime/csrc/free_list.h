// Best-fit free list over a range [0, size): the one placement policy used at
// both levels of device memory (regions in the device's address space, blocks
// in a region). Freed ranges coalesce with their neighbours.
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace spyre {

class FreeList {
 public:
  explicit FreeList(size_t size) : size_(size) {
    if (size > 0) {
      insert(0, size);
    }
  }

  // Smallest free range that holds `length`; returns its start.
  std::optional<size_t> take(size_t length) {
    auto fit = by_size_.lower_bound({length, 0});
    if (length == 0 || fit == by_size_.end()) {
      return std::nullopt;
    }
    const auto [free_len, offset] = *fit;
    erase(offset, free_len);
    if (free_len > length) {
      insert(offset + length, free_len - length);
    }
    return offset;
  }

  void give(size_t offset, size_t length) {
    TORCH_INTERNAL_ASSERT(offset + length <= size_, "spyre: freeing past the end of a range");
    auto next = by_offset_.lower_bound(offset);
    TORCH_INTERNAL_ASSERT(next == by_offset_.end() || next->first >= offset + length,
                          "spyre: freeing a range that overlaps a free one");
    if (next != by_offset_.end() && next->first == offset + length) {
      length += next->second;
      erase(next->first, next->second);
    }
    auto after = by_offset_.lower_bound(offset);
    if (after != by_offset_.begin()) {
      auto prev = std::prev(after);
      TORCH_INTERNAL_ASSERT(prev->first + prev->second <= offset,
                            "spyre: freeing a range that overlaps a free one");
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        length += prev->second;
        erase(prev->first, prev->second);
      }
    }
    insert(offset, length);
  }

  size_t size() const { return size_; }
  size_t free_bytes() const { return free_bytes_; }
  size_t largest() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }
  bool all_free() const { return free_bytes_ == size_; }
  // Smallest free range at least `length` long, or 0: lets a caller choose
  // among several lists without taking from any.
  size_t best_fit_length(size_t length) const {
    auto fit = by_size_.lower_bound({length, 0});
    return fit == by_size_.end() ? 0 : fit->first;
  }

 private:
  void insert(size_t offset, size_t length) {
    by_offset_[offset] = length;
    by_size_.insert({length, offset});
    free_bytes_ += length;
  }
  void erase(size_t offset, size_t length) {
    by_offset_.erase(offset);
    by_size_.erase({length, offset});
    free_bytes_ -= length;
  }

  size_t size_;
  size_t free_bytes_ = 0;
  std::map<size_t, size_t> by_offset_;           // offset -> length
  std::set<std::pair<size_t, size_t>> by_size_;  // (length, offset)
};

}  // namespace spyre
