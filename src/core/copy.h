// The two kernels that core itself needs: a strided, dtype-converting copy within one device and
// a fill. Backends register theirs; Tensor::contiguous/clone/to/copy_/fill_ use them.
#pragma once
#include "core/tensor.h"

namespace myriad {

using CopyKernel = void (*)(const Tensor& src, Tensor& dst);  // same shape and device
using FillKernel = void (*)(Tensor& dst, double value);
void register_copy_kernels(DeviceType t, CopyKernel copy, FillKernel fill);

}  // namespace myriad
