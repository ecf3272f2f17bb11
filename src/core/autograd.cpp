#include "core/autograd.h"

#include <unordered_map>
#include <unordered_set>

namespace myriad {
namespace {
thread_local bool g_grad_enabled = true;
AddFn g_add = nullptr;
}  // namespace

bool grad_enabled() {
  return g_grad_enabled;
}
void set_grad_enabled(bool on) {
  g_grad_enabled = on;
}
void set_grad_add_fn(AddFn fn) {
  g_add = fn;
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && (t->requires_grad() || t->grad_fn())) return true;
  return false;
}
bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && (t.requires_grad() || t.grad_fn())) return true;
  return false;
}

void record(const char* name, Tensor& out, const std::vector<Tensor>& inputs, BackwardFn fn) {
  if (!needs_grad(inputs)) return;
  auto node = std::make_shared<Node>();
  node->name = name;
  node->out_shape = out.shape();
  node->out_dtype = out.dtype();
  node->out_device = out.device();
  node->inputs.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    Node::Edge e;
    if (t.defined()) {
      if (t.grad_fn())
        e.node = t.grad_fn();
      else if (t.requires_grad())
        e.leaf = t.impl_ptr();
    }
    node->inputs.push_back(std::move(e));
  }
  node->backward = std::move(fn);
  out.impl().grad_fn = std::move(node);
  out.impl().requires_grad = true;
}

Tensor recompute(const char* name, const std::function<Tensor(const Tensor&)>& fn,
                 const Tensor& x) {
  if (!grad_enabled() || !x.requires_grad()) return fn(x);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = fn(x);
  }
  y = y.detach();  // a fresh handle: the node attaches to it, not to a tensor fn may hold
  record(name, y, {x}, [fn, xs = x.detach()](const Tensor& gy) {
    Tensor xi = xs.detach();
    xi.requires_grad_(true);
    struct GradOn {  // the backward pass runs with recording off
      bool prev = grad_enabled();
      GradOn() { set_grad_enabled(true); }
      ~GradOn() { set_grad_enabled(prev); }
    };
    Tensor yi;
    {
      GradOn on;
      yi = fn(xi);
    }
    if (yi.requires_grad()) run_backward(yi, gy, false);
    return std::vector<Tensor>{xi.grad()};
  });
  return y;
}

// Whether no other Tensor holds g or shares its data (use counts: a copy of g, a view of it and a
// tensor it views all make it false).
static bool sole_owner(const Tensor& g) {
  return g.impl_ptr().use_count() == 1 && g.impl().storage && g.impl().storage.use_count() == 1;
}

// g is taken by value: a gradient nothing else holds (the pass moves its own in) becomes .grad
// as it is.
static void accumulate_into_leaf(TensorImpl& leaf, Tensor g) {
  MYRIAD_CHECK(g.shape() == leaf.shape, "backward: gradient of shape ", shape_str(g.shape()),
               " for a leaf of shape ", shape_str(leaf.shape));
  if (!leaf.grad) {
    // A conversion is a new tensor. Otherwise a copy unless nothing else holds g: it may alias a
    // tensor someone holds, and optimizers edit .grad in place.
    if (g.dtype() != leaf.dtype)
      leaf.grad = g.to(leaf.dtype).impl_ptr();
    else
      leaf.grad = (sole_owner(g) && g.is_contiguous() ? g : g.clone()).impl_ptr();
    return;
  }
  const Tensor gl = g.dtype() == leaf.dtype ? g : g.to(leaf.dtype);
  MYRIAD_CHECK(g_add, "backward: no add kernel registered");
  leaf.grad = g_add(Tensor(leaf.grad), gl).impl_ptr();
}

namespace {

// The view of part p of g (a tensor of p.in_shape).
Tensor part_view(const Tensor& g, const Node::Part& p) {
  Shape s = g.shape();
  s[p.dim] = p.end - p.start;
  return g.view_as_strided(s, g.strides(), g.offset() + p.start * g.strides()[p.dim]);
}

// g_part as the gradient of the whole input: zeros elsewhere.
// Only the rest is cleared, so the part is written once (a KDA layer's output is nearly all of
// the buffer it shares with the final state).
Tensor widen(const Tensor& g_part, const Node::Part& p) {
  Tensor full = Tensor::empty(p.in_shape, g_part.dtype(), g_part.device());
  part_view(full, p).copy_(g_part);
  const int64_t n = p.in_shape[p.dim];
  for (const auto& [start, end] : {std::pair{int64_t{0}, p.start}, std::pair{p.end, n}})
    if (end > start) part_view(full, {p.dim, start, end, p.in_shape}).fill_(0.0);
  return full;
}

}  // namespace

void run_backward(const Tensor& root, const Tensor& seed, bool retain_graph) {
  NoGradGuard no_grad;
  MYRIAD_CHECK(root.requires_grad(), "backward: tensor ", root.desc(),
               " does not require grad and has no recorded history");
  if (!root.grad_fn()) {  // a leaf: its gradient is the seed
    accumulate_into_leaf(root.impl(), seed);
    return;
  }
  // Count, for every node reachable from the root, how many edges point at it.
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack{root.grad_fn().get()};
  std::unordered_set<Node*> seen{stack.back()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->inputs) {
      if (!e.node) continue;
      ++deps[e.node.get()];
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  std::unordered_map<Node*, Tensor> grads;
  grads[root.grad_fn().get()] = seed;
  // The nodes whose summed gradient this pass allocated itself, so parts may be added into it in
  // place (a gradient a backward returned may be a tensor its closure or the caller still holds).
  std::unordered_set<Node*> own;
  std::vector<std::shared_ptr<Node>> ready{root.grad_fn()};
  while (!ready.empty()) {
    std::shared_ptr<Node> n = std::move(ready.back());
    ready.pop_back();
    Tensor g = std::move(grads[n.get()]);
    grads.erase(n.get());
    MYRIAD_CHECK(n->backward, "use of a released tensor: backward through '", n->name,
                 "' a second time, but its saved tensors were released after the first pass "
                 "(pass retain_graph=true to keep them)");
    MYRIAD_CHECK(g.shape() == n->out_shape, "backward of '", n->name, "': gradient has shape ",
                 shape_str(g.shape()), " but the output had shape ", shape_str(n->out_shape));
    std::vector<Tensor> in_grads = n->backward(g);
    MYRIAD_CHECK(in_grads.size() == n->inputs.size(), "backward of '", n->name, "' returned ",
                 in_grads.size(), " gradients for ", n->inputs.size(), " inputs");
    if (!retain_graph) n->backward = nullptr;
    for (size_t i = 0; i < in_grads.size(); ++i) {
      auto& e = n->inputs[i];
      Tensor& gi = in_grads[i];
      const bool part = n->part.dim >= 0 && i == 0 && gi.defined();
      if (e.leaf) {
        if (gi.defined()) accumulate_into_leaf(*e.leaf, part ? widen(gi, n->part) : std::move(gi));
        continue;
      }
      if (!e.node) continue;
      if (part) {
        Tensor& acc = grads[e.node.get()];
        if (!acc.defined()) {
          acc = widen(gi, n->part);
        } else {
          if (!own.count(e.node.get())) acc = acc.clone();
          Tensor view = part_view(acc, n->part);
          view.copy_(g_add(view, gi));
        }
        own.insert(e.node.get());
      } else if (gi.defined()) {
        auto it = grads.find(e.node.get());
        if (it == grads.end() || !it->second.defined()) {
          grads[e.node.get()] = gi;
          own.erase(e.node.get());
        } else {
          it->second = g_add(it->second, gi);  // a new tensor
          own.insert(e.node.get());
        }
      }
      if (--deps[e.node.get()] == 0) {
        if (!grads[e.node.get()].defined())  // nothing flowed in: a zero gradient
          grads[e.node.get()] =
              Tensor::zeros(e.node->out_shape, e.node->out_dtype, e.node->out_device);
        ready.push_back(e.node);
      }
    }
  }
}

}  // namespace myriad
