// bf16 training with fp32 master weights (TRAINING.md §2): a bf16 working copy of a decoder runs
// forward and backward (bf16 GEMM inputs and outputs with fp32 accumulation; norms, softmax,
// KDA and loss math in fp32 inside the kernels); after each backward its gradients go to the
// master (handed over as they are, bf16, when the master has none yet; added in fp32 when it
// has), and after each update the copy is refreshed from the master: by the optimiser itself,
// which writes the copy's trainable tensors in its update pass once attach()ed, and by
// refresh_buffers() for the rest. The master decoder and all optimiser state stay fp32, and
// updates are computed in fp32; the model code knows nothing of this.
#pragma once
#include <utility>
#include <vector>

#include "model/decoder.h"
#include "train/optim.h"

namespace myriad::train {

class Bf16Copy {
 public:
  // master: the fp32 decoder whose trainable tensors already require grad.
  explicit Bf16Copy(const model::Decoder& master);
  model::Decoder& decoder() { return copy_; }
  const model::Decoder& decoder() const { return copy_; }
  // Moves the copy's bf16 gradients to the master and clears them: a master tensor without a
  // gradient takes the bf16 gradient as it is (the optimiser reads bf16 gradients exactly as the
  // fp32 they widen to); one with a gradient gets the sum in fp32.
  void accumulate_grads();
  // Copies every master tensor (weights and buffers such as the selection bias) into the copy:
  // after anything but the attached optimiser's step() wrote the master (a checkpoint load, a
  // rollback, an expert sync), or when no optimiser is attached.
  void refresh();
  // The optimiser (whose parameters are this master's) writes the copy's trainable tensors as it
  // updates the master's (Optimizer::mirror_into), so a step needs no refresh() pass over them.
  void attach(Optimizer& opt);
  // After the attached optimiser's step(): copies only what it does not write (buffers, the
  // balancer's selection bias); everything, as refresh() does, when no optimiser is attached.
  void refresh_buffers();

 private:
  const model::Decoder& master_;
  model::Decoder copy_;
  std::vector<std::pair<Tensor, Tensor>> params_;      // (master, copy) trainable pairs
  std::vector<std::pair<Tensor, Tensor>> unmirrored_;  // (master, copy) the optimiser leaves
};

}  // namespace myriad::train
