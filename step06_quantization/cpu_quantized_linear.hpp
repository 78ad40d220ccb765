#pragma once
// The quantized product on the CPU, behind the Linear hook (llm/linear.hpp):
// y[rows, out] = x[rows, in] . W~^T with W~ the dequantized matrix, reading
// the packed codes and dequantizing in registers (no dequantized copy of W is
// ever written to memory: that would cost the bytes quantization saves).
//
// Two families of kernels, by matrix.format.activations: fp32 x (every
// weight dequantized to fp32 in registers) and int8 x (int8_activations.hpp:
// integer dot products; the weights stay integers).
// For 1-16 rows every weight is read from memory once and applied to every
// row (in register tiles of up to 4 rows; the codes of a block of outputs stay
// in L1 from one tile to the next); more rows are done 16 at a time.
// SIMD: AVX-512 or AVX2+FMA kernels compiled with per-function target
// attributes and chosen at run time by what the CPU reports, beside a
// portable scalar one. One thread, like the rest of the course.
#include <functional>
#include <memory>
#include <string>

#include "llm/linear.hpp"
#include "step06_quantization/quant_format.hpp"

namespace step06 {

enum class SimdLevel { Portable, Avx2, Avx512 };
std::string simd_name(SimdLevel level);  // "portable", "avx2", "avx512"
// The best level this CPU runs for a product with `activations`: AVX-512F+BW
// (and, for int8 activations, AVX-512 VNNI: its kernels are built on
// vpdpbusd), else AVX2+FMA, else portable.
SimdLevel detected_simd(ActivationFormat activations = ActivationFormat::Fp32);
// True when this CPU can run `level`'s kernels for `activations` (tests run
// every level it can).
bool simd_supported(SimdLevel level, ActivationFormat activations = ActivationFormat::Fp32);

// y [rows, out_features] = x [rows, in_features] . dequantize(matrix)^T, with
// the kernel of `level` (InputError when the CPU cannot run it). With int8
// activations (matrix.format.activations) x is first rounded to int8 blocks
// (int8_activations.hpp) and y is the product with those rounded values.
void quantized_matmul(const QuantizedMatrix& matrix, const float* x, int rows, float* y, SimdLevel level);

class QuantizedLinear final : public llm::Linear {
 public:
  // The best level this CPU runs for the matrix's activation format.
  explicit QuantizedLinear(QuantizedMatrix matrix);
  QuantizedLinear(QuantizedMatrix matrix, SimdLevel level);
  void forward(const float* x, int rows, float* y) const override;
  int in_features() const override { return matrix_.in_features; }
  int out_features() const override { return matrix_.out_features; }
  std::size_t weight_bytes() const override { return matrix_.bytes(); }
  const QuantizedMatrix& matrix() const { return matrix_; }

 private:
  QuantizedMatrix matrix_;
  SimdLevel level_;
};

}  // namespace step06
