// `mxctl demo`: what each format does to a realistic tensor, in one table.
#pragma once

namespace mxctl {

// Quantizes an activation-like tensor and runs a GEMM in every format, printing
// error statistics against FP32/FP64. Returns the process exit status.
int RunDemo();

}  // namespace mxctl
