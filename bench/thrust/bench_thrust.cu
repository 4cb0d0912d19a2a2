// nvcc build of bench_thrust.cpp: the same bench with the thrust-cuda backend added (sm_90).
#include "bench_thrust.cpp"
