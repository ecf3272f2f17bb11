// bf16 training with fp32 master weights (TRAINING.md §2): a bf16 working copy of a decoder runs
// forward and backward (bf16 GEMM inputs and outputs with fp32 accumulation; norms, softmax,
// KDA and loss math in fp32 inside the kernels); after each backward its gradients are added into
// the fp32 master gradients (the optimiser's), and after each update it is refreshed from the
// master. The master decoder, its gradients and all optimiser state stay fp32; the model code
// knows nothing of this.
#pragma once
#include <utility>
#include <vector>

#include "model/decoder.h"

namespace myriad::train {

class Bf16Copy {
 public:
  // master: the fp32 decoder whose trainable tensors already require grad.
  explicit Bf16Copy(const model::Decoder& master);
  model::Decoder& decoder() { return copy_; }
  const model::Decoder& decoder() const { return copy_; }
  // Adds the copy's bf16 gradients (as fp32) into the master's and clears them.
  void accumulate_grads();
  // Copies every master tensor (weights and buffers such as the selection bias) into the copy.
  void refresh();

 private:
  const model::Decoder& master_;
  model::Decoder copy_;
  std::vector<std::pair<Tensor, Tensor>> params_;  // (master, copy) trainable pairs
};

}  // namespace myriad::train
