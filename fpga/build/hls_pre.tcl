# Vitis HLS settings applied before synthesis of mx_gemm (v++ --hls.pre_tcl).
# The source reads 64-bit words; let HLS widen the AXI ports to 512 bits for the
# bursts the row loops make (19.2 GB/s per port at 300 MHz).
config_interface -m_axi_max_widen_bitwidth 512
config_interface -m_axi_alignment_byte_size 64
