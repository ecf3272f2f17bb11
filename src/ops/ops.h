// Everything in ops/, for model code and tests.
#pragma once
#include "ops/conv1d.h"
#include "ops/cross_entropy.h"
#include "ops/cumsum.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/kda.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/rmsnorm.h"
#include "ops/shape.h"
#include "ops/softmax.h"
#include "ops/topk.h"
