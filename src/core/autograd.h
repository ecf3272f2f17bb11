// Define-by-run reverse-mode autograd. Each differentiable op that sees an input requiring grad
// (while grad mode is on) records a Node: its inputs' edges and a backward closure that owns the
// tensors it saved. backward() walks the recorded graph in reverse topological order, sums the
// gradients flowing into each node, and accumulates into the .grad of leaves. After a pass the
// closures are dropped (saved tensors released) unless retain_graph is set.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace myriad {

// One gradient per input; an undefined Tensor means "no gradient" for that input.
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_out)>;

struct Node {
  std::string name;  // the op, for error messages
  // For each input: the node that produced it, or the leaf that wants a gradient, or neither.
  struct Edge {
    std::shared_ptr<Node> node;
    std::shared_ptr<TensorImpl> leaf;
  };
  std::vector<Edge> inputs;
  BackwardFn backward;  // empty once released
  // Set by slice (dim >= 0): backward returns the gradient of the part [start, end) of dimension
  // dim of input 0, whose shape is in_shape, and the pass adds it into that part of the input's
  // gradient. A tensor split into n parts so gets one full-size gradient buffer instead of n
  // zero-padded ones summed (n fills and n - 1 full-size additions: 12% of a KDA layer's forward
  // + backward in a profile).
  struct Part {
    int64_t dim = -1, start = 0, end = 0;
    Shape in_shape;
  };
  Part part;
  Shape out_shape;  // for checking the incoming gradient
  DType out_dtype = DType::F32;
  Device out_device;
};

bool grad_enabled();
void set_grad_enabled(bool on);

// Disables recording for its scope (optimizer steps, evaluation, the backward pass itself).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// True when an op over these inputs must be recorded.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Attaches a Node for `name` to `out` with edges to `inputs`; the closure returns one gradient
// per input, in order. Does nothing when no input needs a gradient.
void record(const char* name, Tensor& out, const std::vector<Tensor>& inputs, BackwardFn fn);

// Activation recomputation: y = fn(x), run without recording, so none of fn's intermediate
// tensors stay alive; the backward pass runs fn(x) again with recording on and backpropagates
// through it (into x and into every parameter fn uses). fn must be deterministic and free of
// side effects that matter twice (a decode cache must not be extended in it). When x does not
// need a gradient, fn runs normally (its parameters still get theirs).
Tensor recompute(const char* name, const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

// Runs the backward pass from `root` seeded with `seed`.
void run_backward(const Tensor& root, const Tensor& seed, bool retain_graph);

// Gradient sums a + b (same shape, a new tensor); supplied by ops/, which owns the add kernel.
using AddFn = Tensor (*)(const Tensor& a, const Tensor& b);
void set_grad_add_fn(AddFn fn);

}  // namespace myriad
