// The (max, sum) merge and its Kokkos reducer.

#include "test_spaces.hpp"

#include <kpa/detail/softmax_state.hpp>

#include <cmath>
#include <random>
#include <vector>

namespace {

using kpa::detail::SoftmaxState;

TEST(SoftmaxState, MergingEmptyStatesGivesAnEmptyStateWithoutNaN) {
  SoftmaxState a, b;
  const auto w = a.merge(b);
  EXPECT_EQ(a.max_logit, -HUGE_VALF);
  EXPECT_EQ(a.exp_sum, 0.0f);
  EXPECT_EQ(w.self, 0.0f);
  EXPECT_EQ(w.other, 0.0f);
  SoftmaxState c{2.0f, 3.0f};
  const auto w2 = c.merge(SoftmaxState{});
  EXPECT_EQ(c.max_logit, 2.0f);
  EXPECT_EQ(c.exp_sum, 3.0f);
  EXPECT_EQ(w2.self, 1.0f);
  EXPECT_EQ(w2.other, 0.0f);
  SoftmaxState d;
  d.merge(SoftmaxState{-1.0f, 2.0f});
  EXPECT_EQ(d.max_logit, -1.0f);
  EXPECT_EQ(d.exp_sum, 2.0f);
}

TEST(SoftmaxState, MergeEqualsTheSoftmaxOfTheUnion) {
  std::mt19937 rng(3);
  std::normal_distribution<double> logit(0.0, 4.0);
  std::vector<double> logits(50);
  for (double& l : logits) l = logit(rng);
  auto state_of = [&](int begin, int end) {
    double m = -HUGE_VAL, s = 0;
    for (int i = begin; i < end; ++i) m = std::fmax(m, logits[i]);
    for (int i = begin; i < end; ++i) s += std::exp(logits[i] - m);
    return SoftmaxState{static_cast<float>(m), static_cast<float>(s)};
  };
  SoftmaxState merged = state_of(0, 17);
  const SoftmaxState tail = state_of(17, 50);
  const SoftmaxState whole = state_of(0, 50);
  merged.merge(tail);
  EXPECT_FLOAT_EQ(merged.max_logit, whole.max_logit);
  EXPECT_NEAR(merged.exp_sum, whole.exp_sum, 1e-5 * whole.exp_sum);
  // share_of: the weight of a normalised part in the whole.
  EXPECT_NEAR(merged.share_of(tail) + merged.share_of(state_of(0, 17)), 1.0, 1e-6);
  EXPECT_EQ(merged.share_of(SoftmaxState{}), 0.0f);
  EXPECT_EQ(whole.share_of(whole), 1.0f);
}

template <class Space>
class SoftmaxReducerOnSpace : public ::testing::Test {};
TYPED_TEST_SUITE(SoftmaxReducerOnSpace, kpa_test::ExecutionSpaces);

// A team-level parallel_reduce with the reducer, at every team size the back end allows,
// equals a sequential merge of the same states.
TYPED_TEST(SoftmaxReducerOnSpace, TeamReduceEqualsSequentialMerge) {
  using Space = TypeParam;
  using Policy = Kokkos::TeamPolicy<Space>;
  const int n = 1000;
  Kokkos::View<float* [2], typename Space::memory_space> states("states", n);
  auto host_states = Kokkos::create_mirror_view(states);
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.0f, 5.0f);
  std::uniform_real_distribution<float> sum(1.0f, 10.0f);
  SoftmaxState expected;
  for (int i = 0; i < n; ++i) {
    const bool empty = i % 7 == 3;
    host_states(i, 0) = empty ? -HUGE_VALF : logit(rng);
    host_states(i, 1) = empty ? 0.0f : sum(rng);
    expected.merge(SoftmaxState{host_states(i, 0), host_states(i, 1)});
  }
  Kokkos::deep_copy(states, host_states);
  const int max_team = std::min<int>(Space().concurrency(), 4);
  for (int team_size = 1; team_size <= max_team; ++team_size) {
    Kokkos::View<float* [2], typename Space::memory_space> result("result", 3);
    Kokkos::parallel_for(
        "kpa_test::softmax_reduce", Policy(3, team_size), KOKKOS_LAMBDA(const typename Policy::member_type& member) {
          SoftmaxState total;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(member, n),
              [&](int i, SoftmaxState& state) { state.merge(SoftmaxState{states(i, 0), states(i, 1)}); },
              kpa::detail::SoftmaxReducer<Space>(total));
          Kokkos::single(Kokkos::PerTeam(member), [&]() {
            result(member.league_rank(), 0) = total.max_logit;
            result(member.league_rank(), 1) = total.exp_sum;
          });
        });
    const auto host = kpa::detail::compat::host_copy(result);
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(host(t, 0), expected.max_logit) << "team_size " << team_size;
      EXPECT_NEAR(host(t, 1), expected.exp_sum, 1e-5 * expected.exp_sum) << "team_size " << team_size;
    }
  }
}

}  // namespace
