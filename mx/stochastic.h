// Seeded random bits for stochastic rounding.
//
// Counter-based: the 32 bits an element rounds with are a pure function of a key
// (seed, stream) and the element's index, so every backend — this library, the
// trainer-side emulator on a CPU or a GPU, any future kernel — draws the same
// bits for the same request, in any order and on any number of threads.
//
//   mix(h, w)    = lowbias32(h XOR w)          (32-bit words, wrapping)
//   prefix       = mix(mix(mix(0x9E3779B9, seed_lo), seed_hi), stream)
//   bits(index)  = mix(mix(prefix, index_lo), index_hi)
//
// lowbias32 is C. Wellons' 32-bit integer hash (x ^= x >> 16; x *= 0x7FEB352D;
// x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16): a bijection whose output bits
// each depend on every input bit, built from 32-bit operations only, so that
// languages and devices without 64-bit unsigned arithmetic compute it exactly.
//
// An element with bits u and a magnitude m lying a fraction f of the way from
// the grid point below it to the next one rounds up iff f · 2^32 > u: with
// probability f, to within 2^-32, which makes the rounding unbiased. A value on
// the grid (f = 0) never moves.
#pragma once

#include <cstdint>

namespace mx {

constexpr uint32_t Lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

class StochasticBits {
 public:
  constexpr StochasticBits(uint64_t seed, uint32_t stream)
      : prefix_(Mix(Mix(Mix(0x9E3779B9u, static_cast<uint32_t>(seed)),
                        static_cast<uint32_t>(seed >> 32)),
                    stream)) {}

  constexpr uint32_t operator()(uint64_t index) const {
    return Mix(Mix(prefix_, static_cast<uint32_t>(index)), static_cast<uint32_t>(index >> 32));
  }

 private:
  static constexpr uint32_t Mix(uint32_t h, uint32_t word) { return Lowbias32(h ^ word); }
  uint32_t prefix_;
};

}  // namespace mx
