// The plan file: conversion between ir::Graph and the proto, reading and
// writing in the three encodings (.pb, .pbtxt, .json), and the structural
// checks every consumer of a plan runs before trusting it.
#pragma once

#include <string>
#include <vector>

#include "plan.pb.h"
#include "planner/cluster/cluster.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::plan {

/// The plan format this build writes and the newest it reads.
constexpr uint32_t kFormatVersion = 1;

proto::Graph graphToProto(const ir::Graph &g);
/// Rebuilds the IR; errors name the op or value field at fault.
Expected<ir::Graph> graphFromProto(const proto::Graph &p);

proto::Cluster clusterToProto(const cluster::ClusterSpec &c);
cluster::ClusterSpec clusterFromProto(const proto::Cluster &p);

/// Parses "[B,16,2*B+1,?]" (shapeString's output); "[*]" means unknown rank.
Expected<ir::Shape> parseShape(const std::string &text, bool &rank_known);

/// Reads a plan in the encoding its extension names (.pb, .pbtxt, .json).
Expected<proto::Plan> readPlan(const std::string &path);
/// Writes a plan in the encoding its extension names, atomically; the same
/// plan always gives the same bytes.
Status writePlan(const proto::Plan &plan, const std::string &path);
/// Serializes in one encoding: ".pb", ".pbtxt" or ".json".
Expected<std::string> encodePlan(const proto::Plan &plan, const std::string &ext);

/// Structural problems of a plan (format version, every op in exactly one
/// stage, stages in order, ranks covering 0..world-1 once each, batch and
/// micro-batches compatible), each naming the field. Empty when sound.
std::vector<std::string> structuralProblems(const proto::Plan &plan);

/// Total number of ranks the plan's stages use.
int worldSize(const proto::Plan &plan);

} // namespace rannc::plan
