// Argument checks shared by the ops: each failure names the op and the tensors involved.
#pragma once
#include <initializer_list>
#include <string>

#include "core/tensor.h"

namespace myriad::ops {

// Every tensor is defined and not released, and all live on one device. Returns that device.
Device check_inputs(const char* op, std::initializer_list<const Tensor*> ts);
// All floating tensors share one dtype.
void check_same_dtype(const char* op, std::initializer_list<const Tensor*> ts);
void check_floating(const char* op, const Tensor& t);
void check_index_dtype(const char* op, const Tensor& idx);  // i32 or i64
void check_dim(const char* op, const Tensor& t, int64_t rank);
// Normalises a possibly negative dimension against rank, or throws naming the op.
int64_t wrap_dim(const char* op, int64_t d, int64_t rank);
std::string descs(std::initializer_list<const Tensor*> ts);  // "f32[2, 3] on cpu, i64[4] on cpu"

}  // namespace myriad::ops
