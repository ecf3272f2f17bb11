#include "core/tensor.h"

#include <sstream>

#include "core/autograd.h"
#include "core/copy.h"

namespace myriad {
namespace {
struct CopyKernels {
  CopyKernel copy = nullptr;
  FillKernel fill = nullptr;
};
CopyKernels& copy_kernels(DeviceType t) {
  static CopyKernels k[kNumDeviceTypes];
  return k[static_cast<int>(t)];
}
CopyKernels& copy_kernels_checked(const char* op, Device d) {
  CopyKernels& k = copy_kernels(d.type);
  MYRIAD_CHECK(k.copy && k.fill, op, ": no copy kernel for device ", d.str());
  return k;
}
}  // namespace

void register_copy_kernels(DeviceType t, CopyKernel copy, FillKernel fill) {
  copy_kernels(t) = {copy, fill};
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}
int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}
Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

TensorImpl& Tensor::impl() const {
  MYRIAD_CHECK(impl_, "use of an undefined tensor");
  return *impl_;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    MYRIAD_CHECK(d >= 0, "empty: negative dimension in shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->device = device;
  impl->storage = std::make_shared<Storage>(shape_numel(shape) * dtype_size(dtype), device);
  return Tensor(std::move(impl));
}
Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_doubles(std::span<const double> v, const Shape& shape, DType dtype,
                            Device device) {
  MYRIAD_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "from_doubles: ", v.size(),
               " values for shape ", shape_str(shape));
  Tensor host = empty(shape, dtype, kCPU);
  for (size_t i = 0; i < v.size(); ++i) store_from_double(host.data_ptr(), dtype, i, v[i]);
  return device.is_cpu() ? host : host.to(device);
}
Tensor Tensor::from_floats(std::span<const float> v, const Shape& shape, DType dtype,
                           Device device) {
  std::vector<double> d(v.begin(), v.end());
  return from_doubles(d, shape, dtype, device);
}
Tensor Tensor::from_ints(std::span<const int64_t> v, const Shape& shape, DType dtype,
                         Device device) {
  MYRIAD_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "from_ints: ", v.size(),
               " values for shape ", shape_str(shape));
  Tensor host = empty(shape, dtype, kCPU);
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::I64)
      host.data<int64_t>()[i] = v[i];
    else
      store_from_double(host.data_ptr(), dtype, i, static_cast<double>(v[i]));
  }
  return device.is_cpu() ? host : host.to(device);
}
Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return from_ints(v, {n}, dtype, device);
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  int64_t dd = d < 0 ? d + n : d;
  MYRIAD_CHECK(dd >= 0 && dd < n, "size: dimension ", d, " out of range for ", desc());
  return shape()[dd];
}

bool Tensor::is_contiguous() const {
  const auto& s = shape();
  const auto& st = strides();
  // No element to lay out (empty() gives such shapes strides that skip the zero dimension).
  if (shape_numel(s) == 0) return true;
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != 1 && st[i] != acc) return false;
    acc *= s[i];
  }
  return true;
}

std::string Tensor::desc() const {
  if (!impl_) return "<undefined>";
  return cat(dtype_name(dtype()), shape_str(shape()), " on ", device().str(),
             impl_->released ? " (released)" : "");
}

void* Tensor::data_ptr() const {
  MYRIAD_CHECK(!impl().released, "use of a released tensor ", desc());
  return static_cast<char*>(impl().storage->data()) + impl().offset * dtype_size(dtype());
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  MYRIAD_CHECK(!impl().released, "use of a released tensor ", desc());
  return impl().storage;
}

std::vector<double> Tensor::to_doubles() const {
  Tensor h = to(kCPU).contiguous();
  std::vector<double> v(h.numel());
  for (int64_t i = 0; i < h.numel(); ++i) v[i] = load_as_double(h.data_ptr(), h.dtype(), i);
  return v;
}
std::vector<float> Tensor::to_floats() const {
  if (dtype() != DType::F32 && dtype() != DType::BF16 && dtype() != DType::F16) {
    std::vector<double> d = to_doubles();  // one rounding, from the exact doubles
    return {d.begin(), d.end()};
  }
  const Tensor h = to(kCPU).to(DType::F32).contiguous();  // exact for the float types
  const float* p = h.data<float>();
  return {p, p + h.numel()};
}
std::vector<int64_t> Tensor::to_ints() const {
  Tensor h = to(kCPU).to(DType::I64).contiguous();
  const int64_t* p = h.data<int64_t>();
  return {p, p + h.numel()};
}
double Tensor::item() const {
  MYRIAD_CHECK(numel() == 1, "item: tensor ", desc(), " has ", numel(), " elements, not 1");
  return to_doubles()[0];
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}
Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  copy_kernels_checked("clone", device()).copy(*this, out);
  return out;
}
Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  Tensor out = empty(shape(), t, device());
  copy_kernels_checked("to", device()).copy(*this, out);
  return out;
}
Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape(), dtype(), d);
  (void)src.data_ptr();  // raises on a released tensor
  if (src.device().is_cpu()) {
    allocator_for(d.type).copy(out.data_ptr(), src.data_ptr(), nbytes(),
                               Allocator::Copy::HostToDevice, d.index);
  } else if (d.is_cpu()) {
    allocator_for(src.device().type)
        .copy(out.data_ptr(), src.data_ptr(), nbytes(), Allocator::Copy::DeviceToHost,
              src.device().index);
  } else {  // device to another device: through the host
    return src.to(kCPU).to(d);
  }
  return out;
}
void Tensor::copy_(const Tensor& src) {
  MYRIAD_CHECK(src.shape() == shape(), "copy_: source ", src.desc(), " into ", desc());
  Tensor s = src.device() == device() ? src : src.to(device());
  copy_kernels_checked("copy_", device()).copy(s, *this);
}
void Tensor::fill_(double value) {
  copy_kernels_checked("fill_", device()).fill(*this, value);
}

Tensor Tensor::view_as_strided(const Shape& shape, const Shape& strides, int64_t offset) const {
  MYRIAD_CHECK(!impl().released, "use of a released tensor ", desc());
  MYRIAD_CHECK(shape.size() == strides.size(), "view: shape ", shape_str(shape), " and strides ",
               shape_str(strides), " differ in rank");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = dtype();
  impl->device = device();
  return Tensor(std::move(impl));
}

Tensor& Tensor::requires_grad_(bool on) {
  MYRIAD_CHECK(!on || is_floating(dtype()), "requires_grad_: ", desc(),
               " is not a floating-point tensor");
  MYRIAD_CHECK(is_leaf() || on, "requires_grad_(false) on a non-leaf tensor ", desc());
  impl().requires_grad = on;
  return *this;
}
Tensor Tensor::grad() const {
  return impl().grad ? Tensor(impl().grad) : Tensor();
}
void Tensor::set_grad(const Tensor& g) {
  MYRIAD_CHECK(!g.defined() || g.shape() == shape(), "set_grad: gradient ", g.desc(),
               " for tensor ", desc());
  impl().grad = g.impl_ptr();
}
void Tensor::zero_grad() {
  impl().grad.reset();
}

void Tensor::backward(const Tensor& seed, bool retain_graph) const {
  MYRIAD_CHECK(requires_grad(), "backward: tensor ", desc(),
               " does not require grad and has no recorded history");
  Tensor s = seed;
  if (!s.defined()) {
    MYRIAD_CHECK(numel() == 1, "backward: a seed gradient is needed for non-scalar ", desc());
    s = full(shape(), 1.0, dtype(), device());
  }
  MYRIAD_CHECK(s.shape() == shape(), "backward: seed ", s.desc(), " for tensor ", desc());
  run_backward(*this, s, retain_graph);
}

Tensor Tensor::detach() const {
  Tensor t = view_as_strided(shape(), strides(), offset());
  return t;
}

void Tensor::release() {
  impl().storage.reset();
  impl().released = true;
  impl().grad_fn.reset();
}

}  // namespace myriad
