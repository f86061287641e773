// SpecController on synthetic step costs (no clocks): which mode it settles on, how often it
// re-measures the other, that a due probe of speculation waits until some sequence can draft, and
// that it follows a workload whose better mode changes.
#include <gtest/gtest.h>

#include <functional>

#include "engine/speculation.h"

namespace sieve::engine {
namespace {

spec::SpeculativeConfig config(int k) {
  spec::SpeculativeConfig c;
  c.method = spec::Method::Eagle3;
  c.num_speculative_tokens = k;
  c.adaptive = true;
  return c;
}

// A workload of `seqs` sequences: a plain step takes `plain_s`, a step with k drafts `spec_s(k)`
// and gains each sequence 1 + `kept` tokens.
struct Workload {
  int seqs = 16;
  double plain_s = 1.0;
  std::function<double(int)> spec_s = [](int k) { return 1.0 + 0.2 * k; };
  double kept = 0.5;
};

struct Trace {
  int plain_steps = 0, spec_steps = 0;
  std::vector<int> probes;  // decision numbers of the probes
};

Trace drive(SpecController& c, const Workload& w, int decisions, bool can_probe = true) {
  Trace t;
  for (int i = 0; i < decisions; ++i) {
    const int k = c.choose(w.seqs, can_probe);
    if (c.probing()) t.probes.push_back(i);
    if (k > 0) {
      ++t.spec_steps;
      c.record_step(k, w.spec_s(k), w.seqs, int64_t(w.seqs * (1 + w.kept)));
    } else {
      ++t.plain_steps;
      c.record_step(0, w.plain_s, w.seqs, w.seqs);
    }
  }
  return t;
}

TEST(SpecController, KeepsSpeculatingWhileItPays) {
  SpecController c(config(3));
  Workload w;
  w.kept = 1.5;  // 2.5 tokens for 1.6 s: 0.64 s a token against 1.0
  const Trace t = drive(c, w, 2000);
  EXPECT_TRUE(c.speculating());
  EXPECT_GT(c.cost_plain(), c.cost_spec());
  // Probes of plain decoding at 64, then every 128, 256, 512, 512 ... decisions.
  ASSERT_GE(t.probes.size(), 4u);
  EXPECT_EQ(t.probes[0], SpecController::first_probe - 1);
  EXPECT_EQ(t.probes[1] - t.probes[0], 2 * SpecController::first_probe);
  EXPECT_EQ(t.probes[2] - t.probes[1], 4 * SpecController::first_probe);
  EXPECT_EQ(t.probes.back() - t.probes[t.probes.size() - 2], SpecController::max_probe_every);
  EXPECT_EQ(t.plain_steps, int(t.probes.size()));
}

TEST(SpecController, SettlesOnPlainWhenDraftsCostMore) {
  SpecController c(config(3));
  Workload w;
  w.kept = 0.3;  // 1.3 tokens for 1.6 s
  const Trace t = drive(c, w, 5000);
  EXPECT_FALSE(c.speculating());
  // Speculation until the first probe of plain decoding, then one probe step now and then: the
  // loss against plain decoding stays far under 5 %.
  const int after = 5000 - SpecController::first_probe;
  const int spec_after = t.spec_steps - (SpecController::first_probe - 1);
  EXPECT_LE(spec_after, after / SpecController::max_probe_every + 8);
  const double loss = (spec_after * (w.spec_s(3) / 1.3 - w.plain_s)) / (after * w.plain_s);
  EXPECT_LT(loss, 0.01);
  EXPECT_EQ(c.probe_interval(), SpecController::max_probe_every);
}

TEST(SpecController, ADueProbeOfSpeculationWaitsForASequenceThatCanDraft) {
  SpecController c(config(3));
  Workload w;
  w.kept = 0.2;
  drive(c, w, 200);
  ASSERT_FALSE(c.speculating());
  // No sequence can draft: no step gets drafts however long it runs.
  const Trace none = drive(c, w, 3000, false);
  EXPECT_EQ(none.spec_steps, 0);
  EXPECT_TRUE(none.probes.empty());
  // The first decision that can probe does, with every position.
  EXPECT_EQ(c.choose(w.seqs, true), 3);
  EXPECT_TRUE(c.probing());
}

// EAGLE3 in plain mode: a new sequence can draft (for a probe) only if the draft followed its
// prompt, which costs a draft pass. A sequence arrives every `every` decisions (its prompt in one
// step, so it can draft at the next decision only); its prompt is followed when the decision
// probes (the draft then follows every row) or a probe waits (covers_prompts). Returns the
// fraction of prompts followed and counts the probes.
double followed_prompts(SpecController& c, const Workload& w, int decisions, int every, int* probes) {
  int arrivals = 0, followed = 0;
  *probes = 0;
  for (int i = 0; i < decisions; ++i) {
    const bool arrived = i % every == 0;
    const int k = c.choose(w.seqs, arrived);
    if (arrived) {
      ++arrivals;
      followed += k > 0 || c.covers_prompts();
    }
    if (c.probing() && k > 0) ++*probes;
    if (k > 0)
      c.record_step(k, w.spec_s(k), w.seqs, int64_t(w.seqs * (1 + w.kept)));
    else
      c.record_step(0, w.plain_s, w.seqs, w.seqs);
  }
  return double(followed) / double(arrivals);
}

TEST(SpecController, WhileOffTheDraftFollowsAboutOnePromptAProbeInterval) {
  SpecController c(config(3));
  Workload w;
  w.kept = 0.3;
  int probes = 0;
  followed_prompts(c, w, 3000, 10, &probes);  // settles: plain, probes every max_probe_every
  ASSERT_FALSE(c.speculating());
  ASSERT_EQ(c.probe_interval(), SpecController::max_probe_every);
  // Settled: each probe waits for the next arrival (at most `every` decisions) and follows only
  // that prompt; none in between.
  const int decisions = 40 * SpecController::max_probe_every;
  const double f = followed_prompts(c, w, decisions, 10, &probes);
  EXPECT_GE(probes, 38);
  EXPECT_LE(probes, 40);
  EXPECT_NEAR(f, 10.0 / SpecController::max_probe_every, 0.004);
  // Speculation on: every prompt is followed.
  SpecController on(config(3));
  Workload good;
  good.kept = 1.5;
  EXPECT_EQ(followed_prompts(on, good, 3000, 10, &probes), 1.0);
  EXPECT_EQ(probes, 0);
}

TEST(SpecController, AProbeWhoseStepMeasuredNothingIsTriedAgainAFewTimes) {
  SpecController c(config(3));
  Workload w;
  w.kept = 0.2;
  drive(c, w, 3000);
  ASSERT_FALSE(c.speculating());
  // Run to the next probe.
  int i = 0;
  while (c.choose(w.seqs, true) == 0) {
    c.record_step(0, w.plain_s, w.seqs, w.seqs);
    ASSERT_LT(++i, 2 * SpecController::max_probe_every);
  }
  ASSERT_TRUE(c.probing());
  // Its step had a prompt chunk (not recorded): the next decisions probe again.
  for (int t = 1; t < SpecController::max_probe_tries; ++t) {
    EXPECT_EQ(c.choose(w.seqs, true), 3) << t;
    EXPECT_TRUE(c.probing());
  }
  // Then it waits a whole interval.
  EXPECT_EQ(c.choose(w.seqs, true), 0);
  EXPECT_FALSE(c.probing());
  EXPECT_FALSE(c.covers_prompts());
  // A probe retried and recorded counts as any: the interval stays at its maximum.
  const Trace t = drive(c, w, 2 * SpecController::max_probe_every);
  EXPECT_EQ(t.spec_steps, 2);
  EXPECT_EQ(c.probe_interval(), SpecController::max_probe_every);
}

TEST(SpecController, ProbesThatNeverMeasureBackOff) {
  // Speculation settled off, then traffic in which no step is decodes alone: no probe's step is
  // recorded. Probes still come (a step of decodes alone may come later), but ever more rarely.
  SpecController c(config(3));
  Workload w;
  w.kept = 0.2;
  drive(c, w, 40);  // just after the switch: probes come often
  ASSERT_FALSE(c.speculating());
  const int before = c.probe_interval();
  ASSERT_LT(before, SpecController::max_probe_every);
  int probes = 0;
  const int decisions = 20 * SpecController::max_probe_every;
  for (int i = 0; i < decisions; ++i) {
    c.choose(w.seqs, true);
    probes += c.probing();
  }
  EXPECT_GE(c.probe_interval(), before);
  EXPECT_EQ(c.probe_interval(), SpecController::max_probe_every);
  // At most the tries of one probe an interval once the interval is at its maximum, and the
  // intervals before it.
  EXPECT_LE(probes, SpecController::max_probe_tries * (20 + 8));
  EXPECT_FALSE(c.speculating());
}

TEST(SpecController, FollowsAWorkloadWhoseBetterModeChanges) {
  SpecController c(config(3));
  Workload busy;
  busy.kept = 0.4;
  busy.spec_s = [](int k) { return 1.0 + 0.4 * k; };
  drive(c, busy, 3000);
  ASSERT_FALSE(c.speculating());
  // Load drops: the verification rows become nearly free and most drafts are kept. Within a few
  // probes (at most max_probe_every decisions apart) speculation is back.
  Workload quiet;
  quiet.seqs = 1;
  quiet.kept = 1.8;
  quiet.spec_s = [](int k) { return 1.0 + 0.05 * k; };
  drive(c, quiet, 4 * SpecController::max_probe_every);
  EXPECT_TRUE(c.speculating());
  // And back to plain decoding when it gets busy again.
  drive(c, busy, 4 * SpecController::max_probe_every);
  EXPECT_FALSE(c.speculating());
}

TEST(SpecController, NoisyProbesDoNotFlipAClearChoice) {
  SpecController c(config(3));
  Workload w;
  w.kept = 0.3;
  drive(c, w, 300);
  ASSERT_FALSE(c.speculating());
  // One probe step that happened to be fast (a quiet moment) does not bring speculation back
  // when the mode's average is clearly worse; the next plain steps confirm plain.
  int flips = 0;
  Workload jitter = w;
  int n = 0;
  jitter.spec_s = [&n](int) { return ++n % 2 ? 1.2 : 2.2; };
  for (int i = 0; i < 4000; ++i) {
    const bool before = c.speculating();
    const int k = c.choose(w.seqs, true);
    if (k > 0)
      c.record_step(k, jitter.spec_s(k), w.seqs, int64_t(w.seqs * 1.3));
    else
      c.record_step(0, w.plain_s, w.seqs, w.seqs);
    flips += c.speculating() != before;
  }
  EXPECT_LE(flips, 2);
}

TEST(SpecController, ModesWithinTheMarginDoNotSwitch) {
  // Plain decoding 2 % cheaper than speculation: the mode in use stays.
  SpecController c(config(3));
  Workload w;
  w.kept = 0.5;  // 24 tokens a step
  w.spec_s = [](int) { return 1.5 * 1.02; };
  const Trace t = drive(c, w, 2000);
  EXPECT_TRUE(c.speculating());
  EXPECT_EQ(t.plain_steps, int(t.probes.size()));
  // 5 % cheaper: it switches.
  w.spec_s = [](int) { return 1.5 * 1.05; };
  drive(c, w, 2000);
  EXPECT_FALSE(c.speculating());
}

TEST(SpecController, DropsPositionsThatRarelyPayAndProbesUseAll) {
  SpecController c(config(3));
  // Position 0 is kept half the time, later ones never.
  for (int i = 0; i < 200; ++i) c.record_draft(3, i % 2);
  EXPECT_EQ(c.choose(4), 1);
  for (int i = 0; i < 200; ++i) c.record_draft(3, 3);
  EXPECT_EQ(c.choose(4), 3);
}

TEST(SpecController, FixedWhenNotAdaptiveAndOffAboveTheBatchLimit) {
  spec::SpeculativeConfig fixed = config(2);
  fixed.adaptive = false;
  SpecController a(fixed);
  Workload w;
  w.kept = 0;
  drive(a, w, 500);
  EXPECT_EQ(a.choose(16), 2);
  spec::SpeculativeConfig limited = config(2);
  limited.disable_by_batch_size = 8;
  SpecController b(limited);
  EXPECT_EQ(b.choose(9), 0);
  EXPECT_EQ(b.choose(8), 2);
}

}  // namespace
}  // namespace sieve::engine
