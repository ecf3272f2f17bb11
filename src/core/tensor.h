// Tensor: a strided view of a shared Storage, with a dtype, a device and autograd metadata.
// Tensors are cheap handles (a shared_ptr); copying one aliases the same data. No math lives
// here: arithmetic is in ops/, which dispatches to backend/ kernels.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"

namespace myriad {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3]"
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

struct Node;
class Tensor;

struct TensorImpl {
  std::shared_ptr<Storage> storage;  // null once released
  Shape shape, strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::F32;
  Device device;
  bool requires_grad = false;
  bool released = false;
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient of a leaf
  std::shared_ptr<Node> grad_fn;     // the op that produced this tensor, when recorded
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Factories.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = kCPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = kCPU);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = kCPU);
  static Tensor ones(const Shape& s, DType t = DType::F32, Device d = kCPU) {
    return full(s, 1.0, t, d);
  }
  // Copies host values (converted to dtype) into a new tensor on device.
  static Tensor from_doubles(std::span<const double> v, const Shape& shape,
                             DType dtype = DType::F32, Device device = kCPU);
  static Tensor from_floats(std::span<const float> v, const Shape& shape, DType dtype = DType::F32,
                            Device device = kCPU);
  static Tensor from_ints(std::span<const int64_t> v, const Shape& shape, DType dtype = DType::I64,
                          Device device = kCPU);
  static Tensor arange(int64_t n, DType dtype = DType::I64, Device device = kCPU);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape()); }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().device; }
  size_t nbytes() const { return numel() * dtype_size(dtype()); }
  bool is_contiguous() const;
  bool is_released() const { return impl_ && impl_->released; }
  // "f32[2, 3] on cpu", for error messages.
  std::string desc() const;

  // Raw data (the view's first element). Throws if released.
  void* data_ptr() const;
  template <class T>
  T* data() const {
    return static_cast<T*>(data_ptr());
  }
  const std::shared_ptr<Storage>& storage() const;

  // Host transfers (through a contiguous copy). Values are converted from the tensor's dtype.
  std::vector<double> to_doubles() const;
  std::vector<float> to_floats() const;
  std::vector<int64_t> to_ints() const;
  double item() const;  // the single element of a one-element tensor

  // Copies (never views). contiguous() returns *this when already contiguous.
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(Device d) const;
  Tensor to(DType t) const;
  void copy_(const Tensor& src);  // same shape; converts dtype and device
  void fill_(double value);

  // A view with new metadata on the same storage (no autograd record; ops/ wraps these).
  Tensor view_as_strided(const Shape& shape, const Shape& strides, int64_t offset) const;

  // Autograd.
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& requires_grad_(bool on = true);
  Tensor grad() const;  // undefined until a backward pass reached this leaf
  void set_grad(const Tensor& g);
  void zero_grad();
  const std::shared_ptr<Node>& grad_fn() const { return impl().grad_fn; }
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  // Reverse-mode pass from this tensor. A scalar needs no seed; retain_graph keeps saved tensors.
  void backward(const Tensor& seed = {}, bool retain_graph = false) const;
  Tensor detach() const;  // same data, no history

  // Frees the data now; any later use raises an error naming the op.
  void release();

  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace myriad
