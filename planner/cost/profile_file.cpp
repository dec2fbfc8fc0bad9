#include "planner/cost/profile_file.h"

#include "planner/support/files.h"
#include "profile.pb.h"

namespace rannc::cost {

// 3: a unit's kept_bytes are what stays alive after its forward when each
// value goes at its last use (Note [last use] in executor/runtime/stage.h),
// and its work_bytes include the gradients of its outputs, handed to autograd
// as rannc-exec does (Note [handing gradients over]). Older versions counted
// every op output as kept, or left the gradients out, and are refused.
constexpr uint32_t kProfileVersion = 3;

Status writeProfile(const CostTable &table, const ProfileKey &key, const std::string &path) {
  proto::Profile p;
  p.set_format_version(kProfileVersion);
  p.set_model_sha256(key.model_sha256);
  p.set_device(key.device);
  p.set_threads(key.threads);
  if (key.precision != "fp32") p.set_precision(key.precision);
  p.set_device_name(table.device_name);
  p.set_optimizer(table.optimizer);
  p.set_optimizer_s_per_param(table.optimizer_s_per_param);
  for (const Unit &u : table.units) {
    auto *r = p.add_units();
    r->set_op_begin(u.op_begin);
    r->set_op_end(u.op_end);
  }
  for (int64_t b : table.batch_sizes) p.add_batch_sizes(b);
  for (ir::ValueId v : table.unsaved_values) p.add_unsaved_values(uint32_t(v));
  for (ir::ValueId v : table.strided_values) p.add_strided_values(uint32_t(v));
  for (const auto &row : table.costs) {
    auto *r = p.add_rows();
    for (const UnitCost &c : row) {
      auto *m = r->add_units();
      m->set_fwd_s(c.fwd_s);
      m->set_bwd_s(c.bwd_s);
      m->set_kept_bytes(c.kept_bytes);
      m->set_work_bytes(c.work_bytes);
      m->set_received_extra_bytes(c.received_extra_bytes);
    }
  }
  std::string bytes;
  if (!p.SerializeToString(&bytes)) return Error{path + ": profile serialization failed"};
  return writeFileAtomic(path, bytes);
}

Expected<CostTable> readProfile(const std::string &path, const ProfileKey &expect) {
  auto bytes = readFile(path);
  if (!bytes) return bytes.error();
  proto::Profile p;
  if (!p.ParseFromString(*bytes) || p.format_version() == 0)
    return Error{path + ": not a rannc profile (protobuf parse failed)"};
  if (p.format_version() > kProfileVersion)
    return Error{path + ": profile format " + std::to_string(p.format_version()) + " is newer than this rannc"};
  if (p.format_version() < kProfileVersion)
    return Error{path + ": profile format " + std::to_string(p.format_version()) +
                 " counted memory as an older rannc-exec held it; re-run rannc-plan profile"};
  if (p.model_sha256() != expect.model_sha256)
    return Error{path + ": the profile was measured for another model (SHA-256 " + p.model_sha256().substr(0, 12) +
                 "..., this model is " + expect.model_sha256.substr(0, 12) + "...); re-run rannc-plan profile"};
  if (p.device() != expect.device)
    return Error{path + ": the profile was measured for '" + p.device() + "'" +
                 (p.device_name().empty() ? "" : " (on " + p.device_name() + ")") + ", the plan is for '" +
                 expect.device + "'"};
  if (p.threads() != expect.threads)
    return Error{path + ": the profile was measured with " + std::to_string(p.threads()) + " thread(s), the plan uses " +
                 std::to_string(expect.threads)};
  if (const std::string got = p.precision().empty() ? "fp32" : p.precision(); got != expect.precision)
    return Error{path + ": the profile was measured in " + got + ", the plan is for --precision " + expect.precision +
                 "; re-run rannc-plan profile --precision " + expect.precision};
  if (p.rows_size() != p.batch_sizes_size() || p.batch_sizes_size() == 0)
    return Error{path + ": corrupt profile (batch sizes and rows differ)"};
  CostTable t;
  t.source = path;
  t.optimizer = p.optimizer();
  t.optimizer_s_per_param = p.optimizer_s_per_param();
  t.device_name = p.device_name();
  for (const auto &u : p.units()) t.units.push_back({u.op_begin(), u.op_end()});
  t.batch_sizes.assign(p.batch_sizes().begin(), p.batch_sizes().end());
  for (uint32_t v : p.unsaved_values()) t.unsaved_values.push_back(ir::ValueId(v));
  for (uint32_t v : p.strided_values()) t.strided_values.push_back(ir::ValueId(v));
  for (const auto &row : p.rows()) {
    if (row.units_size() != p.units_size()) return Error{path + ": corrupt profile (a row has the wrong unit count)"};
    std::vector<UnitCost> r;
    for (const auto &m : row.units())
      r.push_back({m.fwd_s(), m.bwd_s(), m.kept_bytes(), m.work_bytes(), m.received_extra_bytes()});
    t.costs.push_back(std::move(r));
  }
  return t;
}

} // namespace rannc::cost
