# Route 2 (AWS F2 HDK): the same kernel source packaged as a Vivado IP, to be
# instantiated in an F2 custom-logic design. Run: vitis_hls -f package_ip.tcl
# Not run in this repository (no Vitis HLS here); see fpga/README.md.
set pe_rows [expr {[info exists ::env(PE_ROWS)] ? $::env(PE_ROWS) : 8}]
set pe_cols [expr {[info exists ::env(PE_COLS)] ? $::env(PE_COLS) : 128}]

open_project -reset mx_gemm_ip
set_top mx_gemm
add_files ../hls/mx_gemm.cc -cflags "-I../.. -DMXHLS_PE_ROWS=$pe_rows -DMXHLS_PE_COLS=$pe_cols"
open_solution -reset -flow_target vivado solution1
# The VU47P of an F2 instance.
set_part xcvu47p-fsvh2892-2L-e
create_clock -period 300MHz -name default
source hls_pre.tcl
csynth_design
export_design -format ip_catalog -rtl verilog
exit
