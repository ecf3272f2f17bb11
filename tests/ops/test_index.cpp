#include <cmath>

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class Index : public OpTest {};
MYRIAD_OP_TEST_SUITE(Index);

const DType kIndexTypes[] = {DType::I64, DType::I32};

std::string name_of(const char* op, const Shape& a, const Shape& idx, int64_t dim, DType it) {
  return std::string(op) + " " + shape_str(a) + " dim " + std::to_string(dim) + " idx " +
         shape_str(idx) + " " + std::string(dtype_name(it));
}

TEST_P(Index, GatherMatchesReference) {
  struct Case {
    Shape x;
    int64_t dim;
    Shape idx;
  };
  // Odd sizes, length 1, more picks than rows (duplicates), an index smaller than x outside dim,
  // a negative dim, and large ones.
  const Case cases[] = {{{1}, 0, {1}},
                        {{7}, 0, {13}},
                        {{3, 5}, 1, {3, 4}},
                        {{3, 5}, 0, {6, 5}},
                        {{4, 5, 6}, 1, {4, 9, 6}},
                        {{4, 5, 6}, 2, {3, 2, 7}},
                        {{4, 5, 6}, -1, {4, 5, 1}},
                        {{300, 1000}, 1, {300, 777}},
                        {{2, 4097, 33}, 1, {2, 5000, 33}}};
  uint64_t seed = 1;
  for (const Case& c : cases)
    for (DType it : kIndexTypes) {
      int64_t d = c.dim < 0 ? c.dim + static_cast<int64_t>(c.x.size()) : c.dim;
      Tensor x = randn(c.x, seed++).requires_grad_();
      Tensor idx = randint(c.idx, seed++, 0, c.x[d]).to(it);
      expect_matches_reference_all(
          name_of("gather", c.x, c.idx, c.dim, it),
          [dim = c.dim](const std::vector<Tensor>& v) { return ops::gather(v[0], dim, v[1]); },
          {x, idx}, backend());
    }
}

TEST_P(Index, GatherOfTransposedInput) {
  Tensor x = randn({6, 5}, 3).requires_grad_();
  Tensor idx = randint({5, 4}, 4, 0, 6);
  expect_matches_reference_all(
      "gather(x^T)",
      [](const std::vector<Tensor>& v) { return ops::gather(ops::transpose(v[0], 0, 1), 1, v[1]); },
      {x, idx}, backend());
}

TEST_P(Index, ScatterAddMatchesReference) {
  struct Case {
    Shape base;
    int64_t dim;
    Shape idx, src;
  };
  // Heavy duplicates (many src slices onto few rows), src larger than idx, base larger than idx
  // outside dim, inner == 1 (threads over outer rows) and outer == 1 (threads over columns).
  const Case cases[] = {{{1}, 0, {1}, {1}},
                        {{3}, 0, {50}, {50}},
                        {{4, 6}, 1, {4, 9}, {4, 9}},
                        {{4, 6}, 0, {7, 6}, {8, 7}},
                        {{5, 6, 7}, 1, {3, 11, 2}, {4, 11, 5}},
                        {{5, 1000}, 0, {300, 1000}, {300, 1000}},
                        {{1000, 7}, 1, {1000, 20}, {1000, 20}},
                        {{3, 4, 2049}, 2, {3, 4, 3000}, {3, 4, 3000}}};
  uint64_t seed = 10;
  for (const Case& c : cases)
    for (DType it : kIndexTypes) {
      Tensor base = randn(c.base, seed++).requires_grad_();
      Tensor src = randn(c.src, seed++).requires_grad_();
      Tensor idx = randint(c.idx, seed++, 0, c.base[c.dim]).to(it);
      expect_matches_reference_all(
          name_of("scatter_add", c.base, c.idx, c.dim, it),
          [dim = c.dim](const std::vector<Tensor>& v) {
            return ops::scatter_add(v[0], dim, v[1], v[2]);
          },
          {base, idx, src}, backend());
    }
}

// Duplicate indices under threads: adding ones counts hits, which f32 holds exactly.
TEST_P(Index, ScatterAddCountsDuplicatesExactly) {
  Device dev = device_of(backend());
  for (int64_t dim : {0, 1}) {
    Shape idx_shape = dim == 0 ? Shape{20000, 64} : Shape{64, 20000};
    Shape base_shape = dim == 0 ? Shape{37, 64} : Shape{64, 37};
    Tensor idx = randint(idx_shape, 5 + dim, 0, 37);
    Tensor out = ops::scatter_add(Tensor::zeros(base_shape, DType::F32, dev), dim, idx.to(dev),
                                  Tensor::ones(idx_shape, DType::F32, dev));
    std::vector<double> want(shape_numel(base_shape), 0.0);
    std::vector<int64_t> iv = idx.to_ints();
    for (int64_t r = 0; r < idx_shape[0]; ++r)
      for (int64_t c = 0; c < idx_shape[1]; ++c) {
        int64_t k = iv[r * idx_shape[1] + c];
        want[dim == 0 ? k * 64 + c : r * 37 + k] += 1;
      }
    EXPECT_EQ(out.to_doubles(), want) << "dim " << dim;
  }
}

TEST_P(Index, IndexSelectAndIndexAddMatchReference) {
  struct Case {
    Shape x;
    int64_t dim;
    int64_t n;
  };
  const Case cases[] = {
      {{1}, 0, 1},        {{7}, 0, 12},       {{5, 3}, 0, 9},         {{5, 3}, 1, 2},
      {{4, 6, 5}, 1, 20}, {{4, 6, 5}, -1, 3}, {{1000, 257}, 0, 3000}, {{8, 500, 64}, 1, 700}};
  uint64_t seed = 30;
  for (const Case& c : cases)
    for (DType it : kIndexTypes) {
      int64_t d = c.dim < 0 ? c.dim + static_cast<int64_t>(c.x.size()) : c.dim;
      Tensor x = randn(c.x, seed++).requires_grad_();
      Tensor idx = randint({c.n}, seed++, 0, c.x[d]).to(it);
      expect_matches_reference_all(
          name_of("index_select", c.x, {c.n}, c.dim, it),
          [dim = c.dim](const std::vector<Tensor>& v) {
            return ops::index_select(v[0], dim, v[1]);
          },
          {x, idx}, backend());
      Shape src_shape = c.x;
      src_shape[d] = c.n;
      Tensor src = randn(src_shape, seed++).requires_grad_();
      expect_matches_reference_all(
          name_of("index_add", c.x, {c.n}, c.dim, it),
          [dim = c.dim](const std::vector<Tensor>& v) {
            return ops::index_add(v[0], dim, v[1], v[2]);
          },
          {x, idx, src}, backend());
    }
}

TEST_P(Index, IndexSelectWithScalarIndex) {
  Device dev = device_of(backend());
  Tensor x = Tensor::from_doubles(std::vector<double>{0, 1, 2, 3, 4, 5}, {3, 2}, DType::F32, dev);
  Tensor idx = Tensor::from_ints(std::vector<int64_t>{2}, {}, DType::I64, dev);
  Tensor y = ops::index_select(x, 0, idx);
  EXPECT_EQ(y.shape(), (Shape{1, 2}));
  EXPECT_EQ(y.to_doubles(), (std::vector<double>{4, 5}));
}

TEST_P(Index, EmbeddingMatchesReference) {
  struct Case {
    int64_t V, D;
    Shape ids;
  };
  const Case cases[] = {{1, 1, {1}},       {5, 3, {7}},           {11, 16, {3, 5}},
                        {4, 9, {2, 3, 4}}, {1000, 257, {64, 33}}, {50, 2048, {4, 512}},
                        {3, 100, {20000}}};
  uint64_t seed = 50;
  for (const Case& c : cases)
    for (DType it : kIndexTypes) {
      Tensor w = randn({c.V, c.D}, seed++).requires_grad_();
      Tensor ids = randint(c.ids, seed++, 0, c.V).to(it);
      expect_matches_reference_all(
          "embedding V " + std::to_string(c.V) + " D " + std::to_string(c.D) + " ids " +
              shape_str(c.ids) + " " + std::string(dtype_name(it)),
          [](const std::vector<Tensor>& v) { return ops::embedding(v[0], v[1]); }, {w, ids},
          backend());
    }
}

TEST_P(Index, EmbeddingBackwardSumsDuplicates) {
  Device dev = device_of(backend());
  for (DType t : {DType::F32, DType::BF16}) {
    Tensor w = Tensor::zeros({4, 300}, t, dev).requires_grad_();
    std::vector<int64_t> ids_v = {2, 0, 2, 2, 3, 2};
    Tensor ids = Tensor::from_ints(ids_v, {2, 3}, DType::I32, dev);
    Tensor y = ops::embedding(w, ids);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 300}));
    y.backward(Tensor::ones(y.shape(), t, dev));
    std::vector<double> g = w.grad().to_doubles();
    const double count[4] = {1, 0, 4, 1};
    for (int64_t v = 0; v < 4; ++v)
      for (int64_t d = 0; d < 300; ++d) ASSERT_EQ(g[v * 300 + d], count[v]) << "row " << v;
  }
}

TEST_P(Index, ScatterAddServesMaxBackward) {
  Device dev = device_of(backend());
  Tensor x = Tensor::from_doubles(std::vector<double>{1, 5, 2, 7, 3, 0}, {2, 3}, DType::F32, dev)
                 .requires_grad_();
  ops::max(x, 1).values.backward(Tensor::ones({2}, DType::F32, dev));
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{0, 1, 0, 1, 0, 0}));
}

// A MoE's weighted sum back into its tokens: ragged counts (rows no index names stay zero,
// repeated indices accumulate in order), one source row, none at all, and a 1-row output.
TEST_P(Index, WeightedIndexAddMatchesReference) {
  struct Case {
    int64_t n, M, D;
  };
  const Case cases[] = {{6, 13, 5}, {1, 1, 3},        {4, 0, 7},
                        {1, 9, 16}, {2048, 8192, 64}, {50, 7, 257}};
  uint64_t seed = 90;
  for (const Case& c : cases)
    for (DType it : kIndexTypes) {
      // Half the indices land on the first quarter of the rows: a ragged count per row.
      std::vector<int64_t> iv;
      Tensor r = randint({c.M}, seed++, 0, c.n);
      for (int64_t v : r.to_ints()) iv.push_back(iv.size() % 2 ? v : v / 4);
      Tensor idx = Tensor::from_ints(iv, {c.M}, it);
      Tensor src = randn({c.M, c.D}, seed++).requires_grad_();
      Tensor w = randu({c.M}, seed++, 0.1, 1.0).requires_grad_();
      expect_matches_reference_all(
          "weighted_index_add n " + std::to_string(c.n) + " src " + shape_str({c.M, c.D}) + " " +
              std::string(dtype_name(it)),
          [n = c.n](const std::vector<Tensor>& v) {
            return ops::weighted_index_add(n, v[0], v[1], v[2]);
          },
          {idx, src, w}, backend());
    }
}

// In f32 the CPU kernel rounds as the three ops it replaced (index_select of the weights, mul,
// index_add): output, dsrc and dw bit for bit, so a model's f32 numbers did not move.
TEST(Index, WeightedIndexAddHasTheBitsOfMulAndIndexAdd) {
  const int64_t n = 37, M = 150, D = 96;
  std::vector<int64_t> iv;
  for (int64_t v : randint({M}, 71, 0, n).to_ints()) iv.push_back(iv.size() % 3 ? v : v / 5);
  const Tensor idx = Tensor::from_ints(iv, {M});
  const Tensor src = randn({M, D}, 72), w = randu({M}, 73, 0.1, 1.0), g = randn({n, D}, 74);
  auto run = [&](bool fused) {
    Tensor s = src.detach().requires_grad_(), ww = w.detach().requires_grad_();
    Tensor y =
        fused ? ops::weighted_index_add(n, idx, s, ww)
              : ops::index_add(Tensor::zeros({n, D}), 0, idx, ops::mul(s, ops::unsqueeze(ww, 1)));
    ops::sum(ops::mul(y, g)).backward();
    return std::vector<std::vector<double>>{y.to_doubles(), s.grad().to_doubles(),
                                            ww.grad().to_doubles()};
  };
  const auto a = run(true), b = run(false);
  EXPECT_EQ(a[0], b[0]) << "output";
  EXPECT_EQ(a[1], b[1]) << "dsrc";
  EXPECT_EQ(a[2], b[2]) << "dw";
}

TEST(IndexGrad, Gradcheck) {
  Tensor x = randn({3, 4}, 1).requires_grad_();
  Tensor gidx = randint({3, 5}, 2, 0, 4);
  expect_gradcheck(
      "gather", [](const std::vector<Tensor>& v) { return ops::gather(v[0], 1, v[1]); }, {x, gidx});
  Tensor base = randn({4, 3}, 3).requires_grad_(), src = randn({5, 3}, 4).requires_grad_();
  Tensor sidx = randint({5, 2}, 5, 0, 4);  // smaller than src and base: both paddings
  expect_gradcheck(
      "scatter_add",
      [](const std::vector<Tensor>& v) { return ops::scatter_add(v[0], 0, v[1], v[2]); },
      {base, sidx, src});
  Tensor iidx = Tensor::from_ints(std::vector<int64_t>{2, 0, 2, 1, 2}, {5});
  expect_gradcheck("index_select",
                   [](const std::vector<Tensor>& v) { return ops::index_select(v[0], 1, v[1]); },
                   {x, iidx});
  Tensor asrc = randn({3, 5}, 6).requires_grad_();
  expect_gradcheck("index_add",
                   [](const std::vector<Tensor>& v) { return ops::index_add(v[0], 1, v[1], v[2]); },
                   {x, iidx, asrc});
  Tensor w = randn({5, 3}, 7).requires_grad_();
  Tensor ids = Tensor::from_ints(std::vector<int64_t>{4, 1, 4, 0, 4, 2}, {2, 3}, DType::I32);
  expect_gradcheck("embedding",
                   [](const std::vector<Tensor>& v) { return ops::embedding(v[0], v[1]); },
                   {w, ids});
  Tensor wsrc = randn({5, 3}, 8).requires_grad_(), ww = randu({5}, 9, 0.2, 1.0).requires_grad_();
  expect_gradcheck(
      "weighted_index_add",
      [](const std::vector<Tensor>& v) { return ops::weighted_index_add(4, v[0], v[1], v[2]); },
      {iidx, wsrc, ww});
}

TEST(IndexErrors, WeightedIndexAddNamesTheProblem) {
  Tensor src = randn({3, 4}, 1), w = randn({3}, 2);
  Tensor idx = Tensor::from_ints(std::vector<int64_t>{0, 5, 1}, {3});
  expect_error([&] { ops::weighted_index_add(4, idx, src, w); }, {"weighted_index_add", "5"});
  Tensor ok = Tensor::from_ints(std::vector<int64_t>{0, 1, 1}, {3});
  expect_error([&] { ops::weighted_index_add(4, ok, src, randn({2}, 3)); },
               {"weighted_index_add", "[2]"});
  expect_error([&] { ops::weighted_index_add(4, ok, src, w.to(DType::BF16)); },
               {"weighted_index_add"});
}

TEST(IndexErrors, OutOfRangeIndices) {
  Tensor x = randn({3, 5}, 1);
  auto ints = [](std::vector<int64_t> v, Shape s, DType t = DType::I64) {
    return Tensor::from_ints(v, s, t);
  };
  expect_error(
      [&] {
        ops::gather(x, 1, ints({0, 5, 1}, {3, 1}));
      },
      {"gather", "index 5", "[0, 5)", "dimension 1"});
  expect_error([&] { ops::gather(x, 0, ints({-1}, {1, 1}, DType::I32)); }, {"gather", "-1", "3"});
  expect_error(
      [&] {
        ops::scatter_add(x, 0, ints({3, 0}, {2, 1}), randn({2, 1}, 2));
      },
      {"scatter_add", "index 3", "[0, 3)"});
  expect_error(
      [&] {
        ops::index_select(x, 1, ints({1, 7}, {2}));
      },
      {"index_select", "index 7", "[0, 5)"});
  expect_error(
      [&] {
        ops::index_add(x, 0, ints({4}, {1}), randn({1, 5}, 3));
      },
      {"index_add", "index 4", "[0, 3)"});
  expect_error(
      [&] {
        ops::embedding(x, ints({0, 2, 10}, {3}, DType::I32));
      },
      {"embedding", "id 10", "V = 3"});
  expect_error([&] { ops::embedding(x, ints({-2}, {1})); }, {"embedding", "id -2"});
}

TEST(IndexErrors, DtypesRanksAndShapes) {
  Tensor x = randn({3, 5}, 1);
  Tensor fidx = randn({3, 2}, 2);
  expect_error([&] { ops::gather(x, 1, fidx); }, {"gather", "i32 or i64", "f32"});
  expect_error([&] { ops::scatter_add(x, 1, fidx, x); }, {"scatter_add", "i32 or i64"});
  expect_error([&] { ops::index_select(x, 0, randn({2}, 3)); }, {"index_select", "i32 or i64"});
  expect_error([&] { ops::embedding(x, randn({2}, 3)); }, {"embedding", "i32 or i64"});
  Tensor i1 = Tensor::from_ints(std::vector<int64_t>{0, 1}, {2});
  expect_error([&] { ops::gather(x, 1, i1); }, {"gather", "rank", "[3, 5]", "[2]"});
  expect_error(
      [&] {
        ops::gather(x, 1, randint({4, 2}, 4, 0, 3));
      },
      {"gather", "larger", "[4, 2]", "[3, 5]"});
  expect_error([&] { ops::gather(x, 2, randint({3, 2}, 4, 0, 3)); }, {"gather", "dimension 2"});
  expect_error(
      [&] {
        ops::scatter_add(x, 0, randint({2, 6}, 5, 0, 3), randn({2, 6}, 6));
      },
      {"scatter_add", "[2, 6]", "[3, 5]"});
  expect_error([&] { ops::scatter_add(x, 0, i1, x); }, {"scatter_add", "rank"});
  expect_error(
      [&] {
        ops::scatter_add(x, 0, randint({2, 5}, 5, 0, 3), randn({2, 5}, 6).to(DType::BF16));
      },
      {"scatter_add", "dtype"});
  expect_error(
      [&] {
        ops::index_select(x, 0, randint({2, 2}, 7, 0, 3));
      },
      {"index_select", "1-d", "[2, 2]"});
  expect_error(
      [&] {
        ops::index_add(x, 0, i1, randn({2, 4}, 8));
      },
      {"index_add", "[2, 4]", "[2, 5]"});
  expect_error([&] { ops::embedding(randn({3}, 9), i1); }, {"embedding", "2-d", "[3]"});
}

}  // namespace
}  // namespace myriad::testing
