// What the kernel needs from Vitis HLS, owned by the project so the very same
// source compiles with the system g++ as plain C++.
//
// Under Vitis HLS (__SYNTHESIS__ defined) the types map onto ap_int.h and
// hls_stream.h; everywhere else onto standard integers and a FIFO. Pragmas need
// no shim: g++ ignores `#pragma HLS` (the build passes -Wno-unknown-pragmas).
#pragma once

#include <cstdint>

#ifdef __SYNTHESIS__
#include <ap_int.h>
#include <hls_stream.h>
#else
#include <deque>
#include <type_traits>
#endif

namespace mxhls {

#ifdef __SYNTHESIS__

template <int W>
using Int = ap_int<W>;
template <int W>
using UInt = ap_uint<W>;
template <typename T>
using Stream = hls::stream<T>;

#else

namespace internal {
template <int W>
struct IntOfWidth {
  static_assert(W >= 1 && W <= 128, "widths up to 128 bits");
  using Signed = std::conditional_t<(W <= 32), int32_t,
                                    std::conditional_t<(W <= 64), int64_t, __int128>>;
  using Unsigned = std::conditional_t<(W <= 32), uint32_t,
                                      std::conditional_t<(W <= 64), uint64_t, unsigned __int128>>;
};
}  // namespace internal

// The narrowest standard integer holding W bits: the C++ model of ap_int<W>. The
// kernel's arithmetic never exceeds the declared width (the tests would see it:
// the hardware type would wrap where the wider C++ type does not), so both agree.
template <int W>
using Int = typename internal::IntOfWidth<W>::Signed;
template <int W>
using UInt = typename internal::IntOfWidth<W>::Unsigned;

// hls::stream's blocking interface over an unbounded FIFO. C simulation runs a
// dataflow region's processes one after another, so a producer finishes before
// its consumer starts; the FIFO must hold everything in between.
template <typename T>
class Stream {
 public:
  void write(const T& v) { fifo_.push_back(v); }
  T read() {
    T v = fifo_.front();
    fifo_.pop_front();
    return v;
  }
  bool empty() const { return fifo_.empty(); }

 private:
  std::deque<T> fifo_;
};

#endif

}  // namespace mxhls
