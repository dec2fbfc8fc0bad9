#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "executor/schedule/schedule.h"
#include "planner/import/model_format.h"

namespace rannc::schedule {
namespace {

using pipeline::Schedule;

std::string str(const std::vector<Action> &a) {
  std::ostringstream os;
  print(a, os);
  return os.str();
}

/// One action list and what it must print.
struct Case {
  Schedule schedule;
  int stage, stages, microbatches;
  const char *actions;
};

void expectActions(const std::vector<Case> &cases) {
  for (const Case &e : cases)
    EXPECT_EQ(str(build(e.schedule, e.stage, e.stages, e.microbatches)), std::string(e.actions) + "\n")
        << pipeline::scheduleName(e.schedule) << " stage " << e.stage << " of " << e.stages;
}

TEST(GPipe, FirstMiddleAndLastStage) {
  expectActions({
      {Schedule::GPipe, 0, 3, 2,
       "forward(0) send-act(0) forward(1) send-act(1) recv-grad(1) backward(1) recv-grad(0) backward(0) "
       "all-reduce optimizer-step"},
      {Schedule::GPipe, 1, 3, 2,
       "recv-act(0) forward(0) send-act(0) recv-act(1) forward(1) send-act(1) recv-grad(1) backward(1) "
       "send-grad(1) recv-grad(0) backward(0) send-grad(0) all-reduce optimizer-step"},
      {Schedule::GPipe, 2, 3, 2,
       "recv-act(0) forward(0) recv-act(1) forward(1) backward(1) send-grad(1) backward(0) send-grad(0) "
       "all-reduce optimizer-step"},
      {Schedule::GPipe, 0, 1, 1, "forward(0) backward(0) all-reduce optimizer-step"},
  });
}

TEST(OneFOneB, WarmUpSteadyStateCoolDown) {
  expectActions({
      // Stage 0 of 3 with 4 micro-batches: 2 warm-up forwards, then F/B pairs.
      {Schedule::OneFOneB, 0, 3, 4,
       "forward(0) send-act(0) forward(1) send-act(1) forward(2) send-act(2) recv-grad(0) backward(0) "
       "forward(3) send-act(3) recv-grad(1) backward(1) recv-grad(2) backward(2) recv-grad(3) backward(3) "
       "all-reduce optimizer-step"},
      // The last stage alternates from the start.
      {Schedule::OneFOneB, 2, 3, 2,
       "recv-act(0) forward(0) backward(0) send-grad(0) recv-act(1) forward(1) backward(1) send-grad(1) "
       "all-reduce optimizer-step"},
  });
}

TEST(OneFOneB, KeepsAtMostTheRemainingDepthInFlight) {
  for (int stages = 1; stages <= 6; ++stages)
    for (int mb = 1; mb <= 9; ++mb)
      for (int s = 0; s < stages; ++s) {
        EXPECT_EQ(peakMicrobatchesInFlight(build(Schedule::OneFOneB, s, stages, mb)), std::min(mb, stages - s));
        EXPECT_EQ(peakMicrobatchesInFlight(build(Schedule::GPipe, s, stages, mb)), mb);
      }
}

TEST(ZeroBubbleH1, WeightPassesAfterTheirInputPassAndWhatTheyHoldInFlight) {
  // The last of 2 stages: W lags B by one pass; the gradients go back at once.
  EXPECT_EQ(str(build(Schedule::ZBH1, 1, 2, 3)),
            "recv-act(0) forward(0) backward(0) send-grad(0) recv-act(1) forward(1) backward(1) send-grad(1) "
            "backward-weight(0) recv-act(2) forward(2) backward(2) send-grad(2) backward-weight(1) "
            "backward-weight(2) all-reduce optimizer-step\n");
  // A micro-batch is held until its W: min(M, S) on every stage (Note [zero bubble H1]).
  for (int stages = 1; stages <= 6; ++stages)
    for (int mb = 1; mb <= 9; ++mb)
      for (int s = 0; s < stages; ++s)
        EXPECT_EQ(peakMicrobatchesInFlight(build(Schedule::ZBH1, s, stages, mb)), std::min(mb, stages));
}

TEST(ZeroBubbleH2, HoldsTwiceTheStagesLessOneInFlight) {
  // Note [zero bubble H2]: min(M, 2S-1) on every stage, counted on the action list.
  for (int stages = 1; stages <= 6; ++stages)
    for (int mb = 1; mb <= 12; ++mb)
      for (int s = 0; s < stages; ++s)
        EXPECT_EQ(peakMicrobatchesInFlight(build(Schedule::ZBH2, s, stages, mb)), std::min(mb, 2 * stages - 1));
}

/// Plays every stage's action list against the others with blocking receives
/// (sends never block) and checks that all of them run to the end: no
/// deadlock, and every micro-batch's forward precedes its backward.
bool runsToCompletion(Schedule kind, int stages, int mb, int batches = 1) {
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < stages; ++s) lists.push_back(accumulate(build(kind, s, stages, mb), batches, mb));
  std::vector<size_t> pc(stages, 0);
  std::set<std::pair<int, int>> acts, grads; // (stage that may receive, micro-batch)
  std::set<std::pair<int, int>> forwarded;   // (stage, micro-batch) whose forward ran
  std::set<std::pair<int, int>> inputs_done; // (stage, micro-batch) whose backward (B) ran
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      while (pc[s] < lists[s].size()) {
        const Action &a = lists[s][pc[s]];
        if (a.kind == ActionKind::RecvActivations && !acts.count({s, a.microbatch})) break;
        if (a.kind == ActionKind::RecvGradients && !grads.count({s, a.microbatch})) break;
        if (a.kind == ActionKind::Forward) forwarded.insert({s, a.microbatch});
        if (a.kind == ActionKind::Backward && !forwarded.count({s, a.microbatch})) return false;
        if (a.kind == ActionKind::Backward) inputs_done.insert({s, a.microbatch});
        if (a.kind == ActionKind::BackwardWeight && !inputs_done.count({s, a.microbatch})) return false;
        if (a.kind == ActionKind::SendActivations) acts.insert({s + 1, a.microbatch});
        if (a.kind == ActionKind::SendGradients) grads.insert({s - 1, a.microbatch});
        ++pc[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s)
    if (pc[s] != lists[s].size()) return false;
  return true;
}

/// Plays pipeline ranks' lists (an interleaved rank's passes each naming
/// one of its stages) with blocking receives and the transport's rendezvous
/// (Note [awaited gradient sends]): a receive blocks until the stage before
/// (activations) or after (gradients) has sent that micro-batch, an
/// AwaitGradients of stage s, micro-batch m until stage s - 1 has received
/// m's gradients. Whether every list runs to its end with each stage's
/// forward and backward of a micro-batch run once, in that order;
/// `passes` counts them.
bool runsWithRendezvous(const std::vector<std::vector<Action>> &lists, int *passes = nullptr) {
  const int ranks = int(lists.size());
  std::vector<size_t> pc(size_t(ranks), 0);
  std::set<std::pair<int, int>> acts, grads, taken, forwarded, backwarded; // (stage, micro-batch)
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < ranks; ++r)
      while (pc[r] < lists[r].size()) {
        const Action &a = lists[r][pc[r]];
        if (a.stage >= 0 && a.stage % ranks != r) return false; // not one of this rank's stages
        const std::pair<int, int> at{a.stage < 0 ? r : a.stage, a.microbatch};
        if (a.kind == ActionKind::RecvActivations && !acts.count(at)) break;
        if (a.kind == ActionKind::RecvGradients && !grads.count(at)) break;
        if (a.kind == ActionKind::AwaitGradients && !taken.count({at.first - 1, at.second})) break;
        if (a.kind == ActionKind::Forward && !forwarded.insert(at).second) return false;
        if (a.kind == ActionKind::Backward && (!forwarded.count(at) || !backwarded.insert(at).second)) return false;
        if (a.kind == ActionKind::RecvGradients) taken.insert(at);
        if (a.kind == ActionKind::SendActivations) acts.insert({at.first + 1, a.microbatch});
        if (a.kind == ActionKind::SendGradients) grads.insert({at.first - 1, a.microbatch});
        ++pc[r];
        progress = true;
      }
  }
  if (passes) *passes = int(forwarded.size() + backwarded.size());
  for (int r = 0; r < ranks; ++r)
    if (pc[r] != lists[r].size()) return false;
  return true;
}

/// runsWithRendezvous on `ranks` pipeline ranks of `chunks` stages each
/// (Note [interleaved 1F1B]): every stage's passes each run once.
bool interleavedRunsToCompletion(int ranks, int chunks, int mb) {
  std::vector<std::vector<Action>> lists;
  for (int r = 0; r < ranks; ++r) lists.push_back(buildRank(Schedule::Interleaved1F1B, r, ranks, chunks, mb));
  int passes = 0;
  return runsWithRendezvous(lists, &passes) && passes == 2 * ranks * chunks * mb;
}

TEST(Interleaved, EachRankRunsItsChunksStagesWithTheirTransfersAndNeverDeadlocks) {
  // 2 ranks of 2 chunks, M = 2: rank 0 runs stages 0 and 2, the first
  // receiving nothing, the boundary 1 -> 2 a transfer like any other.
  EXPECT_EQ(str(buildRank(Schedule::Interleaved1F1B, 0, 2, 2, 2)),
            "forward(0)@0 send-act(0)@0 forward(1)@0 send-act(1)@0 recv-act(0)@2 forward(0)@2 send-act(0)@2 "
            "recv-act(1)@2 forward(1)@2 send-act(1)@2 recv-grad(0)@2 backward(0)@2 send-grad(0)@2 "
            "recv-grad(1)@2 backward(1)@2 send-grad(1)@2 recv-grad(0)@0 backward(0)@0 recv-grad(1)@0 "
            "backward(1)@0 all-reduce optimizer-step\n");
  EXPECT_EQ(buildRank(Schedule::OneFOneB, 1, 3, 1, 4), build(Schedule::OneFOneB, 1, 3, 4));
  for (int ranks = 1; ranks <= 4; ++ranks)
    for (int chunks = 2; chunks <= 3; ++chunks)
      for (int mb = ranks; mb <= 3 * ranks; mb += ranks)
        EXPECT_TRUE(interleavedRunsToCompletion(ranks, chunks, mb)) << ranks << " " << chunks << " " << mb;
}

/// Every rank's interleaved list for `batches` accumulated runs.
std::vector<std::vector<Action>> interleavedLists(int ranks, int chunks, int mb, int batches) {
  std::vector<std::vector<Action>> lists;
  for (int r = 0; r < ranks; ++r)
    lists.push_back(accumulate(buildRank(Schedule::Interleaved1F1B, r, ranks, chunks, mb), batches, mb));
  return lists;
}

TEST(AwaitGradients, InterleavedWaitsNeverDeadlockAndAddNothingElse) {
  // 2 ranks of 2 chunks, M = 2 (the replay of gradient_waits_test): each
  // backward after a rank's first awaits the gradient its previous one sent.
  auto two = awaitingGradients(interleavedLists(2, 2, 2, 1), 0);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(str(*two),
            "forward(0)@0 send-act(0)@0 forward(1)@0 send-act(1)@0 recv-act(0)@2 forward(0)@2 send-act(0)@2 "
            "recv-act(1)@2 forward(1)@2 send-act(1)@2 recv-grad(0)@2 backward(0)@2 send-grad(0)@2 "
            "recv-grad(1)@2 await-grad(0)@2 backward(1)@2 send-grad(1)@2 recv-grad(0)@0 await-grad(1)@2 "
            "backward(0)@0 recv-grad(1)@0 backward(1)@0 all-reduce optimizer-step\n");
  for (int ranks = 2; ranks <= 4; ++ranks)
    for (int chunks = 2; chunks <= 3; ++chunks)
      for (int mb = ranks; mb <= 3 * ranks; mb += ranks)
        for (int batches = 1; batches <= 2; ++batches) {
          const auto lists = interleavedLists(ranks, chunks, mb, batches);
          std::vector<std::vector<Action>> awaiting;
          int waits = 0;
          for (int r = 0; r < ranks; ++r) {
            auto mine = awaitingGradients(lists, r);
            ASSERT_TRUE(mine.ok());
            std::vector<Action> rest;
            for (const Action &a : *mine)
              if (a.kind == ActionKind::AwaitGradients) ++waits;
              else rest.push_back(a);
            EXPECT_EQ(rest, lists[r]);
            awaiting.push_back(std::move(*mine));
          }
          EXPECT_GT(waits, 0);
          EXPECT_TRUE(runsWithRendezvous(awaiting)) << ranks << " ranks, " << chunks << " chunks, M " << mb;
        }
}

TEST(AwaitGradients, AWaitThatClosesACycleIsCaught) {
  // The control: stage 1 of 2 awaiting its micro-batch-0 gradients before
  // the backward that sends them waits for stage 0, which waits for them.
  std::vector<std::vector<Action>> lists = {build(Schedule::OneFOneB, 0, 2, 2), build(Schedule::OneFOneB, 1, 2, 2)};
  EXPECT_TRUE(runsWithRendezvous(lists));
  auto b0 = std::find(lists[1].begin(), lists[1].end(), Action{ActionKind::Backward, 0});
  ASSERT_NE(b0, lists[1].end());
  lists[1].insert(b0, Action{ActionKind::AwaitGradients, 0});
  EXPECT_FALSE(runsWithRendezvous(lists));
}

TEST(Schedules, NeverDeadlock) {
  for (Schedule kind : pipeline::kSchedules)
    for (int stages = 1; stages <= 5; ++stages)
      for (int mb = 1; mb <= 6; ++mb) EXPECT_TRUE(runsToCompletion(kind, stages, mb)) << stages << " " << mb;
}

TEST(Accumulate, RunsTheBatchesBackToBackWithOneOptimizerStep) {
  // Two batches of 2 micro-batches on the last of 2 stages: batch 1's
  // micro-batches become 2 and 3; one all-reduce and step at the very end.
  EXPECT_EQ(str(accumulate(build(Schedule::OneFOneB, 1, 2, 2), 2, 2)),
            "recv-act(0) forward(0) backward(0) send-grad(0) recv-act(1) forward(1) backward(1) send-grad(1) "
            "recv-act(2) forward(2) backward(2) send-grad(2) recv-act(3) forward(3) backward(3) send-grad(3) "
            "all-reduce optimizer-step\n");
  EXPECT_EQ(str(accumulate(build(Schedule::GPipe, 0, 1, 1), 1, 1)), str(build(Schedule::GPipe, 0, 1, 1)));
  for (Schedule kind : pipeline::kSchedules)
    for (int stages = 1; stages <= 4; ++stages)
      for (int mb = 1; mb <= 4; ++mb)
        for (int batches = 1; batches <= 3; ++batches) {
          EXPECT_TRUE(runsToCompletion(kind, stages, mb, batches)) << stages << " " << mb << " " << batches;
          // Each batch drains before the next: memory stays that of one batch.
          for (int s = 0; s < stages; ++s)
            EXPECT_EQ(peakMicrobatchesInFlight(accumulate(build(kind, s, stages, mb), batches, mb)),
                      peakMicrobatchesInFlight(build(kind, s, stages, mb)));
        }
}

TEST(Samples, SplitAndIntersect) {
  auto parts = splitSamples(5, 2); // 3 + 2
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].begin, 0);
  EXPECT_EQ(parts[0].end, 3);
  EXPECT_EQ(parts[1].begin, 3);
  EXPECT_EQ(parts[1].end, 5);
  // Replica 1 of 3 over 6 samples holds [2,4); it overlaps [3,5) in [3,4).
  SampleRange r = intersect(splitSamples(6, 3)[1], parts[1]);
  EXPECT_EQ(r.begin, 3);
  EXPECT_EQ(r.end, 4);
  EXPECT_LE(intersect({0, 2}, {2, 4}).size(), 0);
}

TEST(StageProgram, EverySendHasAMatchingReceive) {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  auto g = import::importModel(std::string(dir ? dir : "models") + "/gpt/model.onnx");
  ASSERT_TRUE(g.ok()) << g.error().message;
  const int n = static_cast<int>(g->nodes.size());
  std::vector<std::pair<int, int>> ranges{{0, n / 4}, {n / 4, n / 2}, {n / 2, 3 * n / 4}, {3 * n / 4, n}};
  std::set<std::tuple<int, int, ir::ValueId>> sent, received; // (from, to, value)
  std::set<ir::NodeId> computed;
  int loss_stages = 0;
  for (int s = 0; s < 4; ++s) {
    StageProgram p = buildStageProgram(*g, ranges, s);
    for (const auto &t : p.sends) sent.insert({s, t.peer_stage, t.value});
    for (const auto &t : p.recvs) {
      received.insert({t.peer_stage, s, t.value});
      EXPECT_LT(t.peer_stage, s) << "values only flow forward";
    }
    for (ir::NodeId node : p.nodes) {
      bool own = node >= ranges[s].first && node < ranges[s].second;
      bool cheap = g->nodes[node].inputs.empty() || !ir::isFloating(g->values[g->nodes[node].outputs[0]].dtype);
      EXPECT_TRUE(own || cheap) << "only constants and integer values are recomputed elsewhere";
      computed.insert(node);
    }
    for (const auto &t : p.recvs)
      EXPECT_TRUE(ir::isFloating(g->values[t.value].dtype)) << "integer values are recomputed, never received";
    loss_stages += p.computes_loss;
  }
  EXPECT_EQ(sent, received);
  EXPECT_FALSE(sent.empty());
  EXPECT_EQ(computed.size(), g->nodes.size());
  EXPECT_EQ(loss_stages, 1);
}

TEST(StageProgram, TiedParameterIsListedByEveryStageThatReadsIt) {
  // Note [shared parameters]: the GPT with tied embeddings split right before
  // the LM head's weight Transpose: both stages read tok_emb.weight.
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  auto g = import::importModel(std::string(dir ? dir : "models") + "/gpt_tied/model.onnx");
  ASSERT_TRUE(g.ok()) << g.error().message;
  ir::sinkParameterOps(*g);
  const ir::ValueId emb = g->findValue("tok_emb.weight");
  const auto users = g->users();
  ASSERT_EQ(users[emb].size(), 2u);
  const int n = int(g->nodes.size()), cut = users[emb][1];
  const std::vector<std::pair<int, int>> ranges{{0, cut}, {cut, n}};
  for (int s = 0; s < 2; ++s) {
    StageProgram p = buildStageProgram(*g, ranges, s);
    EXPECT_EQ(std::count(p.parameters.begin(), p.parameters.end(), emb), 1) << "stage " << s;
    ASSERT_EQ(p.shared_parameters.size(), 1u) << "stage " << s;
    EXPECT_EQ(p.shared_parameters[0].first, emb);
    EXPECT_EQ(p.shared_parameters[0].second, (std::vector<int>{0, 1}));
  }
  // Three stages: the middle one does not read it, the outer two share it.
  const std::vector<std::pair<int, int>> three{{0, cut / 2}, {cut / 2, cut}, {cut, n}};
  EXPECT_TRUE(buildStageProgram(*g, three, 1).shared_parameters.empty());
  EXPECT_EQ(buildStageProgram(*g, three, 2).shared_parameters[0].second, (std::vector<int>{0, 2}));
  // One stage: nothing is shared.
  EXPECT_TRUE(buildStageProgram(*g, {{0, n}}, 0).shared_parameters.empty());
}

/// A hand-built graph: values and single-output nodes, named after their output.
struct GraphBuilder {
  ir::Graph g;
  const char *domain = ""; ///< "aten" for ATen op names
  ir::ValueId value(const char *name, ir::DType t, ir::ValueKind kind = ir::ValueKind::Intermediate) {
    ir::Value v;
    v.name = name, v.dtype = t, v.kind = kind;
    return g.addValue(v);
  }
  void node(const char *op, std::vector<ir::ValueId> in, ir::ValueId out) {
    ir::Node n;
    n.name = std::string(op) + "_" + g.values[out].name, n.op_type = op, n.domain = domain;
    n.inputs = std::move(in), n.outputs = {out};
    g.addNode(n);
  }
};

TEST(StageProgram, OnlyValuesAGradientCanReachAreReceivedAsLeavesThatNeedOne) {
  // Note [gradient-free values]: a MoE router's expert counts, a float histc
  // of integer ids, each op in a stage of its own.
  GraphBuilder b;
  b.domain = "aten";
  ir::Graph &g = b.g;
  auto value = [&b](auto... a) { return b.value(a...); };
  auto node = [&b](const char *op, std::vector<ir::ValueId> in, ir::ValueId out) { b.node(op, std::move(in), out); };
  const ir::ValueId x = value("x", ir::DType::F32, ir::ValueKind::Input);
  const ir::ValueId w = value("w", ir::DType::F32, ir::ValueKind::Parameter);
  const ir::ValueId h = value("h", ir::DType::F32), ids = value("ids", ir::DType::I64);
  const ir::ValueId as_float = value("as_float", ir::DType::F32), counts = value("counts", ir::DType::F32);
  const ir::ValueId zeros = value("zeros", ir::DType::F32), view = value("view", ir::DType::F32);
  const ir::ValueId written = value("written", ir::DType::F32), offsets = value("offsets", ir::DType::I32);
  const ir::ValueId loss = value("loss", ir::DType::F32);
  node("aten::mm", {x, w}, h);               // 0: carries (w)
  node("aten::argmax", {h}, ids);            // 1: integer
  node("aten::to", {ids}, as_float);         // 2: float of integers: none
  node("aten::histc", {as_float}, counts);   // 3: none
  node("aten::zeros_like", {x}, zeros);      // 4: none, until ...
  node("aten::slice", {zeros}, view);        // 5: ... its view is written in place:
  node("aten::copy_", {view, h}, written);   // 6: the view and zeros carry
  node("aten::cumsum", {counts}, offsets);   // 7
  node("aten::add", {written, zeros}, loss); // 8
  g.loss = loss;
  std::vector<std::pair<int, int>> ranges;
  for (int n = 0; n < 9; ++n) ranges.emplace_back(n, n + 1);
  std::map<ir::ValueId, bool> gradient, sent;
  for (int s = 0; s < 9; ++s) {
    const StageProgram p = buildStageProgram(g, ranges, s);
    for (const Transfer &t : p.recvs) gradient[t.value] = t.gradient;
    for (const Transfer &t : p.sends) sent[t.value] = t.gradient;
  }
  EXPECT_EQ(sent, gradient) << "both ends agree";
  EXPECT_TRUE(gradient.at(h));
  EXPECT_FALSE(gradient.at(as_float));
  EXPECT_FALSE(gradient.at(counts)) << "cumsum with an integer dtype must receive it without a gradient";
  EXPECT_TRUE(gradient.at(view));
  EXPECT_TRUE(gradient.at(zeros)) << "copy_ into its slice makes zeros need a gradient, as in PyTorch";
  EXPECT_TRUE(gradient.at(written));
}

TEST(StageProgram, AValueReadOnlyForItsShapeCarriesNoGradientThere) {
  // Note [shape-only receives]: stage 1 recomputes Shape(h) for its reshape,
  // so it receives h, and reads no element of it; stage 2 adds h.
  GraphBuilder b;
  ir::Graph &g = b.g;
  auto value = [&b](auto... a) { return b.value(a...); };
  auto node = [&b](const char *op, std::vector<ir::ValueId> in, ir::ValueId out) { b.node(op, std::move(in), out); };
  const ir::ValueId x = value("x", ir::DType::F32, ir::ValueKind::Input);
  const ir::ValueId w = value("w", ir::DType::F32, ir::ValueKind::Parameter);
  const ir::ValueId h = value("h", ir::DType::F32), shape = value("shape", ir::DType::I64);
  const ir::ValueId r = value("r", ir::DType::F32), loss = value("loss", ir::DType::F32);
  node("MatMul", {x, w}, h);      // stage 0
  node("Shape", {h}, shape);      // stage 0, recomputed by stage 1
  node("Reshape", {x, shape}, r); // stage 1
  node("Add", {r, h}, loss);      // stage 2
  g.loss = loss;
  const std::vector<std::pair<int, int>> ranges = {{0, 2}, {2, 3}, {3, 4}};
  auto transfer = [](const std::vector<Transfer> &ts, ir::ValueId v, int peer) {
    for (const Transfer &t : ts)
      if (t.value == v && t.peer_stage == peer) return t;
    ADD_FAILURE() << "no transfer of value " << v << " with stage " << peer;
    return Transfer{v, peer, true};
  };
  const StageProgram first = buildStageProgram(g, ranges, 0), reshape = buildStageProgram(g, ranges, 1),
                     add = buildStageProgram(g, ranges, 2);
  EXPECT_FALSE(transfer(reshape.recvs, h, 0).gradient) << "read for its shape alone";
  EXPECT_TRUE(transfer(add.recvs, h, 0).gradient);
  EXPECT_FALSE(transfer(first.sends, h, 1).gradient) << "both ends agree";
  EXPECT_TRUE(transfer(first.sends, h, 2).gradient);
}

} // namespace
} // namespace rannc::schedule
