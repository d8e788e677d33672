// The two kinds of key value (server/key_value.h) through their one
// interface: what the store's push, pull, checkpoint and move paths ask of
// them, without a store around them.
#include "server/key_value.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace psrt {
namespace {

absl::string_view Bytes(const std::vector<float>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

Payload Of(const std::vector<float>& v) {
  Payload p;
  p.Add(Bytes(v));
  return p;
}

std::vector<float> Read(KeyValue* value, absl::Span<const int64_t> ids, int64_t step = 0) {
  std::vector<float> out(value->Size(ids));
  value->Write(ids, step, v1::DTYPE_FLOAT32, reinterpret_cast<char*>(out.data()));
  return out;
}

v1::KeySpec DenseSpec(int64_t n) {
  v1::KeySpec spec;
  spec.set_variable("w");
  spec.set_num_elements(n);
  spec.add_shape(n);
  return spec;
}

// A table of 8 rows of 2, on one server, rows starting at zero.
v1::KeySpec TableSpec() {
  v1::KeySpec spec;
  spec.set_variable("emb");
  spec.add_shape(8);
  spec.add_shape(2);
  v1::TableSpec* t = spec.mutable_table();
  t->set_vocab(8);
  t->set_dim(2);
  t->set_num_shards(1);
  return spec;
}

OptimizerConfig Sgd(double lr) {
  OptimizerConfig c;
  c.lr = lr;
  return c;
}

TEST(KeyValueTest, ADenseValueCountsItsSkippedStepsThroughCheckpointsAndCopies) {
  OptimizerConfig adam = Sgd(0.5);
  adam.kind = OptimizerKind::kAdam;
  const std::vector<float> grad = {0.5, -1, 2};
  auto fresh = [&] {
    std::unique_ptr<KeyValue> v = KeyValue::New("w#0", DenseSpec(3), /*sync=*/true);
    v->Init(adam);
    v->Start(Bytes({1, 2, 3}));
    return v;
  };
  // One update after a skipped step is Adam's first update.
  std::unique_ptr<KeyValue> skipped = fresh(), direct = fresh();
  skipped->Apply(Update(), 0.5, 1);  // no worker had a gradient
  KeyRecord saved;
  saved.version = 1;
  skipped->Save(&saved);
  EXPECT_EQ(saved.step_counters, std::vector<int64_t>{1});
  v1::SeedRequest seed;
  seed.set_version(1);
  ASSERT_NE(skipped->kept_copy(), nullptr);
  skipped->kept_copy()->WriteCopy(&seed);
  EXPECT_EQ(seed.skipped_steps(), 1);

  skipped->Apply({{}, grad.data(), 3, 1}, 0.5, 2);
  direct->Apply({{}, grad.data(), 3, 1}, 0.5, 1);
  EXPECT_EQ(Read(skipped.get(), {}), Read(direct.get(), {}));
  // The checkpoint's and the copy's values do the same.
  std::unique_ptr<KeyValue> restored = fresh(), copied = fresh();
  ASSERT_TRUE(restored->Restore(adam, &saved).ok());
  ASSERT_TRUE(copied->TakeSeed(SeedPart(), seed));
  restored->Apply({{}, grad.data(), 3, 1}, 0.5, 2);
  copied->Apply({{}, grad.data(), 3, 1}, 0.5, 2);
  EXPECT_EQ(Read(restored.get(), {}), Read(direct.get(), {}));
  EXPECT_EQ(Read(copied.get(), {}), Read(direct.get(), {}));
  // More skipped steps than versions cannot be.
  KeyRecord bad;
  skipped->Save(&bad);
  bad.version = 0;
  bad.step_counters = {1};
  EXPECT_EQ(fresh()->Restore(adam, &bad).code(), absl::StatusCode::kDataLoss);
}

TEST(KeyValueTest, ADenseValueChecksItsShapeAndHoldsWeightsSlotsAndTheStepsSum) {
  std::unique_ptr<KeyValue> v = KeyValue::New("w#0", DenseSpec(3), /*sync=*/true);
  const std::vector<int64_t> ids = {1};
  EXPECT_EQ(v->CheckPull(ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v->CheckPush({}, 11, 4, v1::DTYPE_FLOAT32).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(v->CheckPush({}, 6, 2, v1::DTYPE_FLOAT16).ok());
  EXPECT_EQ(v->bytes(), 0);

  OptimizerConfig momentum = Sgd(0.5);
  momentum.momentum = 0.9;
  v->Init(momentum);
  EXPECT_EQ(v->bytes(), 3 * 4 * 3);  // weights, one slot, the step's sum
  v->Start(Bytes({1, 2, 3}));
  EXPECT_EQ(Read(v.get(), {}), (std::vector<float>{1, 2, 3}));

  // Two pushes, averaged: the sum starts over at each step's first push.
  v->Accumulate({}, Of({9, 9, 9}), v1::DTYPE_FLOAT32, 0, /*first=*/true, nullptr);
  v->Accumulate({}, Of({2, 4, 6}), v1::DTYPE_FLOAT32, 0, /*first=*/true, nullptr);
  v->Accumulate({}, Of({4, 0, 2}), v1::DTYPE_FLOAT32, 0, /*first=*/false, nullptr);
  const Update mean = v->StepSum(0.5f);
  ASSERT_EQ(mean.n, 3);
  EXPECT_EQ(std::vector<float>(mean.values, mean.values + 3), (std::vector<float>{3, 2, 4}));
  EXPECT_EQ(v->Apply(mean, 0.5, 1), 0);
  EXPECT_EQ(Read(v.get(), {}), (std::vector<float>{-0.5f, 1, 1}));

  // A copy carries the weights and the momentum: the next update agrees.
  v1::SeedRequest seed;
  *seed.mutable_spec() = DenseSpec(3);
  v->kept_copy()->WriteCopy(&seed);
  absl::StatusOr<SeedPart> part = KeyValue::ReadSeed("w#0", seed, momentum);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_TRUE(part->value);
  std::unique_ptr<KeyValue> copy = KeyValue::New("w#0", DenseSpec(3), true);
  ASSERT_TRUE(copy->CheckSeed(momentum, *part, seed).ok());
  copy->Init(momentum);
  EXPECT_TRUE(copy->TakeSeed(*part, seed));
  const std::vector<float> g = {1, 1, 1};
  v->Apply({{}, g.data(), 3, 1}, 0.5, 2);
  copy->Apply({{}, g.data(), 3, 1}, 0.5, 2);
  EXPECT_EQ(Read(copy.get(), {}), Read(v.get(), {}));
  EXPECT_NE(Read(v.get(), {}), (std::vector<float>{-1, 0.5f, 0.5f}));  // momentum moved it

  // Saved and restored; a record that does not fit the optimizer is refused.
  KeyRecord r;
  v->Save(&r);
  EXPECT_EQ(r.num_elements, 3);
  ASSERT_EQ(r.slots.size(), 1u);
  std::unique_ptr<KeyValue> restored = KeyValue::New("w#0", DenseSpec(3), true);
  KeyRecord bad = r;
  EXPECT_EQ(restored->Restore(Sgd(0.5), &bad).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(restored->bytes(), 0);
  ASSERT_TRUE(restored->Restore(momentum, &r).ok());
  EXPECT_EQ(Read(restored.get(), {}), Read(v.get(), {}));
  EXPECT_EQ(restored->bytes(), v->bytes());

  v->Free();
  EXPECT_EQ(v->bytes(), 0);
  EXPECT_EQ(v->rows(), nullptr);
  SeedPart rows;
  rows.rows = r;
  EXPECT_EQ(v->CheckSeed(momentum, rows, seed).code(), absl::StatusCode::kFailedPrecondition);
  v1::SeedRequest other = seed;
  other.mutable_spec()->set_num_elements(4);
  EXPECT_EQ(v->CheckSeed(momentum, *part, other).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(KeyValueTest, ATablesPartMakesRowsOnUseSumsPerRowAndMovesInParts) {
  std::unique_ptr<KeyValue> v = KeyValue::New("emb#0", TableSpec(), /*sync=*/true);
  const std::vector<int64_t> ids = {5, 2};
  EXPECT_TRUE(v->CheckPull(ids).ok());
  EXPECT_EQ(v->Size(ids), 4);
  EXPECT_EQ(v->CheckPush(ids, 12, 4, v1::DTYPE_FLOAT32).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(v->CheckPush(ids, 16, 4, v1::DTYPE_FLOAT32).ok());

  v->Init(Sgd(1));
  v->Start("");
  EXPECT_EQ(v->bytes(), 0);
  const int64_t row_bytes = 2 * 4;
  EXPECT_EQ(*v->CheckIds(ids), 2 * row_bytes);
  const std::vector<int64_t> twice = {2, 2};
  EXPECT_EQ(v->CheckIds(twice).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> outside = {8};
  EXPECT_EQ(v->CheckIds(outside).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v->bytes(), 0);  // checks make nothing

  EXPECT_EQ(Read(v.get(), ids), (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(v->bytes(), 2 * row_bytes);
  EXPECT_EQ(*v->CheckIds(ids), 0);

  // Two workers' rows, summed per row, averaged, applied.
  std::vector<float> scratch;
  const std::vector<int64_t> a = {5, 2}, b = {2, 7};
  v->Accumulate(a, Of({1, 1, 2, 2}), v1::DTYPE_FLOAT32, 0, true, &scratch);
  v->Accumulate(b, Of({4, 4, 6, 6}), v1::DTYPE_FLOAT32, 0, false, &scratch);
  const Update sum = v->StepSum(0.5f);
  EXPECT_EQ(std::vector<int64_t>(sum.ids.begin(), sum.ids.end()), (std::vector<int64_t>{5, 2, 7}));
  EXPECT_EQ(sum.n, 6);
  EXPECT_EQ(sum.scale, 0.5f);
  v->Apply(sum, 1, 1);
  const std::vector<int64_t> all = {2, 5, 7};
  EXPECT_EQ(Read(v.get(), all), (std::vector<float>{-3, -3, -0.5f, -0.5f, -3, -3}));
  // A step without a gradient changes no row.
  EXPECT_EQ(v->Apply(Update(), 1, 2), 0);
  EXPECT_EQ(Read(v.get(), all), (std::vector<float>{-3, -3, -0.5f, -0.5f, -3, -3}));
  EXPECT_EQ(v->kept_copy(), nullptr);

  // Handed over in parts of one row: each taken once, in order, and the
  // part ends up as it was; the last brings the rest of the hand-over.
  std::vector<v1::SeedRequest> sent;
  std::vector<bool> lasts;
  ASSERT_TRUE(v->HandOver(
                   [&](v1::SeedRequest* req, bool last) {
                     *req->mutable_spec() = TableSpec();
                     req->mutable_spec()->mutable_optimizer()->set_name("sgd");
                     req->set_version(1);
                     lasts.push_back(last);
                   },
                   [&](const v1::SeedRequest& req) {
                     sent.push_back(req);
                     return absl::OkStatus();
                   },
                   row_bytes)
                  .ok());
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(lasts, (std::vector<bool>{false, false, true}));
  std::vector<SeedPart> parts;
  for (const v1::SeedRequest& req : sent) {
    EXPECT_TRUE(req.handover());
    absl::StatusOr<SeedPart> part = KeyValue::ReadSeed("emb#0", req, Sgd(1));
    ASSERT_TRUE(part.ok()) << part.status();
    parts.push_back(*part);
  }
  EXPECT_EQ(parts[1].rows_before, 1);
  EXPECT_TRUE(parts[0].starts_over);
  EXPECT_TRUE(parts[1].more);
  EXPECT_FALSE(parts[2].more);
  std::unique_ptr<KeyValue> moved = KeyValue::New("emb#0", TableSpec(), true);
  ASSERT_TRUE(moved->CheckSeed(Sgd(1), parts[0], sent[0]).ok());
  moved->Init(Sgd(1));
  EXPECT_TRUE(moved->TakeSeed(parts[0], sent[0]));
  EXPECT_EQ(moved->CheckSeed(Sgd(1), parts[2], sent[2]).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(moved->CheckSeed(Sgd(1), parts[1], sent[1]).ok());
  EXPECT_TRUE(moved->TakeSeed(parts[1], sent[1]));
  ASSERT_TRUE(moved->CheckSeed(Sgd(1), parts[1], sent[1]).ok());  // sent again
  EXPECT_FALSE(moved->TakeSeed(parts[1], sent[1]));
  EXPECT_TRUE(moved->TakeSeed(parts[2], sent[2]));
  // A dense copy is no table's part.
  EXPECT_EQ(moved->CheckSeed(Sgd(1), SeedPart(), sent[0]).code(),
            absl::StatusCode::kFailedPrecondition);
  KeyRecord before, after;
  v->Save(&before);
  moved->Save(&after);
  EXPECT_EQ(after.row_ids, before.row_ids);
  EXPECT_EQ(after.weights, before.weights);
  EXPECT_EQ(moved->bytes(), v->bytes());

  // A step half done goes with the last part; the step's first push
  // started a new sum.
  v->Accumulate(a, Of({1, 2, 3, 4}), v1::DTYPE_FLOAT32, 0, true, &scratch);
  v1::SeedRequest seed;
  v->WriteStepSum(&seed);
  moved->TakeStepSum(seed);
  const Update half = moved->StepSum(1);
  EXPECT_EQ(std::vector<int64_t>(half.ids.begin(), half.ids.end()), a);
  EXPECT_EQ(std::vector<float>(half.values, half.values + half.n),
            (std::vector<float>{1, 2, 3, 4}));
}

TEST(KeyValueTest, AFloat16PushIsDecodedOnceAndAPullEncodedForBothKinds) {
  // float16 values 1.0 and 2.0 (0x3c00, 0x4000), scale 1.
  const uint16_t half[] = {0x3c00, 0x4000};
  Payload p;
  p.Add(absl::string_view(reinterpret_cast<const char*>(half), sizeof(half)));
  std::vector<float> scratch;
  const float* values = PayloadValues(p, v1::DTYPE_FLOAT16, 0, &scratch);
  EXPECT_EQ(values, scratch.data());
  EXPECT_EQ(std::vector<float>(values, values + 2), (std::vector<float>{1, 2}));
  const std::vector<float> f = {3, 4};
  Payload in_place = Of(f);
  EXPECT_EQ(PayloadValues(in_place, v1::DTYPE_FLOAT32, 0, &scratch), f.data());

  for (const v1::KeySpec& spec : {DenseSpec(2), TableSpec()}) {
    SCOPED_TRACE(spec.variable());
    std::unique_ptr<KeyValue> v = KeyValue::New(spec.variable(), spec, false);
    v->Init(Sgd(1));
    v->Start(Bytes({0, 0}));
    const std::vector<int64_t> ids =
        spec.has_table() ? std::vector<int64_t>{3} : std::vector<int64_t>{};
    v->Apply({ids, values, 2, 1}, 1, 1);
    uint16_t out[2];
    const float scale = v->Write(ids, 1, v1::DTYPE_FLOAT16, reinterpret_cast<char*>(out));
    EXPECT_EQ(scale, 1);
    EXPECT_EQ(out[0], 0xbc00);  // -1
    EXPECT_EQ(out[1], 0xc000);  // -2
  }
}

}  // namespace
}  // namespace psrt
