// A layer's weight in the form one backend computes with: the CPU kernels'
// panels, the buffers the FPGA kernel reads, a weight resident on the card, or
// nothing at all (the null backend). The registry makes one per (layer version,
// format, layout) through the backend's PrepareWeight, charges its bytes to the
// weight-memory budget, and hands the same one to every request; what is inside
// is the backend's own business.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "mx/format.h"
#include "mx/packed.h"

namespace mxserve {

class PreparedWeight {
 public:
  PreparedWeight(mx::Format format, int64_t rows, int64_t cols)
      : format_(format), rows_(rows), cols_(cols) {}
  virtual ~PreparedWeight() = default;
  PreparedWeight(const PreparedWeight&) = delete;
  PreparedWeight& operator=(const PreparedWeight&) = delete;

  mx::Format format() const { return format_; }
  int64_t rows() const { return rows_; }  // N: Y = X·Wᵀ has N columns
  int64_t cols() const { return cols_; }  // K
  // The memory it holds (host, or the card's for a resident weight), charged
  // to --weight-memory-bytes while the registry caches it.
  virtual uint64_t bytes() const = 0;

 private:
  const mx::Format format_;
  const int64_t rows_;
  const int64_t cols_;
};

// How the registry turns a quantized weight (N rows of K, blocked along K) into
// a PreparedWeight: Backend::PrepareWeight, bound by the daemon.
using WeightPreparer =
    std::function<absl::StatusOr<std::shared_ptr<const PreparedWeight>>(mx::QuantizedMatrix w)>;

}  // namespace mxserve
