// The (max, sum) merge and its Kokkos reducer.

#include "test_spaces.hpp"

#include <kpa/detail/softmax_state.hpp>
#include <kpa/launch_plan.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
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

// The log-sum-exp of the logits folded in, against float64; no logit: -inf; a NaN sum: NaN.
TEST(SoftmaxState, LogSumExpOfTheLogitsFoldedIn) {
  EXPECT_EQ(SoftmaxState{}.log_sum_exp(), -HUGE_VALF);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> logit(-30.0f, 30.0f);
  for (int n = 1; n <= 40; ++n) {
    SoftmaxState state;
    std::vector<float> logits(n);
    double max = -HUGE_VAL;
    for (float& l : logits) {
      l = logit(rng);
      state.add(l);
      max = std::max(max, static_cast<double>(l));
    }
    double sum = 0.0;
    for (float l : logits) sum += std::exp(l - max);
    EXPECT_NEAR(state.log_sum_exp(), max + std::log(sum), 1e-5 * (1 + std::fabs(max))) << n;
  }
  SoftmaxState corrupt;
  corrupt.add(1.0f);
  corrupt.add(std::nanf(""));
  EXPECT_TRUE(std::isnan(corrupt.log_sum_exp()));
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

/// One team reduction per team over `states` (rows of (max, sum)) with SoftmaxReducer; the
/// result of each of the `teams` teams in its row of the returned view.
template <class Space>
Kokkos::View<float* [2], typename Space::memory_space> team_reduce_states(
    const Kokkos::View<float* [2], typename Space::memory_space>& states, int teams, int team_size) {
  using Policy = Kokkos::TeamPolicy<Space>;
  const int n = static_cast<int>(states.extent(0));
  Kokkos::View<float* [2], typename Space::memory_space> result("result", teams);
  Kokkos::parallel_for(
      "kpa_test::softmax_reduce", Policy(teams, team_size), KOKKOS_LAMBDA(const typename Policy::member_type& member) {
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
  return result;
}

/// The same with SoftmaxStates<3> over TeamVectorRange (the device kernel path's reduction):
/// head g of item i is row (3 * i + g) % n of `states`.
template <class Space>
Kokkos::View<float* [2], typename Space::memory_space> team_vector_reduce_heads(
    const Kokkos::View<float* [2], typename Space::memory_space>& states, int team_size, int vector_length) {
  using Policy = Kokkos::TeamPolicy<Space>;
  using States = kpa::detail::SoftmaxStates<3>;
  const int n = static_cast<int>(states.extent(0));
  Kokkos::View<float* [2], typename Space::memory_space> result("result", 3);
  Kokkos::parallel_for(
      "kpa_test::softmax_reduce_heads", Policy(1, team_size, vector_length),
      KOKKOS_LAMBDA(const typename Policy::member_type& member) {
        States total;
        Kokkos::parallel_reduce(
            Kokkos::TeamVectorRange(member, n),
            [&](int i, States& state) {
              for (int g = 0; g < 3; ++g) {
                const int row = (3 * i + g) % n;
                state.head[g].merge(SoftmaxState{states(row, 0), states(row, 1)});
              }
            },
            kpa::detail::SoftmaxReducer<Space, States>(total));
        Kokkos::single(Kokkos::PerTeam(member), [&]() {
          for (int g = 0; g < 3; ++g) {
            result(g, 0) = total.head[g].max_logit;
            result(g, 1) = total.head[g].exp_sum;
          }
        });
      });
  return result;
}

struct RandomStates {
  std::vector<SoftmaxState> states;
  explicit RandomStates(int n) {
    std::mt19937 rng(7);
    std::normal_distribution<float> logit(0.0f, 5.0f);
    std::uniform_real_distribution<float> sum(1.0f, 10.0f);
    for (int i = 0; i < n; ++i) {
      const bool empty = i % 7 == 3;
      states.push_back(empty ? SoftmaxState{} : SoftmaxState{logit(rng), sum(rng)});
    }
  }
  template <class Space>
  Kokkos::View<float* [2], typename Space::memory_space> on() const {
    Kokkos::View<float* [2], typename Space::memory_space> view("states", states.size());
    auto host = Kokkos::create_mirror_view(view);
    for (std::size_t i = 0; i < states.size(); ++i) {
      host(i, 0) = states[i].max_logit;
      host(i, 1) = states[i].exp_sum;
    }
    Kokkos::deep_copy(view, host);
    return view;
  }
};

/// The merged state of states[i] for the i `pick` accepts, in float64: M = max m_i,
/// S = sum s_i exp(m_i - M) (empty states carry no weight).
template <class Pick>
std::pair<double, double> merged_in_float64(const std::vector<SoftmaxState>& states, Pick pick) {
  double max = -HUGE_VAL, sum = 0.0;
  for (std::size_t i = 0; i < states.size(); ++i) {
    if (pick(i) && states[i].exp_sum > 0.0f) max = std::max<double>(max, states[i].max_logit);
  }
  for (std::size_t i = 0; i < states.size(); ++i) {
    if (pick(i) && states[i].exp_sum > 0.0f) sum += states[i].exp_sum * std::exp(states[i].max_logit - max);
  }
  return {max, sum};
}

// A team-level parallel_reduce with the reducer, at every team size the back end allows,
// equals the float64 log-sum-exp of the same states.
TYPED_TEST(SoftmaxReducerOnSpace, TeamReduceEqualsTheFloat64Merge) {
  using Space = TypeParam;
  const RandomStates random(1000);
  const auto [max, sum] = merged_in_float64(random.states, [](std::size_t) { return true; });
  const SoftmaxState expected{static_cast<float>(max), static_cast<float>(sum)};
  const auto states = random.on<Space>();
  const int max_team = std::min<int>(kpa::BackEndLimits::of(Space()).max_team_size, 4);
  for (int team_size = 1; team_size <= max_team; ++team_size) {
    const auto host = kpa::detail::compat::host_copy(team_reduce_states<Space>(states, 3, team_size));
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(host(t, 0), expected.max_logit) << "team_size " << team_size;
      EXPECT_NEAR(host(t, 1), expected.exp_sum, 1e-5 * expected.exp_sum) << "team_size " << team_size;
    }
  }
}

// SoftmaxStates<H> through a TeamVectorRange reduction (several team members and lanes) equals
// each head's float64 log-sum-exp.
TYPED_TEST(SoftmaxReducerOnSpace, TeamVectorReduceOfSeveralHeads) {
  using Space = TypeParam;
  const int n = 301;
  const RandomStates random(n);
  const auto states = random.on<Space>();
  const int team_size = std::min<int>(kpa::BackEndLimits::of(Space()).max_team_size, 2);
  for (int vector_length : {1, 4}) {
    const auto host = kpa::detail::compat::host_copy(team_vector_reduce_heads<Space>(states, team_size, vector_length));
    for (int g = 0; g < 3; ++g) {
      // Head g merges states (3 i + g) mod n for i < n: every state once, as n is not a multiple of 3.
      const auto [max, sum] = merged_in_float64(random.states, [](std::size_t) { return true; });
      const SoftmaxState expected{static_cast<float>(max), static_cast<float>(sum)};
      EXPECT_EQ(host(g, 0), expected.max_logit) << "head " << g << " vector_length " << vector_length;
      EXPECT_NEAR(host(g, 1), expected.exp_sum, 1e-5 * expected.exp_sum) << "head " << g;
    }
  }
}

// add(): one logit at a time equals the merge of one-token states; -inf is no token.
TEST(SoftmaxState, AddingLogitsEqualsMergingOneTokenStates) {
  SoftmaxState added, merged;
  for (float logit : {0.5f, -3.0f, 7.25f, -HUGE_VALF, 7.0f, 12.0f, -1.0f}) {
    added.add(logit);
    merged.merge(logit == -HUGE_VALF ? SoftmaxState{} : SoftmaxState{logit, 1.0f});
  }
  EXPECT_EQ(added.max_logit, 12.0f);
  EXPECT_FLOAT_EQ(added.max_logit, merged.max_logit);
  EXPECT_NEAR(added.exp_sum, merged.exp_sum, 1e-6 * merged.exp_sum);
  SoftmaxState empty;
  empty.add(-HUGE_VALF);
  EXPECT_EQ(empty.exp_sum, 0.0f);
  EXPECT_EQ(empty.max_logit, -HUGE_VALF);
}

}  // namespace
