// The plan file: conversion between ir::Graph and the proto, reading and
// writing in the three encodings (.pb, .pbtxt, .json), and the structural
// checks every consumer of a plan runs before trusting it.
#pragma once

#include <string>
#include <vector>

#include "plan.pb.h"
#include "planner/cluster/cluster.h"
#include "planner/ir/ir.h"
#include "planner/pipeline/schedule.h"
#include "planner/support/status.h"

namespace rannc::plan {

/// Note [plan format versions]
/// format_version tells a reader whether it knows every field that changes
/// what the plan runs. Version 1 is the original format (and additions an
/// older reader may ignore: estimates, device peaks, model inputs, external
/// data hashes). Version 2 adds fields a version-1 reader would silently run
/// differently, as an fp32, unsharded, non-recomputing plan with contiguous
/// samples: precision bf16|fp16, stages[*].zero, stages[*].recompute and
/// graph.ops[*].outputs[*].batch_blocks. Version 3 adds stages[*].tensor_parallel
/// above 1 (with graph.sharding), which an older reader would run as that many
/// whole replicas. Version 4 adds batchnorm: exact, which an older reader
/// would run with each replica's own batch statistics. A plan is written with the oldest
/// version that holds the fields it uses (never below the version it says), so
/// a plan using none of them stays readable by older tools, and an older
/// reader refuses one it would misread ("newer than this rannc understands").
/// A plan claiming an older version than its fields need (a hand edit) is a
/// structural problem, each field named; `rannc-plan convert` rewrites it.
/// Bump kFormatVersion with a new entry in versionedFields() whenever a field
/// is added that an older rannc-exec would misread.
constexpr uint32_t kFormatVersion = 5;

/// A field in use that needs a format version newer than 1.
struct VersionedField {
  std::string field;        ///< where, e.g. "stages[1].zero: 1"
  uint32_t version = 1;     ///< the first format version that has it
  std::string older_reader; ///< what a reader of older versions would do instead
};
/// The fields `plan` uses that need a format version above 1, in field order;
/// many op outputs with a batch layout are one entry, naming the first.
std::vector<VersionedField> versionedFields(const proto::Plan &plan);
/// The oldest format version that holds every field `plan` uses.
uint32_t requiredFormatVersion(const proto::Plan &plan);

proto::Graph graphToProto(const ir::Graph &g);
/// Rebuilds the IR; errors name the op or value field at fault.
Expected<ir::Graph> graphFromProto(const proto::Graph &p);

proto::Cluster clusterToProto(const cluster::ClusterSpec &c);
cluster::ClusterSpec clusterFromProto(const proto::Cluster &p);

/// The plan message's value for `s` (Note [adding a schedule] in planner/pipeline/schedule.h).
proto::Schedule scheduleToProto(pipeline::Schedule s);
/// The schedule a plan's `schedule` field names; the error names the field
/// and its values: "schedule: must be GPIPE, ONE_F_ONE_B, ZB_H1, ...".
Expected<pipeline::Schedule> scheduleFromProto(proto::Schedule s);

/// Parses "[B,16,2*B+1,?]" (shapeString's output); "[*]" means unknown rank.
Expected<ir::Shape> parseShape(const std::string &text, bool &rank_known);

/// Reads a plan in the encoding its extension names (.pb, .pbtxt, .json).
Expected<proto::Plan> readPlan(const std::string &path);
/// Writes a plan in the encoding its extension names, atomically; the same
/// plan always gives the same bytes. A format_version below what the plan's
/// fields need is raised to it (Note [plan format versions]).
Status writePlan(const proto::Plan &plan, const std::string &path);
/// Serializes in one encoding: ".pb", ".pbtxt" or ".json".
Expected<std::string> encodePlan(const proto::Plan &plan, const std::string &ext);

/// Structural problems of a plan (format version, every op in exactly one
/// stage, stages in order, ranks covering 0..world-1 once each, batch and
/// micro-batches compatible), each naming the field. Empty when sound.
std::vector<std::string> structuralProblems(const proto::Plan &plan);

/// Where the layout changes BatchNorm's batch statistics, one line per stage
/// (Note [batch statistics] in batch_statistics.cpp); empty when nowhere.
std::vector<std::string> batchStatisticsNotes(const proto::Plan &plan);

/// What makes a plan's `batchnorm` field unsound (an unknown mode; "exact"
/// with several micro-batches through a BatchNorm), each naming the field.
std::vector<std::string> batchStatisticsProblems(const proto::Plan &plan);

/// Total number of ranks the plan's stages use.
int worldSize(const proto::Plan &plan);

/// The chunks (stages) each pipeline rank runs: virtual_stages, 1 when absent (Note [interleaved 1F1B]).
int virtualStages(const proto::Plan &plan);

/// The pipeline ranks p: the stages over virtualStages (stage k runs on the ranks of stage k % p).
int pipelineRanks(const proto::Plan &plan);

/// A stage's tensor-parallel degree: its field, 1 when absent (0).
int tensorParallel(const proto::Stage &s);
/// A stage's data-parallel replicas: its ranks over its tensor-parallel degree.
int stageReplicas(const proto::Stage &s);

} // namespace rannc::plan
